"""Sweep files → a plan: server configs (outer loop) x loads (inner loop), pure and deterministic.

Server axes (engine, method, num_speculative_tokens, recipe overrides) restart the server; load axes
(concurrency, workload, repeat) reuse it. Every server config and cell gets a stable id (a hash of what
defines it), so a sweep run again finds the cells it already finished.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from sparklab.errors import RecipeError
from sparklab.recipes import Recipe, Strict, explain_validation, load_recipe, read_yaml, recipes_dir
from sparklab.render import LaunchOptions, LaunchSpec, render


class SamplingSpec(Strict):
    max_tokens: int = Field(default=2048, ge=1)
    temperature: float | None = 1.0
    top_p: float | None = 0.95
    ignore_eos: bool = False
    min_tokens: int | None = Field(default=None, ge=1)
    enable_thinking: bool | None = False
    seed: int | None = None


class Match(Strict):
    engine: str | None = None
    method: str | None = None
    num_speculative_tokens: int | None = None
    concurrency: int | None = None
    workload: str | None = None

    def matches(self, values: dict[str, Any]) -> bool:
        return all(values.get(k) == v for k, v in self.model_dump(exclude_none=True).items())


class Override(Strict):
    match: Match
    set: list[str] = Field(default_factory=list)  # recipe overrides, like --set
    serve_args: list[str] = Field(default_factory=list)


class SweepFile(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = ""
    recipe: str
    engines: list[str] | None = None
    methods: list[str] = Field(min_length=1)
    num_speculative_tokens: list[int] = Field(default_factory=lambda: [3], min_length=1)
    concurrency: list[int] = Field(min_length=1)
    workloads: list[str] = Field(default_factory=lambda: ["seed"], min_length=1)
    repeats: int = Field(default=1, ge=1)
    requests: int | dict[int, int] | None = 10
    duration_s: float | None = Field(default=None, gt=0)
    warmup: int = Field(default=2, ge=0)
    stream: bool = True
    sampling: SamplingSpec = Field(default_factory=SamplingSpec)
    set: list[str] = Field(default_factory=list)
    exclude: list[Match] = Field(default_factory=list)
    overrides: list[Override] = Field(default_factory=list)
    max_attempts: int = Field(default=3, ge=1)
    # per request: give up after request_timeout_s; earlier after stall_timeout_s without a byte while the
    # server's health check fails (None: no stall detection)
    request_timeout_s: float = Field(default=1800, gt=0)
    stall_timeout_s: float | None = Field(default=60, gt=0)


def _hash(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Cell:
    id: str
    concurrency: int
    workload: str
    repeat: int
    requests: int | None


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


def load_sweep(path: Path) -> SweepFile:
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: expected a mapping at the top level")
    try:
        return SweepFile.model_validate(data)
    except ValidationError as exc:
        raise explain_validation(exc, str(path)) from None


def _recipe_path(sweep: SweepFile, source: Path) -> Path:
    candidate = Path(sweep.recipe)
    if candidate.suffix in (".yaml", ".yml"):
        return candidate if candidate.is_absolute() else (source.parent / candidate)
    return recipes_dir() / f"{sweep.recipe}.yaml"


def _speculative(recipe: Recipe, engine: str, method: str) -> bool:
    """Whether the method's flags use K at all (a baseline does not: one server, not one per K)."""
    args = recipe.engines[engine].methods[method].args
    return any("num_speculative_tokens" in str(a) for a in args)


def build_plan(path: Path, run_id: str = "plan", ulimits: tuple[str, ...] = ()) -> Plan:
    sweep = load_sweep(path)
    src = str(path)
    recipe_path = _recipe_path(sweep, path)
    base = load_recipe(recipe_path, list(sweep.set))
    engines = sweep.engines or [base.default_engine]
    servers: list[ServerConfig] = []
    for i, engine in enumerate(engines):
        if engine not in base.engines:
            raise RecipeError(f"{src}: engines[{i}]: {engine!r} is not an engine of {recipe_path}",
                              f"Use one of: {', '.join(base.engines)}.")
        for j, method in enumerate(sweep.methods):
            if method not in base.engines[engine].methods:
                raise RecipeError(f"{src}: methods[{j}]: engine {engine!r} of {recipe_path} has no method {method!r}",
                                  f"Its methods: {', '.join(base.engines[engine].methods)}; or exclude the "
                                  f"combination under exclude: [{{engine: {engine}, method: {method}}}].")
            ks = sweep.num_speculative_tokens if _speculative(base, engine, method) else [None]
            for k in ks:
                axes = {"engine": engine, "method": method, "num_speculative_tokens": k}
                if any(m.matches(axes) for m in sweep.exclude):
                    continue
                servers.append(_server(sweep, recipe_path, engine, method, k, axes, run_id, ulimits))
    if not servers:
        raise RecipeError(f"{src}: the matrix is empty after exclusions", "Check exclude:.")
    return Plan(sweep, src, tuple(servers))


def _server(sweep: SweepFile, recipe_path: Path, engine: str, method: str, k: int | None,
            axes: dict[str, Any], run_id: str, ulimits: tuple[str, ...]) -> ServerConfig:
    chosen = [o for o in sweep.overrides if o.match.matches(axes)]
    overrides = tuple(sweep.set) + tuple(s for o in chosen for s in o.set)
    serve_args = tuple(a for o in chosen for a in o.serve_args)
    recipe = load_recipe(recipe_path, list(overrides))
    # vLLM serves POST /reset_prefix_cache (between loads) only in dev mode.
    env = ("VLLM_SERVER_DEV_MODE=1",) if recipe.engines[engine].kind == "vllm" else ()
    options = LaunchOptions(num_speculative_tokens=k, extra_args=serve_args, run_id=run_id, mode="sweep", env=env,
                            ulimits=ulimits)
    spec = render(recipe, engine, method, options)
    server_id = _hash({"recipe": recipe.name, "engine": engine, "method": method, "k": k,
                       "argv": list(spec.argv[: spec.recipe_argv_len]) + list(serve_args), "image": spec.image})
    cells = []
    for concurrency, workload, repeat in itertools.product(sweep.concurrency, sweep.workloads, range(sweep.repeats)):
        load_axes = {**axes, "concurrency": concurrency, "workload": workload}
        if any(m.matches(load_axes) for m in sweep.exclude):
            continue
        requests = sweep.requests.get(concurrency) if isinstance(sweep.requests, dict) else sweep.requests
        if requests is None and sweep.duration_s is None:
            raise RecipeError(f"{sweep.name}: requests: no request count for concurrency {concurrency}",
                              "Give requests: {CONCURRENCY: N, ...} for every concurrency, or duration_s.")
        settings = {"requests": requests, "duration_s": sweep.duration_s, "warmup": sweep.warmup,
                    "stream": sweep.stream, "sampling": sweep.sampling.model_dump()}
        cell_id = _hash({"server": server_id, "concurrency": concurrency, "workload": workload,
                         "repeat": repeat, "settings": settings})
        cells.append(Cell(cell_id, concurrency, workload, repeat, requests))
    return ServerConfig(server_id, engine, method, k, overrides, serve_args, spec, recipe, tuple(cells))


@dataclass(frozen=True)
class TimingModel:
    """A first guess at how long a sweep takes; stored history refines it.

    Aggregate output tok/s at concurrency c is modelled as tokens_per_s x c ** batching (batching 0 = no gain
    from concurrency, 1 = perfect scaling).
    """

    startup_s: float = 300.0
    teardown_s: float = 15.0
    tokens_per_s: float = 80.0
    batching: float = 0.5


def estimate_seconds(plan: Plan, model: TimingModel) -> float:
    total = 0.0
    for server in plan.servers:
        total += model.startup_s + model.teardown_s
        for cell in server.cells:
            if plan.sweep.duration_s:
                total += plan.sweep.duration_s
                continue
            tokens = ((cell.requests or 0) + plan.sweep.warmup) * plan.sweep.sampling.max_tokens
            total += tokens / (model.tokens_per_s * cell.concurrency**model.batching)
    return total
