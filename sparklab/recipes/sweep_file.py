"""The sweep file, read and validated: its pydantic models (SweepFile with its sampling axes, grading, lossless
check, exclusions, per-config overrides and automatic repeats) and load_sweep, which turns a bad file into one
paragraph naming the file and the key. What it plans (server configs x loads) is sparklab.recipes.plan's.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from sparklab.errors import RecipeError
from sparklab.recipes.hosts import HostEntry
from sparklab.recipes.schema import (
    MAX_REPEATS,
    MAX_TEMPERATURE,
    MAX_WARMUP,
    Concurrency,
    RequestsSpec,
    Seconds,
    SpeculativeTokens,
    Strict,
    TokenCount,
    one_or_list,
    read_yaml,
)
from sparklab.recipes.validation import ONE_VALUE, VALUES, explain_validation
from sparklab.records import Sampling

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


def load_sweep(path: Path) -> SweepFile:
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: expected a mapping at the top level")
    try:
        return SweepFile.model_validate(data)
    except ValidationError as exc:
        raise explain_validation(exc, str(path)) from None
