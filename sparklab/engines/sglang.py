"""SGLang: speculative flags, readiness endpoint, known startup deaths."""

from __future__ import annotations

import re
from collections.abc import Sequence

from sparklab.engines.base import EngineKnowledge, KnownFailure, Speculative, as_int, flag_value

# server_args.py's built-in speculative algorithms.
METHODS = frozenset({"EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK"})
NEEDS_DRAFT = frozenset({"EAGLE3", "STANDALONE", "DFLASH", "DSPARK"})


def speculative(argv: Sequence[str]) -> Speculative | None:
    algorithm = flag_value(argv, "--speculative-algorithm")
    if algorithm is None:
        return None
    upper = algorithm.upper()
    if upper == "DSPARK":
        k = as_int(flag_value(argv, "--speculative-dspark-block-size"))
    elif upper == "DFLASH":
        block = as_int(flag_value(argv, "--speculative-dflash-block-size"))
        k = block - 1 if block else None  # the DFlash block is the verify window, K + 1
    else:
        k = as_int(flag_value(argv, "--speculative-num-steps"))
    draft = flag_value(argv, "--speculative-draft-model-path") or flag_value(argv, "--speculative-draft-model")
    options = {}
    for flag in ("--speculative-eagle-topk", "--speculative-num-draft-tokens",
                 "--speculative-moe-runner-backend"):
        value = flag_value(argv, flag)
        if value is not None:
            options[flag.removeprefix("--speculative-").replace("-", "_")] = value
    return Speculative(method=upper, num_speculative_tokens=k, draft_model=draft, options=options)


def network_args(host: str, port: int) -> list[str]:
    return ["--host", host, "--port", str(port)]


def api_key_args(key: str) -> list[str]:
    return ["--api-key", key]


# SGLang 0.5.23 has no environment variable for its key: `api_key` is a command-line field
# (sglang/srt/arg_groups/fields/serving.py:160), the middleware reads it from the parsed server args
# (sglang/srt/entrypoints/http_server.py:2887-2897), and sglang/srt/environ.py names no such variable. The only
# other way in is `--config FILE.yaml` (sglang/srt/server_args.py:401 and 683), a file sparklab would have to
# write and mount; until it does, `up` says where the key is visible.
API_KEY_ON_COMMAND_LINE = (
    "SGLang reads its API key only from its command line (--api-key; no environment variable, see "
    "sglang/srt/arg_groups/fields/serving.py:160 and server_args.py in SGLang 0.5.23), so every local user can "
    "read the key with `ps`. On a shared host, treat the endpoint as open to local users.")


FAILURES = (
    KnownFailure(re.compile(r"out of memory|CUDA error: out of memory", re.IGNORECASE),
                 "the GPU ran out of memory: lower --mem-fraction-static or --context-length."),
    KnownFailure(re.compile(r"requires --speculative-dspark-block-size to be positive"),
                 "the DSpark block size must be a positive integer."),
)

KNOWLEDGE = EngineKnowledge(
    kind="sglang", ready_path="/health", ready_needs_key=False, api_key_env=None,
    methods=METHODS, speculative=speculative, network_args=network_args, api_key_args=api_key_args,
    failures=FAILURES,
)
