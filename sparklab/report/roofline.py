"""The memory-bandwidth bound on decode (pure).

Decode is bandwidth bound: each target step reads the active weights once for the whole batch, plus each
sequence's KV cache and recurrent state. A step verifies a batch of B sequences and yields B x a tokens, a
being the acceptance length (1 without speculative decoding). So

    bound tok/s = bandwidth / bytes_per_step x B x a,   bytes_per_step = W(T) + B x (L x kv + s)

with L the mean context during decode (prompt + half the output), kv the KV bytes per token, s the state bytes per
sequence, and W(T) the weight bytes a step through T tokens reads (T = B x (K + 1) for a drafting config, B
without): a dense model reads all its active weights once, whatever T; a mixture-of-experts model reads its dense
part once and, in each MoE layer, the union of the experts its T tokens route to, E x (1 - (1 - k/E)^T) of E experts
with k routed per token (independent routing assumed), so the bound falls with K (EAGLE3: 2.36x on a dense
Gemma-4-31B, 1.26x on its A4B MoE, ggml-org/llama.cpp#18039).

Bandwidth: a device's usable figure where recipes/hardware.yaml gives one (GB10: ~232 GB/s measured by a
saturating read kernel against 273 nominal, antirez/ds4#773), else its nominal one; the bound at the nominal
figure is kept beside it. Weight bits: `weight_bits`, or the real bits of a `weight_format` with its block scales
(NVFP4: 4 + 8/16 = 4.5). What this leaves out is printed with every report (`assumptions`): it is an upper bound,
so the measured speed is a percentage of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

REQUIRED = ("active_params_b", "weight_bits")

# bits per weight with the format's scales, and how that is counted
FORMATS: dict[str, tuple[float, str]] = {
    "nvfp4": (4.5, "NVFP4: 4-bit E2M1 values and one FP8 E4M3 scale per block of 16 weights (4 + 8/16 bits; the "
                   "one FP32 scale per tensor is negligible)"),
    "mxfp4": (4.25, "MXFP4: 4-bit E2M1 values and one E8M0 scale per block of 32 weights (4 + 8/32 bits)"),
    "fp8": (8.0, "FP8: 8 bits per weight (per-tensor or per-channel scales negligible)"),
    "bf16": (16.0, "BF16: 16 bits per weight"),
    "fp16": (16.0, "FP16: 16 bits per weight"),
    "fp32": (32.0, "FP32: 32 bits per weight"),
}


@dataclass(frozen=True)
class Device:
    name: str
    bandwidth_gbps: float  # nominal
    usable_gbps: float | None = None  # measured by a saturating read, where known
    usable_source: str | None = None

    @property
    def effective_gbps(self) -> float:
        return self.usable_gbps or self.bandwidth_gbps


@dataclass(frozen=True)
class Moe:
    """The routed experts of a mixture-of-experts target (from its config.json)."""

    layers: int  # MoE layers
    experts: int  # routed experts per layer (E)
    per_token: int  # experts routed per token (k)
    expert_params: float  # parameters of one routed expert in one layer

    def experts_read(self, tokens: float) -> float:
        """The expected union of the experts `tokens` tokens route to in one layer: E (1 - (1 - k/E)^T)."""
        return self.experts * (1 - (1 - self.per_token / self.experts) ** max(tokens, 1.0))


@dataclass(frozen=True)
class ModelInputs:
    device: Device
    active_params_b: float
    weight_bits: float
    kv_bytes_per_token: float | None
    state_bytes_per_seq: float | None
    bits_source: str = ""  # how weight_bits was had (a format's real bits, the engine's, or the recipe's)
    moe: Moe | None = None

    @property
    def weight_bytes(self) -> float:
        """One token's active weights (a dense model's every step)."""
        return self.active_params_b * 1e9 * self.weight_bits / 8

    def step_weight_bytes(self, tokens: float) -> float:
        """The weights a target step through `tokens` tokens reads."""
        if self.moe is None:
            return self.weight_bytes
        routed = self.moe.layers * self.moe.per_token * self.moe.expert_params
        dense = self.active_params_b * 1e9 - routed
        read = self.moe.layers * self.moe.experts_read(tokens) * self.moe.expert_params
        return (dense + read) * self.weight_bits / 8


@dataclass(frozen=True)
class RooflinePoint:
    batch: int
    acceptance_length: float
    context_tokens: float | None
    bytes_per_step: float
    bound_tps: float
    measured_tps: float
    measured_source: str
    verify_tokens: float | None = None  # tokens through the target per step (B x (K + 1) drafting, B without)
    experts_per_layer: float | None = None  # MoE: experts a step reads per layer
    nominal_bound_tps: float | None = None  # the bound at the device's nominal bandwidth
    bandwidth_gbps: float | None = None  # the bandwidth behind bound_tps

    @property
    def percent(self) -> float:
        return 100 * self.measured_tps / self.bound_tps

    @property
    def effective_gbps(self) -> float:
        """The bandwidth the measured speed implies: steps per second x bytes per step."""
        return self.measured_tps / (self.batch * self.acceptance_length) * self.bytes_per_step / 1e9


def _moe(facts: dict[str, Any]) -> Moe | None:
    keys = ("moe_layers", "experts", "experts_per_token", "expert_params_m")
    if not all(facts.get(k) for k in keys):
        return None
    return Moe(int(facts["moe_layers"]), int(facts["experts"]), int(facts["experts_per_token"]),
               float(facts["expert_params_m"]) * 1e6)


def model_inputs(facts: dict[str, Any], device: Device) -> tuple[ModelInputs | None, list[str]]:
    bits: Any = facts.get("weight_bits")
    source = "weight_bits"
    if not bits and facts.get("weight_format") in FORMATS:
        bits, source = FORMATS[facts["weight_format"]][0], str(facts["weight_format"])
    missing = [key for key in REQUIRED if not (bits if key == "weight_bits" else facts.get(key))]
    if missing:
        return None, missing
    return ModelInputs(device, float(facts["active_params_b"]), float(bits), _float(facts.get("kv_bytes_per_token")),
                       _float(facts.get("state_bytes_per_seq")), source, _moe(facts)), []


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def bound(inputs: ModelInputs, batch: int, acceptance_length: float, context_tokens: float | None,
          measured_tps: float, measured_source: str, verify_tokens: float | None = None) -> RooflinePoint:
    """verify_tokens: tokens through the target per step (default: the batch, one each)."""
    tokens = verify_tokens if verify_tokens is not None else float(batch)
    per_sequence = (context_tokens or 0.0) * (inputs.kv_bytes_per_token or 0.0) + (inputs.state_bytes_per_seq or 0.0)
    step = inputs.step_weight_bytes(tokens) + batch * per_sequence
    device = inputs.device
    tps = device.effective_gbps * 1e9 / step * batch * acceptance_length
    nominal = device.bandwidth_gbps * 1e9 / step * batch * acceptance_length
    experts = inputs.moe.experts_read(tokens) if inputs.moe else None
    return RooflinePoint(batch, acceptance_length, context_tokens, step, tps, measured_tps, measured_source,
                         tokens, experts, nominal, device.effective_gbps)


def assumptions(inputs: ModelInputs) -> list[str]:
    """What the bound assumes, in words, for the report."""
    device = inputs.device
    kv = (f"KV cache {inputs.kv_bytes_per_token:,.0f} bytes per token of context" if inputs.kv_bytes_per_token
          else "KV cache reads not counted (no kv_bytes_per_token in the model facts)")
    state = (f"recurrent state {inputs.state_bytes_per_seq:,.0f} bytes per sequence" if inputs.state_bytes_per_seq
             else "recurrent state reads not counted (no state_bytes_per_seq)")
    if device.usable_gbps:
        bandwidth = (f"device {device.name}: the bound uses its usable {device.usable_gbps:g} GB/s "
                     f"({device.usable_source or 'measured'}), not its nominal {device.bandwidth_gbps:g} GB/s; "
                     "the nominal bound is given beside it")
    else:
        bandwidth = (f"device {device.name}: {device.bandwidth_gbps:g} GB/s memory bandwidth, nominal (no usable "
                     "figure in recipes/hardware.yaml), all of it taken as usable")
    bits = FORMATS[inputs.bits_source][1] if inputs.bits_source in FORMATS else f"{inputs.weight_bits:g} bits"
    if inputs.moe is None:
        weights = (f"weights: {inputs.active_params_b:g} B active parameters x {inputs.weight_bits:g} bits ({bits}) = "
                   f"{inputs.weight_bytes / 1e9:.3f} GB read once per target step for the whole batch (MoE: no "
                   "expert facts, so the experts a batch touches count as one token's active set, optimistic above "
                   "one token per step)")
    else:
        moe = inputs.moe
        shown = ", ".join(f"{moe.experts_read(t):.1f} at {t}" for t in (1, 2, 4, 6, 8))
        weights = (f"weights at {inputs.weight_bits:g} bits ({bits}): the dense part of {inputs.active_params_b:g} B "
                   f"active parameters once per step, and in each of {moe.layers} MoE layers the union of the routed "
                   f"experts ({moe.expert_params / 1e6:.2f} M parameters each) its tokens go to: "
                   f"{moe.experts} x (1 - (1 - {moe.per_token}/{moe.experts})^T) for T tokens through the target "
                   f"(independent routing assumed; experts per layer {shown} tokens), T = C x (K + 1) when drafting")
    return [
        bandwidth,
        weights,
        f"{kv}; {state}; context = mean prompt tokens + half the mean output",
        "batch = the concurrency (every sequence in every step); tokens per step per sequence = the measured "
        "acceptance length (1 without drafting); the draft model's own reads are not counted",
        "measured = mean per-request decode tok/s x C (time after the first token), else the table's tok/s",
    ]
