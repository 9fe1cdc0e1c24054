"""`sparklab render` and `up` of one server across several Docker hosts (--host, the head first).

render prints every node's `docker run`, paste-ready from this machine (`docker -H URL run …` for another
host), in the order to start them; up starts them in that order (sparklab.cluster) and serves in the
foreground until Ctrl-C or until any node ends, tearing every node down on every host.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Protocol

from sparklab.cli.hosts import Console
from sparklab.errors import SparklabError
from sparklab.recipes import hosts, multinode
from sparklab.recipes.render import LaunchOptions, docker_command
from sparklab.runtimes import cluster, launch


class Across(Protocol):
    """What this half reads of `render`'s typed arguments (sparklab.cli.up.RenderArgs): the hosts."""

    @property
    def hosts(self) -> Sequence[str]: ...


class UpAcross(Across, Protocol):
    """What this half reads of `up`'s typed arguments (sparklab.cli.up.UpArgs)."""

    @property
    def dry_run(self) -> bool: ...
    @property
    def detach(self) -> bool: ...
    @property
    def api_key_value(self) -> str | None: ...
    @property
    def pull(self) -> str: ...
    @property
    def stall_timeout(self) -> float | None: ...


def across(args: Across, p: launch.Launch, options: LaunchOptions) -> multinode.ClusterSpec:
    chosen = hosts.parse_hosts(list(args.hosts), "--host")
    head = multinode.head_options(options, chosen[0]) if chosen else options
    return multinode.render_cluster(p.recipe, p.spec.engine, p.spec.method, head, chosen)


def commands(spec: multinode.ClusterSpec) -> list[str]:
    """Each node's paste-ready command, with a comment saying which and where, in start order."""
    out = []
    for rank, (node, host) in enumerate(zip(spec.nodes, spec.hosts, strict=True)):
        role = "head: serves HTTP" if rank == 0 else "worker"
        out.append(f"# node {rank} ({role}) on {host.name}\n"
                   + docker_command(node, docker_host=None if host.local else hosts.redact_url(host.docker)))
    return out


def cmd_render(args: Across, p: launch.Launch, options: LaunchOptions, out: Console) -> int:
    spec = across(args, p, options)
    out.print(f"# {p.spec.recipe_path}: engine {p.spec.engine}, method {p.spec.method}, across {len(spec.nodes)} "
              f"hosts; start the head first, the others once its cluster port {spec.head_address}:"
              f"{spec.cluster_port} answers", markup=False)
    for text in commands(spec):
        out.print()
        out.print(text, markup=False)
    return 0


def cmd_up(args: UpAcross, p: launch.Launch, options: LaunchOptions, out: Console, err: Console) -> int:
    from sparklab.cli.console import ready_summary
    from sparklab.cli.progress import PullProgress
    from sparklab.runtimes.containers import Docker

    spec = across(args, p, options)
    if args.dry_run:
        out.print("\n\n".join(commands(spec)), markup=False)
        out.print("dry run: preflight passed, nothing started.")
        return 0
    if args.detach:
        raise SparklabError("a server across hosts runs in the foreground (sparklab watches every node)",
                            "Leave out --detach; Ctrl-C stops it on every host.")
    dockers = [Docker.connect(h.docker, h.tls_dir) for h in spec.hosts]
    for host, docker in zip(spec.hosts, dockers, strict=True):
        for info in docker.gc():
            err.print(f"removed leftover container {info.name} on {host.name} (its sparklab process is gone)",
                      markup=False)
    head = spec.head
    err.print(f"starting {head.name} across {', '.join(h.name for h in spec.hosts)}: {head.recipe} / "
              f"{head.engine} / {head.method} ({head.image})", markup=False)
    given_key = args.api_key_value or os.environ.get("SPARKLAB_API_KEY")
    with PullProgress(err) as pull_progress:
        ready = cluster.start(p, spec, dockers, pull_policy=args.pull, on_pull=pull_progress.update,
                              api_key=given_key, stall_s=args.stall_timeout,
                              say=lambda message: err.print(message, markup=False))
    for finding in p.warnings:
        err.print(f"warning: {finding.message}", markup=False)
    with ready.server:
        out.print(ready_summary(ready, bool(given_key)))
        try:
            out.print(f"serving from {len(spec.nodes)} hosts in the foreground: Ctrl-C stops and removes every node.")
            launch.watch(ready.server, ready.watch)  # type: ignore[arg-type]  # a ClusterServer
        except KeyboardInterrupt:
            err.print("stopping…")
            seconds = ready.server.stop()
            err.print(f"stopped and removed {ready.server.name} and its other nodes in {seconds:.1f} s")
    return 0
