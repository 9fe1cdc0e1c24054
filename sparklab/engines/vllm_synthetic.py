"""vLLM's synthetic rejection sampling, checked before a start: the settings vLLM 0.27.1 validates at start-up
(exactly one of per-position rates or a mean length, rates in [0, 1] and not increasing, one per draft position),
and the CPU build that cannot run it unless the image carries sparklab's port (CPU_SYNTHETIC_SWITCH); the rates a
command sets, as vLLM derives them (synthetic_rates), and why such a run's answers are not the target's
(lossy_settings). The adapter, sparklab.engines.vllm, parses the command and delegates here.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from sparklab.engines.base import Finding, where
from sparklab.spec import Speculative

if TYPE_CHECKING:
    from sparklab.spec import LaunchSpec

# The image docker/vllm-cpu-synthetic reads this switch: with it, the CPU build runs synthetic rejection sampling
# (the stock CPU kernels assert it away, vllm/utils/cpu_triton_utils.py:348, :387).
CPU_SYNTHETIC_SWITCH = "SPARKLAB_VLLM_CPU_SYNTHETIC"


def check_synthetic(spec: LaunchSpec, sp: Speculative) -> list[Finding]:
    """Synthetic rejection sampling's settings as vLLM 0.27.1 checks them at start (vllm/config/speculative.py:
    250-281 and :1302-1317), before a model loads; and on a server without GPUs, the CPU build's kernels that
    assert it away unless the image carries the port (docker/vllm-cpu-synthetic, switched on by its variable)."""
    here = where(spec)
    options = sp.options
    rates, length = options.get("synthetic_acceptance_rates"), options.get("synthetic_acceptance_length")
    if options.get("rejection_sample_method") != "synthetic":
        if rates is not None or length is not None:
            return [Finding("error", f"{here}: synthetic_acceptance_rates / synthetic_acceptance_length are set but "
                                     "rejection_sample_method is not synthetic: vLLM refuses to start",
                            "Add --speculative_config.rejection_sample_method synthetic, or drop them.")]
        return []
    found: list[Finding] = []
    k = sp.num_speculative_tokens
    if (rates is None) == (length is None):
        found.append(Finding("error", f"{here}: rejection_sample_method synthetic needs exactly one of "
                                      "synthetic_acceptance_rates and synthetic_acceptance_length",
                             "Give per-position rates ([0.8, 0.6, ...], one per K) or a mean acceptance length."))
    elif rates is not None:
        values = rates if isinstance(rates, list) else None
        if values is None or not all(isinstance(r, (int, float)) and 0 <= r <= 1 for r in values):
            found.append(Finding("error", f"{here}: synthetic_acceptance_rates must be a list of numbers in [0, 1], "
                                          f"got {rates!r}", "Write it as JSON, e.g. [0.8, 0.6, 0.4]."))
        elif k is not None and len(values) != k:
            found.append(Finding("error", f"{here}: synthetic_acceptance_rates has {len(values)} entries for "
                                          f"num_speculative_tokens {k}: vLLM needs one per position",
                                 "Give one rate per draft position (a recipe: slice its list to K, "
                                 "rates[:num_speculative_tokens]), or list as many rates as the largest K."))
        elif any(b > a for a, b in itertools.pairwise(values)):
            found.append(Finding("error", f"{here}: synthetic_acceptance_rates must not increase (each is the "
                                          f"share of drafts whose first i tokens are all accepted), got {values}",
                                 "Make every rate at most the one before it."))
    elif not isinstance(length, (int, float)) or (k is not None and not 1 <= length <= k + 1):
        bound = f" = {k + 1}" if k else ""
        found.append(Finding("error", f"{here}: synthetic_acceptance_length must be a number from 1 to K+1{bound}, "
                                      f"got {length!r}", "Give a mean acceptance length."))
    if not spec.gpus and spec.env.get(CPU_SYNTHETIC_SWITCH) != "1":
        found.append(Finding(
            "error", f"{here}: synthetic rejection sampling does not run on vLLM 0.27.1's CPU build: its CPU "
                     "rejection kernels assert it away (vllm/utils/cpu_triton_utils.py:348, :387), so the engine "
                     "dies on the first request",
            f"Use the image docker/vllm-cpu-synthetic builds with {CPU_SYNTHETIC_SWITCH}=1 (recipes/cpu.yaml's engine "
            "vllm-cpu-synthetic), or a GPU image."))
    return found


def synthetic_rates(sp: Speculative | None) -> tuple[float, ...] | None:
    """speculative_config.rejection_sample_method synthetic (vLLM 0.27.1 vllm/config/speculative.py:217-237):
    synthetic_acceptance_rates as given (unconditional, per position), or synthetic_acceptance_length turned into
    rates as vLLM does (:239-247, the minimum-variance schedule)."""
    if sp is None or sp.options.get("rejection_sample_method") != "synthetic":
        return None
    rates = sp.options.get("synthetic_acceptance_rates")
    if isinstance(rates, list) and all(isinstance(r, (int, float)) for r in rates):
        return tuple(float(r) for r in rates)
    length, k = sp.options.get("synthetic_acceptance_length"), sp.num_speculative_tokens
    if isinstance(length, (int, float)) and k:
        drafts = float(length) - 1
        full = int(drafts)
        return tuple(([1.0] * full + [drafts - full] + [0.0] * (k - full - 1))[:k])
    return ()


def lossy_settings(sp: Speculative | None) -> list[str]:
    """Synthetic rejection sampling accepts a draft token with a fixed probability instead of testing it against
    the target's distribution (vLLM 0.27.1 vllm/config/speculative.py:78, :217-237, :1302-1317; the
    acceptance itself at vllm/v1/sample/rejection_sampler.py:752 and :814): a benchmarking device whose
    answers are not the target's."""
    method = (sp.options if sp else {}).get("rejection_sample_method")
    if method == "synthetic":
        return ["speculative_config.rejection_sample_method synthetic: draft tokens are accepted at a set rate "
                "without the target's test (vllm/config/speculative.py:217-237, "
                "vllm/v1/sample/rejection_sampler.py:752, :814), so the answers are not the target's"]
    if method not in (None, "standard", "block"):
        return [f"speculative_config.rejection_sample_method {method}: not a lossless verification vLLM 0.27.1 "
                "knows (standard, block; vllm/config/speculative.py:78)"]
    return []
