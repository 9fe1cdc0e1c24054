"""`sparklab check RECIPE|SWEEP`: before a night's run, every server's exact command through its image's own parser,
and the engine version each image states, without starting a server (sparklab.runtimes.imagecheck)."""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

from sparklab.cli.args import positive
from sparklab.cli.terminal import err, out
from sparklab.recipes.schema import resolve
from sparklab.runtimes import imagecheck
from sparklab.runtimes.local import Runtime
from sparklab.runtimes.pull import servers_for, sweep_file


@dataclass(frozen=True)
class CheckArgs:
    spec: str  # a sweep (file or name), a recipe (every engine and method of it), or what `up` takes
    target: str | None
    engine: str | None
    overrides: list[str]
    pull: str  # images: pull when missing (default), always, or never
    cache: bool  # reuse verdicts kept per image digest and command
    timeout_s: float

    @classmethod
    def add_cli_args(cls, p: argparse.ArgumentParser) -> None:
        p.add_argument("spec", metavar="RECIPE|SWEEP",
                       help="a sweep (file or name: every server it starts), a recipe (name or file: every engine and "
                            "method), or recipe:method")
        p.add_argument("-t", "--target", help="recipe to take a bare METHOD from (default: gb10)")
        p.add_argument("--engine", help="only this engine of the recipe")
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override a recipe variable or key, as for `up`")
        p.add_argument("--pull", default="missing", choices=["missing", "always", "never"],
                       help="when to pull an image to check it (default: missing)")
        p.add_argument("--no-cache", dest="cache", action="store_false",
                       help="run every parser again instead of reusing verdicts kept per image digest and command")
        p.add_argument("--timeout", dest="timeout_s", type=positive(3600), default=imagecheck.TIMEOUT_S,
                       metavar="SECONDS", help=f"give up on one image's parser after this long "
                                               f"(default {imagecheck.TIMEOUT_S:.0f})")

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> CheckArgs:
        return cls(spec=args.spec, target=args.target, engine=args.engine, overrides=list(args.overrides),
                   pull=args.pull, cache=args.cache, timeout_s=args.timeout_s)


def cmd_check(args: CheckArgs, runtime: Runtime | None = None) -> int:
    """runtime: this machine's containers and host processes (a test's fake stands in for Docker)."""
    from sparklab.cli.console import check_table
    from sparklab.cli.progress import PullProgress

    sweep = sweep_file(args.spec)
    every_method = sweep is None and resolve(args.spec, args.target)[1] is None
    servers = servers_for(args.spec, target=args.target, engine=args.engine, overrides=args.overrides,
                          all_methods=every_method)
    specs = [spec for _, spec in servers]
    cache = imagecheck.Cache() if args.cache else _NoCache()
    started = time.monotonic()
    with PullProgress(err) as layers:
        checks = imagecheck.gather(specs, runtime or Runtime(), pull_policy=None if args.pull == "never" else args.pull,
                                   on_pull=layers.update, cache=cache, timeout_s=args.timeout_s, platform=True)
    out.print(check_table(checks))
    sources = (sweep,) if sweep else ()
    for checked in checks:
        if checked.verdict.status == imagecheck.REJECTED:
            out.print(imagecheck.refusal(checked, sources).message, markup=False, highlight=False)
    for line in imagecheck.summarize(checks):
        err.print(f"warning: {line}", markup=False, highlight=False)
    refused = sum(c.verdict.status == imagecheck.REJECTED for c in checks)
    unchecked = sum(c.verdict.status == imagecheck.NOT_CHECKED for c in checks)
    out.print(f"{len(checks)} server(s): {len(checks) - refused - unchecked} accepted, {refused} refused, "
              f"{unchecked} not checked; {time.monotonic() - started:.1f} s in all", markup=False)
    return 3 if refused else 6 if unchecked else 0


class _NoCache(imagecheck.Cache):
    """--no-cache: every parser runs again (its verdicts are still kept for the next check and start)."""

    def get(self, digest: str | None, spec: object) -> None:
        return None
