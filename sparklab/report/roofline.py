"""The memory-bandwidth bound on decode (pure).

Decode is bandwidth bound: each target step reads the active weights once for the whole batch, plus each
sequence's KV cache and recurrent state. A step verifies a batch of B sequences and yields B x a tokens, a
being the acceptance length (1 without speculative decoding). So

    bound tok/s = bandwidth / bytes_per_step x B x a,   bytes_per_step = W + B x (L x kv + s)

with W = active params x weight bits / 8, L the mean context during decode (prompt + half the output), kv the
KV bytes per token and s the state bytes per sequence. What this leaves out is printed with every report
(`assumptions`): it is an upper bound, so the measured speed is a percentage of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

REQUIRED = ("active_params_b", "weight_bits")


@dataclass(frozen=True)
class Device:
    name: str
    bandwidth_gbps: float


@dataclass(frozen=True)
class ModelInputs:
    device: Device
    active_params_b: float
    weight_bits: float
    kv_bytes_per_token: float | None
    state_bytes_per_seq: float | None

    @property
    def weight_bytes(self) -> float:
        return self.active_params_b * 1e9 * self.weight_bits / 8


@dataclass(frozen=True)
class RooflinePoint:
    batch: int
    acceptance_length: float
    context_tokens: float | None
    bytes_per_step: float
    bound_tps: float
    measured_tps: float
    measured_source: str

    @property
    def percent(self) -> float:
        return 100 * self.measured_tps / self.bound_tps

    @property
    def effective_gbps(self) -> float:
        """The bandwidth the measured speed implies: steps per second x bytes per step."""
        return self.measured_tps / (self.batch * self.acceptance_length) * self.bytes_per_step / 1e9


def model_inputs(facts: dict[str, Any], device: Device) -> tuple[ModelInputs | None, list[str]]:
    missing = [key for key in REQUIRED if not facts.get(key)]
    if missing:
        return None, missing
    return ModelInputs(device, float(facts["active_params_b"]), float(facts["weight_bits"]),
                       _float(facts.get("kv_bytes_per_token")), _float(facts.get("state_bytes_per_seq"))), []


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def bound(inputs: ModelInputs, batch: int, acceptance_length: float, context_tokens: float | None,
          measured_tps: float, measured_source: str) -> RooflinePoint:
    per_sequence = (context_tokens or 0.0) * (inputs.kv_bytes_per_token or 0.0) + (inputs.state_bytes_per_seq or 0.0)
    step = inputs.weight_bytes + batch * per_sequence
    tps = inputs.device.bandwidth_gbps * 1e9 / step * batch * acceptance_length
    return RooflinePoint(batch, acceptance_length, context_tokens, step, tps, measured_tps, measured_source)


def assumptions(inputs: ModelInputs) -> list[str]:
    """What the bound assumes, in words, for the report."""
    kv = (f"KV cache {inputs.kv_bytes_per_token:,.0f} bytes per token of context" if inputs.kv_bytes_per_token
          else "KV cache reads not counted (no kv_bytes_per_token in the model facts)")
    state = (f"recurrent state {inputs.state_bytes_per_seq:,.0f} bytes per sequence" if inputs.state_bytes_per_seq
             else "recurrent state reads not counted (no state_bytes_per_seq)")
    return [
        f"device {inputs.device.name}: {inputs.device.bandwidth_gbps:g} GB/s memory bandwidth, all of it usable",
        f"weights: {inputs.active_params_b:g} B active parameters x {inputs.weight_bits:g} bits = "
        f"{inputs.weight_bytes / 1e9:.3f} GB read once per target step for the whole batch (MoE: the experts a "
        "batch touches counted as one token's active set, optimistic above C=1)",
        f"{kv}; {state}; context = mean prompt tokens + half the mean output",
        "batch = the concurrency (every sequence in every step); tokens per step per sequence = the measured "
        "acceptance length (1 without drafting); the draft model's own reads are not counted",
        "measured = mean per-request decode tok/s x C (time after the first token), else the table's tok/s",
    ]
