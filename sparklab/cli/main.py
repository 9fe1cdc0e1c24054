"""Command line: parse → a typed request → one call → print. The only place that catches SparklabError.

`COMMANDS` is the command line at a glance: each command's name and help, the typed arguments its flags become
and the function that runs them, one file per command group. A command's `XArgs` writes its flags
(`add_cli_args`) and reads them back (`from_cli_args`), as vLLM's benchmarks/sweep does, so argparse stops in
this package: the library takes typed requests.
"""

from __future__ import annotations

import argparse
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from rich.markup import escape

from sparklab import __version__
from sparklab.cli import bench, check, compare, hosts, pull, recipes, rehearse, report, sweep, up
from sparklab.cli.terminal import err, out
from sparklab.errors import SparklabError

A = TypeVar("A")
A_co = TypeVar("A_co", covariant=True)


class ArgsType(Protocol[A_co]):
    """A command's typed arguments, as a class: it writes its flags into a parser and reads a parse back."""

    def add_cli_args(self, parser: argparse.ArgumentParser) -> None: ...
    def from_cli_args(self, args: argparse.Namespace) -> A_co: ...


@dataclass(frozen=True)
class Command(Generic[A]):
    help: str
    args: ArgsType[A]
    run: Callable[[A], int]


def _printing(run: Callable[[A, hosts.Console, hosts.Console], int]) -> Callable[[A], int]:
    """ps, down, logs and gc print through the consoles they are given (sparklab.cli.hosts)."""
    return lambda args: run(args, out, err)


COMMANDS: dict[str, Command[Any]] = {  # in the order `sparklab --help` lists them
    "render": Command("print the docker run and serve command a recipe gives", up.RenderArgs, up.cmd_render),
    "up": Command("start a server from a recipe and wait until it is ready", up.UpArgs, up.cmd_up),
    "bench": Command("benchmark an OpenAI-compatible endpoint (or a sparklab server)",
                     bench.BenchArgs, bench.cmd_bench),
    "sweep": Command("run a sweep file: servers x loads, resumable, results in SQLite",
                     sweep.SweepArgs, sweep.cmd_sweep),
    "tune": Command("the best method and K per concurrency, loading as few servers as it can",
                    sweep.TuneArgs, sweep.cmd_tune),
    "rehearse": Command("run a sweep, tune or up against a DGX Spark twin in minutes: what the real night would do",
                        rehearse.RehearseArgs, rehearse.cmd_rehearse),
    "report": Command("tables, plots, roofline and the best config from a sweep's results (offline)",
                      report.ReportArgs, report.cmd_report),
    "compare": Command("several runs side by side: matched cells, each run against its own none, and what differs "
                       "between them (offline)", compare.CompareArgs, compare.cmd_compare),
    "pull": Command("fetch the images and every model and draft a recipe, method or sweep needs",
                    pull.PullArgs, pull.cmd_pull),
    "check": Command("run each server's command through its image's own parser and read the engine versions",
                     check.CheckArgs, check.cmd_check),
    "down": Command("stop and remove sparklab servers", hosts.DownArgs, _printing(hosts.cmd_down)),
    "ps": Command("list sparklab containers", hosts.PsArgs, _printing(hosts.cmd_ps)),
    "logs": Command("print a server's log", hosts.LogsArgs, _printing(hosts.cmd_logs)),
    "gc": Command("remove containers left behind by a crashed sparklab run; --caches: engine caches",
                  hosts.GcArgs, _printing(hosts.cmd_gc)),
    "recipes": Command("list recipes, engines and methods", recipes.RecipesArgs, recipes.cmd_recipes),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sparklab", description="Benchmark LLM serving with speculative decoding on NVIDIA DGX Spark.")
    parser.add_argument("--version", action="version", version=f"sparklab {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in COMMANDS.items():
        command.args.add_cli_args(sub.add_parser(name, help=command.help))
    return parser


def _as_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, _as_interrupt)
    # A hangup (the terminal or ssh session gone) tears down as SIGTERM does; under nohup it is not for this run.
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        signal.signal(signal.SIGHUP, _as_interrupt)
    command = COMMANDS[args.command]
    try:
        return int(command.run(command.args.from_cli_args(args)))
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
