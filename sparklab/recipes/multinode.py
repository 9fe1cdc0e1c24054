"""One server across several Docker hosts, rendered the way the engines run it (pure).

A recipe engine with `nodes: N` (N > 1) and `cluster_port` serves one model from N hosts: rank 0, the head, runs
on the first host and serves HTTP; ranks 1.. join it on the head's cluster address and cluster_port. What each
node runs is the engine's own multi-node mode (sparklab.engines: `node_command`):

- vLLM with Ray: the head runs `ray start --head --port=PORT` and then `vllm serve … --tensor-parallel-size N
  --distributed-executor-backend ray`; the others run `ray start --address=HEAD:PORT --block`;
- SGLang: every node runs `launch_server … --nnodes N --node-rank R --dist-init-addr HEAD:PORT`.

The link between the Sparks is per host (sparklab.hosts: cluster_address, interface, ib_hca); the recipe's
templates see this node's as `node.*` and the head's as `head.*`, so its environment names each host's own
interface (they differ between Sparks: enp1s0f0np0 on one, enP2p1s0f1np1 on another).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparklab.engines import engine as engine_adapter
from sparklab.errors import RecipeError
from sparklab.recipes.hosts import Host
from sparklab.recipes.render import LaunchOptions, render
from sparklab.recipes.schema import Recipe
from sparklab.spec import API_KEY_PLACEHOLDER, LaunchSpec

_NODE_FIELD = re.compile(r"\b(?:node|head)\.(\w+)")
_FIELD_HINTS = {
    "address": "its IP on the link between the Sparks, e.g. cluster_address: 192.168.100.11",
    "interface": "the netdev on that link, e.g. interface: enp1s0f0np0 (`ibdev2netdev` lists them)",
    "ib_hca": "the RDMA device on that link, e.g. ib_hca: rocep1s0f0 (`ibdev2netdev` lists them)",
}


@dataclass(frozen=True)
class ClusterSpec:
    """The containers of one server across hosts, rank 0 (the head, which serves HTTP) first."""

    nodes: tuple[LaunchSpec, ...]
    hosts: tuple[Host, ...]
    cluster_port: int
    head_address: str  # where the other nodes reach the head

    @property
    def head(self) -> LaunchSpec:
        return self.nodes[0]


def nodes_of(recipe: Recipe, engine: str | None) -> int:
    return recipe.engine(engine)[1].nodes


def _node(host: Host, rank: int, where: str) -> dict[str, Any]:
    address = host.cluster_address or (host.address if not host.local else None)
    found = {"rank": rank, "address": address, "interface": host.interface, "ib_hca": host.ib_hca,
             "host": host.name}
    return {k: v for k, v in found.items() if v is not None}


def _needed(recipe: Recipe, engine: str, method: str) -> set[str]:
    spec = recipe.engines[engine]
    chosen = spec.methods[method]
    texts = [str(v) for v in (*spec.args, *spec.env.values(), *chosen.args, *chosen.env.values())]
    return {"address", *_NODE_FIELD.findall(" ".join(texts))}


def head_options(options: LaunchOptions, head: Host) -> LaunchOptions:
    """The head's options on its host: the controller reaches a remote head at its address, on every interface."""
    if head.local:
        return options
    return dataclasses.replace(options, address=head.address, public=options.public or head.remote_address,
                               hf_cache=Path(head.hf_cache) if head.hf_cache else options.hf_cache)


def require_hosts(recipe: Recipe, engine: str | None, given: int) -> None:
    """A server across N hosts needs its N hosts named before anything else is checked: this machine's port,
    memory and cache say nothing about a server that runs on other machines (issue 23)."""
    engine_name, spec = recipe.engine(engine)
    if spec.nodes > 1 and given < spec.nodes:
        raise RecipeError(f"{recipe.source}: engines.{engine_name}: nodes: {spec.nodes} needs {spec.nodes} Docker "
                          f"hosts, {given} given", _HOSTS_HINT)


_HOSTS_HINT = ("Name them in order, the head first: --host local --host ssh://me@spark-2 (or a sweep file's "
               "hosts:); each with its cluster_address (and interface, ib_hca) on the link between them.")


def render_cluster(recipe: Recipe, engine: str | None, method: str | None, options: LaunchOptions,
                   hosts: Sequence[Host]) -> ClusterSpec:
    """Every node's LaunchSpec, rank 0 on hosts[0]. `options` are the head's (its port, address, API key)."""
    engine_name, spec = recipe.engine(engine)
    method = method or (recipe.default_method if recipe.default_method in spec.methods else next(iter(spec.methods)))
    where = f"{recipe.source}: engines.{engine_name}"
    if spec.nodes < 2:
        raise RecipeError(f"{where}: serves from one host, yet {len(hosts)} hosts were given",
                          "Give one --host (or none), or use a recipe with nodes: 2.")
    if len(hosts) != spec.nodes:
        raise RecipeError(f"{where}: nodes: {spec.nodes} needs {spec.nodes} Docker hosts, {len(hosts)} given",
                          _HOSTS_HINT)
    assert spec.cluster_port is not None  # recipes.EngineSpec checks it
    nodes = [_node(h, rank, where) for rank, h in enumerate(hosts)]
    for name in sorted(_needed(recipe, engine_name, method or "")):
        for host, node in zip(hosts, nodes, strict=True):
            if name not in node and name in _FIELD_HINTS:
                key = "cluster_address" if name == "address" else name
                raise RecipeError(f"{where}: serving across hosts needs each host's {key}; host {host.name} has none",
                                  f"Give that host {_FIELD_HINTS[name]} (a hosts: entry key, or on the command "
                                  f"line --host DOCKER_HOST,{key}=VALUE).")
    adapter = engine_adapter(spec.kind)
    head_address = str(nodes[0]["address"])
    specs: list[LaunchSpec] = []
    for rank, (host, node) in enumerate(zip(hosts, nodes, strict=True)):
        node_options = options if rank == 0 else dataclasses.replace(
            options, hf_cache=Path(host.hf_cache) if host.hf_cache else options.hf_cache)
        context = {"node": node, "head": nodes[0], "nodes": spec.nodes, "cluster_port": spec.cluster_port}
        base = render(recipe, engine_name, method, node_options, node=context)
        try:
            entrypoint, argv = adapter.node_command(base.entrypoint, base.argv, rank, spec.nodes, head_address,
                                                    spec.cluster_port, str(node["address"]))
        except RecipeError as exc:
            exc.message = f"{where}: {exc.message}"
            raise
        labels = {**base.labels, "sparklab.cluster": base.name, "sparklab.node_rank": str(rank),
                  "sparklab.node_host": host.name}
        keyless = rank > 0 and API_KEY_PLACEHOLDER not in argv  # a Ray worker serves nothing: no key to hold
        secret_env = tuple(n for n in base.secret_env if not (keyless and n == base.api_key_env))
        specs.append(dataclasses.replace(
            base, entrypoint=entrypoint, argv=argv, labels=labels, secret_env=secret_env,
            needs_api_key=base.needs_api_key and not keyless, api_key_env=None if keyless else base.api_key_env,
            name=base.name if rank == 0 else f"{base.name[:112]}-node{rank}",
            recipe_argv_len=base.recipe_argv_len if rank == 0 else len(argv)))
    return ClusterSpec(tuple(specs), tuple(hosts), spec.cluster_port, head_address)
