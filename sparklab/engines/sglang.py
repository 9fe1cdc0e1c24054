"""SGLang: speculative flags, preflight, its own parser, startup log, acceptance (log lines, /server_info), deaths.

Read from SGLang 0.5.23 (the wheel), the decode line also from 0.5.9, 0.5.12 and 0.5.16: KNOWLEDGE below.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sparklab.engines import parsers, sglang_lines
from sparklab.engines.argv import as_int, flag_value
from sparklab.engines.base import Acceptance, Engine, FatalLine, Finding, KnownFailure, RecipeView, check_k, where
from sparklab.engines.knowledge import Fact, Knowledge
from sparklab.engines.scrape import StartupFacts, parse_metrics, to_int
from sparklab.errors import EngineUnreachable as Unreachable
from sparklab.spec import Speculative

if TYPE_CHECKING:
    from sparklab.engines.api import EngineAPI, Replies
    from sparklab.records import Sampling
    from sparklab.spec import LaunchSpec

# server_args.py's built-in speculative algorithms.
METHODS = frozenset({"EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK"})
NEEDS_DRAFT = frozenset({"EAGLE3", "STANDALONE", "DFLASH", "DSPARK"})

# -- which versions this adapter's knowledge was read from (sparklab/engines/knowledge.py): each fact with its
# versions and its file:line in each. `sparklab check` and every start warn for an image outside them.
_S23 = ("0.5.23",)
KNOWLEDGE = Knowledge((
    Fact("command", "python3 -m sglang.launch_server / sglang serve", _S23,
         "srt/server_args.py:668-679 (prepare_server_args, prog 'sglang serve')"),
    Fact("flags", "every recipe flag (speculative, MoE runner, Mamba dtype, parsers)", _S23,
         "srt/arg_groups/fields/*.py (scripts/sglang-parser/README.md lists each file:line)"),
    Fact("flags", "--api-key only (no environment variable)", _S23, "srt/arg_groups/fields/serving.py:160"),
    Fact("readiness path", "GET /health (503 while starting)", _S23, "srt/entrypoints/http_server.py:721"),
    Fact("endpoints", "GET /server_info (version, internal_states), /flush_cache", _S23,
         "srt/entrypoints/http_server.py:863-890, :1025"),
    Fact("endpoints", "a streamed chat request with return_token_ids is refused with HTTP 400", _S23,
         "srt/entrypoints/openai/serving_chat.py:1315-1319, serving_base.py:123-128 (0.5.9 and 0.5.16 have no "
         "such field: entrypoints/openai/protocol.py)"),
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


# The startup lines sparklab reads, as SGLang 0.5.23 writes them (paths under sglang/srt/):
#   mem_cache/memory_pool.py:2087-2090 f"{cache_name} is allocated. dtype: {self.dtype}, #tokens: {num_tokens}, "
#       f"K size: {k:.2f} GB, V size: {v:.2f} GB" (cache_name "KV Cache"; a fused pool prints "KV size: X GB")
#   managers/scheduler.py:1268-1275 f"max_total_num_tokens={n}, chunked_prefill_size={n}, max_prefill_tokens={n}, "
#       f"max_running_requests={n}, context_len={n}, available_gpu_mem={x:.2f} GB" (available_cpu_mem on CPU)
#   model_executor/model_runner.py:1372-1378 f"Load weight end. elapsed={t:.2f} s, type={cls}, [quant, ]"
#       f"avail mem={x:.2f} GB, mem usage={y:.2f} GB."
#   entrypoints/http_server.py:2600 "The server is fired up and ready to roll!" (after the warm-up request)
_KV = re.compile(r"KV Cache is allocated\.(?: dtype: \S+,)? #tokens: ([\d,]+)")
_MAX_TOKENS = re.compile(r"max_total_num_tokens=(\d+)")
_MAX_RUNNING = re.compile(r"max_running_requests=(\d+)")
_CONTEXT = re.compile(r"context_len=(\d+)")
_LOAD_TIME = re.compile(r"Load weight end\..*?elapsed=([\d.]+) s")
_LOAD_MEM = re.compile(r"Load weight end\..*?mem usage=([\d.]+) GB")

# /metrics (only with --enable-metrics), SGLang 0.5.23 observability/metrics_collector.py: both counters grow
# when a request finishes (observe_one_finished_request, :2092-2112), so their difference over a window is the
# window's own: generated tokens / verify steps = the acceptance length of the requests finished in it, the
# per-request `spec_accept_length` of tokenizer_manager.py:3166 (completion_tokens / spec_verify_ct) pooled.
# /server_info's internal_states[0].avg_spec_accept_length, under this key in a snapshot
_CUMULATIVE = "sglang_avg_spec_accept_length"
GENERATION_TOKENS = "sglang:generation_tokens_total"  # metrics_collector.py:1860
VERIFY_CALLS = "sglang:spec_verify_calls_total"  # metrics_collector.py:1865 (incremented by spec_verify_ct)


_LEN_FACT, _RATE_FACT = KNOWLEDGE.in_area("acceptance lines")
_COUNTERS_FACT = KNOWLEDGE.in_area("acceptance counters")[0]
_INFO_FACT = KNOWLEDGE.in_area("endpoints")[0]


def _rate_holds(version: str | None) -> bool:
    """Whether `accept rate` is the share of draft tokens accepted in this version (0.5.12-0.5.23 as read; 0.5.9
    counted the bonus token). An unknown version keeps the rate: the report marks it by the run's version."""
    return version is None or bool(KNOWLEDGE.holds(_RATE_FACT, version))


def log_acceptance(text: str, version: str | None = None) -> dict[str, Any] | None:
    """SGLang's decode log lines of the window: acceptance length (incl. the bonus token) and rate.

    Each line states its own stretch of decode iterations; their verify-step counts are not printed, so the
    lines are pooled weighted by #running-req (the batch size when the line was written). The rate is left out
    for a version whose `accept rate` means something else, or nobody read (KNOWLEDGE)."""
    found = sglang_lines.pooled(text)
    if found is None:
        return None
    if found["rate"] is not None and not _rate_holds(version):
        found["rate"] = None
        found["rate_left_out"] = (f"SGLang {version}'s `accept rate` is not known to be the share of draft tokens "
                                  f"accepted (read so in 0.5.12-0.5.23; 0.5.9 counted the bonus token)")
    return found


def metrics_window(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any] | None:
    """Acceptance length over the window from /metrics counter differences (None without --enable-metrics)."""
    b, a = before.get("sglang_metrics") or {}, after.get("sglang_metrics") or {}
    if any(m.get(k) is None for m in (a, b) for k in ("generation_tokens", "verify_calls")):
        return None
    steps = a["verify_calls"] - b["verify_calls"]
    tokens = a["generation_tokens"] - b["generation_tokens"]
    if steps <= 0:
        return None
    return {"acceptance_length": tokens / steps, "acceptance_rate": None, "verify_steps": steps,
            "generated_tokens": tokens,
            "source": f"SGLang /metrics over the window: {GENERATION_TOKENS} / {VERIFY_CALLS} differences"}


class SGLang(Engine):
    kind = "sglang"
    multinode = True  # its own --nnodes mode (node_command)
    ready_path = "/health"
    ready_needs_key = False
    ready_line = re.compile(r"The server is fired up and ready to roll!")
    label = "SGLang"
    name = "SGLang"
    knowledge = KNOWLEDGE
    # SGLang can return input-token log-probabilities (/generate with return_logprob and logprob_start_len,
    # sglang/srt/managers/io_struct.py:233 in 0.5.23); sparklab does not drive it yet (no SGLang server here to
    # test against), so its sampled answers are "not checkable" rather than checked untested.
    scoring_unsupported = ("sparklab does not score answers on SGLang yet (its /generate return_logprob with "
                           "logprob_start_len could; untested here)")
    memory_fraction_flag = "--mem-fraction-static"
    # sglang 0.5.23 leaves pre_model_load_memory x (1 - mem_fraction_static) free, i.e. the fraction is of the
    # memory free before its model load (srt/model_executor/model_runner_components/kv_pool_runtime.py:75-77);
    # the draft runners' pools are resized with the target's (kv_pool_runtime.py:59-62): the drafter is inside it
    memory_fraction_of = "free"
    method_noun = "speculative algorithm"
    api_key_env = None  # SGLang reads its key only from --api-key (see README: security)
    api_key_warning = API_KEY_ON_COMMAND_LINE
    methods = METHODS
    failures = FAILURES
    fatal_lines = FATAL_LINES
    reads_log_acceptance = True

    def speculative(self, argv: Sequence[str]) -> Speculative | None:
        return speculative(argv)

    def request_sampling(self, sampling: Sampling) -> Sampling:
        """No vLLM `return_token_ids`: SGLang 0.5.23 refuses it on a streamed chat request with HTTP 400 (KNOWLEDGE,
        "endpoints"), and earlier versions ignore it. Tokens per chunk then come from the stream and usage."""
        return dataclasses.replace(sampling, token_ids=False)

    def api_key_args(self, key: str) -> list[str]:
        return ["--api-key", key]

    def node_command(self, entrypoint: Sequence[str], argv: Sequence[str], rank: int, nodes: int, head: str,
                     cluster_port: int, address: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """SGLang's own multi-node mode: every node runs launch_server with --nnodes, its --node-rank and the
        head's --dist-init-addr (SGLang 0.5.23 sglang/srt/arg_groups/fields/parallel.py:32-44); only rank 0 serves
        HTTP: a node of rank >= 1 returns from launch_server once its schedulers exit (entrypoints/
        http_server.py:3163-3165) and runs no tokenizer (entrypoints/engine.py:1234-1235)."""
        return tuple(entrypoint), (*argv, "--nnodes", str(nodes), "--node-rank", str(rank),
                                   "--dist-init-addr", f"{head}:{cluster_port}")

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

    def check_speculative(self, spec: LaunchSpec, recipe: RecipeView, sp: Speculative) -> list[Finding]:
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

    counter_paths = ("/server_info", "/metrics")

    def read_counters(self, replies: Replies) -> dict[str, Any]:
        """/server_info's avg_spec_accept_length (cumulative: kept as a last resort) and, with --enable-metrics,
        the /metrics counters whose differences give the window's acceptance length."""
        snap: dict[str, Any] = {}
        try:
            answer = replies.get("/server_info")
            if answer.status == 200:
                states = answer.json().get("internal_states") or [{}]
                snap[_CUMULATIVE] = states[0].get("avg_spec_accept_length")
        except (Unreachable, ValueError, AttributeError, IndexError):
            pass
        try:
            answer = replies.get("/metrics")  # 404 without --enable-metrics
            if answer.status == 200:
                values = parse_metrics(answer.text)
                snap["sglang_metrics"] = {"generation_tokens": values.get(GENERATION_TOKENS),
                                          "verify_calls": values.get(VERIFY_CALLS)}
        except (Unreachable, ValueError):
            pass
        return snap

    def window(self, before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
        found = metrics_window(before, after)
        return {"speculative": found} if found else {}

    def log_acceptance(self, text: str, version: str | None = None) -> dict[str, Any] | None:
        return log_acceptance(text, version)

    def acceptance(self, result: dict[str, Any]) -> Acceptance | None:
        """Per window first: /metrics differences (exact for the requests finished in the window), then the
        window's decode log lines; /server_info's cumulative average only when neither exists."""
        spec = result.get("speculative") or {}
        if spec.get("verify_steps") and spec.get("acceptance_length") is not None:
            return float(spec["acceptance_length"]), str(spec["source"])
        log = result.get("speculative_log") or {}
        if log.get("mean") is not None:
            return float(log["mean"]), "SGLang decode log lines in the window (accept len, weighted by #running-req)"
        info = self.cumulative_acceptance((result.get("server") or {}).get("after") or {})
        if info is not None:
            return info[0], f"{info[1]} (cumulative since start or /flush_cache)"
        return None

    def cumulative_acceptance(self, snapshot: dict[str, Any]) -> Acceptance | None:
        value = snapshot.get(_CUMULATIVE)
        return None if value is None else (float(value), "SGLang /server_info avg_spec_accept_length")

    def acceptance_rate(self, result: dict[str, Any]) -> float | None:
        """The window's decode log lines' `accept rate` (SGLang's counters carry no draft counts)."""
        log = result.get("speculative_log") or {}
        return None if log.get("rate") is None else float(log["rate"])

    def acceptance_fact(self, result: dict[str, Any]) -> Fact | None:
        spec = result.get("speculative") or {}
        if spec.get("verify_steps") and spec.get("acceptance_length") is not None:
            return _COUNTERS_FACT
        if (result.get("speculative_log") or {}).get("mean") is not None:
            return _LEN_FACT
        return _INFO_FACT if self.acceptance(result) is not None else None

    def version(self, api: EngineAPI) -> str | None:
        """GET /server_info's `version` (sglang.version.__version__, http_server.py:888 in 0.5.23)."""
        try:
            answer = api.get("/server_info")
            value = answer.json().get("version") if answer.status == 200 else None
            return str(value) if value else None
        except (Unreachable, ValueError, AttributeError):
            return None

    def parser_probe(self, specs: Sequence[LaunchSpec]) -> parsers.Probe | str:
        """SGLang's own prepare_server_args (what launch_server calls) in the image (probes/sglang_args.py: the
        parser contract test's code), plus the algorithm name and DSpark block-size rules it leaves to start-up."""
        cases = []
        for i, spec in enumerate(specs):
            argv = parsers.key_free(parsers.command_of(spec))
            if argv[:2] == ["-m", "sglang.launch_server"]:
                argv = argv[2:]
            elif spec.entrypoint[0].rsplit("/", 1)[-1] == "sglang" and argv[:1] == ["serve"]:
                argv = argv[1:]
            else:
                return (f"the command runs {' '.join([*spec.entrypoint, *argv[:2]])} …, not `python3 -m "
                        f"sglang.launch_server` or `sglang serve`: sparklab knows only SGLang's server parser")
            cases.append({"id": str(i), "argv": argv})
        return parsers.python_probe("sglang", specs[0].entrypoint[0], "sglang_args.py", cases)

    def parser_verdicts(self, specs: Sequence[LaunchSpec], run: parsers.ProbeRun) -> list[parsers.Verdict]:
        return parsers.case_verdicts(run, len(specs), _PARSER, "sglang_version")

    def reset_prefix_cache(self, api: EngineAPI) -> None:
        with contextlib.suppress(Unreachable):
            api.post("/flush_cache")  # also resets /server_info's cumulative acceptance (while idle)


_PARSER = ("SGLang's prepare_server_args (launch_server's parser), SpeculativeAlgorithm.from_string and the DSpark "
           "block-size rule (no device, no model)")

ENGINE = SGLang()
