"""`sparklab report`: a sweep's stored results → tables, plots, roofline and a recommendation, offline.

    store ─model.build→ Report ─content.document→ Document ─document.markdown / to_html→ text
                               ─exports.to_csv / to_json→ text      ─plots.all_plots→ PNG files

Pure over stored results: it may import `sweep.store` (to read a run), `bench.metrics`, `recipes.schema` (the
hardware table), `engines` (what an engine's numbers mean), `outputs`, `records` and `errors`; never the runtimes,
the chat client or anything that talks to a network (a test imports it with those blocked).
"""

from __future__ import annotations

from pathlib import Path

from sparklab.errors import SparklabError
from sparklab.report.content import document
from sparklab.report.document import markdown, to_html
from sparklab.report.exports import to_csv, to_json
from sparklab.report.model import Overrides, Report, build

FORMATS = ("md", "csv", "json", "html")

__all__ = ["FORMATS", "Overrides", "Report", "build", "locate", "overrides_from", "render", "write_all"]


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


def locate(run: str, runs_dir: Path) -> tuple[Path, str | None]:
    """(results.sqlite, a note) for RUN: a results file, a run directory, a run id under runs_dir, or a sweep
    name (its newest run, which the note names)."""
    given = Path(run)
    for candidate in (given, given / "results.sqlite", runs_dir / run / "results.sqlite"):
        if candidate.is_file():
            return candidate, None
    newest = sorted(runs_dir.glob(f"{run}-*/results.sqlite"))
    if newest:
        return newest[-1], f"newest run of sweep {run}: {newest[-1].parent.name}"
    runs = sorted(p.parent.name for p in runs_dir.glob("*/results.sqlite"))
    raise SparklabError(f"no results for run {run!r}: neither a results.sqlite file, nor a run directory, nor "
                        f"{runs_dir / run / 'results.sqlite'}",
                        f"Runs under {runs_dir}: {', '.join(runs) or 'none'} (another place: --runs-dir DIR).")


def overrides_from(hardware: str | None, bandwidth_gbps: float | None, facts: list[str],
                   slo: str | None = None) -> Overrides:
    """The report-time corrections `--hardware`, `--bandwidth-gbps`, `--fact KEY=VALUE` and `--slo`, checked."""
    from sparklab.recipes.schema import ModelFacts, load_hardware
    from sparklab.report.roofline import Device

    device = None
    if hardware:
        devices = load_hardware()
        if hardware not in devices:
            raise SparklabError(f"--hardware {hardware}: no such device in recipes/hardware.yaml",
                                f"Known: {', '.join(devices) or 'none'}; add it there, or give --bandwidth-gbps.")
        known = devices[hardware]
        device = Device(hardware, known.bandwidth_gbps, known.usable_bandwidth_gbps, known.usable_source)
    if bandwidth_gbps is not None:
        if not bandwidth_gbps > 0:
            raise SparklabError(f"--bandwidth-gbps must be positive, got {bandwidth_gbps:g}")
        device = Device(f"{hardware or 'given'} at --bandwidth-gbps", bandwidth_gbps)
    values: dict[str, float] = {}
    for text in facts:
        key, _, raw = text.partition("=")
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if key.strip() not in ModelFacts.model_fields or not value >= 0:
            raise SparklabError(f"--fact {text!r}: expected KEY=NUMBER (not negative), KEY one of "
                                f"{', '.join(ModelFacts.model_fields)}", "Example: --fact active_params_b=3")
        values[key.strip()] = value
    if slo is not None:
        from sparklab.bench import slo as slos

        try:
            slos.parse(slo)
        except slos.SloError as exc:
            raise SparklabError(f"--slo: {exc}", f"Example: --slo '{slos.EXAMPLE}'") from None
    return Overrides(device, values, slo)
