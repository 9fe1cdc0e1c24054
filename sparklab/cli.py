"""Command line: parse → load → one call → print. The only place that catches SparklabError."""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from sparklab import __version__, launch, preflight
from sparklab.engines import engine as engine_adapter
from sparklab.errors import SparklabError
from sparklab.recipes import (
    MAX_CONCURRENCY,
    MAX_DURATION_S,
    MAX_REQUESTS,
    MAX_SPECULATIVE_TOKENS,
    MAX_TOKENS,
    MAX_WARMUP,
    list_recipes,
    load_recipe,
)
from sparklab.render import LaunchOptions, docker_command, serve_command

# Piped output keeps whole lines (rich would wrap tables at 80 columns) so it can be grepped.
_WIDTH = None if sys.stdout.isatty() or "COLUMNS" in os.environ else 200
out = Console(highlight=False, soft_wrap=True, width=_WIDTH)
err = Console(stderr=True, highlight=False, soft_wrap=True, width=_WIDTH)


def _default_hf_cache() -> Path:
    home = os.environ.get("HF_HOME")
    return Path(home).expanduser() if home else Path("~/.cache/huggingface").expanduser()


def _whole(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number from low to high, else a usage error now rather than a traceback later."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected a whole number from {low} to {high}, got {text}")
        return value
    return parse


def _positive(high: float) -> Callable[[str], float]:
    """An argparse type: a number above 0 and at most high (not nan or inf)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not 0 < value <= high:
            raise argparse.ArgumentTypeError(f"expected a number above 0 and at most {high:g}, got {text}")
        return value
    return parse


def _launch_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", metavar="RECIPE|METHOD",
                   help="a method of the target recipe (dspark), a recipe name (gb10-modelcard), "
                        "recipe:method, or a recipe file path")
    p.add_argument("-t", "--target", help="recipe to take METHOD from (default: gb10)")
    p.add_argument("--engine", help="engine of the recipe (vllm, sglang, …; default: the recipe's)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a recipe variable (max_model_len=32768), model=ID, or a dotted recipe path")
    p.add_argument("--image", help="run this image instead of the recipe's")
    p.add_argument("--port", type=_whole(1, 65535), help="serve on this port")
    p.add_argument("-k", "--num-speculative-tokens", type=_whole(1, MAX_SPECULATIVE_TOKENS), metavar="K",
                   help="speculative tokens per step")
    p.add_argument("--serve-arg", dest="extra_args", action="append", default=[], metavar="ARG",
                   help="append one argument to the serve command (repeat; use --serve-arg=--flag)")
    p.add_argument("-e", "--env", action="append", default=[], metavar="NAME[=VALUE]",
                   help="environment for the server; NAME alone passes the host's value (never printed)")
    p.add_argument("--hf-cache", type=Path, default=_default_hf_cache(),
                   help="Hugging Face cache to mount (default: $HF_HOME or ~/.cache/huggingface)")
    p.add_argument("--ulimit", dest="ulimits", action="append", default=[], metavar="NAME=SOFT[:HARD]",
                   help="override a container ulimit (the recipes ask memlock=-1, stack=67108864)")
    p.add_argument("--no-gpus", dest="gpus", action="store_false", default=None,
                   help="do not request GPUs (CPU images)")
    p.add_argument("--public", action="store_true",
                   help="listen on all interfaces instead of 127.0.0.1")
    p.add_argument("--no-api-key", dest="api_key", action="store_false",
                   help="do not protect the endpoint with a generated API key")
    p.add_argument("--ready-timeout", type=_positive(MAX_DURATION_S), metavar="SECONDS",
                   help="readiness deadline (default: the recipe's, 1800 s)")


def _options(args: argparse.Namespace, mode: str = "up") -> LaunchOptions:
    return LaunchOptions(
        image=args.image, port=args.port, num_speculative_tokens=args.num_speculative_tokens,
        public=args.public, api_key=args.api_key, hf_cache=args.hf_cache.expanduser(), gpus=args.gpus,
        extra_args=tuple(args.extra_args), env=tuple(args.env), ulimits=tuple(args.ulimits),
        run_id="" if mode == "render" else launch.new_run_id(),
        mode=mode, ready_timeout_s=args.ready_timeout)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sparklab", description="Benchmark LLM serving with speculative decoding on NVIDIA DGX Spark.")
    parser.add_argument("--version", action="version", version=f"sparklab {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("render", help="print the docker run and serve command a recipe gives")
    _launch_args(p)
    p.add_argument("--host-checks", action="store_true", help="also run the host preflight checks")
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("up", help="start a server from a recipe and wait until it is ready")
    _launch_args(p)
    p.add_argument("-d", "--detach", action="store_true", help="leave it running and return")
    p.add_argument("--pull", default="missing", choices=["missing", "always", "never"],
                   help="when to pull the image (default: missing)")
    p.add_argument("--api-key", dest="api_key_value", metavar="KEY",
                   help="use this API key instead of a generated one (or set SPARKLAB_API_KEY)")
    p.add_argument("--allow-foreign-platform", action="store_true",
                   help="run an image built for another CPU architecture (needs emulation)")
    p.add_argument("--dry-run", action="store_true", help="render and preflight only")
    p.add_argument("--no-download", dest="download", action="store_false",
                   help="do not fetch the model and drafts into the Hugging Face cache first (`sparklab pull`)")
    p.set_defaults(func=cmd_up)

    p = sub.add_parser("bench", help="benchmark an OpenAI-compatible endpoint (or a sparklab server)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--url", help="endpoint, e.g. http://127.0.0.1:8000/v1")
    where.add_argument("--container", metavar="NAME",
                       help="a running `sparklab up` server (default: the only one); its key is used")
    p.add_argument("--api-key", help="API key for --url (or set SPARKLAB_API_KEY)")
    p.add_argument("--model", help="model name (default: the first in /v1/models)")
    p.add_argument("-w", "--workload", default="seed", help="built-in workload or a JSONL file (default: seed)")
    p.add_argument("-c", "--concurrency", type=_whole(1, MAX_CONCURRENCY), default=1,
                   help="requests in flight (default 1)")
    amount = p.add_mutually_exclusive_group()
    amount.add_argument("-n", "--requests", type=_whole(1, MAX_REQUESTS), help="measured requests (default 10)")
    amount.add_argument("--duration", type=_positive(MAX_DURATION_S), metavar="SECONDS",
                        help="send requests for this long instead")
    p.add_argument("--rate", type=_positive(1e6), metavar="REQ_PER_S",
                   help="Poisson arrivals instead of a closed loop")
    p.add_argument("--warmup", type=_whole(0, MAX_WARMUP), default=2,
                   help="requests before the window, excluded (default 2)")
    p.add_argument("--max-tokens", type=_whole(1, MAX_TOKENS), default=2048)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--ignore-eos", action="store_true", help="generate max-tokens tokens (vLLM, SGLang)")
    p.add_argument("--min-tokens", type=_whole(1, MAX_TOKENS), help="at least this many tokens before EOS")
    p.add_argument("--thinking", choices=["on", "off", "default"], default="off",
                   help="chat_template_kwargs.enable_thinking (default off, as seed 000)")
    p.add_argument("--seed", type=int, help="sampling seed sent with each request")
    p.add_argument("--no-stream", dest="stream", action="store_false",
                   help="non-streaming requests: seed 000's bench.py exactly (no TTFT or ITL)")
    p.add_argument("--no-token-ids", dest="token_ids", action="store_false",
                   help="do not ask for per-chunk token ids (then tokens per chunk are estimated)")
    p.add_argument("--request-timeout", type=_positive(MAX_DURATION_S), default=1800, metavar="SECONDS")
    p.add_argument("--json", dest="json_path", type=Path, metavar="FILE", help="write the result here")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("sweep", help="run a sweep file: servers x loads, resumable, results in SQLite")
    p.add_argument("file", type=Path, help="a sweep file (recipes/sweeps/*.yaml)")
    p.add_argument("--dry-run", action="store_true", help="print the plan, the commands and an ETA; run nothing")
    p.add_argument("--resume", metavar="RUN", help="continue this run (a directory under --runs-dir)")
    p.add_argument("--new", action="store_true", help="start a new run even if an earlier one can continue")
    p.add_argument("--retry-failed", action="store_true", help="run cells that failed max_attempts times again")
    p.add_argument("--runs-dir", type=Path, default=Path("runs"), help="where runs are kept (default ./runs)")
    p.add_argument("--pull", default="missing", choices=["missing", "always", "never"])
    p.add_argument("--drop-caches", action="store_true",
                   help="drop the page cache before each server (root; GB10 unified memory)")
    p.add_argument("--ulimit", dest="ulimits", action="append", default=[], metavar="NAME=SOFT[:HARD]",
                   help="override a container ulimit for every server")
    p.add_argument("--no-download", dest="download", action="store_false",
                   help="do not fetch every model and draft into the Hugging Face cache before the first server")
    p.add_argument("--min-free-mib", type=float, default=256.0, metavar="MIB",
                   help="stop cleanly when the runs directory's disk has less free space before a server (256)")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("report", help="tables, plots, roofline and the best config from a sweep's results (offline)")
    p.add_argument("run", metavar="RUN",
                   help="a run id or sweep name (its newest run) under --runs-dir, a run directory or a results.sqlite")
    p.add_argument("--runs-dir", type=Path, default=Path("runs"), help="where runs are kept (default ./runs)")
    p.add_argument("-f", "--format", default="md", choices=["md", "csv", "json", "html"],
                   help="what to print on stdout (default md, paste-ready Markdown)")
    p.add_argument("-o", "--out", type=Path, metavar="DIR",
                   help="write report.md, .csv, .json, .html and plots/*.png here instead of printing")
    p.add_argument("--hardware", metavar="NAME", help="roofline for this device of recipes/hardware.yaml")
    p.add_argument("--bandwidth-gbps", type=float, metavar="GBPS", help="roofline with this memory bandwidth")
    p.add_argument("--fact", dest="facts", action="append", default=[], metavar="KEY=VALUE",
                   help="override a model fact for the roofline, e.g. --fact active_params_b=3 (repeatable)")
    p.set_defaults(func=cmd_report)

    from sparklab.pull import add_pull_parser

    add_pull_parser(sub)

    p = sub.add_parser("down", help="stop and remove sparklab servers")
    p.add_argument("name", nargs="?", help="container name (see `sparklab ps`)")
    p.add_argument("--all", action="store_true", help="every sparklab container you started")
    p.add_argument("--all-users", action="store_true", help="every sparklab container, other users' too")
    p.set_defaults(func=cmd_down)

    p = sub.add_parser("ps", help="list sparklab containers")
    p.set_defaults(func=cmd_ps)

    p = sub.add_parser("logs", help="print a server's log")
    p.add_argument("name", nargs="?", help="container name (default: the only one)")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    p.add_argument("--tail", default="all", help="only the last N lines")
    p.set_defaults(func=cmd_logs)

    p = sub.add_parser("gc", help="remove containers left behind by a crashed sparklab run")
    p.set_defaults(func=cmd_gc)

    p = sub.add_parser("recipes", help="list recipes, engines and methods")
    p.set_defaults(func=cmd_recipes)
    return parser


# ---------------------------------------------------------------------------------------------------


def cmd_render(args: argparse.Namespace) -> int:
    options = _options(args, mode="render")
    p = launch.prepare(args.spec, target=args.target, engine_name=args.engine, overrides=args.overrides,
                       options=options, check_host=args.host_checks)
    _print_warnings(p.warnings)
    spec = p.spec
    out.print(f"# {spec.recipe_path}: engine {spec.engine}, method {spec.method}")
    out.print(docker_command(spec), markup=False)
    out.print()
    out.print("# serve command inside the container:")
    out.print(serve_command(spec), markup=False)
    return 0


def _print_warnings(findings: list[preflight.Finding]) -> None:
    for f in findings:
        err.print("[yellow]warning:[/] " + escape(f.message + (f"\n  {f.hint}" if f.hint else "")), markup=True)


def cmd_up(args: argparse.Namespace) -> int:
    from sparklab.containers import Docker

    options = _options(args)
    p = launch.prepare(args.spec, target=args.target, engine_name=args.engine, overrides=args.overrides,
                       options=options, check_host=True)
    _print_warnings(p.warnings)
    spec = p.spec
    key_warning = engine_adapter(spec.kind).api_key_warning
    if spec.needs_api_key and key_warning:
        err.print("[yellow]warning:[/] " + escape(key_warning), markup=True)
    if args.dry_run:
        out.print(docker_command(spec), markup=False)
        out.print("dry run: preflight passed, nothing started.")
        return 0
    docker = Docker()
    for info in docker.gc():
        err.print(f"removed leftover container {info.name} (its sparklab process is gone)")
    if args.download:  # before the clock starts: a download never counts as time to ready
        from sparklab.progress import DownloadProgress
        from sparklab.pull import pull

        with DownloadProgress.to_stderr() as downloads:
            pull([(p.recipe, spec)], pull_image=None, on_progress=downloads.update, say=downloads.say)
    err.print(f"starting {spec.name}: {spec.recipe} / {spec.engine} / {spec.method} ({spec.image})")
    from sparklab.progress import PullProgress

    shown = len(p.warnings)
    with PullProgress(err) as pull_progress, err.status("waiting for the server…") as status:
        def on_wait(elapsed: float) -> None:
            status.update(f"waiting for {spec.endpoint}{spec.ready_path} ({elapsed:.0f} s)…")

        given_key = args.api_key_value or os.environ.get("SPARKLAB_API_KEY")
        ready = launch.start(p, docker, pull_policy=args.pull,
                             allow_foreign_platform=args.allow_foreign_platform, on_pull=pull_progress.update,
                             api_key=given_key, detach=args.detach, on_wait=on_wait)
    _print_warnings(p.warnings[shown:])
    with ready.server:
        _print_ready(ready, key_given=bool(given_key))
        if args.detach:
            ready.server.keep()
            out.print(f"left running (detached). Stop it with: sparklab down {ready.server.name}")
            return 0
        out.print("serving in the foreground: Ctrl-C stops and removes it.")
        try:
            launch.watch(ready.server)
        except KeyboardInterrupt:
            err.print("stopping…")
            seconds = ready.server.stop()
            err.print(f"stopped and removed {ready.server.name} in {seconds:.1f} s")
            return 0
    return 0


def _print_ready(ready: launch.Ready, key_given: bool = False) -> None:
    from sparklab.console import ready_summary

    out.print(ready_summary(ready, key_given))


def cmd_bench(args: argparse.Namespace) -> int:
    import json

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from sparklab import bench
    from sparklab.console import bench_result
    from sparklab.records import Sampling
    from sparklab.workloads import load_workload

    docker, target = None, None
    if args.url:
        endpoint = bench.Endpoint.from_url(args.url, args.api_key or os.environ.get("SPARKLAB_API_KEY"), args.model)
    else:
        from sparklab.containers import Docker

        docker = Docker()
        target = docker.endpoint_of(args.container)
        err.print(f"benchmarking {target.name} at {target.url}")
        endpoint = bench.Endpoint.from_url(target.url, target.api_key, args.model, target.kind)
    requests = args.requests if args.requests is not None or args.duration is not None else 10
    load = bench.Load(concurrency=args.concurrency, requests=requests, duration_s=args.duration,
                      rate=args.rate, warmup=args.warmup, stream=args.stream)
    thinking = {"on": True, "off": False, "default": None}[args.thinking]
    sampling = Sampling(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                        ignore_eos=args.ignore_eos, min_tokens=args.min_tokens, enable_thinking=thinking,
                        seed=args.seed, token_ids=args.token_ids)
    workload = load_workload(args.workload)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True) as progress:
        task = progress.add_task(f"{workload.name} c={load.concurrency}", total=load.requests)
        result = bench.run(endpoint, workload, sampling, load, on_done=lambda r: progress.advance(task),
                           request_timeout_s=args.request_timeout)
    if docker is not None and target is not None:  # a sparklab server: its log may say more (SGLang's lines)
        since = result["measurement"]["window_started_at"]
        bench.add_log_acceptance(result, endpoint.kind, lambda: docker.log_text(target.name, since=since))
    out.print(bench_result(result))
    if args.json_path:
        args.json_path.write_text(json.dumps(result, indent=1))
        out.print(f"result written to {args.json_path} (schema {result['schema']})")
    return 0 if result["summary"]["requests"]["ok"] else 5


def cmd_sweep(args: argparse.Namespace) -> int:
    import time

    from sparklab import sweep
    from sparklab.console import plan_table, sweep_table

    request = sweep.Request(args.file, args.runs_dir, args.resume, args.new, args.retry_failed, tuple(args.ulimits),
                            sweep.Options(args.pull, args.drop_caches, min_free_mib=args.min_free_mib),
                            download=args.download)
    if args.dry_run:
        out.print(plan_table(*sweep.dry_run(request)))
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
        outcome = sweep.sweep(request, say)
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


def _built_report(path: Path, overrides: Any = None) -> Any:
    from sparklab import report
    from sparklab.store import Store

    with Store.open(path, readonly=True) as store:
        return report.build(store, path.parent.name, overrides)


def cmd_report(args: argparse.Namespace) -> int:
    import tempfile

    from sparklab import report

    path, note = report.locate(args.run, args.runs_dir)
    if note:
        err.print(note, markup=False)
    built = _built_report(path, report.overrides_from(args.hardware, args.bandwidth_gbps, args.facts))
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


def cmd_down(args: argparse.Namespace) -> int:
    from sparklab.containers import Docker

    docker = Docker()
    containers = docker.containers()
    if args.all_users or args.all:
        targets = [c.name for c in containers if args.all_users or c.mine]
        others = len(containers) - len(targets)
        if others:
            err.print(f"left {others} container(s) of other users (or from before sparklab labelled users): "
                      "sparklab down --all-users removes them too", markup=False)
    elif args.name:
        targets = [args.name]
    else:
        running = [c.name for c in containers if c.labels.get("sparklab.mode") == "up" and c.mine]
        if len(running) != 1:
            names = ", ".join(running) or "none"
            raise SparklabError(f"say which server to stop (sparklab up containers: {names})",
                                "sparklab down NAME, or sparklab down --all")
        targets = running
    for name in targets:
        docker.remove(name)
        out.print(f"removed {name}")
    if not targets:
        out.print("no sparklab containers")
    return 0


def cmd_ps(args: argparse.Namespace) -> int:
    from sparklab.containers import Docker
    from sparklab.owners import created_age, owner_alive

    table = Table("NAME", "STATUS", "RECIPE", "ENGINE", "METHOD", "MODE", "ENDPOINT", "AGE", "OWNER")
    for c in Docker().containers():
        status = c.status + (f" ({c.exit_code})" if c.exit_code is not None else "")
        owner = "detached" if c.detached else (
            "running" if owner_alive(c.labels.get("sparklab.owner", "")) else "gone (gc removes it)")
        table.add_row(c.name, status, c.labels.get("sparklab.recipe", ""), c.labels.get("sparklab.engine", ""),
                      c.labels.get("sparklab.method", ""), c.labels.get("sparklab.mode", ""),
                      c.labels.get("sparklab.endpoint", ""), created_age(c.created), owner)
    out.print(table)
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    from sparklab.containers import Docker

    docker = Docker()
    name = args.name
    if not name:
        names = [c.name for c in docker.containers()]
        if len(names) != 1:
            raise SparklabError(f"say whose logs to show (sparklab containers: {', '.join(names) or 'none'})",
                                "sparklab logs NAME")
        name = names[0]
    tail: Any = int(args.tail) if str(args.tail).isdigit() else "all"
    for chunk in docker.logs(name, follow=args.follow, tail=tail):
        sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    from sparklab.containers import Docker

    removed = Docker().gc()
    for info in removed:
        out.print(f"removed {info.name} ({info.status}; its sparklab process is gone)")
    out.print(f"{len(removed)} leftover container(s) removed")
    return 0


def cmd_recipes(args: argparse.Namespace) -> int:
    table = Table("RECIPE", "ENGINE", "METHODS", "IMAGE")
    for column in table.columns:
        column.overflow = "fold"
    for path in list_recipes():
        recipe = load_recipe(path)
        for name, engine in recipe.engines.items():
            table.add_row(recipe.name, name, ", ".join(engine.methods), engine.image)
    out.print(table)
    return 0


# ---------------------------------------------------------------------------------------------------


def _sigterm_as_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        return int(args.func(args))
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
