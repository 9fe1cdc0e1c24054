"""`sparklab report`: a sweep's stored results → tables, plots, roofline and a recommendation, offline.

    store ─model.build→ Report ─content.document→ Document ─document.markdown / to_html→ text
                               ─exports.to_csv / to_json→ text      ─plots.all_plots→ PNG files
"""

from __future__ import annotations

from pathlib import Path

from sparklab.report.content import document
from sparklab.report.document import markdown, to_html
from sparklab.report.exports import to_csv, to_json
from sparklab.report.model import Overrides, Report, build

FORMATS = ("md", "csv", "json", "html")

__all__ = ["FORMATS", "Overrides", "Report", "build", "render", "write_all"]


def render(report: Report, fmt: str, plot_dir: Path | None = None) -> str:
    """One format as text. HTML embeds plots, drawn into plot_dir (required for html)."""
    if fmt == "md":
        return markdown(document(report))
    if fmt == "csv":
        return to_csv(report)
    if fmt == "json":
        return to_json(report)
    if fmt == "html":
        if plot_dir is None:
            raise ValueError("html needs a directory for its plots")
        from sparklab.report.plots import all_plots

        return to_html(document(report, all_plots(report, plot_dir)))
    raise ValueError(f"unknown report format {fmt!r}")


def write_all(report: Report, out: Path) -> list[Path]:
    """report.md (linking plots/*.png), report.csv, report.json and the self-contained report.html."""
    from sparklab.report.plots import all_plots

    out.mkdir(parents=True, exist_ok=True)
    plots = all_plots(report, out / "plots")
    doc = document(report, plots)
    files = {"report.md": markdown(doc, base=out), "report.csv": to_csv(report), "report.json": to_json(report),
             "report.html": to_html(doc)}
    written = []
    for name, text in files.items():
        (out / name).write_text(text, encoding="utf-8")
        written.append(out / name)
    return written + [path for _, path in plots]
