"""SGLang: speculative flags, preflight, startup log, acceptance (log lines, /server_info), known deaths."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sparklab.engines.base import (
    Acceptance,
    Engine,
    FatalLine,
    Finding,
    KnownFailure,
    Speculative,
    as_int,
    check_k,
    flag_value,
    where,
)
from sparklab.errors import EngineUnreachable as Unreachable
from sparklab.scrape import StartupFacts, to_int

if TYPE_CHECKING:
    from sparklab.engine_api import EngineAPI
    from sparklab.recipes import Recipe
    from sparklab.render import LaunchSpec

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

# Lines after which SGLang cannot serve, though its HTTP server may run on. The strings are SGLang 0.5.23's own
# (`pip download --no-deps sglang==0.5.23`; file:line of the string under python/sglang/srt/).
FATAL_LINES = (
    # managers/scheduler.py:6372 f"Scheduler hit an exception: {traceback}", then SIGQUIT to the parent;
    # managers/detokenizer_manager.py:566, managers/tokenizer_manager.py:4043,
    # managers/data_parallel_controller.py:1011, managers/multi_tokenizer_mixin.py:833 and :945 alike
    FatalLine(re.compile(r"(Scheduler|DetokenizerManager|TokenizerManager|DataParallelController|"
                         r"MultiDetokenizerRouter|MultiTokenizerRouter) hit an exception"),
              "an SGLang process died (scheduler, tokenizer or detokenizer)"),
    # entrypoints/engine.py:1978 "Received sigquit from a child process. It usually means the child failed."
    FatalLine(re.compile(r"Received sigquit from a child process"), "an SGLang child process failed while starting"),
    # managers/tokenizer_manager.py:4074 f"SIGQUIT received. {signum=}, {frame=}. It usually means one child failed."
    FatalLine(re.compile(r"SIGQUIT received\..*It usually means one child failed"),
              "an SGLang child process failed while serving"),
    # utils/watchdog.py:217 f"Subprocess {name} (pid={proc.pid}) crashed with exit code {proc.exitcode}. ..."
    FatalLine(re.compile(r"Subprocess \S+ \(pid=\d+\) crashed with exit code"), "an SGLang subprocess crashed"),
    # utils/watchdog.py:154 f"{self.debug_name} watchdog timeout ({self.watchdog_timeout=}, {self.soft=})";
    # only soft=False ends the server (it then sends SIGQUIT)
    FatalLine(re.compile(r"watchdog timeout \(self\.watchdog_timeout=[\d.]+, self\.soft=False\)"),
              "SGLang's watchdog found its scheduler hung"),
)


_KV = re.compile(r"KV Cache is allocated\. #tokens: ([\d,]+)")
_MAX_TOKENS = re.compile(r"max_total_num_tokens=(\d+)")
_MAX_RUNNING = re.compile(r"max_running_requests=(\d+)")
_CONTEXT = re.compile(r"context_len=(\d+)")
_LOAD_TIME = re.compile(r"Load weight end\..*?elapsed=([\d.]+) s")
_LOAD_MEM = re.compile(r"Load weight end\..*?mem usage=([\d.]+) GB")
_ACCEPT_LEN = re.compile(r"accept len: ([\d.]+)")


def log_acceptance(text: str) -> dict[str, Any] | None:
    """SGLang's per-batch `accept len: X` log lines (acceptance length incl. the bonus token), summarised."""
    values = [float(v) for v in _ACCEPT_LEN.findall(text)]
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return {"samples": len(values), "median": median, "mean": sum(values) / len(values), "max": ordered[-1],
            "source": "SGLang decode log lines 'accept len: X' within the window (per batch, not per token)"}


class SGLang(Engine):
    kind = "sglang"
    ready_path = "/health"
    ready_needs_key = False
    ready_line = re.compile(r"The server is fired up and ready to roll!")
    label = "SGLang"
    memory_fraction_flag = "--mem-fraction-static"
    method_noun = "speculative algorithm"
    api_key_env = None  # SGLang reads its key only from --api-key (see README: security)
    api_key_warning = API_KEY_ON_COMMAND_LINE
    methods = METHODS
    failures = FAILURES
    fatal_lines = FATAL_LINES
    reads_log_acceptance = True

    def speculative(self, argv: Sequence[str]) -> Speculative | None:
        return speculative(argv)

    def api_key_args(self, key: str) -> list[str]:
        return ["--api-key", key]

    def cache_env(self, target: str) -> dict[str, str]:
        # SGLang 0.5.23 sglang/srt/environ.py:1383 (else ~/.cache/sglang): its DeepGEMM, CuTe AOT and JIT kernel
        # caches live under it (environ.py:1373, 1387; sglang/kernels/jit/utils/compile/cache.py:318 falls back
        # to ~/.cache/sglang/jit, so SGLANG_JIT_CACHE_DIR is set too). SGLang would point Triton, Inductor and
        # FlashInfer under it only with setdefault (environ.py:2309-2337); sparklab sets them explicitly.
        return {"SGLANG_CACHE_DIR": f"{target}/sglang", "SGLANG_JIT_CACHE_DIR": f"{target}/sglang/jit",
                **super().cache_env(target)}

    def method_hint(self, method: str) -> str:
        if method.lower() == "mtp":
            return " SGLang runs a model's built-in MTP layers through its EAGLE worker: use method eagle."
        return ""

    def check_speculative(self, spec: LaunchSpec, recipe: Recipe, sp: Speculative) -> list[Finding]:
        here = where(spec)
        found: list[Finding] = []
        if sp.method in NEEDS_DRAFT and not sp.draft_model:
            found.append(Finding(
                "error", f"{here}: --speculative-algorithm {sp.method} needs --speculative-draft-model-path",
                "Add --speculative-draft-model-path <draft checkpoint>."))
        flag = "--speculative-dspark-block-size" if sp.method == "DSPARK" else "--speculative-num-steps"
        if sp.method in ("DSPARK", "EAGLE", "EAGLE3", "NEXTN") and sp.num_speculative_tokens is not None:
            found += check_k(spec, recipe, sp.num_speculative_tokens, flag)
        return found

    def read_startup(self, text: str, facts: StartupFacts) -> None:
        if m := _KV.search(text):
            facts.kv_cache_tokens = to_int(m.group(1))
        elif m := _MAX_TOKENS.search(text):
            facts.kv_cache_tokens = int(m.group(1))
        if (m := _MAX_RUNNING.search(text)) is not None:
            facts.max_concurrency = float(m.group(1))
            if c := _CONTEXT.search(text):
                facts.concurrency_tokens_per_request = int(c.group(1))
        if m := _LOAD_TIME.search(text):
            facts.model_load_seconds = float(m.group(1))
        if m := _LOAD_MEM.search(text):
            facts.model_load_gib = float(m.group(1))

    def snapshot(self, api: EngineAPI) -> dict[str, Any]:
        """/server_info's internal_states[0].avg_spec_accept_length (cumulative over the server's life)."""
        try:
            answer = api.get("/server_info")
            if answer.status == 200:
                states = answer.json().get("internal_states") or [{}]
                return {"sglang_avg_spec_accept_length": states[0].get("avg_spec_accept_length")}
        except (Unreachable, ValueError, AttributeError, IndexError):
            pass
        return {}

    def log_acceptance(self, text: str) -> dict[str, Any] | None:
        return log_acceptance(text)

    def acceptance(self, result: dict[str, Any]) -> Acceptance | None:
        log = result.get("speculative_log") or {}
        if log.get("mean") is not None:
            return float(log["mean"]), "SGLang `accept len` log lines in the window (mean over batches)"
        info = ((result.get("server") or {}).get("after") or {}).get("sglang_avg_spec_accept_length")
        if info is not None:
            return float(info), "SGLang /server_info avg_spec_accept_length after the window"
        return None

    def reset_prefix_cache(self, api: EngineAPI) -> None:
        with contextlib.suppress(Unreachable):
            api.post("/flush_cache")  # also resets /server_info's cumulative acceptance (while idle)


ENGINE = SGLang()
