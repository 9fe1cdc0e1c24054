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
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from sparklab.bench.workloads import load_workload
from sparklab.engines import engine as engine_adapter
from sparklab.errors import RecipeError
from sparklab.recipes.hosts import HostEntry
from sparklab.recipes.multinode import ClusterSpec
from sparklab.recipes.render import LaunchOptions, render
from sparklab.recipes.schema import (
    MAX_REPEATS,
    MAX_TEMPERATURE,
    MAX_WARMUP,
    ONE_VALUE,
    VALUES,
    Concurrency,
    Recipe,
    RequestsSpec,
    Seconds,
    SpeculativeTokens,
    Strict,
    TokenCount,
    explain_validation,
    load_recipe,
    one_or_list,
    read_yaml,
    recipes_dir,
)
from sparklab.records import Sampling
from sparklab.spec import LaunchSpec

_SAMPLING = Sampling()  # the one place sampling defaults are written (sparklab.records.Sampling)


Temperature = Annotated[float, Field(ge=0, le=MAX_TEMPERATURE, allow_inf_nan=False)]
TopP = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]
AXES = ("temperature", "top_p", "max_tokens")  # sampling keys that may list values: load axes, like concurrency
MaxTokensAxis = Annotated[Annotated[TokenCount, Tag(ONE_VALUE)] | Annotated[list[TokenCount], Tag(VALUES)],
                          Discriminator(one_or_list)]
TemperatureAxis = Annotated[Annotated[Temperature | None, Tag(ONE_VALUE)]
                            | Annotated[list[Temperature | None], Tag(VALUES)], Discriminator(one_or_list)]
TopPAxis = Annotated[Annotated[TopP | None, Tag(ONE_VALUE)] | Annotated[list[TopP | None], Tag(VALUES)],
                     Discriminator(one_or_list)]


class SamplingSpec(Strict):
    """A sweep file's `sampling:`; every default is sparklab.records.Sampling's. `temperature`, `top_p` and
    `max_tokens` may each list values (`max_tokens: [4096, 16000]`): every combination is a load of its own on the
    same server (seed 002 found the budget at which answers appear this way)."""

    max_tokens: MaxTokensAxis = _SAMPLING.max_tokens
    temperature: TemperatureAxis = _SAMPLING.temperature
    top_p: TopPAxis = _SAMPLING.top_p
    ignore_eos: bool = _SAMPLING.ignore_eos
    min_tokens: TokenCount | None = _SAMPLING.min_tokens
    enable_thinking: bool | None = _SAMPLING.enable_thinking
    seed: int | None = _SAMPLING.seed

    @field_validator("max_tokens", "temperature", "top_p")
    @classmethod
    def _listed_once(cls, value: Any) -> Any:
        if isinstance(value, list) and (not value or len(set(value)) != len(value)):
            raise ValueError("a list of values must name each value once, and at least one")
        return value

    # Any: sampling values as the sweep file gives them (YAML scalars or lists)
    def variants(self) -> list[dict[str, Any]]:
        """Every concrete sampling (one per combination of listed values, in the file's order); a file that
        lists nothing has one, equal to its own model_dump (so its cells keep their ids)."""
        base = self.model_dump()
        lists = [[(k, v) for v in base[k]] for k in AXES if isinstance(base[k], list)]
        return [{**base, **dict(combo)} for combo in itertools.product(*lists)] if lists else [base]

    def varying(self) -> tuple[str, ...]:
        """The sampling keys this file sweeps over (listed with more than one value)."""
        return tuple(k for k in AXES if isinstance(getattr(self, k), list) and len(getattr(self, k)) > 1)


class Grading(Strict):
    """How graded suites are graded (sparklab.bench.grading): the code suite's sandbox container."""

    sandbox_image: str = "sparklab/base:bookworm"
    timeout_s: Seconds = 60.0
    per_test_s: Seconds = 10.0
    memory_mib: int = Field(default=256, strict=True, ge=32, le=65536)
    cpus: float = Field(default=1.0, gt=0, le=64)


class Lossless(Strict):
    """The lossless check at temperature > 0 (sparklab.sweep.lossless): score every sampled answer under the target
    on a plain server of the same recipe after the window."""

    enabled: bool = True
    alpha: float = Field(default=0.05, gt=0, lt=0.5)  # family-wise, over every test the run makes (Bonferroni)


class Match(Strict):
    engine: str | None = None
    method: str | None = None
    num_speculative_tokens: int | None = None
    concurrency: int | None = None
    workload: str | None = None

    # Any: a server config's values as the sweep file gives them (YAML scalars)
    def matches(self, values: dict[str, Any]) -> bool:
        return all(values.get(k) == v for k, v in self.model_dump(exclude_none=True).items())


class AutoRepeats(Strict):
    """`repeats: auto`: repeat each load until its 95% interval's half-width is under `target` of its mean
    (at least `min` runs, at most `max`); quiet loads stop early, noisy ones get more runs."""

    min: int = Field(default=3, strict=True, ge=2, le=MAX_REPEATS)
    max: int = Field(default=8, strict=True, ge=2, le=MAX_REPEATS)
    target: float = Field(default=0.03, gt=0, lt=1)


class Override(Strict):
    match: Match
    set: list[str] = Field(default_factory=list)  # recipe overrides, like --set
    serve_args: list[str] = Field(default_factory=list)


class SweepFile(Strict):
    # a path component of every run (runs/tune-<name>-<id>/): short enough for any filesystem's 255 bytes
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", max_length=100)
    description: str = ""
    recipe: str
    engines: list[str] | None = None
    methods: list[str] = Field(min_length=1)
    num_speculative_tokens: list[SpeculativeTokens] = Field(default_factory=lambda: [3], min_length=1)
    concurrency: list[Concurrency] = Field(min_length=1)
    workloads: list[str] = Field(default_factory=lambda: ["seed"], min_length=1)
    repeats: int | Literal["auto"] = 1  # see _repeats
    auto_repeats: AutoRepeats = Field(default_factory=AutoRepeats)  # used with `repeats: auto`
    # The figure that heads the report and decides speedups, the best pick and `repeats: auto`: seed000 =
    # per-request tok/s at C=1 (incl. TTFT), aggregate above; decode = generation tok/s excluding TTFT, with the
    # TTFT median beside it (seed 004's table).
    headline: Literal["seed000", "decode"] = "seed000"
    requests: RequestsSpec | None = 10
    duration_s: Seconds | None = None
    warmup: int = Field(default=2, strict=True, ge=0, le=MAX_WARMUP)
    stream: bool = True
    sampling: SamplingSpec = Field(default_factory=SamplingSpec)
    set: list[str] = Field(default_factory=list)
    exclude: list[Match] = Field(default_factory=list)
    overrides: list[Override] = Field(default_factory=list)
    max_attempts: int = Field(default=3, strict=True, ge=1, le=100)
    # A cell is whole when at least this share of its measured requests succeeded (1.0: every one); a cell
    # below it is partial: it runs again, and after max_attempts its numbers are kept flagged.
    require_ok: float = Field(default=1.0, gt=0, le=1)
    # per request: give up after request_timeout_s; earlier after stall_timeout_s without a byte while the
    # server's health check fails (None: no stall detection)
    request_timeout_s: Seconds = 1800.0
    stall_timeout_s: Seconds | None = 60.0
    # Stop a server when MemAvailable falls under this (GiB; 0: off; None: on unified-memory recipes 8, or the
    # room the server's memory fraction leaves where that is less: host/headroom.py).
    memory_floor_gib: float | None = Field(default=None, ge=0, le=4096)
    # A server whose engine prints nothing for this long while not ready fails as "stalled" (null: never).
    load_stall_s: Seconds | None = 600.0
    # Docker hosts to spread the server configs over (sparklab.hosts); none: the local engine only.
    hosts: list[HostEntry] = Field(default_factory=list)
    # A latency objective, e.g. "tpot_p90<=50ms,ttft_p90<=500ms" (sparklab.bench.slo): the report's best config per
    # concurrency among those that meet it, and the highest concurrency any config meets it at; `tune` picks among
    # those only.
    slo: str | None = None

    @field_validator("slo")
    @classmethod
    def _slo(cls, value: str | None) -> str | None:
        from sparklab.bench import slo

        try:
            slo.parse(value)
        except slo.SloError as exc:
            raise PydanticCustomError("slo", "{reason}", {"reason": str(exc)}) from None
        return value
    grading: Grading = Field(default_factory=Grading)
    lossless: Lossless = Field(default_factory=Lossless)

    @field_validator("hosts", mode="before")
    @classmethod
    def _host_strings(cls, value: Any) -> Any:
        """`- ssh://me@spark-2` is short for `- {docker: ssh://me@spark-2}`."""
        return [{"docker": v} if isinstance(v, str) else v for v in value] if isinstance(value, list) else value


    @field_validator("engines", "methods", "num_speculative_tokens", "concurrency", "workloads")
    @classmethod
    def _each_once(cls, value: list[Any] | None) -> list[Any] | None:
        """A value listed twice planned its cells twice (`concurrency: [1, 1, 2, 1]` ran C=1 six times, past
        max_attempts). Refused, not deduplicated: it is a typo more often than a wish, and more runs of a load
        is what `repeats:` says."""
        for item in value or ():
            times = value.count(item) if value else 0
            if times > 1:
                raise ValueError(f"{item!r} is listed {times} times; list each value once (`repeats: N` runs "
                                 "each load N times)")
        return value

    @field_validator("repeats", mode="before")
    @classmethod
    def _repeats(cls, value: Any) -> Any:
        if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_REPEATS):
            return value
        raise ValueError(f"expected a whole number of runs per load (1 to {MAX_REPEATS}) or auto")

    @property
    def max_repeats(self) -> int:
        """Runs planned per load: all of them (a number), or `auto_repeats.max` (`auto` stops early)."""
        return self.auto_repeats.max if self.repeats == "auto" else int(self.repeats)


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


def load_sweep(path: Path) -> SweepFile:
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: expected a mapping at the top level")
    try:
        return SweepFile.model_validate(data)
    except ValidationError as exc:
        raise explain_validation(exc, str(path)) from None


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


def _check_workloads(sweep: SweepFile, src: str) -> None:
    """Every workload loads now, before any server starts (not after a model has loaded for its first cell)."""
    for i, workload in enumerate(sweep.workloads):
        try:
            load_workload(workload)
        except RecipeError as exc:
            raise RecipeError(f"{src}: workloads[{i}]: {exc.message}", exc.hint) from None


def build_plan(path: Path, run_id: str = "plan", ulimits: tuple[str, ...] = ()) -> Plan:
    sweep = load_sweep(path)
    src = str(path)
    auto = sweep.auto_repeats
    if sweep.repeats == "auto" and auto.min > auto.max:
        raise RecipeError(f"{src}: auto_repeats: min {auto.min} is more than max {auto.max}",
                          "Give auto_repeats.min <= auto_repeats.max.")
    _check_workloads(sweep, src)
    recipe_path = recipe_file(sweep, path)
    base = load_recipe(recipe_path, list(sweep.set))
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
                servers.append(_server(sweep, recipe_path, engine, method, k, axes, run_id, ulimits))
    if not servers:
        raise RecipeError(f"{src}: the matrix is empty after exclusions", "Check exclude:.")
    return Plan(sweep, src, tuple(servers))


def variant(plan: Plan, server: ServerConfig, extra_serve_args: tuple[str, ...], run_id: str = "plan",
            ulimits: tuple[str, ...] = ()) -> ServerConfig:
    """The server config with more serve arguments (its own id and cells), e.g. the K schedule `sparklab tune`
    measures before it recommends it: the same sweep file, recipe, overrides and loads."""
    axes = {"engine": server.engine, "method": server.method, "num_speculative_tokens": server.num_speculative_tokens}
    return _server(plan.sweep, recipe_file(plan.sweep, Path(plan.source)), server.engine, server.method,
                   server.num_speculative_tokens, axes, run_id, ulimits, extra_serve_args)


def _server(sweep: SweepFile, recipe_path: Path, engine: str, method: str, k: int | None,
            axes: dict[str, Any], run_id: str, ulimits: tuple[str, ...],
            extra_serve_args: tuple[str, ...] = ()) -> ServerConfig:
    chosen = [o for o in sweep.overrides if o.match.matches(axes)]
    overrides = tuple(sweep.set) + tuple(s for o in chosen for s in o.set)
    serve_args = tuple(a for o in chosen for a in o.serve_args) + extra_serve_args
    recipe = load_recipe(recipe_path, list(overrides))
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
