"""`sparklab render` and `up`: one server from a recipe, printed or started and served in the foreground.

Both take the same launch flags (`LaunchArgs`); a recipe with nodes > 1 or `--host` goes to sparklab.cli.cluster.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.markup import escape

from sparklab.cli import cluster
from sparklab.cli.args import default_hf_cache, host_option, positive, whole
from sparklab.cli.terminal import err, out
from sparklab.engines import engine as engine_adapter
from sparklab.engines.api import EngineAPI
from sparklab.errors import ServerError, SparklabError
from sparklab.host import preflight, watchdog
from sparklab.recipes import multinode
from sparklab.recipes.render import LaunchOptions, launch_command, serve_command
from sparklab.recipes.schema import MAX_DURATION_S, MAX_SPECULATIVE_TOKENS
from sparklab.runtimes import launch
from sparklab.runtimes.base import Runtime
from sparklab.sweep import rundir

ACROSS = ("serve across these Docker hosts, the head first (a recipe with nodes: 2); each as "
          "DOCKER_HOST[,cluster_address=IP][,interface=IFACE][,ib_hca=HCA]")


@dataclass(frozen=True)
class LaunchArgs:
    """The flags render and up share: which server (a method, recipe or file; its engine and overrides), on which
    hosts, and the launch choices that override the recipe's."""

    spec: str
    target: str | None
    engine: str | None
    overrides: list[str]  # KEY=VALUE, as launch.prepare takes them
    hosts: tuple[str, ...]
    image: str | None
    port: int | None
    num_speculative_tokens: int | None
    extra_args: tuple[str, ...]
    env: tuple[str, ...]
    hf_cache: Path
    ulimits: tuple[str, ...]
    gpus: bool | None
    public: bool
    api_key: bool  # protect the endpoint with a generated key (--no-api-key: False)
    ready_timeout: float | None

    @staticmethod
    def add_launch_flags(p: argparse.ArgumentParser) -> None:
        p.add_argument("spec", metavar="RECIPE|METHOD",
                       help="a method of the target recipe (dspark), a recipe name (gb10-modelcard), "
                            "recipe:method, or a recipe file path")
        p.add_argument("-t", "--target", help="recipe to take METHOD from (default: gb10)")
        p.add_argument("--engine", help="engine of the recipe (vllm, sglang, …; default: the recipe's)")
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override a recipe variable (max_model_len=32768), model=ID, or a dotted recipe path")
        p.add_argument("--image", help="run this image instead of the recipe's")
        p.add_argument("--port", type=whole(1, 65535), help="serve on this port")
        p.add_argument("-k", "--num-speculative-tokens", type=whole(1, MAX_SPECULATIVE_TOKENS), metavar="K",
                       help="speculative tokens per step")
        p.add_argument("--serve-arg", dest="extra_args", action="append", default=[], metavar="ARG",
                       help="append one argument to the serve command (repeat; use --serve-arg=--flag)")
        p.add_argument("-e", "--env", action="append", default=[], metavar="NAME[=VALUE]",
                       help="environment for the server; NAME alone passes the host's value (never printed)")
        p.add_argument("--hf-cache", type=Path, default=default_hf_cache(),
                       help="Hugging Face cache to mount (default: $HF_HOME or ~/.cache/huggingface)")
        p.add_argument("--ulimit", dest="ulimits", action="append", default=[], metavar="NAME=SOFT[:HARD]",
                       help="override a container ulimit (the recipes ask memlock=-1, stack=67108864)")
        p.add_argument("--no-gpus", dest="gpus", action="store_false", default=None,
                       help="do not request GPUs (CPU images)")
        p.add_argument("--public", action="store_true",
                       help="listen on all interfaces instead of 127.0.0.1")
        p.add_argument("--no-api-key", dest="api_key", action="store_false",
                       help="do not protect the endpoint with a generated API key")
        p.add_argument("--ready-timeout", type=positive(MAX_DURATION_S), metavar="SECONDS",
                       help="readiness deadline (default: the recipe's, 1800 s)")
        host_option(p, ACROSS)

    @staticmethod
    def launch_fields(args: argparse.Namespace) -> dict[str, Any]:
        return {"spec": args.spec, "target": args.target, "engine": args.engine, "overrides": list(args.overrides),
                "hosts": tuple(args.hosts), "image": args.image, "port": args.port,
                "num_speculative_tokens": args.num_speculative_tokens, "extra_args": tuple(args.extra_args),
                "env": tuple(args.env), "hf_cache": args.hf_cache, "ulimits": tuple(args.ulimits),
                "gpus": args.gpus, "public": args.public, "api_key": args.api_key,
                "ready_timeout": args.ready_timeout}


@dataclass(frozen=True)
class RenderArgs(LaunchArgs):
    host_checks: bool

    @classmethod
    def add_cli_args(cls, p: argparse.ArgumentParser) -> None:
        cls.add_launch_flags(p)
        p.add_argument("--host-checks", action="store_true", help="also run the host preflight checks")

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> RenderArgs:
        return cls(**cls.launch_fields(args), host_checks=args.host_checks)


@dataclass(frozen=True)
class UpArgs(LaunchArgs):
    detach: bool
    pull: str  # when to pull the image: missing, always, never
    api_key_value: str | None  # --api-key KEY: this key instead of a generated one
    allow_foreign_platform: bool
    dry_run: bool
    download: bool
    stall_timeout: float | None
    memory_floor_gib: float | None  # None: the default floor (8 GiB on unified-memory recipes); 0: off

    @classmethod
    def add_cli_args(cls, p: argparse.ArgumentParser) -> None:
        cls.add_launch_flags(p)
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
        p.add_argument("--stall-timeout", type=positive(MAX_DURATION_S), metavar="SECONDS",
                       help="fail when the engine prints nothing for this long while loading (default: off); "
                            "in the foreground, also stop it when it prints nothing and answers no health check "
                            f"for this long while serving (default {launch.SERVING_STALL_S:.0f})")
        p.add_argument("--memory-floor-gib", type=float, metavar="GIB",
                       help="stop the server when this machine's MemAvailable falls under this while it loads or "
                            "serves in the foreground (default: 8 on unified-memory recipes; 0: off)")

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> UpArgs:
        return cls(**cls.launch_fields(args), detach=args.detach, pull=args.pull, api_key_value=args.api_key_value,
                   allow_foreign_platform=args.allow_foreign_platform, dry_run=args.dry_run, download=args.download,
                   stall_timeout=args.stall_timeout, memory_floor_gib=args.memory_floor_gib)


def launch_options(args: LaunchArgs, mode: str = "up") -> LaunchOptions:
    """The launch flags of `render` and `up` as render's options (a fresh run id for each server `up` starts)."""
    return LaunchOptions(
        image=args.image, port=args.port, num_speculative_tokens=args.num_speculative_tokens,
        public=args.public, api_key=args.api_key, hf_cache=args.hf_cache.expanduser(), gpus=args.gpus,
        extra_args=args.extra_args, env=args.env, ulimits=args.ulimits,
        run_id="" if mode == "render" else rundir.new_run_id(),
        mode=mode, ready_timeout_s=args.ready_timeout)


def cmd_render(args: RenderArgs) -> int:
    options = launch_options(args, mode="render")
    p = launch.prepare(args.spec, target=args.target, engine_name=args.engine, overrides=args.overrides,
                       options=options, check_host=args.host_checks, hosts_given=len(args.hosts))
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


def cmd_up(args: UpArgs) -> int:
    """One server here, or one across several Docker hosts (--host, or a recipe with nodes > 1): one path from the
    preflight to the Ctrl-C stop; only the start differs (launch.start or cluster.start, both a launch.Ready)."""
    from sparklab.cli.hosts import connect_every
    from sparklab.cli.progress import PullProgress
    from sparklab.recipes.hosts import LOCAL
    from sparklab.runtimes import cluster as runtimes_cluster
    from sparklab.runtimes.base import HostRuntime
    from sparklab.runtimes.local import Runtime as LocalRuntime

    options = launch_options(args)
    p = launch.prepare(args.spec, target=args.target, engine_name=args.engine, overrides=args.overrides,
                       options=options, check_host=True, hosts_given=len(args.hosts))
    _print_warnings(p.warnings)
    spec = p.spec
    key_warning = engine_adapter(spec.kind).api_key_warning
    if spec.needs_api_key and key_warning:
        err.print("[yellow]warning:[/] " + escape(key_warning), markup=True)
    nodes = cluster.across(args, p, options) if args.hosts or multinode.nodes_of(p.recipe, spec.engine) > 1 else None
    if args.dry_run:
        if nodes is None:
            out.print(launch_command(spec), markup=False)
            dry_parser_check([p.spec])
        else:
            out.print("\n\n".join(cluster.commands(nodes)), markup=False)
        out.print("dry run: preflight passed, nothing started.")
        return 0
    if nodes is not None and args.detach:
        raise SparklabError("a server across hosts runs in the foreground (sparklab watches every node)",
                            "Leave out --detach; Ctrl-C stops it on every host.")
    hosts = [LOCAL] if nodes is None else nodes.hosts
    runtimes: list[HostRuntime] = [LocalRuntime()] if nodes is None else list(connect_every(list(hosts)))
    for host, runtime in zip(hosts, runtimes, strict=True):
        where = "" if nodes is None else f" on {host.name}"
        for info in runtime.gc():
            err.print(f"removed leftover {info.noun} {info.name}{where} (its sparklab process is gone)", markup=False)
    if args.download and nodes is None:  # before the clock starts: a download never counts as time to ready
        from sparklab.cli.progress import DownloadProgress
        from sparklab.runtimes.pull import pull

        with DownloadProgress.to_stderr() as downloads:  # this machine's cache (other hosts read their own)
            pull([(p.recipe, spec)], pull_image=None, on_progress=downloads.update, say=downloads.say)
    across = "" if nodes is None else f" across {', '.join(h.name for h in hosts)}"
    err.print(f"starting {spec.name}{across}: {spec.recipe} / {spec.engine} / {spec.method} ({spec.image})",
              markup=False)
    shown = len(p.warnings)
    given_key = args.api_key_value or os.environ.get("SPARKLAB_API_KEY")
    memory = _memory_watch(args, p, runtimes[0]) if nodes is None else None  # this machine's memory: its own server
    with memory or contextlib.nullcontext(), contextlib.ExitStack() as owned:
        try:
            with PullProgress(err) as pull_progress, err.status("waiting for the server…") as status:
                def on_wait(elapsed: float) -> None:
                    status.update(f"waiting for {spec.endpoint}{spec.ready_path} ({elapsed:.0f} s)…")

                if nodes is None:
                    ready = launch.start(p, runtimes[0], pull_policy=args.pull,
                                         allow_foreign_platform=args.allow_foreign_platform,
                                         on_pull=pull_progress.update, api_key=given_key, detach=args.detach,
                                         on_wait=on_wait, stall_s=args.stall_timeout)
                else:
                    ready = runtimes_cluster.start(p, nodes, runtimes, pull_policy=args.pull,
                                                   on_pull=pull_progress.update, api_key=given_key, on_wait=on_wait,
                                                   stall_s=args.stall_timeout,
                                                   say=lambda message: err.print(message, markup=False))
                # owned at once: a Ctrl-C while the displays close or the warnings print stops it too
                owned.enter_context(ready.server)
        except ServerError:
            if memory is not None and memory.tripped is not None:  # the floor stopped it while it loaded
                raise launch.floor_error(memory) from None
            raise
        _print_warnings(p.warnings[shown:])
        return _serve(ready, args, len(hosts), memory, key_given=bool(given_key))


def _memory_watch(args: UpArgs, p: launch.Launch, runtime: Runtime) -> watchdog.Sampler:
    """This machine's memory while the server loads and serves, and its floor (as a sweep's: --memory-floor-gib,
    else 8 GiB on unified-memory recipes): under it the server is killed before the machine wedges."""
    name = p.spec.name
    return watchdog.Sampler(floor_gib=watchdog.floor_for(p.recipe, args.memory_floor_gib),
                            locate=lambda: runtime.container_id(name), on_floor=lambda: runtime.kill(name))


def _serve(ready: launch.Ready, args: UpArgs, hosts: int, memory: watchdog.Sampler | None, key_given: bool) -> int:
    """Report the ready server; then leave it (--detach) or serve in the foreground, watched as a sweep watches its
    servers (it exits, its engine logs a fatal line or goes silent, the memory floor), until Ctrl-C, SIGTERM or a
    hangup stops and removes it. The caller owns the server (its context ends it unless kept)."""
    if memory is not None and memory.tripped is not None:  # before the server existed: nothing was killed yet
        ready.server.stop(0)
        raise launch.floor_error(memory)
    disagree = launch.read_served_version(ready, EngineAPI(ready.server.spec.endpoint, ready.api_key))
    if disagree:
        err.print("[yellow]warning:[/] " + escape(disagree), markup=True)
    _print_ready(ready, key_given=key_given)
    if args.detach:
        ready.server.keep()
        out.print(f"left running (detached). Stop it with: sparklab down {ready.server.name}")
        return 0
    try:  # the line is inside: a signal that comes while it is printed still stops the server cleanly
        out.print("serving in the foreground: Ctrl-C stops and removes it." if hosts == 1 else
                  f"serving from {hosts} hosts in the foreground: Ctrl-C stops and removes every node.")
        launch.watch(ready.server, ready.watch, memory=memory,
                     stall_s=args.stall_timeout or launch.SERVING_STALL_S,
                     api=EngineAPI(ready.server.spec.endpoint, ready.api_key))
    except KeyboardInterrupt:
        err.print("stopping…")
        seconds = ready.server.stop()
        others = "" if hosts == 1 else " and its other nodes"
        err.print(f"stopped and removed {ready.server.name}{others} in {seconds:.1f} s")
        return 0
    return 0


def dry_parser_check(specs: list[Any], sources: tuple[Path, ...] = ()) -> None:
    """--dry-run: each command through its image's own parser, where the image is already here (a dry run pulls
    nothing; the verdict is kept for the start). A refusal is the dry run's error; what could not run, a warning."""
    from sparklab.cli.console import check_table
    from sparklab.runtimes import imagecheck
    from sparklab.runtimes.local import Runtime

    checks = imagecheck.gather(specs, Runtime(), pull_policy=None)
    out.print(check_table(checks))
    _print_warnings([preflight.Finding("warning", w) for w in imagecheck.summarize(checks)])
    refused = [c for c in checks if c.verdict.status == imagecheck.REJECTED]
    if refused:
        error = imagecheck.refusal(refused[0], sources)
        error.message = "\n".join(imagecheck.refusal(c, sources).message for c in refused)
        raise error


def _print_ready(ready: launch.Ready, key_given: bool = False) -> None:
    from sparklab.cli.console import ready_summary

    out.print(ready_summary(ready, key_given))
