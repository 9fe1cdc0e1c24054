"""`sparklab rehearse [sweep|tune|up] TARGET`: the night of a sweep, tune or up, run through sparklab's own code
against a DGX Spark twin in minutes (sparklab.rehearse), then what the real night would do."""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sparklab.cli.args import positive
from sparklab.cli.report import built_report
from sparklab.cli.terminal import err, out

if TYPE_CHECKING:
    from sparklab.rehearse.night import RehearsalRequest

COMMAND_WORDS = ("sweep", "tune", "up")


@dataclass(frozen=True)
class RehearseArgs:
    request: RehearsalRequest

    @classmethod
    def add_cli_args(cls, p: argparse.ArgumentParser) -> None:
        p.add_argument("what", nargs="+", metavar="[sweep|tune|up] TARGET",
                       help="a sweep file or its name (seed000), or RECIPE[:METHOD] as `sparklab up` takes it "
                            "(gb10:dspark, dspark); `tune TARGET` rehearses a tune over it")
        p.add_argument("--fault", choices=["dead-engine", "oom", "slow-download", "disk-full", "host-lost"],
                       help="inject one fault into the night: the first engine dies after ready; it leaks memory "
                            "under load; the weights come over a slow network at start; the disk fills after the "
                            "first server; the night's last host goes away mid-night (a night over two hosts: "
                            "a pair's worker)")
        p.add_argument("--throttle", action="store_true",
                       help="the twin's GPU throttles under sustained load (recipes/hardware.yaml's twin.throttle)")
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override a recipe value for every server, as a sweep file's set: "
                            "(e.g. gpu_memory_utilization=0.97)")
        p.add_argument("--engine", help="the recipe's engine (RECIPE targets; default: the recipe's)")
        p.add_argument("--minutes", type=positive(600), default=1.5,
                       help="wall time to compress the night into (default 1.5; the stand-ins set a floor)")
        p.add_argument("--runs-dir", type=Path,
                       help="keep the rehearsal's run here (default: a scratch directory, removed; never ./runs)")

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> RehearseArgs:
        from sparklab.errors import SparklabError
        from sparklab.rehearse.night import RehearsalRequest

        words = list(args.what)
        command = words.pop(0) if len(words) > 1 and words[0] in COMMAND_WORDS else None
        if len(words) != 1:
            raise SparklabError(f"rehearse: {' '.join(args.what)!r} is not [sweep|tune|up] TARGET",
                                "e.g. sparklab rehearse seed000, sparklab rehearse tune gb10, "
                                "sparklab rehearse up gb10:dspark")
        return cls(RehearsalRequest(words[0], command, args.fault, args.throttle, tuple(args.overrides), args.engine,
                                    wall_s=args.minutes * 60, runs_dir=args.runs_dir, keep=args.runs_dir is not None))


def cmd_rehearse(args: RehearseArgs) -> int:
    from sparklab.cli.console import sweep_table
    from sparklab.cli.tune_text import tune_summary
    from sparklab.rehearse import verdict as verdicts
    from sparklab.rehearse.night import rehearse

    started = time.monotonic()

    def say(message: str) -> None:
        err.print(f"{time.strftime('%H:%M:%S')} (+{time.monotonic() - started:5.1f} s) {message}", markup=False,
                  highlight=False)

    with rehearse(args.request, say) as rehearsal:
        if rehearsal.interrupted:
            say("interrupted; the rehearsal's servers are down (it says nothing of the night)")
            return 130
        verdict = verdicts.judge(rehearsal)
        if rehearsal.run_dir is not None and rehearsal.counts.get("done"):
            report = built_report(rehearsal.run_dir / "results.sqlite")
            out.print("the report the night would produce (times on the night's clock):", markup=False)
            if rehearsal.tune_state is not None:
                out.print(tune_summary(report, rehearsal.tune_state), markup=False)
            else:
                out.print(sweep_table(report))
        for line in verdicts.lines(rehearsal, verdict):
            out.print(line, markup=False, highlight=False)
        if args.request.runs_dir is not None and rehearsal.run_dir is not None:
            out.print(f"the rehearsal's run: {rehearsal.run_dir} (sparklab report {rehearsal.run_dir.name} "
                      f"--runs-dir {args.request.runs_dir})", markup=False)
    return verdict.exit_code
