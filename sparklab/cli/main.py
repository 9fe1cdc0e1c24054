"""Command line: parse → load → one call → print. The only place that catches SparklabError."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from sparklab.cli import cluster
from sparklab.cli.args import build_parser, launch_options
from sparklab.engines import engine as engine_adapter
from sparklab.errors import SparklabError
from sparklab.host import preflight
from sparklab.recipes import multinode
from sparklab.recipes.render import launch_command, serve_command
from sparklab.runtimes import launch

# Piped output keeps whole lines (rich would wrap tables at 80 columns) so it can be grepped.
_WIDTH = None if sys.stdout.isatty() or "COLUMNS" in os.environ else 200
out = Console(highlight=False, soft_wrap=True, width=_WIDTH)
err = Console(stderr=True, highlight=False, soft_wrap=True, width=_WIDTH)


def cmd_render(args: argparse.Namespace) -> int:
    options = launch_options(args, mode="render")
    p = launch.prepare(args.spec, target=args.target, engine_name=args.engine, overrides=args.overrides,
                       options=options, check_host=args.host_checks)
    _print_warnings(p.warnings)
    if args.hosts or multinode.nodes_of(p.recipe, p.spec.engine) > 1:  # one server across several hosts
        return cluster.cmd_render(args, p, options, out)
    spec = p.spec
    out.print(f"# {spec.recipe_path}: engine {spec.engine}, method {spec.method}")
    out.print(launch_command(spec), markup=False)
    if spec.runtime == "container":
        out.print()
        out.print("# serve command inside the container:")
        out.print(serve_command(spec), markup=False)
    return 0


def _print_warnings(findings: list[preflight.Finding]) -> None:
    for f in findings:
        err.print("[yellow]warning:[/] " + escape(f.message + (f"\n  {f.hint}" if f.hint else "")), markup=True)


def cmd_up(args: argparse.Namespace) -> int:
    from sparklab.runtimes.local import Runtime

    options = launch_options(args)
    p = launch.prepare(args.spec, target=args.target, engine_name=args.engine, overrides=args.overrides,
                       options=options, check_host=True)
    _print_warnings(p.warnings)
    spec = p.spec
    key_warning = engine_adapter(spec.kind).api_key_warning
    if spec.needs_api_key and key_warning:
        err.print("[yellow]warning:[/] " + escape(key_warning), markup=True)
    if args.hosts or multinode.nodes_of(p.recipe, p.spec.engine) > 1:
        return cluster.cmd_up(args, p, options, out, err)
    if args.dry_run:
        out.print(launch_command(spec), markup=False)
        out.print("dry run: preflight passed, nothing started.")
        return 0
    docker = Runtime()
    for info in docker.gc():
        err.print(f"removed leftover {info.noun} {info.name} (its sparklab process is gone)")
    if args.download:  # before the clock starts: a download never counts as time to ready
        from sparklab.cli.progress import DownloadProgress
        from sparklab.runtimes.pull import pull

        with DownloadProgress.to_stderr() as downloads:
            pull([(p.recipe, spec)], pull_image=None, on_progress=downloads.update, say=downloads.say)
    err.print(f"starting {spec.name}: {spec.recipe} / {spec.engine} / {spec.method} ({spec.image})")
    from sparklab.cli.progress import PullProgress

    shown = len(p.warnings)
    with PullProgress(err) as pull_progress, err.status("waiting for the server…") as status:
        def on_wait(elapsed: float) -> None:
            status.update(f"waiting for {spec.endpoint}{spec.ready_path} ({elapsed:.0f} s)…")

        given_key = args.api_key_value or os.environ.get("SPARKLAB_API_KEY")
        ready = launch.start(p, docker, pull_policy=args.pull,
                             allow_foreign_platform=args.allow_foreign_platform, on_pull=pull_progress.update,
                             api_key=given_key, detach=args.detach, on_wait=on_wait, stall_s=args.stall_timeout)
    _print_warnings(p.warnings[shown:])
    with ready.server:
        _print_ready(ready, key_given=bool(given_key))
        if args.detach:
            ready.server.keep()
            out.print(f"left running (detached). Stop it with: sparklab down {ready.server.name}")
            return 0
        try:  # the line is inside: a signal that comes while it is printed still stops the server cleanly
            out.print("serving in the foreground: Ctrl-C stops and removes it.")
            launch.watch(ready.server, ready.watch)
        except KeyboardInterrupt:
            err.print("stopping…")
            seconds = ready.server.stop()
            err.print(f"stopped and removed {ready.server.name} in {seconds:.1f} s")
            return 0
    return 0


def _print_ready(ready: launch.Ready, key_given: bool = False) -> None:
    from sparklab.cli.console import ready_summary

    out.print(ready_summary(ready, key_given))


def cmd_bench(args: argparse.Namespace) -> int:
    import json

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from sparklab.bench import cell
    from sparklab.bench.workloads import load_workload
    from sparklab.cli.console import bench_result
    from sparklab.records import Sampling

    docker, target = None, None
    if args.url:
        endpoint = cell.Endpoint.from_url(args.url, args.api_key or os.environ.get("SPARKLAB_API_KEY"), args.model)
    else:
        from sparklab.runtimes.local import Runtime

        docker = Runtime()
        target = docker.endpoint_of(args.container)
        err.print(f"benchmarking {target.name} at {target.url}")
        endpoint = cell.Endpoint.from_url(target.url, target.api_key, args.model, target.kind)
    requests = args.requests if args.requests is not None or args.duration is not None else 10
    load = cell.Load(concurrency=args.concurrency, requests=requests, duration_s=args.duration,
                      rate=args.rate, warmup=args.warmup, stream=args.stream)
    thinking = {"on": True, "off": False, "default": None}[args.thinking]
    sampling = Sampling(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                        ignore_eos=args.ignore_eos, min_tokens=args.min_tokens, enable_thinking=thinking,
                        seed=args.seed, token_ids=args.token_ids)
    workload = load_workload(args.workload)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True) as progress:
        task = progress.add_task(f"{workload.name} c={load.concurrency}", total=load.requests)
        result = cell.run(endpoint, workload, sampling, load, on_done=lambda r: progress.advance(task),
                           request_timeout_s=args.request_timeout, stall_timeout_s=args.stall_timeout)
    if docker is not None and target is not None:  # a sparklab server: its log may say more (SGLang's lines)
        since = result["measurement"]["window_started_at"]
        cell.add_log_acceptance(result, endpoint.kind, lambda: docker.log_text(target.name, since=since))
    out.print(bench_result(result))
    if args.json_path:
        args.json_path.write_text(json.dumps(result, indent=1))
        out.print(f"result written to {args.json_path} (schema {result['schema']})")
    return 0 if result["summary"]["requests"]["ok"] else 5


def cmd_sweep(args: argparse.Namespace) -> int:
    import time

    from sparklab.cli.console import plan_table, sweep_table
    from sparklab.sweep import runner

    request = runner.Request(args.file, args.runs_dir, args.resume, args.new, args.retry_failed, tuple(args.ulimits),
                            runner.Options(args.pull, args.drop_caches, min_free_mib=args.min_free_mib,
                                          memory_floor_gib=args.memory_floor_gib, allow_drift=args.allow_drift),
                            download=args.download, hosts=tuple(args.hosts))
    if args.dry_run:
        out.print(plan_table(*runner.dry_run(request)))
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
        say(f"interrupted; the server is down and the run can continue: sparklab sweep {args.file} "
            f"--resume {run.name} --runs-dir {args.runs_dir}")
        return 130
    out.print(sweep_table(_built_report(run / "results.sqlite")))
    out.print(f"results: {run / 'results.sqlite'} · {outcome.counts}")
    out.print(f"report (tables, intervals, roofline, plots): sparklab report {run.name} --runs-dir "
              f"{args.runs_dir} -o {run / 'report'}", markup=False)
    return 0 if outcome.complete else 6


def cmd_tune(args: argparse.Namespace) -> int:
    from sparklab.cli.console import timestamped, tune_summary
    from sparklab.tune import driver

    say = timestamped(err)
    request = driver.request_from_args(args)
    if args.dry_run:
        from sparklab.cli.console import tune_plan

        out.print(tune_plan(driver.dry_run(request)), markup=False)
        return 0
    outcome = driver.run_tune(request, say)
    if outcome.interrupted:
        say(f"interrupted; the same command continues {outcome.run_dir}")
        return 130
    out.print(tune_summary(_built_report(outcome.run_dir / "results.sqlite"), outcome.state), markup=False)
    return 0 if outcome.state.get("picks") else 6


def _built_report(path: Path, overrides: Any = None) -> Any:
    from sparklab import report
    from sparklab.sweep.store import Store

    with Store.open(path, readonly=True) as store:
        return report.build(store, path.parent.name, overrides)


def cmd_report(args: argparse.Namespace) -> int:
    import tempfile

    from sparklab import report

    path, note = report.locate(args.run, args.runs_dir)
    if args.out:
        report.check_out(args.out)  # before anything is read: a file there is never touched
    if note:
        err.print(note, markup=False)
    overrides = report.overrides_from(args.hardware, args.bandwidth_gbps, args.facts)
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


def _on_hosts(name: str) -> Callable[[argparse.Namespace], int]:
    """ps, down, logs and gc: every Docker host sparklab works with (sparklab.host_commands)."""

    def run(args: argparse.Namespace) -> int:
        from sparklab.cli import hosts as host_commands

        return int(getattr(host_commands, f"cmd_{name}")(args, out, err))

    return run


def cmd_recipes(args: argparse.Namespace) -> int:
    from sparklab.cli.console import recipes_table

    out.print(recipes_table())
    return 0


def cmd_pull(args: argparse.Namespace) -> int:
    from sparklab.cli import pull

    return pull.cmd_pull(args)


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "pull": cmd_pull,
    "render": cmd_render, "up": cmd_up, "bench": cmd_bench, "sweep": cmd_sweep, "tune": cmd_tune,
    "report": cmd_report,
    "down": _on_hosts("down"), "ps": _on_hosts("ps"), "logs": _on_hosts("logs"), "gc": _on_hosts("gc"),
    "recipes": cmd_recipes,
}


# ---------------------------------------------------------------------------------------------------


def _sigterm_as_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        return int(COMMANDS[args.command](args))
    except SparklabError as exc:
        if args.debug:
            raise
        err.print("[bold red]error:[/] " + escape(exc.message), markup=True)
        if exc.hint:
            err.print(exc.hint, markup=False)
        return exc.exit_code
    except KeyboardInterrupt:
        err.print("interrupted; everything sparklab started has been removed.")
        return 130
