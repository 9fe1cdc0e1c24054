"""Sweep files → a plan: server configs (outer loop) x loads (inner loop), pure and deterministic.

Server axes (engine, method, num_speculative_tokens, recipe overrides) restart the server; load axes
(concurrency, workload, repeat) reuse it. Every server config and cell gets a stable id (a hash of what
defines it), so a sweep run again finds the cells it already finished.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparklab.bench.prompts import Workload
from sparklab.bench.workloads import load_workload
from sparklab.engines import engine as engine_adapter
from sparklab.errors import RecipeError
from sparklab.recipes.multinode import ClusterSpec
from sparklab.recipes.render import LaunchOptions, render
from sparklab.recipes.schema import Recipe, load_recipe, recipes_dir
from sparklab.recipes.sweep_file import SweepFile, load_sweep
from sparklab.spec import LaunchSpec


def _hash(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Cell:
    id: str
    concurrency: int
    workload: str
    repeat: int
    requests: int | None
    sampling: dict[str, Any] = field(default_factory=dict)  # this load's concrete sampling (SamplingSpec.variants)


@dataclass(frozen=True)
class ServerConfig:
    id: str
    engine: str
    method: str
    num_speculative_tokens: int | None
    overrides: tuple[str, ...]
    serve_args: tuple[str, ...]
    spec: LaunchSpec
    recipe: Recipe
    cells: tuple[Cell, ...] = field(default_factory=tuple)
    options: LaunchOptions | None = None  # what rendered spec; another host renders it again with its own port
    cluster: ClusterSpec | None = None  # a server across hosts, once its hosts are chosen (spec: its head)


    @property
    def label(self) -> str:
        k = f" K={self.num_speculative_tokens}" if self.num_speculative_tokens is not None else ""
        return f"{self.engine}/{self.method}{k}"


@dataclass(frozen=True)
class Plan:
    sweep: SweepFile
    source: str
    servers: tuple[ServerConfig, ...]

    @property
    def cells(self) -> list[Cell]:
        return [cell for server in self.servers for cell in server.cells]


def recipe_file(sweep: SweepFile, source: Path) -> Path:
    """The recipe file a sweep file names (a path beside the sweep file, or a recipe under recipes/)."""
    candidate = Path(sweep.recipe)
    if candidate.suffix in (".yaml", ".yml"):
        return candidate if candidate.is_absolute() else (source.parent / candidate)
    return recipes_dir() / f"{sweep.recipe}.yaml"


def _speculative(recipe: Recipe, engine: str, method: str) -> bool:
    """Whether the method's flags use K at all (a baseline does not: one server, not one per K)."""
    args = recipe.engines[engine].methods[method].args
    return any("num_speculative_tokens" in str(a) for a in args)


def _check_workloads(sweep: SweepFile, src: str) -> list[Workload]:
    """Every workload loads now, before any server starts (not after a model has loaded for its first cell)."""
    loaded = []
    for i, workload in enumerate(sweep.workloads):
        try:
            loaded.append(load_workload(workload))
        except RecipeError as exc:
            raise RecipeError(f"{src}: workloads[{i}]: {exc.message}", exc.hint) from None
    return loaded


def _check_requests(sweep: SweepFile, src: str, servers: list[ServerConfig], loaded: list[Workload]) -> None:
    """Every prompt a server's cells send is one its engine can answer with that server's settings (the adapter's
    request_conflict), checked now: a refused request fails its cell on every such server, after its model load."""
    for server in servers:
        adapter = engine_adapter(server.recipe.engines[server.engine].kind)
        sent = {cell.workload for cell in server.cells}
        for i, (name, workload) in enumerate(zip(sweep.workloads, loaded, strict=True)):
            if name not in sent:
                continue
            for prompt in workload.prompts:
                reason = adapter.request_conflict(server.spec.argv, prompt.extra or {})
                if reason is None:
                    continue
                raise RecipeError(
                    f"{src}: workloads[{i}]: {name!r}: prompt {prompt.id!r} cannot run on engine {server.engine}'s "
                    f"method {server.method}: {reason}.",
                    f"Leave the pair out with exclude: [{{engine: {server.engine}, method: {server.method}, "
                    f"workload: {name}}}] (the other methods still run it), or drop the workload.")


def build_plan(path: Path, run_id: str = "plan", ulimits: tuple[str, ...] = ()) -> Plan:
    sweep = load_sweep(path)
    src = str(path)
    auto = sweep.auto_repeats
    if sweep.repeats == "auto" and auto.min > auto.max:
        raise RecipeError(f"{src}: auto_repeats: min {auto.min} is more than max {auto.max}",
                          "Give auto_repeats.min <= auto_repeats.max.")
    loaded = _check_workloads(sweep, src)
    recipe_path = recipe_file(sweep, path)
    base = load_recipe(recipe_path, list(sweep.set), f"{src}: set:")
    engines = sweep.engines or [base.default_engine]
    servers: list[ServerConfig] = []
    for i, engine in enumerate(engines):
        if engine not in base.engines:
            raise RecipeError(f"{src}: engines[{i}]: {engine!r} is not an engine of {recipe_path}",
                              f"Use one of: {', '.join(base.engines)}.")
        for j, method in enumerate(sweep.methods):
            if method not in base.engines[engine].methods:
                if any(m.matches({"engine": engine, "method": method}) for m in sweep.exclude):
                    continue  # excluded for this engine, as the hint below suggests
                raise RecipeError(f"{src}: methods[{j}]: engine {engine!r} of {recipe_path} has no method {method!r}",
                                  f"Its methods: {', '.join(base.engines[engine].methods)}; or exclude the "
                                  f"combination under exclude: [{{engine: {engine}, method: {method}}}].")
            ks = sweep.num_speculative_tokens if _speculative(base, engine, method) else [None]
            for k in ks:
                axes = {"engine": engine, "method": method, "num_speculative_tokens": k}
                if any(m.matches(axes) for m in sweep.exclude):
                    continue
                servers.append(_server(sweep, src, recipe_path, engine, method, k, axes, run_id, ulimits))
    if not servers:
        raise RecipeError(f"{src}: the matrix is empty after exclusions", "Check exclude:.")
    _check_requests(sweep, src, servers, loaded)
    return Plan(sweep, src, tuple(servers))


def variant(plan: Plan, server: ServerConfig, extra_serve_args: tuple[str, ...], run_id: str = "plan",
            ulimits: tuple[str, ...] = ()) -> ServerConfig:
    """The server config with more serve arguments (its own id and cells), e.g. the K schedule `sparklab tune`
    measures before it recommends it: the same sweep file, recipe, overrides and loads."""
    axes = {"engine": server.engine, "method": server.method, "num_speculative_tokens": server.num_speculative_tokens}
    return _server(plan.sweep, plan.source, recipe_file(plan.sweep, Path(plan.source)), server.engine,
                   server.method, server.num_speculative_tokens, axes, run_id, ulimits, extra_serve_args)


def _server(sweep: SweepFile, src: str, recipe_path: Path, engine: str, method: str, k: int | None,
            axes: dict[str, Any], run_id: str, ulimits: tuple[str, ...],
            extra_serve_args: tuple[str, ...] = ()) -> ServerConfig:
    chosen = [o for o in sweep.overrides if o.match.matches(axes)]
    overrides = tuple(sweep.set) + tuple(s for o in chosen for s in o.set)
    serve_args = tuple(a for o in chosen for a in o.serve_args) + extra_serve_args
    recipe = load_recipe(recipe_path, list(overrides), f"{src}: set: or overrides: set:")
    env = engine_adapter(recipe.engines[engine].kind).sweep_env()
    options = LaunchOptions(num_speculative_tokens=k, extra_args=serve_args, run_id=run_id, mode="sweep", env=env,
                            ulimits=ulimits)
    spec = render(recipe, engine, method, options)
    server_id = _hash({"recipe": recipe.name, "engine": engine, "method": method, "k": k,
                       "argv": list(spec.argv[: spec.recipe_argv_len]) + list(serve_args), "image": spec.image})
    cells = []
    for concurrency, workload, sampling, repeat in itertools.product(sweep.concurrency, sweep.workloads,
                                                                     sweep.sampling.variants(),
                                                                     range(sweep.max_repeats)):
        load_axes = {**axes, "concurrency": concurrency, "workload": workload}
        if any(m.matches(load_axes) for m in sweep.exclude):
            continue
        requests = sweep.requests.get(concurrency) if isinstance(sweep.requests, dict) else sweep.requests
        if requests is None and sweep.duration_s is None:
            raise RecipeError(f"{sweep.name}: requests: no request count for concurrency {concurrency}",
                              "Give requests: {CONCURRENCY: N, ...} for every concurrency, or duration_s.")
        settings = {"requests": requests, "duration_s": sweep.duration_s, "warmup": sweep.warmup,
                    "stream": sweep.stream, "sampling": sampling}
        cell_id = _hash({"server": server_id, "concurrency": concurrency, "workload": workload,
                         "repeat": repeat, "settings": settings})
        cells.append(Cell(cell_id, concurrency, workload, repeat, requests, sampling))
    return ServerConfig(server_id, engine, method, k, overrides, serve_args, spec, recipe, tuple(cells), options)


@dataclass(frozen=True)
class TimingModel:
    """A first guess at how long a sweep takes; stored history refines it.

    Aggregate output tok/s at concurrency c is modelled as tokens_per_s x c ** batching (batching 0 = no gain
    from concurrency, 1 = perfect scaling). A server's start takes startup_s unless server_startup_s says
    otherwise for it (an engine that builds on its first start, or a start measured before); builds names, per
    engine, the allowance a first start that builds is counted at.
    """

    startup_s: float = 300.0
    teardown_s: float = 15.0
    tokens_per_s: float = 80.0
    batching: float = 0.5
    server_startup_s: Mapping[str, float] = field(default_factory=dict)
    builds: Mapping[str, float] = field(default_factory=dict)

    def startup_for(self, server: ServerConfig) -> float:
        return self.server_startup_s.get(server.id, self.startup_s)

    def startup_text(self) -> str:
        """How the model counts a server's start, for the dry runs' ETA lines."""
        text = f"{self.startup_s:.0f} s per server start"
        for name, seconds in self.builds.items():
            text += (f"; {name}: up to {seconds:.0f} s per server, whose first start builds its engines (the "
                     "recipe's ready deadline; a measured start of the same server replaces it)")
        return text


def estimate_seconds(plan: Plan, model: TimingModel) -> float:
    total = 0.0
    for server in plan.servers:
        total += model.startup_for(server) + model.teardown_s
        for cell in server.cells:
            if plan.sweep.duration_s:
                total += plan.sweep.duration_s
                continue
            tokens = ((cell.requests or 0) + plan.sweep.warmup) * int(cell.sampling.get("max_tokens") or 0)
            total += tokens / (model.tokens_per_s * cell.concurrency**model.batching)
    return total
