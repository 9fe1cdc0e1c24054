"""`sparklab compare RUN RUN …`: runs side by side (sparklab.report.compare), in report's formats, offline."""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sparklab.cli.terminal import err, out
from sparklab.errors import SparklabError


@dataclass(frozen=True)
class CompareArgs:
    runs: list[str]  # two or more: a run id or sweep name under runs_dir, a run directory or a results.sqlite
    runs_dir: Path
    format: str  # what to print on stdout: md, csv, json or html
    out: Path | None  # write every format and the plots here instead of printing
    force: bool  # compare the shared cells even when some cells are in one run only

    @classmethod
    def add_cli_args(cls, p: argparse.ArgumentParser) -> None:
        p.add_argument("runs", nargs="+", metavar="RUN", help="two or more runs: a run id or sweep name under "
                                                              "--runs-dir, a run directory, a results.sqlite")
        p.add_argument("--runs-dir", type=Path, default=Path("runs"), help="where runs are kept (default ./runs)")
        p.add_argument("-f", "--format", default="md", choices=["md", "csv", "json", "html"],
                       help="what to print on stdout (default md)")
        p.add_argument("-o", "--out", type=Path, metavar="DIR",
                       help="write compare.md, .csv, .json, .html and plots/*.png here instead of printing")
        p.add_argument("--force", action="store_true",
                       help="compare the cells the runs share even when some cells are in one run only (listed)")

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> CompareArgs:
        return cls(runs=list(args.runs), runs_dir=args.runs_dir, format=args.format, out=args.out, force=args.force)


def cmd_compare(args: CompareArgs) -> int:
    from sparklab import report
    from sparklab.report import compare
    from sparklab.sweep.store import Store

    reports, ids = [], []
    for run in args.runs:
        path, note = report.locate(run, args.runs_dir)
        if note:
            err.print(note, markup=False)
        with Store.open(path, readonly=True) as store:
            reports.append(report.build(store, path.parent.name))
        ids.append(path.parent.name)
    if len(set(ids)) != len(ids):
        raise SparklabError(f"the same run is named twice: {', '.join(ids)}", "Name each run once.")
    comparison = compare.compare(ids, reports, force=args.force)
    if args.out:
        for written in compare.write_all(comparison, args.out):
            out.print(str(written), markup=False)
        return 0
    if args.format != "html":
        sys.stdout.write(compare.render(comparison, args.format))
        return 0
    with tempfile.TemporaryDirectory(prefix="sparklab-compare-") as plots:
        sys.stdout.write(compare.render(comparison, "html", Path(plots)))
    return 0
