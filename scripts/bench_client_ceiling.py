#!/usr/bin/env python3
"""How fast can sparklab's benchmark client ingest a stream, and how exactly does it time it?

Both sparklab (`bench.run`, in this process) and `vllm bench serve` (vLLM 0.27.1 CPU image, in a container on the
host network) are pointed at the same zero-latency streaming server, written here with stdlib asyncio and run in
its own process. Same prompts, request counts, max_tokens and warmups for both, at concurrency 1, 8, 64 and 256:

- ceiling modes: the server writes each pre-rendered response at once (one token per SSE chunk, like vLLM without
  speculation, and several tokens per chunk, like speculative decoding). Ingest = output tokens / the client's
  own measured window.
- paced mode: the server sends the first token `--ttft-ms` after it has read the request, then one chunk every
  `--gap-ms`. It records when it actually wrote each chunk; those send times are the truth the clients' mean
  TTFT and TPOT are compared with (the nominal schedule is reported too, with how far the server slipped).

The machine has 2 cores, so client and server compete. By default the server is pinned to CPU 0 and each client
to CPU 1 (`--no-pin` lets the kernel place them). Only 127.0.0.1 is used. The server process and the container
are removed on every path, Ctrl-C included.

    python scripts/bench_client_ceiling.py --quick
    python scripts/bench_client_ceiling.py --out results.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

IMAGE = "127.0.0.1:5000/sparklab/vllm-cpu:0.27.1"
TOKENIZER = "/models/SmolLM2-135M-Instruct"  # inside the image; vllm bench serve needs one for prompt lengths
MODEL = "zero-latency"
WARMUPS = 2
CONTAINER_LABEL = "sparklab.script=bench_client_ceiling"
CONCURRENCIES = (1, 8, 64, 256)
TOKEN_TEXT, TOKEN_ID = " the", 279
PROMPT_INDEX = re.compile(r"Request (\d+):")


# ---------------------------------------------------------------------------------------------------------------
# The zero-latency server (runs in its own process)


@dataclass(frozen=True)
class Pace:
    """How the server answers: `None` delays mean everything at once (the ceiling)."""

    tokens_per_chunk: int = 1
    ttft_s: float | None = None
    gap_s: float | None = None

    @property
    def paced(self) -> bool:
        return self.ttft_s is not None


def _http_chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _sse(event: dict[str, Any] | str) -> bytes:
    data = event if isinstance(event, str) else json.dumps(event, separators=(",", ":"))
    return _http_chunk(f"data: {data}\n\n".encode())


def render_sends(tokens: int, per_chunk: int, token_ids: bool, usage: bool) -> list[bytes]:
    """The bytes of each timed send, as vLLM streams them: the role chunk goes with the first token, and the usage
    chunk, [DONE] and the end of the chunked body go with the last one. Each SSE event is one HTTP chunk."""
    base = {"id": "chatcmpl-0123456789abcdef", "object": "chat.completion.chunk", "created": 1_700_000_000,
            "model": MODEL}

    def event(delta: dict[str, Any], ids: list[int] | None, finish: str | None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        if ids is not None:
            choice["token_ids"] = ids
        return {**base, "choices": [choice]}

    chunks = math.ceil(tokens / per_chunk)
    sends = []
    for i in range(chunks):
        k = min(per_chunk, tokens - i * per_chunk)
        last = i == chunks - 1
        data = _sse(event({"content": TOKEN_TEXT * k}, [TOKEN_ID] * k if token_ids else None,
                          "length" if last else None))
        if i == 0:
            data = _sse(event({"role": "assistant", "content": ""}, None, None)) + data
        if last:
            if usage:
                data += _sse({**base, "choices": [], "usage": {"prompt_tokens": 16, "completion_tokens": tokens,
                                                               "total_tokens": 16 + tokens}})
            data += _sse("[DONE]") + b"0\r\n\r\n"
        sends.append(data)
    return sends


@dataclass
class ServedRequest:
    """One chat completion as the server saw it (time.monotonic, seconds)."""

    received: float  # request fully read
    tokens: int
    prompt: int  # N of the prompt "Request N: ...", to match the client's record of the same request
    first_sent: float = 0.0  # the write of the first token chunk
    last_sent: float = 0.0  # the write of the last token chunk
    max_late_s: float = 0.0  # worst lateness of a write against its schedule


class ZeroLatencyServer:
    """Just enough OpenAI API: /v1/models, streamed /v1/chat/completions, and a control API for this script."""

    def __init__(self) -> None:
        self.pace = Pace()
        self.log: list[ServedRequest] = []
        self._rendered: dict[tuple[int, int, bool, bool], list[bytes]] = {}
        self._cpu_mark = time.process_time()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, v in (x.split(":", 1) for x in lines[1:] if ":" in x)}
                body = await reader.readexactly(int(headers.get("content-length", 0)))
                received = time.monotonic()
                if path.startswith("/v1/chat/completions") and method == "POST":
                    await self._chat(json.loads(body), writer, received)
                elif path == "/v1/models":
                    self._json(writer, 200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
                elif path == "/_ceiling/pace" and method == "POST":
                    self.pace, self.log = Pace(**json.loads(body)), []
                    self._cpu_mark = time.process_time()
                    self._json(writer, 200, {"ok": True})
                elif path == "/_ceiling/log":
                    self._json(writer, 200, {"requests": [asdict(r) for r in self.log],
                                             "cpu_s": time.process_time() - self._cpu_mark})
                else:
                    self._json(writer, 404, {"error": {"message": f"{path} not served here"}})
                if headers.get("connection", "").lower() == "close":
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    @staticmethod
    def _json(writer: asyncio.StreamWriter, status: int, payload: dict[str, Any]) -> None:
        body = json.dumps(payload).encode()
        writer.write(b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                     % (status, len(body), body))

    async def _chat(self, request: dict[str, Any], writer: asyncio.StreamWriter, received: float) -> None:
        tokens = int(request.get("max_completion_tokens") or request.get("max_tokens") or 256)
        pace = self.pace
        key = (tokens, pace.tokens_per_chunk, bool(request.get("return_token_ids")),
               bool((request.get("stream_options") or {}).get("include_usage")))
        sends = self._rendered.get(key)
        if sends is None:
            sends = self._rendered[key] = render_sends(*key)
        match = PROMPT_INDEX.search(str((request.get("messages") or [{}])[-1].get("content", "")))
        record = ServedRequest(received, tokens, int(match.group(1)) if match else -1)
        self.log.append(record)
        head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        if not pace.paced:
            writer.write(head + b"".join(sends))
            record.first_sent = record.last_sent = time.monotonic()
            await writer.drain()
            return
        writer.write(head)  # headers at once, as uvicorn does; then the tokens on schedule
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        assert pace.ttft_s is not None and pace.gap_s is not None

        def send(i: int) -> None:
            if writer.is_closing():
                if not done.done():
                    done.set_result(None)
                return
            now = time.monotonic()
            writer.write(sends[i])
            record.max_late_s = max(record.max_late_s, now - (received + pace.ttft_s + i * pace.gap_s))
            if i == 0:
                record.first_sent = now
            if i + 1 < len(sends):
                loop.call_at(received + pace.ttft_s + (i + 1) * pace.gap_s, send, i + 1)
            else:
                record.last_sent = now
                done.set_result(None)

        # loop.time() is time.monotonic(), so the schedule and the records share one clock
        loop.call_at(received + pace.ttft_s, send, 0)
        await done
        await writer.drain()


def serve(port: int, cpu: int | None, ready: Connection) -> None:
    """Process entry: serve on 127.0.0.1:port until terminated. The parent handles Ctrl-C and stops us."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})

    async def main() -> None:
        server = await asyncio.start_server(ZeroLatencyServer().handle, "127.0.0.1", port, backlog=1024)
        ready.send(True)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


@contextlib.contextmanager
def running_server(port: int, cpu: int | None):  # type: ignore[no-untyped-def]
    parent, child = multiprocessing.Pipe()
    process = multiprocessing.get_context("spawn").Process(target=serve, args=(port, cpu, child), daemon=True,
                                                           name="zero-latency-server")
    process.start()
    try:
        if not parent.poll(30) or not parent.recv():
            raise RuntimeError("the zero-latency server did not start")
        yield process
    finally:
        process.terminate()
        process.join(5)
        if process.is_alive():
            process.kill()
            process.join()


def control(port: int, path: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
    data = json.dumps(payload).encode() if payload is not None else None
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method="POST" if data else "GET")
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


# ---------------------------------------------------------------------------------------------------------------
# The clients


@dataclass
class Cell:
    mode: str  # "ceiling k=1", "ceiling k=4", "paced k=1"
    pace: Pace
    concurrency: int
    requests: int
    max_tokens: int


@dataclass
class ClientRun:
    client: str
    ok: int
    failed: int
    output_tokens: int
    window_s: float
    tok_s: float
    ttft_ms: float | None
    tpot_ms: float | None
    client_cpu_s: float | None = None
    errors: list[str] = field(default_factory=list)
    # prompt index -> (start, first token) on the client's clock; CLOCK_MONOTONIC, the server's clock too
    timeline: dict[int, tuple[float, float]] = field(default_factory=dict, repr=False)


def run_sparklab(cell: Cell, port: int, prompts_file: Path) -> ClientRun:
    from sparklab.bench import cell as bench
    from sparklab.bench.workloads import load_workload
    from sparklab.records import RequestRecord, Sampling

    endpoint = bench.Endpoint.from_url(f"http://127.0.0.1:{port}/v1", model=MODEL)
    sampling = Sampling(max_tokens=cell.max_tokens, temperature=0, ignore_eos=True)  # = --temperature 0 --ignore-eos
    load = bench.Load(concurrency=cell.concurrency, requests=cell.requests, warmup=WARMUPS)
    timeline: dict[int, tuple[float, float]] = {}

    def on_done(record: RequestRecord) -> None:  # measured requests only; perf_counter is CLOCK_MONOTONIC
        if record.first_token is not None:
            timeline[record.index] = (record.start, record.first_token)

    cpu = time.process_time()
    result = bench.run(endpoint, load_workload(str(prompts_file)), sampling, load, on_done=on_done)
    summary = result["summary"]
    return ClientRun("sparklab", summary["requests"]["ok"], summary["requests"]["failed"], summary["output_tokens"],
                     summary["wall_s"], summary["aggregate_tps"], (summary["ttft_ms"] or {}).get("mean"),
                     (summary["tpot_ms"] or {}).get("mean"), time.process_time() - cpu,
                     summary["requests"]["first_errors"], timeline)


class VllmBench:
    """`vllm bench serve` in one long-lived container (host network, pinned), one `docker exec` per cell."""

    def __init__(self, image: str, workdir: Path, cpu: int | None) -> None:
        self.image, self.workdir, self.cpu = image, workdir, cpu
        self.name = f"bench-client-ceiling-{os.getpid()}"

    def __enter__(self) -> VllmBench:
        argv = ["docker", "run", "-d", "--rm", "--name", self.name, "--label", CONTAINER_LABEL,
                "--label", f"sparklab.script.pid={os.getpid()}", "--network", "host",
                "-v", f"{self.workdir}:/work", "--entrypoint", "sleep"]
        if self.cpu is not None:
            argv += ["--cpuset-cpus", str(self.cpu)]
        subprocess.run([*argv, self.image, "infinity"], check=True, capture_output=True, text=True, timeout=120)
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["docker", "rm", "-f", self.name], capture_output=True, timeout=60)

    def version(self) -> str:
        out = subprocess.run(["docker", "image", "inspect", "--format", "{{index .RepoDigests 0}} {{.Id}}",
                              self.image], capture_output=True, text=True, timeout=30)
        return out.stdout.strip()

    def run(self, cell: Cell, port: int, prompts_name: str, tag: str) -> ClientRun:
        result_name = f"vllm-{tag}.json"
        argv = ["docker", "exec", self.name, "vllm", "bench", "serve", "--backend", "openai-chat",
                "--base-url", f"http://127.0.0.1:{port}", "--endpoint", "/v1/chat/completions", "--model", MODEL,
                "--tokenizer", TOKENIZER, "--dataset-name", "sharegpt", "--dataset-path", f"/work/{prompts_name}",
                "--sharegpt-output-len", str(cell.max_tokens), "--disable-shuffle",
                "--ignore-eos", "--temperature", "0", "--max-concurrency", str(cell.concurrency),
                "--num-prompts", str(cell.requests), "--num-warmups", str(WARMUPS), "--seed", "0",
                "--disable-tqdm", "--save-result", "--save-detailed", "--result-dir", "/work",
                "--result-filename", result_name]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
        path = self.workdir / result_name
        if done.returncode != 0 or not path.exists():
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
            raise RuntimeError(f"vllm bench serve failed ({done.returncode}):\n{tail}")
        data = json.loads(path.read_text())
        path.unlink()
        # outputs are in prompt order (--disable-shuffle); its perf_counter is the host's CLOCK_MONOTONIC
        timeline = {i: (start, start + ttft) for i, (start, ttft) in enumerate(zip(data["start_times"], data["ttfts"],
                                                                                   strict=True)) if ttft}
        return ClientRun("vllm", data["completed"], data.get("failed", 0), data["total_output_tokens"],
                         data["duration"], data["output_throughput"], data["mean_ttft_ms"], data["mean_tpot_ms"],
                         errors=[e for e in data.get("errors", []) if e][:3], timeline=timeline)


# ---------------------------------------------------------------------------------------------------------------
# Truth, cells and the report


def server_truth(log: dict[str, Any], run: ClientRun, pace: Pace) -> dict[str, Any]:
    """Mean TTFT/TPOT from the server's own send times for the client's measured requests (matched by prompt; the
    warmups reuse the first prompts, so the last request the server received for a prompt is the measured one), and
    where the client's TTFT error arises: before the server has the request (send lag) or after the first token
    was written (receive lag), both on the shared CLOCK_MONOTONIC."""
    latest = {r["prompt"]: r for r in sorted(log["requests"], key=lambda r: r["received"])}
    served = [latest[i] for i in run.timeline if i in latest]
    truth: dict[str, Any] = {"requests": len(served), "server_cpu_s": log["cpu_s"]}
    if served:
        truth["send_lag_ms"] = 1000 * statistics.fmean(latest[i]["received"] - start
                                                       for i, (start, _) in run.timeline.items() if i in latest)
        truth["receive_lag_ms"] = 1000 * statistics.fmean(first - latest[i]["first_sent"]
                                                          for i, (_, first) in run.timeline.items() if i in latest)
        truth["max_send_lag_ms"] = 1000 * max(latest[i]["received"] - start
                                              for i, (start, _) in run.timeline.items() if i in latest)
    if pace.paced and served:
        assert pace.ttft_s is not None and pace.gap_s is not None
        truth["ttft_ms"] = 1000 * statistics.fmean(r["first_sent"] - r["received"] for r in served)
        truth["tpot_ms"] = 1000 * statistics.fmean((r["last_sent"] - r["first_sent"]) / (r["tokens"] - 1)
                                                   for r in served)
        chunks = math.ceil(served[0]["tokens"] / pace.tokens_per_chunk)
        truth["nominal_ttft_ms"] = 1000 * pace.ttft_s
        truth["nominal_tpot_ms"] = 1000 * pace.gap_s * (chunks - 1) / (served[0]["tokens"] - 1)
        truth["max_late_ms"] = 1000 * max(r["max_late_s"] for r in served)
        truth["mean_late_first_ms"] = truth["ttft_ms"] - truth["nominal_ttft_ms"]
    return truth


def error_pct(measured: float | None, truth: float | None) -> float | None:
    if measured is None or not truth:
        return None
    return 100 * (measured - truth) / truth


def cells(args: argparse.Namespace) -> list[Cell]:
    out = []
    k = args.tokens_per_chunk
    modes = [("ceiling k=1", Pace(1)), (f"ceiling k={k}", Pace(k)),
             ("paced k=1", Pace(1, args.ttft_ms / 1000, args.gap_ms / 1000))]
    for mode, pace in modes:
        for c in args.concurrency:
            if pace.paced:
                requests = max(c * (1 if args.quick else 2), 2 if args.quick else 4)
                out.append(Cell(mode, pace, c, requests, args.paced_tokens))
            else:
                requests = max(c * (2 if args.quick else 4), 64 if args.quick else 400)
                out.append(Cell(mode, pace, c, requests, args.tokens))
    return out


def measure(cell: Cell, port: int, vllm: VllmBench, workdir: Path, prompts: Path, client_cpu: int | None,
            order: int) -> dict[str, Any]:
    """One cell: each client against the same server pace; the order alternates between cells."""
    runs: dict[str, Any] = {}
    tag = f"{cell.mode.replace(' ', '').replace('=', '')}-c{cell.concurrency}"
    for client in (("sparklab", "vllm") if order % 2 == 0 else ("vllm", "sparklab")):
        control(port, "/_ceiling/pace", asdict(cell.pace))
        if client == "sparklab":
            if client_cpu is not None:
                os.sched_setaffinity(0, {client_cpu})
            run = run_sparklab(cell, port, prompts)
        else:
            run = vllm.run(cell, port, prompts.with_suffix(".json").name, tag)
        truth = server_truth(control(port, "/_ceiling/log"), run, cell.pace)
        runs[client] = {**{k: v for k, v in asdict(run).items() if k != "timeline"}, "truth": truth,
                        "ttft_error_pct": error_pct(run.ttft_ms, truth.get("ttft_ms")),
                        "tpot_error_pct": error_pct(run.tpot_ms, truth.get("tpot_ms"))}
    ratio = runs["sparklab"]["tok_s"] / runs["vllm"]["tok_s"] if runs["vllm"]["tok_s"] else None
    return {**asdict(cell), "runs": runs, "ratio": ratio}


def _f(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _lags(truth: dict[str, Any]) -> str:
    return f"{_f(truth.get('send_lag_ms'), '.1f')}+{_f(truth.get('receive_lag_ms'), '.1f')}"


def table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'mode':<12} {'c':>4} {'reqs':>5} {'sparklab tok/s':>14} {'vllm tok/s':>11} {'ratio':>6} "
            f"{'TTFT err% s/v':>15} {'TPOT err% s/v':>15} {'truth TTFT/TPOT ms':>19} {'srv late':>9} "
            f"{'send+recv lag ms s | v':>23}")
    lines = [head, "-" * len(head)]
    for row in rows:
        s, v = row["runs"]["sparklab"], row["runs"]["vllm"]
        truth = s["truth"]
        late = max(s["truth"].get("max_late_ms", 0), v["truth"].get("max_late_ms", 0)) if "ttft_ms" in truth else None
        lines.append(
            f"{row['mode']:<12} {row['concurrency']:>4} {row['requests']:>5} {s['tok_s']:>14,.0f} {v['tok_s']:>11,.0f} "
            f"{_f(row['ratio'], '.2f'):>6} "
            f"{_f(s['ttft_error_pct'], '+.2f'):>7}/{_f(v['ttft_error_pct'], '+.2f'):<7} "
            f"{_f(s['tpot_error_pct'], '+.2f'):>7}/{_f(v['tpot_error_pct'], '+.2f'):<7} "
            f"{_f(truth.get('ttft_ms'), '.1f'):>9}/{_f(truth.get('tpot_ms'), '.2f'):<9} "
            f"{_f(late, '.1f'):>9} {_lags(s['truth']):>11} | {_lags(v['truth']):<11}")
    return "\n".join(lines)


def verdict(rows: list[dict[str, Any]], target_ratio: float, target_err: float) -> list[str]:
    out = []
    for row in rows:
        name = f"{row['mode']} c={row['concurrency']}"
        s = row["runs"]["sparklab"]
        if row["mode"].startswith("ceiling"):
            ok = row["ratio"] is not None and row["ratio"] >= target_ratio
            out.append(f"{'PASS' if ok else 'FAIL'} {name}: ingest {_f(row['ratio'], '.2f')}x vllm's "
                       f"(target >= {target_ratio}x)")
        else:
            errs = [abs(e) for e in (s["ttft_error_pct"], s["tpot_error_pct"]) if e is not None]
            ok = len(errs) == 2 and max(errs) <= target_err
            out.append(f"{'PASS' if ok else 'FAIL'} {name}: TTFT {_f(s['ttft_error_pct'], '+.2f')}%, "
                       f"TPOT {_f(s['tpot_error_pct'], '+.2f')}% (target |error| <= {target_err}%)")
            # The TTFT error above includes the send lag: the time from the client's send to the server reading
            # the request, which under a burst is the server's own read queue (a user waits for it too). The part
            # the client adds is the receive lag: the server wrote the first token, the client parsed it.
            truth = s.get("truth") or {}
            if truth.get("receive_lag_ms") is not None and truth.get("ttft_ms"):
                own = 100 * truth["receive_lag_ms"] / truth["ttft_ms"]
                out.append(f"{'PASS' if own <= target_err else 'FAIL'} {name}: TTFT error the client adds "
                           f"(receive lag {truth['receive_lag_ms']:.2f} ms) {own:.2f}%; send lag "
                           f"{truth['send_lag_ms']:.2f} ms is the server reading a burst of requests")
    return out


def write_prompts(workdir: Path, count: int) -> Path:
    """The same prompts, in order, for both: JSONL for sparklab, ShareGPT JSON for vllm bench serve (its `custom`
    dataset needs pandas, which the CPU image lacks). The two-turn ShareGPT form is only there to be accepted; its
    output length is overridden with --sharegpt-output-len. Returns the JSONL path; the JSON has the same stem."""
    texts = [f"Request {i}: write a short story about the number {i}." for i in range(count)]
    jsonl = workdir / "prompts.jsonl"
    jsonl.write_text("".join(json.dumps({"id": f"p{i}", "prompt": t}) + "\n" for i, t in enumerate(texts)))
    sharegpt = [{"conversations": [{"from": "human", "value": t}, {"from": "gpt", "value": "Once upon a time."}]}
                for t in texts]
    jsonl.with_suffix(".json").write_text(json.dumps(sharegpt))
    return jsonl


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def remove_stale_containers() -> None:
    """Containers left by an earlier run of this script that was killed outright (SIGKILL)."""
    out = subprocess.run(["docker", "ps", "-aq", "--filter", f"label={CONTAINER_LABEL}", "--format",
                          '{{.ID}} {{.Label "sparklab.script.pid"}}'], capture_output=True, text=True, timeout=30)
    for line in out.stdout.splitlines():
        cid, _, pid = line.partition(" ")
        if not pid.isdigit() or not Path(f"/proc/{pid}").exists():
            subprocess.run(["docker", "rm", "-f", cid], capture_output=True, timeout=60)


def host_facts(pin: bool, vllm_image: str) -> dict[str, Any]:
    import openai

    import sparklab

    cpu_model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), platform.machine())
    versions = {}
    for dist in ("openai", "httpx", "httpx2", "h11"):
        with contextlib.suppress(Exception):
            import importlib.metadata

            versions[dist] = importlib.metadata.version(dist)
    return {"cpus": os.cpu_count(), "cpu_model": cpu_model, "python": platform.python_version(),
            "sparklab": sparklab.__version__, "openai": openai.__version__, "packages": versions,
            "vllm_image": vllm_image,
            "placement": "server on CPU 0, each client on CPU 1" if pin else "unpinned: client and server share 2 CPUs"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    default_out = Path.home() / ".cache/sparklab/measurements" / (
        f"bench_client_ceiling-{datetime.now().strftime('%Y%m%d-%H%M%S')}.json")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer requests per cell (about 3 minutes)")
    p.add_argument("--out", type=Path, default=default_out, help=f"JSON results (default {default_out.parent}/…)")
    p.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCIES))
    p.add_argument("--tokens", type=int, default=256, help="output tokens per request, ceiling modes (default 256)")
    p.add_argument("--tokens-per-chunk", type=int, default=4, help="the multi-token ceiling mode's k (default 4)")
    p.add_argument("--paced-tokens", type=int, default=64, help="output tokens per request, paced mode (default 64)")
    p.add_argument("--ttft-ms", type=float, default=50.0, help="paced mode: first token after this (default 50)")
    p.add_argument("--gap-ms", type=float, default=20.0, help="paced mode: one chunk every this (default 20)")
    p.add_argument("--image", default=IMAGE)
    p.add_argument("--no-pin", dest="pin", action="store_false", help="do not pin server and client to CPUs")
    p.add_argument("--target-ratio", type=float, default=1.5)
    p.add_argument("--target-error-pct", type=float, default=1.0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    pin = args.pin and (os.cpu_count() or 1) >= 2
    server_cpu, client_cpu = (0, 1) if pin else (None, None)
    plan = cells(args)
    print(f"{os.cpu_count()} CPUs: client and server compete for them; "
          f"{'server pinned to CPU 0, clients to CPU 1' if pin else 'not pinned'}. {len(plan)} cells, "
          f"{WARMUPS} warmups per client run.", flush=True)
    remove_stale_containers()
    rows: list[dict[str, Any]] = []
    port = free_port()
    original_affinity = os.sched_getaffinity(0)
    with tempfile.TemporaryDirectory(prefix="bench-ceiling-") as tmp:
        workdir = Path(tmp)
        os.chmod(workdir, 0o777)  # the container writes its result files here
        prompts = write_prompts(workdir, max(c.requests for c in plan))
        try:
            with running_server(port, server_cpu), VllmBench(args.image, workdir, client_cpu) as vllm:
                facts = host_facts(pin, vllm.version())
                for order, cell in enumerate(plan):
                    t0 = time.monotonic()
                    row = measure(cell, port, vllm, workdir, prompts, client_cpu, order)
                    os.sched_setaffinity(0, original_affinity)
                    rows.append(row)
                    s, v = row["runs"]["sparklab"], row["runs"]["vllm"]
                    print(f"  {cell.mode:<12} c={cell.concurrency:<4} n={cell.requests:<5} sparklab "
                          f"{s['tok_s']:>9,.0f} tok/s  vllm {v['tok_s']:>9,.0f} tok/s  ratio "
                          f"{_f(row['ratio'], '.2f')}  ({time.monotonic() - t0:.0f} s)", flush=True)
        except KeyboardInterrupt:
            print("interrupted: server stopped, container removed", file=sys.stderr)
            return 130
        finally:
            os.sched_setaffinity(0, original_affinity)
    print()
    print(table(rows))
    print("\nTTFT/TPOT errors: each client's mean vs the mean of the server's actual send times for the same "
          "requests (first token write - request read; (last - first token write) / (N - 1)). 'srv late' is the "
          "server's worst slip behind its nominal schedule, in ms. TTFT error = send lag (client start -> server has "
          "read the request) + receive lag (server wrote the first token -> client parsed it), on the shared clock.")
    print("\n".join(verdict(rows, args.target_ratio, args.target_error_pct)))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "schema": "sparklab.bench_client_ceiling/1",
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": facts, "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "method": __doc__, "cells": rows,
        "verdict": verdict(rows, args.target_ratio, args.target_error_pct)}, indent=1))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
