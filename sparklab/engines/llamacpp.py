"""llama.cpp's llama-server: speculative flags, preflight, startup log, /metrics acceptance, known deaths.

What this module knows was read off the real server, Debian sid's llama.cpp-tools 1:0.7.0+dfsg-2 =
upstream build b11669 (`llama-server --version`: "0.7.0 (build 11669, commit Debian)"), the engine of the
CPU tier (docker/llamacpp-cpu/build.sh), and off llama.cpp's source on GitHub (ggml-org/llama.cpp); strings
are quoted so they can be found with grep in either. Line numbers at tag b11669 could not be pinned: the
repository (1.47 GB) is over the 500 MiB a snapshot may have here, the source index holds one later version per
file (server-http.cpp at commit 00dd081, server-context.cpp at 001d906), and Debian's mirror does not serve the
package's source; so the strings are the citation:
- flags: common/arg.cpp (`llama-server --help` prints the same table; tests/e2e parses it). The speculative
  flags were renamed in 2026: `--spec-type`, `--spec-draft-model` (alias `-md`, `--model-draft`),
  `--spec-draft-n-max`, `--spec-draft-n-min`, `--spec-draft-p-min` (alias `--draft-p-min`). The old
  `--draft-max`/`--draft`/`--draft-n` and `--draft-min`/`--draft-n-min` now print "the argument has been
  removed" and stop the server.
- /health: 503 `{"error": {"message": "Loading model", ...}}` while loading, 200 `{"status": "ok"}` when
  ready, and public (no API key), tools/server/server.cpp.
- /metrics, only with `--metrics` (env LLAMA_ARG_ENDPOINT_METRICS): counters
  `llamacpp:spec_decode_num_drafts_total`, `..._num_draft_tokens_total`, `..._num_accepted_tokens_total`
  and `llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="i"}`
  (`server_task_result_metrics`, tools/server/server-task.cpp: "Speculative: Total speculative decoding
  verification steps"), the same shape as vLLM's, so acceptance length = 1 + accepted / drafts.
- per response: `timings.draft_n` and `timings.draft_n_accepted` (drafted and accepted tokens of that
  request, server-task.cpp `result_timings::to_json`), in the last chunk of a stream.
- /props: `build_info` ("b11669-Debian"), `total_slots`.
- the API key: `--api-key` or env LLAMA_API_KEY (common/arg.cpp), so the key stays out of argv.
- keep-alive: a streamed response carries `Keep-Alive: timeout=5, max=100` and no `Connection: close`, yet the
  server closes the connection right after the chunked body's last chunk. Measured on b11669 with a raw socket
  (3 of 3 connections: recv() gave EOF 0.000 s after `0\r\n\r\n`). The source says why:
  tools/server/server-http.cpp process_handler_response's `chunked_content_provider` calls `sink.done()` and
  then `return has_next;`, false after the last chunk, and
  cpp-httplib's write_content_chunked treats a false return as a failed write, which ends its keep-alive loop.
  So `keeps_streamed_connections = False`: bench opens one connection per request (none is sent into a closing
  socket and resent).
- prompt cache: a slot keeps its prompt's KV cache, and with `--cache-ram` (env LLAMA_ARG_CACHE_RAM, default
  8192 MiB) idle slots' prompts also go to a RAM cache a later request restores from. POST
  /slots/{id}?action=erase empties a slot, only with `--slot-save-path` (env LLAMA_ARG_SLOT_SAVE_PATH; else 501
  "This server does not support slots action. Start it with `--slot-save-path`"), and leaves the RAM cache:
  measured on b11669, prompt A, prompt B, erase, prompt A again reused 53 of 54 tokens; with
  LLAMA_ARG_CACHE_RAM=0 as well, 0. A sweep sets both (`sweep_env`). /metrics counts the window's prompt
  tokens: `llamacpp:prompt_tokens_total` ("processed, excluding cached tokens") and
  `llamacpp:prompt_tokens_cached_total` ("reused from the cache"); a response's `timings.cache_n` and
  `usage.prompt_tokens_details.cached_tokens` say the same per request.
- GET /v1/models: `data[0].meta` = {n_params, size (the weights' bytes), ftype ("Q4_1")}.
- log lines: common/log.cpp stamps each line "M.SS.mmm.uuu L " (minutes, seconds, ms, us since start).
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sparklab.engines import llamacpp_help, parsers, scrape
from sparklab.engines.argv import as_int, flag_value, flag_values
from sparklab.engines.base import Acceptance, Engine, FatalLine, Finding, KnownFailure, RecipeView, where
from sparklab.engines.counters import spec_delta
from sparklab.engines.knowledge import Fact, Knowledge
from sparklab.engines.scrape import StartupFacts
from sparklab.errors import EngineUnreachable as Unreachable
from sparklab.spec import Speculative

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sparklab.engines.api import EngineAPI, Replies
    from sparklab.spec import LaunchSpec

log = logging.getLogger(__name__)

BUILD = "b11669"
# `--spec-type`'s choices in build b11669 (`llama-server --help`).
METHODS = frozenset({
    "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark",
    "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache",
})
# Types that draft with a second model, named by --spec-draft-model. Without one the server logs "failed to
# initialize speculative decoding context: draft-simple requires a draft context" and serves WITHOUT drafting.
NEEDS_DRAFT = frozenset({"draft-simple", "draft-eagle3", "draft-dflash", "draft-dspark"})
DRAFT_FLAGS = ("--spec-draft-model", "-md", "--model-draft", "--spec-draft-hf", "-hfd", "-hfrd", "--hf-repo-draft")
K_FLAG = "--spec-draft-n-max"
DEFAULT_K = 3  # "--spec-draft-n-max N ... (default: 3)"
# Flags b11669 prints as "the argument has been removed", with what replaced them.
REMOVED = {
    "--draft-max": K_FLAG, "--draft": K_FLAG, "--draft-n": K_FLAG,
    "--draft-min": "--spec-draft-n-min", "--draft-n-min": "--spec-draft-n-min",
    "--spec-ngram-size-n": "--spec-ngram-<type>-size-n", "--spec-ngram-size-m": "--spec-ngram-<type>-size-m",
    "--spec-ngram-min-hits": "--spec-ngram-<type>-min-hits",
}


def spec_types(argv: Sequence[str]) -> list[str]:
    """`--spec-type a,b` (comma-separated; the last flag wins, as with every llama.cpp option)."""
    value = flag_value(argv, "--spec-type")
    return [t.strip() for t in value.split(",") if t.strip() and t.strip() != "none"] if value else []


def draft_model(argv: Sequence[str]) -> str | None:
    found = [v for flag in DRAFT_FLAGS for v in flag_values(argv, flag)]
    return found[-1] if found else None


def speculative(argv: Sequence[str]) -> Speculative | None:
    types = spec_types(argv)
    if not types:
        return None
    k = as_int(flag_value(argv, K_FLAG))
    if k is None and not any(t.startswith("ngram") for t in types):
        k = DEFAULT_K
    options = {}
    for flag in ("--spec-draft-n-min", "--spec-draft-p-min", "--draft-p-min", "--spec-draft-p-split",
                 "--spec-draft-ngl", "--spec-ngram-mod-n-max"):
        value = flag_value(argv, flag)
        if value is not None:
            options[flag.lstrip("-").replace("-", "_")] = value
    return Speculative(method=",".join(types), num_speculative_tokens=k, draft_model=draft_model(argv),
                       options=options)


FAILURES = (
    # gguf_init_from_file: "failed to open GGUF file '%s' (%s)"
    KnownFailure(re.compile(r"failed to open GGUF file"),
                 "llama-server cannot open the GGUF file: check the -m/--model path and that its directory is "
                 "mounted in the container."),
    # common/arg.cpp: "error: invalid argument: %s"
    KnownFailure(re.compile(r"error: invalid argument: (\S+)"),
                 "llama-server does not know one of the recipe's flags (this build's `llama-server --help` "
                 "lists them; the speculative flags were renamed to --spec-*)."),
    KnownFailure(re.compile(r"the argument has been removed"),
                 "the recipe uses a removed llama.cpp flag: --draft-max is now --spec-draft-n-max, "
                 "--draft-min is --spec-draft-n-min."),
    # ggml-cuda: "cudaMalloc failed: out of memory"; llama_context: "failed to allocate compute buffers"
    KnownFailure(re.compile(r"cudaMalloc failed: out of memory|failed to allocate|out of memory", re.IGNORECASE),
                 "llama.cpp ran out of memory: lower -c/--ctx-size or -np/--parallel, or offload fewer layers "
                 "(-ngl)."),
)

# llama-server is one process: a fatal error ends it, so these lines mostly name why the container exited.
FATAL_LINES = (
    # tools/server/server.cpp: LOG_ERR("%s: exiting due to model loading error\n", __func__)
    FatalLine(re.compile(r"exiting due to model loading error"), "llama-server could not load the model"),
    # ggml/src/ggml.c ggml_abort: "%s:%d: GGML_ASSERT(%s) failed" / "GGML_ABORT"
    FatalLine(re.compile(r"GGML_ASSERT\(.*\) failed|: GGML_ABORT"), "llama.cpp aborted (a ggml assertion)"),
)

_STAMP = r"^(\d+)\.(\d\d)\.(\d{3})\.(\d{3}) "
# tools/server/server-context.cpp load_model: "initializing, n_slots = %d, n_ctx_slot = %d, kv_unified = '%s'"
_SLOTS = re.compile(r"n_slots = (\d+), n_ctx_slot = (\d+)(?:, kv_unified = '(true|false)')?")
_LOADING = re.compile(_STAMP + r".*load_model: loading model ", re.MULTILINE)
_LOADED = re.compile(_STAMP + r".*(?:llama_server|main): model loaded", re.MULTILINE)
_NO_SPEC = re.compile(r"failed to initialize speculative decoding context: (.*)")


def _stamp(m: re.Match[str]) -> float:
    minutes, seconds, ms, us = (int(g) for g in m.groups()[:4])
    return minutes * 60 + seconds + ms / 1e3 + us / 1e6


_COUNTERS = {
    "llamacpp:spec_decode_num_drafts_total": "drafts",
    "llamacpp:spec_decode_num_draft_tokens_total": "draft_tokens",
    "llamacpp:spec_decode_num_accepted_tokens_total": "accepted",
}
_PER_POSITION = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"
_PROMPT = ("llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total")  # processed, reused from cache
# The `source` of a window's acceptance from these counters; stored results are known as llama.cpp's by it, word
# for word (vLLM's counters have the same shape and their own source), so it is never reworded.
METRICS_SOURCE = ("llamacpp:spec_decode_* counters from /metrics (needs --metrics), after warmup and after "
                  "the window (delta)")


def spec_counters(text: str) -> dict[str, Any]:
    """llama.cpp's speculative counters; empty when the server has drafted nothing yet or has no --metrics."""
    return scrape.spec_counters(text, _COUNTERS, _PER_POSITION)


def prompt_counters(text: str) -> dict[str, float]:
    """The prompt-token counters (processed, reused from the cache); empty when the server has none."""
    values = scrape.parse_metrics(text)
    return {name: values[name] for name in _PROMPT if name in values}


def prefix_cache(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any] | None:
    """Prompt tokens over the window: all of them (processed + reused) and those reused from the prompt cache."""
    a, b = before.get("llamacpp_prompt") or {}, after.get("llamacpp_prompt") or {}
    if _PROMPT[1] not in b:
        return None
    processed = b.get(_PROMPT[0], 0.0) - a.get(_PROMPT[0], 0.0)
    hits = b[_PROMPT[1]] - a.get(_PROMPT[1], 0.0)
    queried = processed + hits
    return {"queried_tokens": queried, "hit_tokens": hits, "hit_rate": hits / queried if queried > 0 else None,
            "source": "llama.cpp's llamacpp:prompt_tokens_total (processed) and prompt_tokens_cached_total (reused), "
                      "/metrics delta over the window"}


# -- which versions this adapter's knowledge was read from (sparklab/engines/knowledge.py): each fact with its
# versions and its file:line in each. `sparklab check` and every start warn for an image outside them.
KNOWLEDGE = Knowledge((
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


class LlamaCpp(Engine):
    kind = "llamacpp"
    ready_path = "/health"  # 503 while loading, 200 when ready; public
    ready_needs_key = False
    ready_line = re.compile(r"(?:llama_server|main): model loaded")
    label = f"llama.cpp {BUILD}"
    name = "llama.cpp"
    knowledge = KNOWLEDGE
    # The lossless check needs the model's log-probabilities of given tokens; llama-server returns them for the
    # tokens it generates only: no echo or prompt_logprobs on /v1/completions (ggml-org/llama.cpp#27174, open;
    # the echo pull requests #15189 and #17935 were not merged).
    scoring_unsupported = (f"llama.cpp {BUILD}'s server gives log-probabilities of generated tokens only, never of "
                           "given ones (no echo or prompt_logprobs: ggml-org/llama.cpp#27174)")
    method_noun = "speculative type"
    api_key_env = "LLAMA_API_KEY"
    memory_fraction_flag = None  # llama.cpp sizes memory by -c/-np/-ngl, not a fraction
    methods = METHODS
    failures = FAILURES
    fatal_lines = FATAL_LINES
    keeps_streamed_connections = False  # closes after every streamed response (module docstring)
    # every token is its own SSE event, drafted or not: measured on b11669, 1.00 tokens per chunk at an acceptance
    # length of 2.53 (K=3), so tokens per chunk say nothing of acceptance
    streams_one_chunk_per_step = False

    def sweep_env(self) -> tuple[str, ...]:
        # slot erase needs a slot save path; the RAM prompt cache survives an erase, so it is off (module docstring)
        return ("LLAMA_ARG_SLOT_SAVE_PATH=/tmp", "LLAMA_ARG_CACHE_RAM=0")

    def speculative(self, argv: Sequence[str]) -> Speculative | None:
        return speculative(argv)

    def cache_env(self, target: str) -> dict[str, str]:
        return {}  # no JIT or compile cache: ggml's kernels are built into the binary

    def method_hint(self, method: str) -> str:
        if method.lower() in ("draft_model", "standalone", "draft"):
            return " llama.cpp calls drafting with a second model --spec-type draft-simple."
        return ""

    def check_spec(self, spec: LaunchSpec, recipe: RecipeView) -> list[Finding]:
        found = [Finding("error", f"{where(spec)}: {flag} was removed from llama-server (build {BUILD} stops "
                                  f"with 'the argument has been removed')", f"Use {new} instead.")
                 for flag, new in REMOVED.items() if flag_values(spec.argv, flag)]
        sp = spec.speculative
        if sp is None:
            if draft_model(spec.argv):
                found.append(Finding(
                    "warning", f"{where(spec)}: a draft model is given but no --spec-type, so llama-server "
                               f"loads the draft and does not draft", "Add --spec-type draft-simple."))
            return found
        for part in (sp.method or "").split(","):
            if part not in self.methods:
                found.append(Finding("error", f"{where(spec)}: {self.label} has no speculative type {part!r}",
                                     f"Known types: {', '.join(sorted(self.methods))}."))
        return found + self.check_speculative(spec, recipe, sp)

    def check_speculative(self, spec: LaunchSpec, recipe: RecipeView, sp: Speculative) -> list[Finding]:
        here = where(spec)
        found: list[Finding] = []
        needs = sorted(set((sp.method or "").split(",")) & NEEDS_DRAFT)
        if needs and not sp.draft_model:
            found.append(Finding(
                "error", f"{here}: --spec-type {needs[0]} needs a draft model (--spec-draft-model); without one "
                         f"llama-server logs 'requires a draft context' and serves without drafting",
                "Add --spec-draft-model <draft GGUF> (in the recipe: {{ drafts.NAME }})."))
        if sp.num_speculative_tokens is not None and sp.num_speculative_tokens < 1:
            found.append(Finding("error", f"{here}: {K_FLAG} must be a positive integer, got "
                                          f"{sp.num_speculative_tokens}", f"Give {K_FLAG} N (N >= 1)."))
        if not any(flag_values(spec.argv, f) for f in ("--metrics",)) and \
                spec.env.get("LLAMA_ARG_ENDPOINT_METRICS") not in ("1", "true"):
            found.append(Finding(
                "warning", f"{here}: no --metrics, so llama-server serves no /metrics and sparklab cannot read "
                           f"acceptance from the server", "Add --metrics to the engine's args."))
        return found

    def read_startup(self, text: str, facts: StartupFacts) -> None:
        if m := _SLOTS.search(text):
            slots, per_slot = int(m.group(1)), int(m.group(2))
            facts.max_concurrency = float(slots)
            facts.concurrency_tokens_per_request = per_slot
            # A unified KV cache is one pool of n_ctx_slot cells shared by the slots; otherwise each slot has
            # its own n_ctx_slot cells.
            facts.kv_cache_tokens = per_slot if m.group(3) == "true" else slots * per_slot
        loading, loaded = _LOADING.search(text), _LOADED.search(text)
        if loading and loaded:
            facts.model_load_seconds = round(_stamp(loaded) - _stamp(loading), 3)
        if m := _NO_SPEC.search(text):
            facts.advice.append(f"llama-server is serving WITHOUT speculative decoding: {m.group(1).strip()}")

    counter_paths = ("/metrics",)

    def read_counters(self, replies: Replies) -> dict[str, Any]:
        try:
            answer = replies.get("/metrics")
            if answer.status == 200:
                return {"llamacpp_spec": spec_counters(answer.text), "llamacpp_prompt": prompt_counters(answer.text)}
            return {"metrics_error": f"/metrics answered {answer.status} (is --metrics given?)"}
        except (Unreachable, ValueError) as exc:
            return {"metrics_error": str(exc)}

    def window(self, before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
        counted = after.get("llamacpp_spec") or {}
        delta = None
        # llama-server prints its spec_decode counters whether or not it drafts: zero drafts over its whole life
        # is a server without speculative decoding, which has no acceptance to report
        if counted.get("drafts"):
            delta = spec_delta(before.get("llamacpp_spec"), counted, METRICS_SOURCE)
        return {"speculative": delta, "prefix_cache": prefix_cache(before, after)}

    def acceptance(self, result: dict[str, Any]) -> Acceptance | None:
        spec = result.get("speculative") or {}
        if spec.get("acceptance_length") is not None and spec.get("source") == METRICS_SOURCE:
            return float(spec["acceptance_length"]), "llama.cpp spec-decode counters (/metrics delta over the window)"
        return None

    def reset_prefix_cache(self, api: EngineAPI) -> None:
        """Erase every slot's KV cache: POST /slots/{id}?action=erase.

        A whole reset needs --slot-save-path (else 501, and a repeated prompt reused 48 of its 49 tokens on b11669)
        and no RAM prompt cache (--cache-ram 0): a sweep sets both (sweep_env). Without them a later load may hit
        prefixes an earlier one left; the log says so.
        """
        with contextlib.suppress(Unreachable, ValueError, AttributeError, TypeError):
            slots = api.get("/slots")
            if slots.status != 200:
                return
            for slot in slots.json():
                answer = api.post(f"/slots/{int(slot['id'])}?action=erase")
                if answer.status != 200:
                    log.warning("llama-server kept its prompt cache: slot erase answered %s (%s)",
                                answer.status, answer.text[:200])
                    return

    def served_facts(self, api: EngineAPI) -> dict[str, Any]:
        """GET /v1/models: the GGUF's tensor bytes, parameters and file type (`meta`), so the roofline of a GGUF
        row counts the bytes llama.cpp reads, not those of another engine's copy of the model."""
        try:
            answer = api.get("/v1/models")
            meta = answer.json()["data"][0]["meta"] if answer.status == 200 else {}
            size, params = int(meta["size"]), int(meta["n_params"])
        except (Unreachable, ValueError, LookupError, TypeError):
            return {}
        if size <= 0 or params <= 0:
            return {}
        return {"weights": {"bytes": size, "params": params, "file_type": str(meta.get("ftype") or "") or None,
                            "bits_per_param": round(8 * size / params, 3),
                            "source": "llama-server GET /v1/models meta (size, n_params, ftype)"}}

    def version_key(self, version: str | None) -> tuple[int, ...] | None:
        """Builds are counted: `b11669`, `b11669-Debian`, `0.7.0 (build 11669, …)` → (11669,)."""
        m = llamacpp_help.BUILD_NUMBER.search(version or "")
        return (int(next(g for g in m.groups() if g)),) if m else None

    def acceptance_fact(self, result: dict[str, Any]) -> Fact | None:
        return KNOWLEDGE.in_area("acceptance counters")[0] if self.acceptance(result) else None

    def parser_probe(self, specs: Sequence[LaunchSpec]) -> parsers.Probe | str:
        args: list[str] = ["sparklab-probe", specs[0].entrypoint[0]]
        for spec in specs:
            argv = parsers.key_free(parsers.command_of(spec))
            args += [str(len(argv)), *argv]
        return parsers.Probe("sh", ("-c", llamacpp_help.PROBE, *args))

    def parser_verdicts(self, specs: Sequence[LaunchSpec], run: parsers.ProbeRun) -> list[parsers.Verdict]:
        return llamacpp_help.verdicts(specs, run)

    def version(self, api: EngineAPI) -> str | None:
        """GET /props: build_info, e.g. "b11669-Debian"."""
        try:
            answer = api.get("/props")
            return str(answer.json().get("build_info")) if answer.status == 200 else None
        except (Unreachable, ValueError, AttributeError):
            return None


ENGINE = LlamaCpp()
