"""`sparklab report`: a sweep's stored results → tables, plots, roofline and a recommendation, offline.

    store ─from_store.build→ Report ─content.document→ Document ─document.markdown / to_html→ text
                               ─exports.to_csv / to_json→ text      ─plots.all_plots→ PNG files

Pure over stored results: it may import `sweep.store` and its row types `sweep.store_rows` (to read a run),
`bench.metrics`, `recipes.schema` (the hardware table), `engines` (what an engine's numbers mean), `outputs`,
`records` and `errors`; never the runtimes, the chat client or anything that talks to a network (a test imports it
with those blocked).
"""

from __future__ import annotations

from pathlib import Path

from sparklab.errors import RecipeError
from sparklab.report.content import document
from sparklab.report.document import json_visible, markdown, to_html, visible
from sparklab.report.exports import to_csv, to_json
from sparklab.report.files import check_out, load, locate, malformed, publish, staged
from sparklab.report.from_store import build
from sparklab.report.model import Overrides, Report

FORMATS = ("md", "csv", "json", "html")

__all__ = ["FORMATS", "Overrides", "Report", "build", "check_out", "load", "locate", "malformed", "overrides_from",
           "render", "write_all"]


def render(report: Report, fmt: str, plot_dir: Path | None = None) -> str:
    """One format as text. HTML embeds plots, drawn into plot_dir (required for html). Control characters from
    stored strings are shown, never passed to a terminal (document.visible)."""
    if fmt == "md":
        return visible(markdown(document(report)))
    if fmt == "csv":
        return visible(to_csv(report))
    if fmt == "json":
        return json_visible(to_json(report))
    if fmt == "html":
        if plot_dir is None:
            raise ValueError("html needs a directory for its plots")
        from sparklab.report.plots import all_plots

        return visible(to_html(document(report, all_plots(report, plot_dir))))
    raise ValueError(f"unknown report format {fmt!r}")


def write_all(report: Report, out: Path) -> list[Path]:
    """report.md (linking plots/*.png), report.csv, report.json and the self-contained report.html, all or
    nothing: built beside `out`, then moved into it (an error leaves `out` as it was)."""
    from sparklab.report.plots import all_plots

    with staged(out) as staging:
        plots = all_plots(report, staging / "plots")
        doc = document(report, plots)
        files = {"report.md": visible(markdown(doc, base=staging)), "report.csv": visible(to_csv(report)),
                 "report.json": json_visible(to_json(report)), "report.html": visible(to_html(doc))}
        for name, text in files.items():
            (staging / name).write_text(text, encoding="utf-8")
        return publish(staging, out, [staging / name for name in files] + [path for _, path in plots])


def overrides_from(hardware: str | None, bandwidth_gbps: float | None, facts: list[str],
                   slo: str | None = None) -> Overrides:
    """The report-time corrections `--hardware`, `--bandwidth-gbps`, `--fact KEY=VALUE` and `--slo`, checked: a bad
    value is a RecipeError (exit 2), as the same mistake is in tune and sweep."""
    from sparklab.recipes.schema import ModelFacts, load_hardware
    from sparklab.report.roofline import Device

    device = None
    if hardware:
        devices = load_hardware()
        if hardware not in devices:
            raise RecipeError(f"--hardware {hardware}: no such device in recipes/hardware.yaml",
                              f"Known: {', '.join(devices) or 'none'}; add it there, or give --bandwidth-gbps.")
        known = devices[hardware]
        device = Device(hardware, known.bandwidth_gbps, known.usable_bandwidth_gbps, known.usable_source)
    if bandwidth_gbps is not None:
        if not bandwidth_gbps > 0:
            raise RecipeError(f"--bandwidth-gbps must be positive, got {bandwidth_gbps:g}")
        device = Device(f"{hardware or 'given'} at --bandwidth-gbps", bandwidth_gbps)
    values: dict[str, float] = {}
    for text in facts:
        key, _, raw = text.partition("=")
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if key.strip() not in ModelFacts.model_fields or not value >= 0:
            raise RecipeError(f"--fact {text!r}: expected KEY=NUMBER (not negative), KEY one of "
                              f"{', '.join(ModelFacts.model_fields)}", "Example: --fact active_params_b=3")
        values[key.strip()] = value
    if slo is not None:
        from sparklab.bench import slo as slos

        slos.check_flag(slo)
    return Overrides(device, values, slo)
