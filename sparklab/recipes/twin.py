"""The DGX Spark twin as data (pure): the host model (recipes/hardware.yaml's `<device>.twin`) and the engines' model
(recipes/twin/<device>.yaml, each number derived from the seeds or marked assumed), and what follows from them
for one server: the stand-in engine's timing knob (STANDIN_MODEL) and the night's seconds for its start and its
cells. host/twin.py runs the host model, runtimes/twin.py starts the stand-ins, sparklab.rehearse puts them together.

The timing model the stand-in enacts and the ETA counts (recipes/twin/gb10.yaml's header derives it):
    TTFT(C) = prefill_ms x (1 + per_running x (C - 1));   one step = step_ms(K, C);   tokens per step: 1 + accepted
    one request = TTFT + tokens / AL(K) x step            (C: requests in flight, AL: the acceptance length)
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError

from sparklab.errors import RecipeError
from sparklab.recipes.schema import Hardware, Recipe, Strict, explain_validation, load_hardware, read_yaml, recipes_dir
from sparklab.spec import LaunchSpec

GIB = 2**30
REF_K = 3  # the K the seeds measured drafters at; other K by the profile's k_slope


class Clocks(Strict):
    sm_clock_mhz: float = Field(gt=0)
    power_w: float = Field(ge=0)
    temperature_c: float


class Throttle(Strict):
    after_s: float = Field(ge=0)
    sm_clock_mhz: float = Field(gt=0)
    temperature_c: float
    reason: str


class HostModel(Strict):
    page_cache_gib: float = Field(ge=0)
    reserve_gib: float = Field(ge=0)
    disk_read_gbps: float = Field(gt=0)
    download_mbps: float = Field(gt=0)
    disk_free_gib: float = Field(gt=0)
    max_sm_clock_mhz: float = Field(gt=0)
    idle: Clocks
    load: Clocks
    heat_time_constant_s: float = Field(gt=0)
    throttle: Throttle


class EngineModel(Strict):
    version: str
    image_gib: float = Field(ge=0)
    startup_check: Literal["MemAvailable", "MemFree"] | None = None
    init_s: float = Field(ge=0)
    cold_init_s: float = Field(ge=0)
    cold_per_server: bool = False  # each server config pays the cold start once (an engine build), not each image
    outside_gib: float = Field(ge=0)
    per_request_gib: float = Field(ge=0)
    kv_tokens: int = Field(gt=0)


class Checkpoint(Strict):
    weights_gib: float = Field(gt=0)


class Bucket(Strict):
    """Prompts up to max_words (None: any longer): one workload of a seed that measured several."""

    max_words: int | None = None
    workload: str
    prefill_ms: dict[str, float]
    step_ms: dict[str, dict[int, float]]
    acceptance_length: dict[str, float] = Field(default_factory=dict)


class Profile(Strict):
    kind: str
    default: bool = False
    sweeps: list[str] = Field(default_factory=list)
    source: str
    output_tokens: int = Field(gt=0)
    prefill_ms: float | None = None
    per_running: float = Field(ge=0)
    k_slope: float = Field(ge=0)
    published: dict[str, Any]
    step_ms: dict[str, dict[int, float]] = Field(default_factory=dict)
    buckets: list[Bucket] = Field(default_factory=list)


class TwinFile(Strict):
    acceptance: dict[str, list[float]]
    engines: dict[str, EngineModel]
    models: dict[str, Checkpoint]
    profiles: dict[str, Profile]


# ---------------------------------------------------------------------------------------------------
# One server's decode timing


@dataclass(frozen=True)
class Phase:
    """The timing of prompts up to max_words words (None: the rest)."""

    max_words: int | None
    prefill_ms: float
    step_ms: dict[int, float]  # by requests in flight, piecewise linear
    accept: tuple[float, ...]  # a_1..a_K

    @property
    def acceptance_length(self) -> float:
        return 1.0 + sum(self.accept)

    def step(self, running: int) -> float:
        points = sorted(self.step_ms.items())
        if running <= points[0][0]:
            return points[0][1]
        for (c0, s0), (c1, s1) in itertools.pairwise(points):
            if running <= c1:
                return s0 + (s1 - s0) * (running - c0) / (c1 - c0)
        return points[-1][1]


@dataclass(frozen=True)
class Timing:
    """How one twin server decodes: its phases by prompt length, TTFT growth with concurrency, natural length."""

    profile: str
    phases: tuple[Phase, ...]
    per_running: float
    output_tokens: int

    def phase(self, words: float) -> Phase:
        return next((p for p in self.phases if p.max_words is None or words <= p.max_words), self.phases[-1])

    def request_s(self, words: float, tokens: int, running: int) -> float:
        """One request's latency in the night (TTFT and its decode steps), seconds."""
        phase = self.phase(words)
        ttft = phase.prefill_ms * (1 + self.per_running * (running - 1))
        return (ttft + tokens / phase.acceptance_length * phase.step(running)) / 1000

    def cell_s(self, words: float, tokens: int, concurrency: int, requests: int, warmup: int) -> float:
        """A cell in the night: its warmup one at a time, then `requests` in a closed loop of `concurrency`."""
        running = max(1, min(concurrency, requests))
        rounds = math.ceil(requests / running)
        return warmup * self.request_s(words, tokens, 1) + rounds * self.request_s(words, tokens, running)

    def standin_model(self, time_scale: float) -> str:
        """The stand-in's STANDIN_MODEL knob (docker/standin/standin.py reads it)."""
        return json.dumps({"time_scale": time_scale, "per_running": self.per_running, "phases": [
            {"max_words": p.max_words, "prefill_ms": p.prefill_ms, "accept": list(p.accept),
             "step_ms": {str(c): ms for c, ms in p.step_ms.items()}} for p in self.phases]})


@dataclass(frozen=True)
class Twin:
    """A device's twin: its hardware entry, host model and engines' model."""

    name: str
    hardware: Hardware
    host: HostModel
    data: TwinFile
    source: str  # the engines' file

    @property
    def mem_total_gib(self) -> float:
        return self.hardware.mem_total_gib or self.hardware.memory_gib or 0.0

    @property
    def os_baseline_gib(self) -> float:
        return self.hardware.os_baseline_gib or 0.0

    def engine(self, kind: str) -> EngineModel:
        found = self.data.engines.get(kind)
        if found is None:
            raise RecipeError(f"{self.source}: engines: the twin has no model of engine kind {kind!r}",
                              f"Add it under engines: (known: {', '.join(self.data.engines)}).")
        return found

    def profile(self, kind: str, sweep: str | None = None) -> tuple[str, Profile]:
        """The profile a server of this kind runs: the one naming the sweep, else the kind's default."""
        mine = [(n, p) for n, p in self.data.profiles.items() if p.kind == kind]
        for name, profile in mine:
            if sweep is not None and sweep in profile.sweeps:
                return name, profile
        for name, profile in mine:
            if profile.default:
                return name, profile
        raise RecipeError(f"{self.source}: profiles: none for engine kind {kind!r}",
                          "Add a profile with `kind:` and `default: true`.")

    def weights_gib(self, recipe: Recipe, spec: LaunchSpec) -> float:
        """What the server loads: the target and every draft its argv names (unknown checkpoints: 0)."""
        model = recipe.model_of(spec.engine)
        ids = [model.id, *(d.id for d in model.drafts.values() if any(d.id in a for a in spec.argv))]
        return sum(self.data.models[i].weights_gib for i in dict.fromkeys(ids) if i in self.data.models)

    def timing(self, kind: str, method: str, k: int | None, sweep: str | None = None) -> Timing:
        name, profile = self.profile(kind, sweep)
        accept = () if method == "none" else tuple(self._acceptance(method)[:k or REF_K])
        if profile.buckets:
            phases = tuple(self._bucket_phase(name, profile, b, method, k, accept) for b in profile.buckets)
        else:
            steps = self._steps(name, profile, method, k)
            phases = (Phase(None, profile.prefill_ms or 0.0, steps, accept),)
        return Timing(name, phases, profile.per_running, profile.output_tokens)

    def _acceptance(self, method: str) -> list[float]:
        found = self.data.acceptance.get(method)
        if found is None:
            raise RecipeError(f"{self.source}: acceptance: the twin has no acceptance for method {method!r}",
                              f"Add its per-position acceptance (known: {', '.join(self.data.acceptance)}).")
        return found

    def _steps(self, name: str, profile: Profile, method: str, k: int | None) -> dict[int, float]:
        exact = profile.step_ms.get(f"{method}-k{k}") if k is not None else None
        if exact:
            return dict(exact)
        base = profile.step_ms.get(method) or self._elsewhere(profile.kind, method)
        if base is None:
            raise RecipeError(f"{self.source}: profiles.{name}: no step cost for method {method!r}, nor in another "
                              "profile", "Add it under the profile's step_ms:.")
        factor = 1.0 if k is None or method == "none" else max(0.1, 1 + profile.k_slope * (k - REF_K))
        return {c: ms * factor for c, ms in base.items()}

    def _elsewhere(self, kind: str, method: str) -> dict[int, float] | None:
        """A method this profile did not measure: the same kind's other profiles first, then any (e.g. SGLang's
        EAGLE over the MTP layers: vLLM's MTP, per the acceptance table's note)."""
        like = "mtp" if method == "eagle" else method
        ordered = sorted(self.data.profiles.values(), key=lambda p: p.kind != kind)
        return next((p.step_ms[m] for p in ordered for m in (method, like) if m in p.step_ms), None)

    def _bucket_phase(self, name: str, profile: Profile, bucket: Bucket, method: str, k: int | None,
                      accept: tuple[float, ...]) -> Phase:
        step = bucket.step_ms.get(method)
        if step is None:
            raise RecipeError(f"{self.source}: profiles.{name}: workload {bucket.workload} has no step cost for "
                              f"method {method!r}", "Add it under the bucket's step_ms:.")
        factor = 1.0 if k is None or method == "none" else max(0.1, 1 + profile.k_slope * (k - REF_K))
        target = bucket.acceptance_length.get(method)
        if target is not None and accept:  # the published length, the shape of the method's positions
            accept = reshaped(self._acceptance(method), target)[:len(accept)]
        prefill = bucket.prefill_ms.get(method, bucket.prefill_ms.get("none", 0.0))
        return Phase(bucket.max_words, prefill, {c: ms * factor for c, ms in step.items()}, accept)


def reshaped(accept: list[float], length: float, k: int = REF_K) -> tuple[float, ...]:
    """The positions raised to the power that makes AL(k) = length: each stays a probability, the shape its order."""
    low, high = 0.01, 20.0
    power = 1.0
    for _ in range(60):  # bisection: the sum falls as the power grows
        power = (low + high) / 2
        if sum(a ** power for a in accept[:k]) > length - 1:
            low = power
        else:
            high = power
    return tuple(a ** power for a in accept)


def load_twin(device: str, directory: Path | None = None) -> Twin:
    """The twin of a device of recipes/hardware.yaml (its `twin:` entry and recipes/twin/<device>.yaml)."""
    root = directory or recipes_dir()
    devices = load_hardware(root)
    hardware = devices.get(device)
    hw_path = root / "hardware.yaml"
    if hardware is None or hardware.twin is None:
        have = ", ".join(n for n, d in devices.items() if d.twin) or "none"
        raise RecipeError(f"{hw_path}: {device}: no twin: entry, so sparklab cannot rehearse on it",
                          f"Rehearse a recipe whose hardware has a twin (devices with one: {have}), or add "
                          f"{device}.twin and recipes/twin/{device}.yaml.")
    try:
        host = HostModel.model_validate(hardware.twin)
    except ValidationError as exc:
        raise explain_validation(exc, f"{hw_path}: {device}.twin") from None
    path = root / "twin" / f"{device}.yaml"
    if not path.is_file():
        raise RecipeError(f"{path}: missing: the engines of the {device} twin", "See recipes/twin/gb10.yaml.")
    try:
        data = TwinFile.model_validate(read_yaml(path))
    except ValidationError as exc:
        raise explain_validation(exc, str(path)) from None
    return Twin(device, hardware, host, data, str(path))
