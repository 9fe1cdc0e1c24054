"""`sparklab report`: tables, plots, roofline and the best config from a run's results, offline."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparklab.cli.terminal import err, out


@dataclass(frozen=True)
class ReportArgs:
    run: str  # a run id or sweep name under runs_dir, a run directory or a results.sqlite
    runs_dir: Path
    format: str  # what to print on stdout: md, csv, json or html
    out: Path | None  # write every format and the plots here instead of printing
    hardware: str | None
    bandwidth_gbps: float | None
    facts: list[str]  # KEY=VALUE model facts for the roofline
    slo: str | None = None  # a latency objective: the best config per concurrency among those meeting it

    @classmethod
    def add_cli_args(cls, p: argparse.ArgumentParser) -> None:
        p.add_argument("run", metavar="RUN", help="a run id or sweep name (its newest run) under --runs-dir, "
                                                  "a run directory or a results.sqlite")
        p.add_argument("--runs-dir", type=Path, default=Path("runs"), help="where runs are kept (default ./runs)")
        p.add_argument("-f", "--format", default="md", choices=["md", "csv", "json", "html"],
                       help="what to print on stdout (default md, paste-ready Markdown)")
        p.add_argument("-o", "--out", type=Path, metavar="DIR",
                       help="write report.md, .csv, .json, .html and plots/*.png here instead of printing")
        p.add_argument("--hardware", metavar="NAME", help="roofline for this device of recipes/hardware.yaml")
        p.add_argument("--bandwidth-gbps", type=float, metavar="GBPS", help="roofline with this memory bandwidth")
        p.add_argument("--fact", dest="facts", action="append", default=[], metavar="KEY=VALUE",
                       help="override a model fact for the roofline, e.g. --fact active_params_b=3 (repeatable)")
        p.add_argument("--slo", metavar="TERMS",
                       help="judge configs by a latency objective, e.g. 'tpot_p90<=50ms,ttft_p90<=500ms': the best per "
                            "concurrency among those whose interval meets it, and the highest concurrency any meets it "
                            "at (default: the sweep file's slo:; --slo '' drops it)")

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> ReportArgs:
        return cls(run=args.run, runs_dir=args.runs_dir, format=args.format, out=args.out, hardware=args.hardware,
                   bandwidth_gbps=args.bandwidth_gbps, facts=list(args.facts), slo=args.slo)


def built_report(path: Path, overrides: Any = None) -> Any:
    """The report model of one results file (sweep and tune print its tables too)."""
    from sparklab import report

    return report.load(path, overrides)


def cmd_report(args: ReportArgs) -> int:
    import tempfile

    from sparklab import report

    path, note = report.locate(args.run, args.runs_dir)
    if args.out:
        report.check_out(args.out)  # before anything is read: a file there is never touched
    if note:
        err.print(note, markup=False)
    overrides = report.overrides_from(args.hardware, args.bandwidth_gbps, args.facts, args.slo)
    with report.malformed(path):  # whatever a hand-edited file holds: one error naming it, nothing written
        built = report.load(path, overrides)
        if not built.groups:
            err.print(f"{path}: no finished cells yet; the report has no measurements", markup=False)
        if args.out:
            for written in report.write_all(built, args.out):
                out.print(str(written), markup=False)
            return 0
        if args.format != "html":
            sys.stdout.write(report.render(built, args.format))
            return 0
        with tempfile.TemporaryDirectory(prefix="sparklab-report-") as plots:  # drawn, then inlined in the page
            sys.stdout.write(report.render(built, "html", Path(plots)))
    return 0
