"""vLLM 0.27.1: speculative flags (JSON and dotted forms), readiness endpoint, known startup deaths."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from sparklab.engines.base import EngineKnowledge, KnownFailure, Speculative, _norm, as_int, json_or_text

# SpeculativeConfig's method Literal in vLLM 0.27.1 (vllm/config/speculative.py), per-model MTP aliases aside.
METHODS = frozenset({
    "ngram", "medusa", "mlp_speculator", "draft_model", "suffix", "custom_class", "eagle", "eagle3",
    "extract_hidden_states", "mtp", "dflash", "ngram_gpu", "dspark",
})
# Methods whose draft is a separate checkpoint that must be named (no fallback that works).
NEEDS_DRAFT = frozenset({"dflash", "dspark", "draft_model", "eagle", "eagle3", "medusa", "mlp_speculator"})
SPEC_MOE_BACKENDS = ("triton", "batched_triton", "flashinfer_trtllm", "flashinfer_cutlass", "aiter")
PARALLEL_DRAFTING_ERROR = (
    "ValueError: Model config must specify `dflash_config.mask_token_id`, `mask_token_id`, "
    "`dspark_noise_token_id`, `pard_token`, or `ptd_token_id` for parallel drafting."
)
_SPEC = "--speculative-config"


def speculative(argv: Sequence[str]) -> Speculative | None:
    """Merge `--speculative-config JSON` / `-sc JSON` and dotted `--speculative_config.KEY VALUE` like vLLM."""
    config: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, inline = arg.partition("=")
        norm = _norm(name)
        value: str | None = inline if eq else (argv[i + 1] if i + 1 < len(argv) else None)
        step = 1 if eq else 2
        if norm in (_SPEC, "-sc") and value is not None:
            parsed = json_or_text(value)
            if isinstance(parsed, dict):
                config.update(parsed)
            i += step
            continue
        if norm.startswith(_SPEC + ".") and value is not None:
            _set_dotted(config, norm[len(_SPEC) + 1:].split("."), json_or_text(value))
            i += step
            continue
        i += 1
    if not config:
        return None
    method = config.get("method")
    model = config.get("model")
    if method is None and isinstance(model, str):
        method = _infer_method(model)
    options = {k: v for k, v in config.items() if k not in ("method", "model", "num_speculative_tokens")}
    return Speculative(method=method, num_speculative_tokens=as_int(config.get("num_speculative_tokens")),
                       draft_model=model if isinstance(model, str) else None, options=options)


def _set_dotted(config: dict[str, Any], keys: list[str], value: Any) -> None:
    node = config
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = value


def _infer_method(model: str) -> str:
    """vLLM's own inference from the draft's name when no method is given."""
    lowered = model.lower()
    if model in ("ngram", "[ngram]"):
        return "ngram"
    for needle, method in (("eagle3", "eagle3"), ("eagle-", "eagle"), ("dflash", "dflash"), ("dspark", "dspark")):
        if needle in lowered:
            return method
    return "draft_model"


def network_args(host: str, port: int) -> list[str]:
    return ["--host", host, "--port", str(port)]


def api_key_args(_key: str) -> list[str]:
    return []  # vLLM reads VLLM_API_KEY, so the key never appears in argv


FAILURES = (
    KnownFailure(re.compile(r"for parallel drafting"),
                 "the speculative method needs a draft checkpoint with a mask token; vLLM fell back to the "
                 "target model. Name the draft with --speculative_config.model."),
    KnownFailure(re.compile(r"Insufficient space in /dev/shm"),
                 "/dev/shm is too small: run with ipc: host (the default) or set shm_size in the recipe."),
    KnownFailure(re.compile(r"CUDNN_STATUS_EXECUTION_FAILED|fp8_gemm_sm100"),
                 "the fp8 KV-cache path failed on this GPU (seen on GB10): try --set with a recipe "
                 "without --kv-cache-dtype fp8."),
    KnownFailure(re.compile(r"Free memory on device .* is less than desired GPU memory utilization"),
                 "not enough free memory for --gpu-memory-utilization; on GB10 page cache counts as used: "
                 "drop caches (sync; echo 3 > /proc/sys/vm/drop_caches) or lower the fraction."),
    KnownFailure(re.compile(r"does not allow any tokens to be scheduled"),
                 "the speculative slots exceed max_num_batched_tokens: raise --max-num-batched-tokens or "
                 "lower num_speculative_tokens / max_num_seqs."),
    KnownFailure(re.compile(r"Unsupported speculative method|unknown speculative method"),
                 "this vLLM build does not support the speculative method."),
)

KNOWLEDGE = EngineKnowledge(
    kind="vllm", ready_path="/v1/models", ready_needs_key=True, api_key_env="VLLM_API_KEY",
    methods=METHODS, speculative=speculative, network_args=network_args, api_key_args=api_key_args,
    failures=FAILURES,
)
