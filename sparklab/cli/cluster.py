"""`sparklab render` and `up` of one server across several Docker hosts (--host, the head first).

render prints every node's `docker run`, paste-ready from this machine (`docker -H URL run …` for another
host), in the order to start them; up (cli.up.cmd_up, the one path of every `up`) starts them in that order
(runtimes.cluster) and serves in the foreground until Ctrl-C or until any node ends, tearing every node down on
every host.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from sparklab.cli.hosts import Console
from sparklab.recipes import hosts, multinode
from sparklab.recipes.render import LaunchOptions, docker_command
from sparklab.runtimes import launch


class Across(Protocol):
    """What this half reads of `render`'s typed arguments (sparklab.cli.up.RenderArgs): the hosts."""

    @property
    def hosts(self) -> Sequence[str]: ...


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
