"""`sparklab sweep` and `tune`: a sweep file's servers x loads, and the search for the best method and K, both on
the sweep machinery (sparklab.sweep.runner, sparklab.tune.driver), resumable, results in SQLite."""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sparklab.cli.args import host_option, k_values, positive, whole
from sparklab.cli.report import built_report
from sparklab.cli.terminal import err, out
from sparklab.recipes.schema import MAX_CONCURRENCY, MAX_DURATION_S, MAX_REQUESTS, MAX_TOKENS

if TYPE_CHECKING:  # both import the chat client: loaded when their command runs, not for every command
    from sparklab.sweep.runner import Request
    from sparklab.tune.driver import TuneChoices


@dataclass(frozen=True)
class SweepArgs:
    request: Request
    dry_run: bool  # print the plan, the commands and an ETA; run nothing

    @classmethod
    def add_cli_args(cls, p: argparse.ArgumentParser) -> None:
        p.add_argument("file", type=Path, help="a sweep file (recipes/sweeps/*.yaml)")
        p.add_argument("--dry-run", action="store_true", help="print the plan, the commands and an ETA; run nothing")
        p.add_argument("--resume", metavar="RUN", help="continue this run (a directory under --runs-dir)")
        p.add_argument("--new", action="store_true", help="start a new run even if an earlier one can continue")
        p.add_argument("--retry-failed", action="store_true", help="run cells that failed max_attempts times again")
        p.add_argument("--allow-drift", action="store_true",
                       help="resume even if the recipe, the sampling or an image digest changed since the run's "
                            "earlier cells (the report marks cells from different images)")
        p.add_argument("--runs-dir", type=Path, default=Path("runs"), help="where runs are kept (default ./runs)")
        p.add_argument("--pull", default="missing", choices=["missing", "always", "never"])
        drop = p.add_mutually_exclusive_group()
        drop.add_argument("--drop-caches", dest="drop_caches", action="store_const", const=True, default=None,
                          help="free the model files' page cache before every server, not only unified-memory ones "
                               "(as root: the whole page cache)")
        drop.add_argument("--no-drop-caches", dest="drop_caches", action="store_const", const=False,
                          help="never free the page cache before a server (default: when MemFree is short on "
                               "unified memory, posix_fadvise over the model's files)")
        p.add_argument("--memory-floor-gib", type=float, metavar="GIB",
                       help="stop a server when MemAvailable falls under this (default: the sweep file's "
                            "memory_floor_gib, else on unified-memory recipes 8, or less where the memory fraction "
                            "leaves less, see host/headroom.py; 0: off)")
        p.add_argument("--ulimit", dest="ulimits", action="append", default=[], metavar="NAME=SOFT[:HARD]",
                       help="override a container ulimit for every server")
        p.add_argument("--no-download", dest="download", action="store_false",
                       help="do not fetch every model and draft into the Hugging Face cache before the first server")
        p.add_argument("--min-free-mib", type=float, default=256.0, metavar="MIB",
                       help="stop cleanly when the runs directory's disk has less free space before a server (256)")
        host_option(p, "spread the servers over these Docker hosts instead of the sweep file's hosts: "
                       "(repeatable; local, ssh://user@host, tcp://host:2376, or a Docker context)")

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> SweepArgs:
        from sparklab.sweep import runner

        options = runner.Options(args.pull, args.drop_caches, min_free_mib=args.min_free_mib,
                                 memory_floor_gib=args.memory_floor_gib, allow_drift=args.allow_drift)
        request = runner.Request(args.file, args.runs_dir, args.resume, args.new, args.retry_failed,
                                 tuple(args.ulimits), options, download=args.download, hosts=tuple(args.hosts))
        return cls(request, args.dry_run)


def cmd_sweep(args: SweepArgs) -> int:
    from sparklab.cli.console import plan_table, sweep_table
    from sparklab.sweep import runner

    request = args.request
    if args.dry_run:
        from sparklab.cli.up import dry_parser_check

        planned = runner.dry_run(request)
        out.print(plan_table(*planned))
        dry_parser_check([s.spec for s in planned[0].servers if s.cluster is None], (request.file,))
        return 0
    status = err.status("starting the sweep…") if err.is_terminal else None

    def say(message: str) -> None:
        """A plain line per event (logs, overnight runs); on a terminal also a live status line."""
        err.print(f"{time.strftime('%H:%M:%S')} {message}", markup=False, highlight=False)
        if status is not None:
            status.update(message)

    if status is not None:
        status.start()
    try:
        outcome = runner.sweep(request, say)
    finally:
        if status is not None:
            status.stop()
    run = outcome.run_dir
    if outcome.interrupted:
        say(f"interrupted; the server is down and the run can continue: sparklab sweep {request.file} "
            f"--resume {run.name} --runs-dir {request.runs_dir}")
        return 130
    out.print(sweep_table(built_report(run / "results.sqlite")))
    out.print(f"results: {run / 'results.sqlite'} · {outcome.counts}")
    out.print(f"report (tables, intervals, roofline, plots): sparklab report {run.name} --runs-dir "
              f"{request.runs_dir} -o {run / 'report'}", markup=False)
    return 0 if outcome.complete else 6


@dataclass(frozen=True)
class TuneArgs:
    choices: TuneChoices
    dry_run: bool  # print the plan, the most model loads and an ETA bound; start nothing

    @classmethod
    def add_cli_args(cls, p: argparse.ArgumentParser) -> None:
        p.add_argument("space", metavar="RECIPE|SWEEP",
                       help="a recipe (name or file) with --methods/--k/--concurrency, or a sweep file (or its name "
                            "under recipes/sweeps) whose methods x K x concurrency is the space")
        p.add_argument("--engine", help="engine of the recipe to tune (default: the sweep file's first, else the "
                                        "recipe's default)")
        p.add_argument("--methods", nargs="+", metavar="METHOD", help="methods of the recipe (none, ngram, mtp, …)")
        p.add_argument("--k", type=k_values, metavar="K",
                       help="speculative tokens to consider: 1-8, 1,2,4 (default 1-3)")
        p.add_argument("--concurrency", nargs="+", type=whole(1, MAX_CONCURRENCY), metavar="C",
                       help="concurrencies to answer for (each gets its own best)")
        p.add_argument("-w", "--workload", help="one workload (default: the sweep's, else seed)")
        p.add_argument("--objective", choices=["aggregate", "per-request", "decode"],
                       help="what to maximise: aggregate output tok/s, mean per-request tok/s or mean decode tok/s "
                            "(default: decode for a sweep file with headline: decode, else aggregate)")
        p.add_argument("--ttft-max", type=positive(MAX_DURATION_S * 1000), metavar="MS",
                       help="only configs whose median TTFT (mean over repeats) is at most MS count")
        p.add_argument("--slo", metavar="TERMS",
                       help="only configs whose 95%% interval meets this latency objective count, e.g. "
                            "'tpot_p90<=50ms,ttft_p90<=500ms' (default: the sweep file's slo:; --slo '' drops it); "
                            "the output adds the highest concurrency at which any config meets it")
        p.add_argument("--grid", action="store_true",
                       help="load every config of the space first (the full grid), then the same verdict rules: "
                            "reloads, tie-breaks, the K schedule measured (what scripts/bench_tune_vs_grid.py "
                            "compares tune with)")
        p.add_argument("--repeats", type=whole(1, 20), metavar="N",
                       help="runs per load of every measured config (default: the sweep's; auto_repeats.min for "
                            "repeats: auto; else 2)")
        p.add_argument("--max-repeats", type=whole(1, 60), metavar="N",
                       help="the budget per config and concurrency, in runs over all its loads: the best and its "
                            "runner-up are reloaded (ABBA) and a contender not told apart from the best is reloaded "
                            "with it until they are told apart or this runs out, then the smaller K wins a "
                            "tie-break (default: auto_repeats.max for repeats: auto, else 2 x --repeats, one reload "
                            "each)")
        p.add_argument("-n", "--requests", type=whole(1, MAX_REQUESTS), help="measured requests per cell (default 10)")
        p.add_argument("--max-tokens", type=whole(1, MAX_TOKENS), help="max_tokens per request (default: sweep's)")
        p.add_argument("--tolerance", type=positive(1.0), default=0.15, metavar="FRACTION",
                       help="a drafter whose measured acceptance length misses its prediction by this much is "
                            "measured, not predicted; in measured mode, K values within it of the best are tried "
                            "(default 0.15)")
        p.add_argument("--dry-run", action="store_true",
                       help="print the plan, the most model loads it can take and an ETA upper bound; start nothing")
        p.add_argument("--resume", metavar="RUN", help="continue this tune run (default: the newest unfinished one)")
        p.add_argument("--new", action="store_true", help="start a new run even if an earlier one can continue")
        p.add_argument("--runs-dir", type=Path, default=Path("runs"), help="where runs are kept (default ./runs)")
        p.add_argument("--pull", default="missing", choices=["missing", "always", "never"])
        p.add_argument("--ulimit", dest="ulimits", action="append", default=[], metavar="NAME=SOFT[:HARD]",
                       help="override a container ulimit for every server")
        p.add_argument("--no-download", dest="download", action="store_false",
                       help="do not fetch every model and draft into the Hugging Face cache first")
        host_option(p, "Docker host to spread the servers over, as a sweep file's hosts: (repeat; a server across "
                       "hosts needs one per node, the head first, each DOCKER_HOST[,cluster_address=IP][,…])")

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> TuneArgs:
        from sparklab.tune.driver import TuneChoices

        choices = TuneChoices(
            args.space, engine=args.engine, methods=tuple(args.methods or ()), k=tuple(args.k or ()),
            concurrency=tuple(args.concurrency or ()), workload=args.workload, objective=args.objective,
            ttft_max_ms=args.ttft_max, slo=args.slo, grid=args.grid, repeats=args.repeats,
            max_repeats=args.max_repeats, requests=args.requests,
            max_tokens=args.max_tokens, tolerance=args.tolerance, runs_dir=args.runs_dir, resume=args.resume,
            new=args.new, pull_policy=args.pull, ulimits=tuple(args.ulimits), download=args.download,
            hosts=tuple(args.hosts))
        return cls(choices, args.dry_run)


def cmd_tune(args: TuneArgs) -> int:
    from sparklab.cli.console import timestamped
    from sparklab.cli.tune_text import tune_summary
    from sparklab.tune import driver

    say = timestamped(err)
    request = driver.request_for(args.choices)
    if args.dry_run:
        from sparklab.cli.tune_text import tune_plan

        out.print(tune_plan(driver.dry_run(request)), markup=False)
        return 0
    outcome = driver.run_tune(request, say)
    if outcome.interrupted:
        say(f"interrupted; the same command continues {outcome.run_dir}")
        return 130
    out.print(tune_summary(built_report(outcome.run_dir / "results.sqlite"), outcome.state), markup=False)
    return 0 if outcome.state.get("picks") else 6
