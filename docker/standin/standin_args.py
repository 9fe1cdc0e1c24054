"""Lenient argv parsing for the sparklab stand-in engine (vLLM `serve` and SGLang `launch_server` flags).

Known flags are interpreted; everything else is accepted, recorded in Config.unknown and ignored.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any


def names(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Flags that never take a value (so `--enforce-eager some/model` keeps the model positional).
BOOL_FLAGS = names(
    """enforce-eager trust-remote-code enable-prefix-caching enable-chunked-prefill enable-metrics
    enable-auto-tool-choice disable-log-requests disable-log-stats enable-log-requests disable-radix-cache
    disable-cuda-graph skip-server-warmup async-scheduling skip-tokenizer-init disable-overlap-schedule
    enable-torch-compile headless speculative-adaptive enable-lora enable-context-reuse enable-in-flight-batching
    clear-engine-cache"""
)
SGLANG_SPEC_KEYS = names(
    """speculative-algorithm speculative-draft-model-path speculative-draft-model speculative-num-steps
    speculative-num-draft-tokens speculative-dspark-block-size speculative-dflash-block-size
    speculative-eagle-topk"""
)
KNOWN = SGLANG_SPEC_KEYS | names(
    """host port model model-path served-model-name max-model-len context-length api-key speculative-config
    max-num-batched-tokens enable-metrics max-batch-size max-input-len max-kv-cache-capacity reasoning-parser
    tensor-parallel-size pipeline-parallel-size distributed-executor-backend nnodes node-rank dist-init-addr"""
)


def decode(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return value


@dataclass
class Spec:
    method: str
    model: str | None
    k: int


@dataclass
class Config:
    mode: str  # "vllm" | "sglang" | "trtedge"
    argv: list[str]
    model: str = "standin-model"
    served_names: list[str] = field(default_factory=list)
    host: str = "0.0.0.0"
    port: int = 8000
    max_len: int = 2048
    max_batched: int = 2048
    api_key: str | None = None
    spec: Spec | None = None
    spec_raw: dict[str, Any] = field(default_factory=dict)
    opts: dict[str, Any] = field(default_factory=dict)
    unknown: list[str] = field(default_factory=list)


def parse_args(mode: str, argv: list[str]) -> Config:
    """Lenient parse: known flags are interpreted, anything else is recorded and ignored."""
    cfg = Config(mode=mode, argv=list(argv), port=30000 if mode == "sglang" else 8000)
    args = list(argv[1:] if mode in ("vllm", "trtedge") and argv[:1] == ["serve"] else argv)
    positional: list[str] = []
    i = 0
    while i < len(args):
        tok = args[i]
        i += 1
        if not tok.startswith("-") or tok == "-":
            positional.append(tok)
            continue
        name, eq, value = tok.lstrip("-").partition("=")
        head, dot, sub = name.partition(".")
        key = "speculative-config" if head in ("sc",) else head.replace("_", "-")
        takes_value = not (key in BOOL_FLAGS or key.startswith("no-"))
        values: list[str] = [value] if eq else []
        if not eq and takes_value:
            while i < len(args) and not args[i].startswith("-"):
                values.append(args[i])
                i += 1
                if key != "served-model-name":
                    break
        if dot and key == "speculative-config":
            cfg.spec_raw[sub.replace("-", "_")] = decode(values[0]) if values else True
        elif key == "speculative-config" and values:
            loaded = decode(values[0])
            cfg.spec_raw.update(loaded if isinstance(loaded, dict) else {})
        elif key == "served-model-name":
            cfg.served_names = values
        else:
            cfg.opts[key] = values[0] if values else True
        if key not in KNOWN:
            cfg.unknown.append(tok.split("=", 1)[0])
    if cfg.opts.get("api-key") is True:  # `--api-key -Xy…`: argparse reads the value as a flag and refuses (vLLM
        # 0.27.1 vllm/entrypoints/openai/cli_args.py:283 and SGLang 0.5.23 srt/arg_groups/fields/serving.py:160, both
        # run here); before, the stand-in served with no key and every request got 401
        raise SystemExit(f"{mode}: error: argument --api-key: expected one argument")
    cfg.model = str(cfg.opts.get("model") or cfg.opts.get("model-path") or (positional or [cfg.model])[0])
    if (mode != "sglang" and len(positional) > 1) or (mode == "sglang" and positional):
        cfg.unknown += positional[0 if mode == "sglang" else 1 :]
    cfg.served_names = cfg.served_names or [cfg.model]
    cfg.host = str(cfg.opts.get("host", cfg.host))
    cfg.port = int(cfg.opts.get("port", cfg.port))
    cfg.max_len = int(cfg.opts.get("max-model-len") or cfg.opts.get("context-length")
                      or cfg.opts.get("max-kv-cache-capacity") or (8192 if mode == "trtedge" else cfg.max_len))
    cfg.max_batched = int(cfg.opts.get("max-num-batched-tokens", cfg.max_batched))
    key = cfg.opts.get("api-key") or (os.environ.get("VLLM_API_KEY") if mode == "vllm" else None)
    cfg.api_key = str(key) if key else None
    # Edge-LLM's --speculative-config has vLLM's keys (experimental/server/config.py:66 in tensorrt-edgellm 0.11.0)
    cfg.spec = sglang_spec(cfg.opts) if mode == "sglang" else vllm_spec(cfg.spec_raw)
    return cfg


def vllm_spec(raw: dict[str, Any]) -> Spec | None:
    if not raw:
        return None
    k = int(raw.get("num_speculative_tokens") or 1)
    return Spec(str(raw.get("method", "draft_model" if raw.get("model") else "ngram")), raw.get("model"), k)


def sglang_spec(opts: dict[str, Any]) -> Spec | None:
    algo = opts.get("speculative-algorithm")
    if not algo:
        return None
    if opts.get("speculative-dspark-block-size"):
        k = int(opts["speculative-dspark-block-size"])
    elif opts.get("speculative-num-draft-tokens"):
        k = max(1, int(opts["speculative-num-draft-tokens"]) - 1)
    else:
        k = int(opts.get("speculative-num-steps") or 3)
    draft = opts.get("speculative-draft-model-path") or opts.get("speculative-draft-model")
    return Spec(str(algo), str(draft) if draft else None, k)
