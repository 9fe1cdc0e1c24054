"""sparklab stand-in engine: a stdlib-only test double for vLLM's and SGLang's server surfaces.

It is NOT an inference engine. It parses the real engines' argv leniently, prints startup lines in their log
formats, serves their readiness/OpenAI/metrics endpoints with deterministic fake tokens, and can simulate
faults (see docker/README.md). Entry points: `vllm serve ...` (/usr/local/bin/vllm),
`python3 -m sglang.launch_server ...`, and TensorRT Edge-LLM's `trtedge serve ...` / `tensorrt-edgellm-serve ...`
(bin/trtedge, bin/tensorrt-edgellm-serve). It runs in the image or straight from this directory on the host
(`python3 docker/standin/bin/trtedge serve MODEL`), as sparklab's host-process tests do.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import queue
import random
import signal
import socket
import sys
import threading
import time
import uuid
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import standin_cluster
from standin_args import Config, decode, names, parse_args

# STANDIN_VERSION: the engine version it reports (a rehearsal's twin sets the night's); its /version and first log
# line still say what it is (engine "standin", "test double").
VERSION = os.environ.get("STANDIN_VERSION") or "standin"


# Log messages in the real engines' wording (the fault ones are marked "(standin fault)").
SPEC_BUDGET_WARNING = (
    "max_num_scheduled_tokens is set to {n} based on the speculative decoding settings. This may lead to "
    "suboptimal performance. Consider increasing max_num_batched_tokens to accommodate the additional draft "
    "token slots, or decrease num_speculative_tokens or max_num_seqs."
)
VLLM_START_ERROR = (
    "ValueError: Free memory on device (0.5/119.7 GiB) on startup is less than desired GPU memory "
    "utilization (0.9, 107.73 GiB). (standin fault)"
)
VLLM_CORE_FAILED = "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"
SGLANG_START_ERROR = (
    "Scheduler hit an exception: RuntimeError: Not enough memory. Please try to increase "
    "--mem-fraction-static. (standin fault)"
)
SGLANG_CHILD_FAILED = "Received sigquit from a child process. It usually means the child failed."
# vLLM 0.27.1's startup check, verbatim: vllm/v1/worker/utils.py:419-427 (request_memory), with format_gib
# from vllm/utils/mem_utils.py:30 (round to 2 decimals). STANDIN_UNIFIED_MEMORY=1 applies it to MemFree, as
# cudaMemGetInfo reports it on GB10 (vllm-project/vllm#48140).
VLLM_FREE_MEMORY_ERROR = (
    "ValueError: Free memory on device {device} ({free}/{total} GiB) on startup is less than desired GPU memory "
    "utilization ({util}, {requested} GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
    "processes."
)
# A dead engine in a live container (STANDIN_FATAL_*): vLLM 0.27.1's own lines, file:line as it prints them
# (vllm/v1/engine/core.py:1349 and :1351, vllm/v1/engine/async_llm.py:724), and SGLang 0.5.23's
# (sglang/srt/managers/scheduler.py:6372). The traceback's last line carries the wall-clock time of the fatal
# line, so a test can measure how long sparklab took to report it.
VLLM_FATAL_BEFORE_READY = ("core.py:1349", "EngineCore failed to start.")
VLLM_FATAL_AFTER_READY = ("core.py:1351", "EngineCore encountered a fatal error.")
VLLM_OUTPUT_HANDLER_FAILED = ("async_llm.py:724", "AsyncLLM output_handler failed.")
SGLANG_SCHEDULER_FAILED = "Scheduler hit an exception: Traceback (most recent call last):"
# Edge-LLM 0.11.0's ChatCompletionRequest fields (experimental/server/api/protocol.py:59-92); its models forbid
# any other (protocol.py:34, extra="forbid"), answered 400 by api/app.py:101-110.
EDGE_CHAT_FIELDS = names("""messages model frequency_penalty presence_penalty logit_bias logprobs top_logprobs
    max_tokens max_completion_tokens n seed stop stream stream_options temperature top_p top_k min_p
    repetition_penalty tools tool_choice parallel_tool_calls response_format guided_decoding modalities audio
    apply_chat_template add_generation_prompt enable_thinking reasoning_effort chat_template_kwargs
    disable_spec_decode reuse_context cache_generated_tokens""")


def redact(argv: list[str]) -> list[str]:
    """The argv with API key values replaced: secrets never reach the logs."""

    def is_key(tok: str) -> bool:
        return tok.startswith("-") and tok.lstrip("-").split("=", 1)[0].replace("_", "-") == "api-key"

    out: list[str] = []
    for i, tok in enumerate(argv):
        if is_key(tok) and "=" in tok:
            out.append(tok.split("=", 1)[0] + "=***")
        else:
            out.append("***" if i > 0 and is_key(argv[i - 1]) and "=" not in argv[i - 1] else tok)
    return out


def env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


def time_scale() -> float:
    """STANDIN_TIME_SCALE: wall seconds per modelled second (a rehearsal's compressed night); delays are scaled,
    log lines state modelled seconds."""
    return env_float("STANDIN_TIME_SCALE", 1.0)


class Model:
    """STANDIN_MODEL (JSON): the decode timing of a real engine on real hardware, as sparklab's twin derives it
    from published tables (sparklab/recipes/twin.py, recipes/twin/gb10.yaml):
      {"time_scale": S, "per_running": q, "phases": [{"max_words": N|null, "prefill_ms": P,
                                                       "step_ms": {"1": ms, "8": ms}, "accept": [a1, ..., aK]}]}
    A request's first token comes prefill_ms x (1 + q x (running - 1)) after it arrives; then each step takes
    step_ms at the number of requests in flight (piecewise linear) and yields 1 + the draft positions accepted:
    position i survives with probability a_i / a_(i-1). Steps are paced by deadline from the first token, so the
    stand-in's own overhead does not add up. The first phase whose max_words covers the prompt's words applies."""

    def __init__(self, text: str) -> None:
        data = json.loads(text)
        self.scale = float(data.get("time_scale", 1.0))
        self.per_running = float(data.get("per_running", 0.0))
        self.phases = [(p.get("max_words"), float(p.get("prefill_ms", 0.0)),
                        sorted((int(c), float(ms)) for c, ms in (p.get("step_ms") or {"1": 10.0}).items()),
                        [float(a) for a in p.get("accept") or []]) for p in data["phases"]]

    def phase(self, words: int) -> tuple[float, list[tuple[int, float]], list[float]]:
        for max_words, prefill, steps, accept in self.phases:
            if max_words is None or words <= max_words:
                return prefill, steps, accept
        return self.phases[-1][1:]

    @staticmethod
    def step_ms(steps: list[tuple[int, float]], running: int) -> float:
        if running <= steps[0][0]:
            return steps[0][1]
        for (c0, s0), (c1, s1) in itertools.pairwise(steps):
            if running <= c1:
                return s0 + (s1 - s0) * (running - c0) / (c1 - c0)
        return steps[-1][1]

    @staticmethod
    def accepted(rng: random.Random, accept: list[float]) -> int:
        n, before = 0, 1.0
        for a in accept:
            if rng.random() >= (a / before if before > 0 else 0.0):
                break
            n, before = n + 1, a
        return n


MODEL = Model(os.environ["STANDIN_MODEL"]) if os.environ.get("STANDIN_MODEL") else None


# ---------------------------------------------------------------------------------------------- logging
class Log:
    def __init__(self, mode: str) -> None:
        self.mode, self.pid = mode, os.getpid()
        # STANDIN_LOG_LAG: each line reaches the log this many seconds after it was written, in order, as a busy
        # dockerd's log copier stamps and stores it late (its stamp is taken when it reads the pipe)
        self.lag = env_float("STANDIN_LOG_LAG", 0.0)
        self.lock = threading.Lock()
        self.late: queue.SimpleQueue[tuple[float, str, bool]] = queue.SimpleQueue()
        if self.lag > 0:
            threading.Thread(target=self._late, daemon=True).start()

    def emit(self, line: str, err: bool = False) -> None:
        if self.lag > 0:
            self.late.put((time.monotonic() + self.lag, line, err))
        else:
            self._write(line, err)

    def _late(self) -> None:
        while True:
            due, line, err = self.late.get()
            time.sleep(max(0.0, due - time.monotonic()))
            self._write(line, err)

    def _write(self, line: str, err: bool) -> None:
        stream = sys.stderr if err else sys.stdout
        with self.lock:
            stream.write(line + "\n")
            stream.flush()

    def vllm(self, proc: str, level: str, where: str, msg: str) -> None:
        stamp = time.strftime("%m-%d %H:%M:%S")
        self.emit(f"({proc} pid={self.pid}) {level} {stamp} [{where}] {msg}", err=level == "ERROR")

    def api(self, where: str, msg: str, level: str = "INFO") -> None:
        self.vllm("APIServer", level, where, msg)

    def engine(self, where: str, msg: str, level: str = "INFO") -> None:
        self.vllm("EngineCore", level, where, msg)

    def sgl(self, msg: str, tp: bool = False, err: bool = False) -> None:
        self.emit(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}{' TP0' if tp else ''}] {msg}", err=err)

    def edge(self, name: str, msg: str, level: str = "INFO") -> None:
        """Edge-LLM's format, experimental/server/cli.py:35 (tensorrt-edgellm 0.11.0)."""
        self.emit(f"{time.strftime('%H:%M:%S')} {level:<8} {name}: {msg}", err=level == "ERROR")

    def uvicorn(self, msg: str) -> None:
        if self.mode == "trtedge":
            self.emit(f"INFO:     {msg}")
        elif self.mode == "vllm":
            self.emit(f"(APIServer pid={self.pid}) INFO:     {msg}")
        else:
            self.sgl(f"INFO:     {msg}")


# ---------------------------------------------------------------------------------------------- metrics
class Metrics:
    def __init__(self, k: int | None) -> None:
        self.lock = threading.Lock()
        self.k = k
        self.prompt = self.generation = self.drafts = self.draft_tokens = self.accepted = 0
        self.success: dict[str, int] = {}
        self.per_pos = [0] * (k or 0)
        self.running = 0
        # SGLang counts per finished request (observability/metrics_collector.py:2092-2112 in SGLang 0.5.23)
        self.sgl_generation = self.sgl_verify = 0
        # and keeps a server-life total for /server_info (scheduler_components/internal_state.py:243-253),
        # reset by /flush_cache
        self.sgl_total_tokens = self.sgl_total_verify = 0

    def sglang_finish(self, tokens: int, verify_steps: int) -> None:
        with self.lock:
            self.sgl_generation += tokens
            self.sgl_verify += verify_steps
            self.sgl_total_tokens += tokens
            self.sgl_total_verify += verify_steps

    def sglang_flush(self) -> None:
        with self.lock:
            self.sgl_total_tokens = self.sgl_total_verify = 0

    def sglang_avg_accept_length(self) -> float | None:
        return self.sgl_total_tokens / self.sgl_total_verify if self.sgl_total_verify else None

    def chunk(self, size: int) -> None:
        with self.lock:
            self.generation += size
            if self.k:
                acc = min(size - 1, self.k)
                self.drafts += 1
                self.draft_tokens += self.k
                self.accepted += acc
                for pos in range(acc):
                    self.per_pos[pos] += 1

    def finish(self, prompt: int, reason: str) -> None:
        with self.lock:
            self.prompt += prompt
            self.success[reason] = self.success.get(reason, 0) + 1

    def accept_length(self) -> float:
        return 1.0 + self.accepted / self.drafts if self.drafts else 0.0

    def render(self, model: str) -> str:
        """vLLM's Prometheus names (counters get prometheus_client's `_total` suffix)."""
        lbl = f'model_name="{model}",engine="0"'
        out: list[str] = []

        def metric(name: str, kind: str, rows: list[tuple[str, float]]) -> None:
            out.extend([f"# HELP {name} standin metric", f"# TYPE {name} {kind}"])
            out.extend(f"{name}{{{lbl}{extra}}} {float(v)}" for extra, v in rows)

        with self.lock:
            metric("vllm:num_requests_running", "gauge", [("", self.running)])
            metric("vllm:prompt_tokens_total", "counter", [("", self.prompt)])
            metric("vllm:generation_tokens_total", "counter", [("", self.generation)])
            reasons = sorted({"stop", "length", *self.success})
            rows = [(f',finished_reason="{r}"', self.success.get(r, 0)) for r in reasons]
            metric("vllm:request_success_total", "counter", rows)
            if self.k:
                metric("vllm:spec_decode_num_drafts_total", "counter", [("", self.drafts)])
                metric("vllm:spec_decode_num_draft_tokens_total", "counter", [("", self.draft_tokens)])
                metric("vllm:spec_decode_num_accepted_tokens_total", "counter", [("", self.accepted)])
                rows = [(f',position="{i}"', n) for i, n in enumerate(self.per_pos)]
                metric("vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter", rows)
        return "\n".join(out) + "\n"

    def render_sglang(self, model: str) -> str:
        """A few of SGLang 0.5.23's names (served only with --enable-metrics, like SGLang; file:line under
        sglang/srt/observability/metrics_collector.py): prompt/generation tokens :1855-1863 (label
        is_streaming), spec_verify_calls_total :1865, spec_accept_length/rate gauges :511-520 (last log
        interval), num_running_reqs. The counters grow when a request finishes (:2092-2112)."""
        lbl = f'model_name="{model}",engine_type="unified",tp_rank="0",pp_rank="0"'
        stream = ',is_streaming="true"'
        with self.lock:
            rows = [("sglang:prompt_tokens_total", "counter", stream, self.prompt)]
            rows += [("sglang:generation_tokens_total", "counter", stream, self.sgl_generation)]
            rows += [("sglang:num_running_reqs", "gauge", "", self.running)]
            if self.k:
                rows += [("sglang:spec_verify_calls_total", "counter", "", self.sgl_verify)]
                rows += [("sglang:spec_accept_length", "gauge", "", self.accept_length())]
        out = [f"# HELP {n} standin metric\n# TYPE {n} {t}\n{n}{{{lbl}{x}}} {float(v)}" for n, t, x, v in rows]
        return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------- generation
def chunk_sizes(limit: int | None) -> list[int]:
    sizes = [max(1, int(s)) for s in os.environ.get("STANDIN_TOKENS_PER_CHUNK", "1").split(",") if s.strip()]
    if limit:
        sizes = [min(s, limit) for s in sizes]
    return sizes or [1]


def token_id(word: str) -> int:
    """A word's token id (what /tokenize gives for it): fixed per word, never an answer's ids (1000 + position)."""
    return 100_000 + zlib.crc32(word.encode()) % 50_000


def prompt_words(value: Any) -> list[str]:
    """A prompt's words (a string, or messages and content parts with their text): the stand-in's tokens."""
    if isinstance(value, str):
        return value.split()
    if isinstance(value, list):
        parts = (v.get("content", v.get("text", "")) if isinstance(v, dict) else v for v in value)
        return [w for part in parts for w in prompt_words(part)]
    return []


def word_count(value: Any) -> int:
    return len(prompt_words(value))


def plan(body: dict[str, Any], prompt_tokens: int, max_len: int) -> tuple[int, str]:
    """Return (number of completion tokens, finish_reason)."""
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    limit = int(max_tokens) if max_tokens else max(1, max_len - prompt_tokens)
    eos_env = int(env_float("STANDIN_EOS_AFTER", 0))
    natural = eos_env or (16 if not max_tokens else 0)  # without max_tokens, "EOS" arrives after 16 tokens
    if natural and not body.get("ignore_eos"):
        natural = max(natural, int(body.get("min_tokens") or 0))
        if natural < limit:
            return natural, "stop"
    return limit, "length"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY, as the engines' servers have it (uvicorn on asyncio or uvloop: asyncio's TCP transports set it,
    # CPython 3.12 asyncio/selector_events.py:_SelectorSocketTransport.__init__ -> base_events._set_nodelay). With
    # Nagle on, each SSE chunk after the first waits for the client's delayed ACK (up to 40 ms on Linux).
    disable_nagle_algorithm = True
    server_version = "standin"
    sys_version = ""
    app: App

    def log_message(self, format: str, *args: Any) -> None:  # uvicorn-style access log
        pass

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        phrase = self.responses.get(int(code), ("",))[0] if str(code).isdigit() else ""
        peer = f"{self.client_address[0]}:{self.client_address[1]}"
        self.app.log.uvicorn(f'{peer} - "{self.requestline}" {code} {phrase}')

    def send_json(self, code: int, payload: Any) -> None:
        self.send_text(code, json.dumps(payload), "application/json")

    def send_error_json(self, code: int, message: str, kind: str) -> None:
        self.send_json(code, {"error": {"message": message, "type": kind, "code": code}})

    def send_text(self, code: int, text: str, ctype: str = "text/plain; version=0.0.4") -> None:
        data = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def authorized(self) -> bool:
        key = self.app.cfg.api_key
        if not key or not self.path.startswith("/v1/"):
            return True
        if self.headers.get("Authorization", "") == f"Bearer {key}":
            return True
        self.send_json(401, {"error": "Unauthorized"})
        return False

    def do_GET(self) -> None:
        if not self.authorized():
            return
        app, path = self.app, self.path.split("?", 1)[0]
        # SGLang 0.5.23 sglang/srt/entrypoints/http_server.py:721-800: /health and /health_generate are one
        # handler, 503 while starting (ServerStatus.Starting) and 200 after; /health_generate (and /health with
        # SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION) runs a 1-token request and answers 503 when the scheduler
        # does not answer within HEALTH_CHECK_TIMEOUT. The stand-in answers 503 at once when its engine is dead.
        if app.cfg.mode == "trtedge" and path in ("/health", "/health/ready"):
            self.send_json(*app.edge_health(path))
        elif path in ("/health", "/health_generate", "/ping"):  # vLLM's /health is 503 once its engine is dead
            self.send_text(200 if app.ready.is_set() and not app.dead.is_set() else 503, "")
        elif path == "/v1/models":
            self.send_json(200, app.models())
        elif path == "/version":
            self.send_json(200, {"version": VERSION, "engine": "standin", "emulates": app.cfg.mode})
        elif path == "/load":
            self.send_json(200, {"server_load": app.metrics.running})
        elif path == "/metrics" and app.cfg.mode == "vllm":
            self.send_text(200, app.metrics.render(app.cfg.served_names[0]))
        elif path == "/metrics" and app.cfg.opts.get("enable-metrics"):
            self.send_text(200, app.metrics.render_sglang(app.cfg.served_names[0]))
        elif app.cfg.mode == "sglang" and path in ("/server_info", "/get_server_info"):
            self.send_json(200, app.server_info())
        elif app.cfg.mode == "sglang" and path in ("/get_model_info", "/model_info"):
            self.send_json(200, app.model_info())
        else:
            self.send_json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))  # always drain (keep-alive)
        if not self.authorized():
            return
        path = self.path.split("?", 1)[0]
        if path == "/flush_cache" and self.app.cfg.mode == "sglang":
            # SGLang 0.5.23 entrypoints/http_server.py:1025-1041; also resets /server_info's cumulative
            # avg_spec_accept_length (scheduler_components/internal_state.py)
            self.app.metrics.sglang_flush()
            self.send_text(200, "Cache flushed.\nPlease check backend logs for more details. (When there are "
                                "running or waiting requests, the operation will not be performed.)\n")
            return
        scoring = path == "/tokenize" and self.app.cfg.mode == "vllm"
        if path not in ("/v1/chat/completions", "/v1/completions") and not scoring:
            self.send_json(404, {"detail": "Not Found"})
            return
        try:
            body = json.loads(raw or b"{}")
            assert isinstance(body, dict)
        except (ValueError, AssertionError):
            self.send_error_json(400, "invalid JSON body", "BadRequestError")
            return
        if scoring:
            self.send_json(200, self.app.tokenize(body))
            return
        if self.app.cfg.mode == "vllm" and path == "/v1/completions" and body.get("prompt_logprobs") is not None:
            self.app.prompt_logprobs(self, body)
            return
        model = body.get("model")
        extra = sorted(set(body) - EDGE_CHAT_FIELDS)
        if self.app.cfg.mode == "trtedge" and extra:  # pydantic's extra="forbid" through Edge-LLM's handler
            self.send_error_json(400, f"{extra[0]}: Extra inputs are not permitted", "invalid_request_error")
            return
        if (self.app.cfg.mode == "sglang" and path == "/v1/chat/completions" and body.get("stream")
                and body.get("return_token_ids")):
            # SGLang 0.5.23 refuses it (entrypoints/openai/serving_chat.py:1315-1319, a ValueError that
            # serving_base.py:123-128 answers as HTTP 400 with its ErrorResponse, protocol.py:106-111)
            self.send_json(400, {"object": "error", "message": "return_token_ids is not supported with streaming on "
                                 "/v1/chat/completions. Please set stream=false when using return_token_ids=true.",
                                 "type": "BadRequest", "param": None, "code": 400})
            return
        if self.app.cfg.mode == "vllm" and model and model not in self.app.cfg.served_names:
            self.send_error_json(404, f"The model `{model}` does not exist.", "NotFoundError")
            return
        self.app.complete(self, body, chat=path.endswith("chat/completions"))


# ---------------------------------------------------------------------------------------------- app
class App:
    def __init__(self, cfg: Config) -> None:
        self.cfg, self.log = cfg, Log(cfg.mode)
        self.kv_tokens = int(env_float("STANDIN_KV_TOKENS", 93184))
        self.metrics = Metrics(cfg.spec.k if cfg.spec else None)
        self.ready = threading.Event()
        self.dead = threading.Event()  # the engine died; the API server runs on (STANDIN_FATAL_AFTER)
        self.requests_seen = 0
        self.arrivals, self.arrivals_lock = 0, threading.Lock()  # completion requests, counted as they arrive
        self.server: ThreadingHTTPServer | None = None

    def models(self) -> dict[str, Any]:
        card = dict(object="model", created=int(time.time()), owned_by="standin", root=self.cfg.model)
        card.update(parent=None, max_model_len=self.cfg.max_len, permission=[])
        return {"object": "list", "data": [{"id": n, **card} for n in self.cfg.served_names]}

    def server_info(self) -> dict[str, Any]:
        opts = self.cfg.opts.items()
        info = {k.replace("-", "_"): decode(v) if isinstance(v, str) else v for k, v in opts if k != "api-key"}
        info.update(model_path=self.cfg.model, served_model_name=self.cfg.served_names[0], version=VERSION)
        info.update(port=self.cfg.port, context_length=self.cfg.max_len)
        # SGLang 0.5.23 entrypoints/http_server.py:863-890: the resolved server args, "startup_time",
        # "internal_states" (one per DP rank), "version", "frontend". Each state (managers/scheduler_components/
        # internal_state.py:65-125): last_gen_throughput and effective_max_running_requests_per_dp (:73-74),
        # memory_usage.token_capacity = max_total_num_tokens (:76-89), and with speculative decoding
        # avg_spec_accept_length = total accepted tokens / total verify steps since start or the last
        # /flush_cache (:119-125, :243-253): CUMULATIVE, not per window.
        state: dict[str, Any] = {
            "last_gen_throughput": 0.0,
            "effective_max_running_requests_per_dp": 48,
            "memory_usage": {"token_capacity": self.kv_tokens},
        }
        if self.cfg.spec and (avg := self.metrics.sglang_avg_accept_length()) is not None:
            state["avg_spec_accept_length"] = round(avg, 4)
        info["internal_states"] = [state]
        info["frontend"] = "python"
        return info

    def edge_health(self, path: str) -> tuple[int, dict[str, Any]]:
        """Edge-LLM's /health and /health/ready bodies (experimental/server/api/routes.py:44-84, 0.11.0); its
        HTTP server starts only after the model loaded, so both answer 200 once listening."""
        running = self.metrics.running
        if path == "/health/ready":
            return 200, {"status": "ready", "active_requests": running, "queued_requests": 0}
        spec = self.cfg.spec
        caps = {"chat": True, "max_model_len": self.cfg.max_len, "max_batch_size": int(self.cfg.opts.get(
            "max-batch-size", 1)), "kv_cache_dtype": "fp8", "speculative_decoding": spec is not None,
            "speculative_method": spec.method if spec else "none", "context_reuse": False}
        return 200, {"status": "healthy", "model": self.cfg.served_names[0], "active_requests": running,
                     "queued_requests": 0, "scheduling": None, "capabilities": caps}

    def model_info(self) -> dict[str, Any]:
        info = dict(model_path=self.cfg.model, tokenizer_path=self.cfg.model, is_generation=True)
        return {**info, "model_type": "standin", "architectures": ["StandinForCausalLM"]}

    def tool_calls(self, h: Handler, body: dict[str, Any]) -> None:
        """A chat request offering tools: one get_weather-style call of the first tool (finish_reason tool_calls);
        with STANDIN_TOOL_RUNAWAY=N and tool_choice "required", N identical calls until finish_reason length
        (seed 002's runaway). Streamed as vLLM does: one delta per call, 8 token ids each."""
        prompt = word_count(body.get("messages"))
        tool = ((body.get("tools") or [{}])[0].get("function") or {}).get("name", "tool")
        runaway = int(env_float("STANDIN_TOOL_RUNAWAY", 0))
        calls = runaway if runaway and body.get("tool_choice") == "required" else 1
        reason = "length" if calls > 1 else "tool_calls"
        base = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk", "created": int(time.time()),
                "model": str(body.get("model") or self.cfg.served_names[0])}
        arguments = json.dumps({"city": "Tokyo"})
        usage = {"prompt_tokens": prompt, "completion_tokens": 8 * calls, "total_tokens": prompt + 8 * calls}
        if not body.get("stream"):
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{i}", "type": "function", "function": {"name": tool, "arguments": arguments}}
                for i in range(calls)]}
            h.send_json(200, {**base, "object": "chat.completion", "usage": usage,
                              "choices": [{"index": 0, "message": message, "finish_reason": reason}]})
            return
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Connection", "close")
        h.end_headers()
        h.close_connection = True
        self.sse(h, base, {"role": "assistant", "content": ""}, None, True)
        for i in range(calls):
            self.metrics.chunk(8)
            delta: dict[str, Any] = {"tool_calls": [{"index": i, "id": f"call_{i}", "type": "function",
                                                     "function": {"name": tool, "arguments": arguments}}]}
            ids = list(range(2000 + 8 * i, 2008 + 8 * i)) if body.get("return_token_ids") else None
            self.sse(h, base, delta, reason if i == calls - 1 else None, True, ids)
        self.metrics.finish(prompt, reason)
        if (body.get("stream_options") or {}).get("include_usage"):
            h.wfile.write(f"data: {json.dumps({**base, 'choices': [], 'usage': usage})}\n\n".encode())
        h.wfile.write(b"data: [DONE]\n\n")
        h.wfile.flush()

    def pacer(self, body: dict[str, Any], words: int, limit: int = 1 << 30) -> Any:
        """With STANDIN_MODEL: a function that waits for the next step's deadline and returns its tokens (the first
        call waits out the prefill); None without it. At temperature 0 a prompt's acceptances repeat exactly."""
        if MODEL is None:
            return None
        prefill, steps, accept = MODEL.phase(words)
        accept = accept[: self.cfg.spec.k] if self.cfg.spec else []
        greedy = not body.get("temperature")
        with self.metrics.lock:
            self.requests_seen += 1
            seed = zlib.crc32(json.dumps(body.get("messages") or body.get("prompt"), sort_keys=True).encode())
            rng = random.Random(seed if greedy else seed + self.requests_seen)
        running = max(1, self.metrics.running)
        clock = [time.monotonic() + prefill * (1 + MODEL.per_running * (running - 1)) / 1000 * MODEL.scale]
        first = [True]

        def step() -> int:
            """Wait for the next token(s): the prefill's one token first, then each decode step's 1 + accepted.
            Steps whose deadline has passed already (a compressed night's steps can be shorter than the stand-in's
            own work per chunk) come in one chunk, so the tokens keep the model's time however short a step is."""
            wait = clock[0] - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            tokens = 0
            while True:
                clock[0] += Model.step_ms(steps, max(1, self.metrics.running)) / 1000 * MODEL.scale
                if first[0]:
                    first[0] = False
                    return 1
                tokens += 1 + Model.accepted(rng, accept)
                if clock[0] > time.monotonic() or tokens >= limit:
                    return tokens

        return step

    def tell_load(self) -> None:
        """STANDIN_LOAD_FILE: the requests in flight, rewritten on each change (a twin host reads it)."""
        path = os.environ.get("STANDIN_LOAD_FILE")
        if not path:
            return
        try:
            with open(path + ".tmp", "w") as f:
                f.write(str(self.metrics.running))
            os.replace(path + ".tmp", path)
        except OSError:
            pass

    def tokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        """vLLM 0.27.1's POST /tokenize (vllm/entrypoints/serve/tokenize/protocol.py: TokenizeChatRequest :50,
        TokenizeCompletionRequest :24, TokenizeResponse :159-163): the prompt's token ids, one per word here (as
        the stand-in counts prompt tokens), the same ids for the same words."""
        said = prompt_words(body.get("messages") if "messages" in body else body.get("prompt"))
        return {"count": len(said), "max_model_len": self.cfg.max_len, "tokens": [token_id(w) for w in said],
                "token_strs": None}

    def prompt_logprobs(self, h: Handler, body: dict[str, Any]) -> None:
        """vLLM 0.27.1's POST /v1/completions with `prompt_logprobs` (vllm/entrypoints/openai/completion/
        protocol.py:341-370, serving.py:520): choices[0].prompt_logprobs holds, per prompt token, {token id: {logprob,
        rank, decoded_token}}, None for the first; the log-probability here is a fixed function of the token id, so
        two answers with the same ids score the same (the stand-in's drafters change no token). The prefill takes
        the stand-in model's prefill time for the prompt, as a scoring request does on the engine."""
        prompt = body.get("prompt")
        if not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt):
            h.send_error_json(400, "the stand-in scores token-id prompts only", "BadRequestError")
            return
        if MODEL is not None:
            time.sleep(MODEL.phase(len(prompt))[0] / 1000 * MODEL.scale)
        entries: list[Any] = [None] + [{str(t): {"logprob": -1.0 - (t % 97) / 97, "rank": 1, "decoded_token": "w"}}
                                       for t in prompt[1:]]
        choice = {"index": 0, "text": "w", "logprobs": None, "finish_reason": "length", "prompt_logprobs": entries}
        h.send_json(200, {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                          "model": str(body.get("model") or self.cfg.served_names[0]), "choices": [choice],
                          "usage": {"prompt_tokens": len(prompt), "completion_tokens": 1,
                                    "total_tokens": len(prompt) + 1}})

    def complete(self, h: Handler, body: dict[str, Any], chat: bool) -> None:
        with self.arrivals_lock:
            self.arrivals += 1
            arrived = self.arrivals
        # STANDIN_FATAL_AT_REQUEST=N: the engine dies as its N-th completion request arrives (that request and
        # every later one hang, as on a dead vLLM engine): a death inside the night's cells however fast they run
        if arrived == int(env_float("STANDIN_FATAL_AT_REQUEST", 0)):
            self.die()
        if chat and body.get("tools") and body.get("tool_choice") != "none":
            self.tool_calls(h, body)
            return
        prompt = word_count(body.get("messages") if chat else body.get("prompt"))
        n_tokens, reason = plan(body, prompt, self.cfg.max_len)
        n_reason = min(n_tokens, int(env_float("STANDIN_REASONING_TOKENS", 0))) if chat else 0
        words = [f"think{i}" for i in range(n_reason)] + [f"tok{i}" for i in range(n_tokens - n_reason)]
        # STANDIN_ALTER_OUTPUT=N: a drafting server answers differently from token N on (a broken verifier)
        alter = int(env_float("STANDIN_ALTER_OUTPUT", -1)) if self.cfg.spec else -1
        if 0 <= alter < len(words):
            words[alter] = "altered"
        delay = env_float("STANDIN_TOKEN_DELAY", 0.005)
        sizes = chunk_sizes(self.cfg.spec.k + 1 if self.cfg.spec else None)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        name = str(body.get("model") or self.cfg.served_names[0])
        base = {
            "id": rid,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": name,
        }
        usage = {"prompt_tokens": prompt, "completion_tokens": n_tokens, "total_tokens": prompt + n_tokens}
        stream = bool(body.get("stream"))
        with self.metrics.lock:
            self.metrics.running += 1
            self.tell_load()
        try:
            if stream:
                h.send_response(200)
                h.send_header("Content-Type", "text/event-stream")
                h.send_header("Connection", "close")
                h.end_headers()
                h.close_connection = True
                if chat:
                    self.sse(h, base, {"role": "assistant", "content": ""}, None, chat)
            pace = self.pacer(body, prompt, len(words))
            pos, c = 0, 0
            while pos < len(words):
                if pace is not None:
                    k = min(pace(), len(words) - pos)
                else:
                    k = min(sizes[c % len(sizes)], len(words) - pos)
                    time.sleep(delay)
                while self.dead.is_set():  # a dead engine: the request hangs, as vLLM's do
                    time.sleep(3600)
                self.metrics.chunk(k)
                if stream:
                    done = reason if pos + k >= len(words) else None
                    ids = ([7 if words[i] == "altered" else 1000 + i for i in range(pos, pos + k)]
                           if body.get("return_token_ids") else None)
                    self.sse(h, base, self.delta(words, pos, k, n_reason), done, chat, ids)
                pos, c = pos + k, c + 1
            self.metrics.finish(prompt, reason)
            if self.cfg.mode == "sglang" and self.cfg.spec and c:
                self.metrics.sglang_finish(len(words), c)  # each chunk is one verify step
                # SGLang 0.5.23's decode line (managers/scheduler_components/metrics_reporter.py:963-1042), here
                # once per request instead of every 40 decode iterations: accept len = accepted tokens incl. the
                # bonus / verify steps; accept rate = correct drafts / (verify steps x drafts per step, K).
                length = len(words) / c
                rate = (len(words) - c) / (c * max(self.cfg.spec.k or 1, 1))
                self.log.sgl(f"Decode batch, #running-req: {self.metrics.running}, #token: {n_tokens}, "
                             f"token usage: 0.00, accept len: {length:.2f}, accept rate: {rate:.2f}, "
                             f"cpu graph: False, gen throughput (token/s): 0.00, #queue-req: 0", tp=True)
            if stream:
                if (body.get("stream_options") or {}).get("include_usage"):
                    h.wfile.write(f"data: {json.dumps({**base, 'choices': [], 'usage': usage})}\n\n".encode())
                h.wfile.write(b"data: [DONE]\n\n")
                h.wfile.flush()
                return
            text = " ".join(words[n_reason:])
            if chat:
                msg: dict[str, Any] = {"role": "assistant", "content": text}
                if n_reason:
                    msg["reasoning_content"] = " ".join(words[:n_reason])
                choice: dict[str, Any] = {"index": 0, "message": msg, "finish_reason": reason}
                if body.get("return_token_ids") and self.cfg.mode == "vllm":
                    # vLLM 0.27.1 chat_completion/serving.py:1027-1031: the whole answer's ids in the choice
                    choice["token_ids"] = [7 if w == "altered" else 1000 + i for i, w in enumerate(words)]
            else:
                choice = {"index": 0, "text": text, "finish_reason": reason}
            obj = "chat.completion" if chat else "text_completion"
            h.send_json(200, {**base, "object": obj, "choices": [choice], "usage": usage})
        except (BrokenPipeError, ConnectionResetError):
            self.metrics.finish(prompt, "abort")
        finally:
            with self.metrics.lock:
                self.metrics.running -= 1
                self.tell_load()

    @staticmethod
    def delta(words: list[str], pos: int, k: int, n_reason: int) -> dict[str, str]:
        out: dict[str, str] = {}
        for i in range(pos, pos + k):
            field_name = "reasoning_content" if i < n_reason else "content"
            first = i == 0 or i == n_reason
            out[field_name] = out.get(field_name, "") + ("" if first else " ") + words[i]
        return out

    @staticmethod
    def sse(h: Handler, base: dict[str, Any], delta: dict[str, str], finish: str | None, chat: bool,
            token_ids: list[int] | None = None) -> None:
        if chat:
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": "".join(delta.values()), "finish_reason": finish}
        if token_ids is not None:  # vLLM's return_token_ids: the chunk's token ids
            choice["token_ids"] = token_ids
        h.wfile.write(f"data: {json.dumps({**base, 'choices': [choice]})}\n\n".encode())
        h.wfile.flush()

    # ------------------------------------------------------------------------------------------ lifecycle
    def listen(self) -> None:
        class Server(ThreadingHTTPServer):
            daemon_threads = True
            address_family = socket.AF_INET6 if ":" in self.cfg.host else socket.AF_INET

        handler = type("BoundHandler", (Handler,), {"app": self})
        self.server = Server((self.cfg.host, self.cfg.port), handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def shutdown(self, signum: int, _frame: Any) -> None:
        if self.cfg.mode == "trtedge":
            self.log.uvicorn("Shutting down")
        elif self.cfg.mode == "vllm":
            self.log.api("launcher.py:110", "Shutting down FastAPI HTTP server.")
        else:
            self.log.sgl(f"Received signal {signal.Signals(signum).name}; shutting down (standin).")
        self.log.uvicorn("Shutting down")
        os._exit(0)

    def fail(self, code: int) -> None:
        if self.cfg.mode == "trtedge":  # experimental/server/cli.py:41: SystemExit with this text
            self.log.emit("TensorRT prerequisite error: libnvinfer.so.10 not found (standin fault)", err=True)
        elif self.cfg.mode == "vllm":
            self.log.engine("core.py:708", "EngineCore failed to start.", "ERROR")
            self.log.engine("core.py:708", VLLM_START_ERROR, "ERROR")
            self.log.emit(VLLM_CORE_FAILED, err=True)
        else:
            self.log.sgl(SGLANG_START_ERROR, tp=True, err=True)
            self.log.sgl(SGLANG_CHILD_FAILED, err=True)
        os._exit(code)

    def fatal(self, before_ready: bool) -> None:
        """Print a real fatal line and its traceback; the process (and the container) runs on."""
        fault = f"RuntimeError: standin fault: fatal line at {time.time():.3f} (epoch s)"
        if self.cfg.mode == "vllm":
            where, msg = VLLM_FATAL_BEFORE_READY if before_ready else VLLM_FATAL_AFTER_READY
            for line in (msg, "Traceback (most recent call last):",
                         '  File "/opt/vllm/lib/python3.11/site-packages/vllm/v1/engine/core.py", line 1340, in '
                         "run_engine_core", "    raise RuntimeError(", fault):
                self.log.engine(where, line, "ERROR")
            if not before_ready:
                self.log.api(*VLLM_OUTPUT_HANDLER_FAILED, "ERROR")
        else:
            self.log.sgl(SGLANG_SCHEDULER_FAILED, tp=True, err=True)
            self.log.emit(fault, err=True)

    def hang(self) -> None:
        while True:
            time.sleep(3600)

    def faults_at_start(self) -> None:
        if os.environ.get("STANDIN_FATAL_BEFORE_READY") == "1":
            self.fatal(before_ready=True)
            self.hang()
        if os.environ.get("STANDIN_EXIT_AT_START"):
            self.fail(int(os.environ["STANDIN_EXIT_AT_START"]))
        if os.environ.get("STANDIN_OOM") == "1":
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(0.5)  # as PID 1 without --init the kernel ignores SIGKILL from inside; mimic it
            os._exit(137)
        if os.environ.get("STANDIN_NEVER_READY") == "quiet":  # one loading line, then silence: a hung load
            msg = "Loading safetensors checkpoint shards:   0% Completed | 0/4 [00:00<?, ?it/s]"
            self.log.engine("default_loader.py:267", msg) if self.cfg.mode == "vllm" else self.log.sgl(msg, tp=True)
            self.hang()
        if os.environ.get("STANDIN_NEVER_READY") == "1":
            started = time.monotonic()
            while True:
                elapsed = int(time.monotonic() - started)
                msg = f"Loading safetensors checkpoint shards:   0% Completed | 0/4 [{elapsed}s<?, ?it/s]"
                if self.cfg.mode == "vllm":
                    self.log.engine("default_loader.py:267", msg)
                else:
                    self.log.sgl(msg, tp=True)
                time.sleep(1)

    def unified_memory_check(self) -> None:
        """STANDIN_UNIFIED_MEMORY=1: vLLM's startup check against the host's MemFree (a GB10 without the
        integrated-GPU correction), failing with its exact text; =MemAvailable: against MemAvailable, as vLLM 0.27.1
        judges an integrated GPU (vllm/utils/mem_utils.py:147-155). STANDIN_MEMINFO: read that file instead of
        /proc/meminfo (a twin host's memory at the engine's start)."""
        field = {"1": "MemFree", "MemFree": "MemFree", "MemAvailable": "MemAvailable"}.get(
            os.environ.get("STANDIN_UNIFIED_MEMORY", ""))
        if field is None:
            return
        info: dict[str, int] = {}
        with open(os.environ.get("STANDIN_MEMINFO") or "/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                info[key] = int(rest.split()[0]) * 1024
        util = float(self.cfg.opts.get("gpu-memory-utilization") or 0.9)
        free, total = info[field], info["MemTotal"]
        requested = math.ceil(total * util)
        if free >= requested:
            return
        gib = 1 << 30
        text = VLLM_FREE_MEMORY_ERROR.format(device="cuda:0", free=round(free / gib, 2), total=round(total / gib, 2),
                                             util=util, requested=round(requested / gib, 2))
        self.log.engine("core.py:1082", "EngineCore failed to start.", "ERROR")
        self.log.emit("Traceback (most recent call last):", err=True)
        self.log.emit('  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/utils.py", line 419, '
                      "in request_memory", err=True)
        self.log.emit(text, err=True)
        self.log.emit(VLLM_CORE_FAILED.format("{'EngineCore_DP0': 1}"), err=True)
        os._exit(1)

    def grow_after_ready(self) -> None:
        """STANDIN_GROW_MIB_PER_S: allocate (and touch) memory gradually after ready, at most
        STANDIN_GROW_MAX_MIB (default 1024): a server whose memory climbs toward the host's floor."""
        rate = env_float("STANDIN_GROW_MIB_PER_S", 0)
        if rate <= 0:
            return
        limit = int(env_float("STANDIN_GROW_MAX_MIB", 1024))
        self.held: list[bytes] = []  # kept for the server's life

        def grow() -> None:
            while len(self.held) < limit:
                self.held.append(b"\x01" * (1 << 20))  # written, so resident
                time.sleep(1.0 / rate)

        threading.Thread(target=grow, daemon=True).start()

    def die(self) -> None:
        """The engine dies after ready (STANDIN_FATAL_AFTER, STANDIN_FATAL_AT_REQUEST): its fatal line, once; the
        API server runs on and every request in flight or to come hangs, as on a dead vLLM engine."""
        if not self.dead.is_set():
            self.dead.set()
            self.fatal(before_ready=False)

    def after_ready(self) -> None:
        self.grow_after_ready()
        fatal_after = os.environ.get("STANDIN_FATAL_AFTER")
        if fatal_after:
            threading.Timer(float(fatal_after), self.die).start()
        die_after = os.environ.get("STANDIN_DIE_AFTER")
        if not die_after:
            return

        def die() -> None:
            if os.environ.get("STANDIN_DIE_QUIET") == "1":  # a crash that prints nothing (segfault, OOM killer)
                os._exit(1)
            if self.cfg.mode == "vllm":
                self.log.engine("core.py:789", "EngineCore encountered a fatal error. (standin fault)", "ERROR")
                self.log.api("async_llm.py:480", "AsyncLLM output_handler failed.", "ERROR")
            else:
                self.log.sgl("Scheduler hit an exception: RuntimeError: standin fault", tp=True, err=True)
            os._exit(1)

        threading.Timer(float(die_after), die).start()

    def preamble(self) -> None:
        hf = "set" if os.environ.get("HF_TOKEN") else "not set"
        lines = [
            f"sparklab standin engine (test double, not {self.cfg.mode}); mode={self.cfg.mode}",
            f"argv: {json.dumps(redact(self.cfg.argv))}",
            f"unknown flags (accepted, ignored): {json.dumps(self.cfg.unknown)}",
            f"HF_TOKEN is {hf}; api key {'configured' if self.cfg.api_key else 'not configured'}",
        ]
        for line in lines:
            self.log.api("standin.py:1", line) if self.cfg.mode == "vllm" else self.log.sgl(line)

    def run_vllm(self) -> None:
        cfg, log, spec = self.cfg, self.log, self.cfg.spec
        log.api("api_server.py:1839", f"vLLM API server version {VERSION}")
        log.api("model.py:1510", f"Using max model len {cfg.max_len}")
        if spec:
            log.api("vllm.py:1648", SPEC_BUDGET_WARNING.format(n=cfg.max_batched - 16), "WARNING")
        sc = spec and f"SpeculativeConfig(method={spec.method!r}, model={spec.model!r}, num_spec_tokens={spec.k})"
        msg = f"Initializing a V1 LLM engine ({VERSION}) with config: model={cfg.model!r}, speculative_config="
        log.engine("core.py:93", f"{msg}{sc}, max_seq_len={cfg.max_len}, served_model_name={cfg.served_names[0]}")
        self.join_ray()
        self.faults_at_start()
        self.unified_memory_check()
        delay = env_float("STANDIN_START_DELAY", 1.0)
        time.sleep(delay * time_scale())
        log.engine("gpu_model_runner.py:2000", f"Model loading took 0.2534 GiB memory and {delay:.6f} seconds")
        log.engine("gpu_worker.py:391", "Available KV cache memory: 8.53 GiB")
        log.engine("kv_cache_utils.py:1087", f"GPU KV cache size: {self.kv_tokens:,} tokens")
        conc = f"{cfg.max_len:,} tokens per request: {self.kv_tokens / cfg.max_len:.2f}x"
        log.engine("kv_cache_utils.py:1091", f"Maximum concurrency for {conc}")
        self.listen()
        log.api("api_server.py:1880", f"Starting vLLM API server 0 on http://{cfg.host}:{cfg.port}")
        log.uvicorn(f"Started server process [{os.getpid()}]")
        log.uvicorn("Waiting for application startup.")
        self.ready.set()
        log.uvicorn("Application startup complete.")

    def join_ray(self) -> None:
        """--distributed-executor-backend ray over more than one GPU: wait until the Ray cluster this container's
        `ray start --head` made has one node per GPU (standin_cluster.py)."""
        opts = self.cfg.opts
        world = int(opts.get("tensor-parallel-size") or 1) * int(opts.get("pipeline-parallel-size") or 1)
        if opts.get("distributed-executor-backend") != "ray" or world < 2:
            return
        try:
            address = standin_cluster.read_address()
        except OSError:
            self.log.emit("ConnectionError: could not find any running Ray instance (standin: no ray start --head "
                          "in this container)", err=True)
            os._exit(1)
        waiting = (f"Waiting for creating a placement group of specs for 10 seconds. specs={[{'GPU': 1.0}] * world}. "
                   "Check `ray status` and `ray list nodes` to see if you have enough resources (standin).")
        standin_cluster.wait_for_nodes(address, world, 1800, waiting)
        self.log.engine("ray_utils.py:470", f"Ray cluster has the {world} nodes the placement group needs (standin)")

    def run_sglang(self) -> None:
        cfg, log, spec = self.cfg, self.log, self.cfg.spec
        algo = repr(spec.method) if spec else None
        args = f"model_path={cfg.model!r}, host={cfg.host!r}, port={cfg.port}, context_length={cfg.max_len}"
        log.sgl(f"server_args=ServerArgs({args}, speculative_algorithm={algo}, version={VERSION!r})")
        nnodes, rank = int(cfg.opts.get("nnodes") or 1), int(cfg.opts.get("node-rank") or 0)
        dist = str(cfg.opts.get("dist-init-addr") or "127.0.0.1:20000")
        if nnodes > 1 and rank > 0:  # no HTTP on the other ranks: join rank 0, end when it goes away
            log.sgl(f"node rank {rank} of {nnodes}: joining {dist} (standin)")
            os._exit(standin_cluster.join_and_block(dist, f"rank{rank}", env_float("STANDIN_JOIN_TIMEOUT", 60)))
        if nnodes > 1:
            standin_cluster.Membership(int(dist.rpartition(":")[2])).serve()
        self.listen()
        log.uvicorn(f"Started server process [{os.getpid()}]")
        log.uvicorn("Waiting for application startup.")
        log.uvicorn("Application startup complete.")
        log.uvicorn(f"Uvicorn running on http://{cfg.host}:{cfg.port} (Press CTRL+C to quit)")
        if nnodes > 1:
            standin_cluster.wait_for_nodes(f"127.0.0.1:{dist.rpartition(':')[2]}", nnodes, 1800,
                                           f"waiting for {nnodes} nodes at {dist} (standin)")
            log.sgl(f"all {nnodes} nodes joined at {dist} (standin)")
        log.sgl("Load weight begin. avail mem=110.00 GB", tp=True)
        self.faults_at_start()
        delay = env_float("STANDIN_START_DELAY", 1.0)
        time.sleep(delay * time_scale())
        # SGLang 0.5.23 (sglang/srt/): model_executor/model_runner.py:1372-1378, mem_cache/memory_pool.py:
        # 2087-2090, managers/scheduler.py:1268-1275; "fired up" is entrypoints/http_server.py:2600
        log.sgl(f"Load weight end. elapsed={delay:.2f} s, type=StandinForCausalLM, avail mem=109.75 GB, "
                f"mem usage=0.25 GB.", True)
        log.sgl(f"KV Cache is allocated. dtype: torch.bfloat16, #tokens: {self.kv_tokens}, K size: 1.00 GB, "
                f"V size: 1.00 GB", True)
        limits = "chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=48"
        log.sgl(f"max_total_num_tokens={self.kv_tokens}, {limits}, context_len={cfg.max_len}, "
                f"available_gpu_mem=107.75 GB", True)
        self.ready.set()
        log.sgl("The server is fired up and ready to roll!")

    def run_trtedge(self) -> None:
        """Edge-LLM 0.11.0's start: load (build or reuse the engine bundle), one "Loaded model" line
        (experimental/server/cli.py:43-51), then uvicorn; nothing listens before the model is loaded."""
        cfg, log, spec = self.cfg, self.log, self.cfg.spec
        log.edge("experimental.server.runtime.engine", f"Loading runtime bundle from ~/.cache/edgellm/{cfg.model}")
        self.faults_at_start()
        build = env_float("STANDIN_BUILD_S", 0.0)
        if build:  # a first start builds the TensorRT engines, silent between these two lines (builder.py:485-499)
            log.edge("experimental.builder.core.builder", "Building serialized engine (this may take several "
                                                          "minutes)...")
            time.sleep(build * time_scale())
            log.edge("experimental.builder.core.builder", f"Engine written to ~/.cache/edgellm/{cfg.model}/llm.engine")
        time.sleep(env_float("STANDIN_START_DELAY", 1.0) * time_scale())
        log.edge("experimental.server.runtime.engine", "Engine loaded and ready.")
        log.edge("edgellm.server", f"Loaded model={cfg.served_names[0]} max_model_len={cfg.max_len} "
                                   f"kv_cache_dtype=fp8 speculative_decoding={spec is not None} context_reuse=False")
        self.listen()
        log.uvicorn(f"Started server process [{os.getpid()}]")
        log.uvicorn("Waiting for application startup.")
        log.uvicorn("Application startup complete.")
        self.ready.set()
        log.uvicorn(f"Uvicorn running on http://{cfg.host}:{cfg.port} (Press CTRL+C to quit)")

    def run(self) -> None:
        signal.signal(signal.SIGTERM, self.shutdown)
        signal.signal(signal.SIGINT, self.shutdown)
        self.preamble()
        runs = {"vllm": self.run_vllm, "sglang": self.run_sglang, "trtedge": self.run_trtedge}
        try:
            runs[self.cfg.mode]()
        except OSError as exc:
            self.log.emit(f"OSError: {exc}", err=True)
            os._exit(1)
        self.after_ready()
        while True:
            time.sleep(3600)


def main(mode: str, argv: list[str] | None = None) -> None:
    """STANDIN_BOOT_S: wall seconds of silence before anything (unscaled): the stand-in's own boot on a busy
    machine, which no engine's modelled start includes (a rehearsal must not count it as the night's)."""
    time.sleep(env_float("STANDIN_BOOT_S", 0.0))
    argv = list(sys.argv[1:] if argv is None else argv)
    if mode == "vllm" and argv[:1] in (["--version"], ["-v"]):
        print(VERSION)
        return
    if mode == "vllm" and argv[:1] != ["serve"]:
        print(f"usage: vllm serve [MODEL] [options]  (standin; got {argv!r})", file=sys.stderr)
        sys.exit(2)
    App(parse_args(mode, argv)).run()


if __name__ == "__main__":
    main(os.environ.get("STANDIN_MODE", "vllm"))
