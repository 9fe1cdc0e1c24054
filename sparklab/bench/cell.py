"""One benchmark cell: warmup, then a measured load (closed loop or Poisson), server counters around it.

The result is a self-describing dict (schema `sparklab.bench/1`): settings, how it was measured, the
summary, the server's speculative-decoding counters, and every request with times relative to the window.
It never contains the API key.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any

from sparklab import __version__, engines
from sparklab.bench import metrics
from sparklab.bench.client import TRANSPORT, ChatClient
from sparklab.bench.ownthread import in_own_thread
from sparklab.bench.workloads import Workload
from sparklab.engines.api import COUNTERS_BUDGET_S, Budget, EngineAPI
from sparklab.errors import SparklabError
from sparklab.records import Alive, BenchResult, RequestRecord, Sampling

SCHEMA = "sparklab.bench/1"


@dataclass(frozen=True)
class Load:
    concurrency: int = 1
    requests: int | None = 10
    duration_s: float | None = None
    rate: float | None = None  # requests/s, Poisson arrivals; concurrency then caps requests in flight
    warmup: int = 2
    stream: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise SparklabError(f"--concurrency must be at least 1, got {self.concurrency}")
        if (self.requests is None) == (self.duration_s is None):
            raise SparklabError("give either a request count (--requests) or a duration (--duration)")
        if self.requests is not None and self.requests < 1:
            raise SparklabError(f"--requests must be at least 1, got {self.requests}")
        if self.rate is not None and self.rate <= 0:
            raise SparklabError(f"--rate must be positive, got {self.rate}")
        if self.warmup < 0:
            raise SparklabError(f"--warmup cannot be negative, got {self.warmup}")


@dataclass(frozen=True)
class Endpoint:
    root: str  # http://host:port, without /v1
    api_key: str | None = None
    model: str | None = None
    kind: str | None = None  # the engine's kind when known (a sparklab server); None: ask every adapter

    @property
    def api(self) -> EngineAPI:
        return EngineAPI(self.root, self.api_key)

    @staticmethod
    def from_url(url: str, api_key: str | None = None, model: str | None = None, kind: str | None = None) -> Endpoint:
        root = url.rstrip("/")
        root = root[: -len("/v1")] if root.endswith("/v1") else root
        if not root.startswith(("http://", "https://")):
            raise SparklabError(f"--url {url!r} is not an http(s) URL", "Example: --url http://127.0.0.1:8000/v1")
        return Endpoint(root, api_key, model, kind)


Progress = Callable[[RequestRecord], None]


async def _send(client: ChatClient, workload: Workload, sampling: Sampling, load: Load, index: int,
                warmup: bool = False) -> RequestRecord:
    prompt = workload.prompt(index)
    return await client.request(index, prompt.id, list(prompt.messages), sampling, load.stream, warmup=warmup,
                                extra=prompt.extra)


async def _closed_loop(client: ChatClient, workload: Workload, sampling: Sampling, load: Load,
                       on_done: Progress | None) -> list[RequestRecord]:
    """N workers, each sending its next request as soon as its previous one finishes."""
    records: list[RequestRecord] = []
    counter = iter(range(10**12))
    deadline = time.perf_counter() + load.duration_s if load.duration_s else None

    async def worker() -> None:
        while True:
            index = next(counter)
            if load.requests is not None and index >= load.requests:
                return
            if deadline is not None and time.perf_counter() >= deadline:
                return
            record = await _send(client, workload, sampling, load, index)
            records.append(record)
            if on_done:
                on_done(record)

    await asyncio.gather(*(worker() for _ in range(load.concurrency)))
    return records


async def _poisson(client: ChatClient, workload: Workload, sampling: Sampling, load: Load,
                   on_done: Progress | None) -> list[RequestRecord]:
    """Arrivals at exponential intervals (mean 1/rate); at most `concurrency` in flight."""
    records: list[RequestRecord] = []
    rng = random.Random(load.seed)
    gate = asyncio.Semaphore(load.concurrency)
    started = time.perf_counter()

    async def one(index: int) -> None:
        async with gate:
            record = await _send(client, workload, sampling, load, index)
        records.append(record)
        if on_done:
            on_done(record)

    tasks = []
    index, at = 0, 0.0
    while load.requests is None or index < load.requests:
        at += rng.expovariate(load.rate or 1.0)
        if load.duration_s is not None and at >= load.duration_s:
            break
        await asyncio.sleep(max(0.0, started + at - time.perf_counter()))
        tasks.append(asyncio.create_task(one(index)))
        index += 1
    await asyncio.gather(*tasks)
    return records


# Why the whole cell must end now (a server its caller watches died, its host went away), or None while it may go
# on: the error the cell raises.
Stop = Callable[[], "Exception | None"]
STOP_POLL_S = 0.2  # how often a cell asks its Stop


@dataclass(frozen=True)
class Patience:
    """How long a request may take: the request timeout, the stall detector, the grace after a complete answer; and
    what ends the whole cell early."""

    request_timeout_s: float = 1800
    stall_timeout_s: float | None = 60  # no bytes this long while `alive` fails ends a request; None: never
    alive: Alive | None = None
    finish_grace_s: float = 2.0
    counters_budget_s: float = COUNTERS_BUDGET_S  # both counter snapshots together (sparklab.engines.api)
    stop: Stop | None = None
    # wall seconds per second of the measured night: 1 for a real server; a rehearsal's stand-ins run its night
    # compressed, and its records are read back on the night's clock (times / scale), so its tables are the night's
    time_scale: float = 1.0
    # called after the warmup, before the window opens: waits until the engine's log holds the warmup's lines
    # (settle_log), so that lines a busy log copier stamps late are not read as the window's
    before_window: Callable[[], object] | None = None


async def _run(endpoint: Endpoint, model: str, workload: Workload, sampling: Sampling, load: Load,
               on_done: Progress | None, patience: Patience) -> BenchResult:
    """The cell; with patience.stop, cut short (its requests cancelled, its connections closed) once stop() gives a
    reason, which is raised."""
    work = asyncio.ensure_future(_measure(endpoint, model, workload, sampling, load, on_done, patience))
    if patience.stop is None:
        return await work
    while not work.done():
        await asyncio.wait((work,), timeout=STOP_POLL_S)
        reason = None if work.done() else patience.stop()
        if reason is not None:
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):  # what the cut-short requests raise
                await work
            raise reason
    return work.result()


async def _measure(endpoint: Endpoint, model: str, workload: Workload, sampling: Sampling, load: Load,
                   on_done: Progress | None, patience: Patience) -> BenchResult:
    reuse = engines.engine(endpoint.kind).keeps_streamed_connections if endpoint.kind else True
    client = ChatClient(endpoint.root + "/v1", endpoint.api_key, model, timeout_s=patience.request_timeout_s,
                        finish_grace_s=patience.finish_grace_s, stall_timeout_s=patience.stall_timeout_s,
                        alive=patience.alive, reuse_connections=reuse)
    try:
        # sequential, like seed 000's bench.py
        warmup = [await _send(client, workload, sampling, load, i, warmup=True) for i in range(load.warmup)]
        if warmup and endpoint.kind is not None:  # warmup answers the first prompts: not from cache in the window
            adapter = engines.engine(endpoint.kind)
            await in_own_thread(lambda: adapter.reset_prefix_cache(endpoint.api))
        if patience.before_window is not None:
            await in_own_thread(patience.before_window, "log-settle")
        await client.warm(load.concurrency)
        budget = Budget(patience.counters_budget_s)
        # in threads of their own: a cell cut short (stop()) never waits for a call its engine does not answer
        before = await in_own_thread(lambda: engines.snapshot(endpoint.api, endpoint.kind, budget))
        window_start = time.perf_counter()
        window_wall = time.time()
        runner = _poisson if load.rate else _closed_loop
        measured = await runner(client, workload, sampling, load, on_done)
        window_end = max([r.end for r in measured], default=time.perf_counter())
        after = await in_own_thread(lambda: engines.snapshot(endpoint.api, endpoint.kind, budget))
        connections = client.connections()
    finally:
        await client.close()
    records = warmup + sorted(measured, key=lambda r: r.index)
    if patience.time_scale != 1:
        window_start, window_end = _on_night_clock(records, window_start, window_end, patience.time_scale)
    result = _result(endpoint, model, workload, sampling, load, records, (window_start, window_end),
                     before, after)
    result["measurement"]["window_started_at"] = window_wall
    if connections is not None:
        result["measurement"]["connections"] = connections
    return result


# A line reaches a container's log when dockerd's copier reads it from the engine's pipe, and is stamped then: a
# moment after the engine wrote it (here 0.1-0.2 ms median, up to 29 ms while other containers flooded their logs;
# more on a loaded host). A window's log is read once no new acceptance line has come for LOG_QUIET_S.
LOG_QUIET_S = 0.3
LOG_SETTLE_BUDGET_S = 3.0  # an engine that keeps printing acceptance lines is read as it stands after this
LOG_POLL_S = 0.1


def settle_log(kind: str | None, log_text: Callable[[], str], scale: float = 1.0,
               clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], object] = time.sleep) -> str:
    """The log once its engine's acceptance lines stopped arriving: none new for LOG_QUIET_S (at most
    LOG_SETTLE_BUDGET_S), both times `scale` (a rehearsal's wall seconds per night second, Patience.time_scale, so
    that its night is not lengthened by a wait the real night does not have). Other lines (a health check's access
    line) do not hold it up. For an engine that states acceptance elsewhere, the log as it is."""
    adapter = engines.engine(kind) if kind is not None else None
    text = log_text()
    if adapter is None or not adapter.reads_log_acceptance:
        return text

    def lines(text: str) -> int:
        return int((adapter.log_acceptance(text) or {}).get("samples") or 0)

    quiet_s, poll_s = LOG_QUIET_S * scale, LOG_POLL_S * scale
    seen, quiet_from, deadline = lines(text), clock(), clock() + LOG_SETTLE_BUDGET_S * scale
    while clock() - quiet_from < quiet_s and clock() < deadline:
        sleep(poll_s)
        text = log_text()
        if (now := lines(text)) != seen:
            seen, quiet_from = now, clock()
    return text


def log_settler(kind: str | None, log_text: Callable[[], str], scale: float = 1.0) -> Callable[[], object] | None:
    """Patience.before_window for an engine whose acceptance is read from its log (settle_log); None for the
    others."""
    adapter = engines.engine(kind) if kind is not None else None
    if adapter is None or not adapter.reads_log_acceptance:
        return None
    return lambda: settle_log(kind, log_text, scale)


def add_log_acceptance(result: BenchResult, kind: str | None, log_text: Callable[[], str],
                       version: str | None = None, scale: float = 1.0) -> None:
    """For engines that state acceptance only in their log (SGLang), the window's lines into the result, read as the
    engine's version (when known) prints them, once the log has caught up with the window's end (settle_log)."""
    adapter = engines.engine(kind) if kind is not None else None
    if adapter is not None and adapter.reads_log_acceptance:
        result["speculative_log"] = adapter.log_acceptance(settle_log(kind, log_text, scale), version)


def discover_model(endpoint: Endpoint) -> str:
    """The first model the server lists, when the user did not name one."""
    return endpoint.api.first_model()


FD_HEADROOM = 64  # files besides one socket per concurrent request: scrapes, the openai pool's spare, logs


def ensure_open_files(concurrency: int) -> None:
    """One socket per request in flight must fit under RLIMIT_NOFILE: raise the soft limit toward the hard one
    when it is too low, else refuse up front (not EMFILE halfway through a window)."""
    try:
        import resource
    except ImportError:  # not a POSIX system
        return
    try:
        in_use = len(os.listdir("/proc/self/fd"))
    except OSError:
        in_use = 32
    needed = in_use + concurrency + FD_HEADROOM
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    if hard == resource.RLIM_INFINITY or hard >= needed:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
            return
        except (ValueError, OSError):
            pass
    raise SparklabError(
        f"--concurrency {concurrency} needs about {needed} open files, but this process may open only {soft} "
        f"(ulimit -n; hard limit {'unlimited' if hard == resource.RLIM_INFINITY else hard})",
        f"Lower --concurrency, or raise the limit in the shell that runs sparklab: ulimit -n {needed} (above the "
        f"hard limit this needs root, or a nofile entry in /etc/security/limits.conf).")


def run(endpoint: Endpoint, workload: Workload, sampling: Sampling, load: Load,
        on_done: Progress | None = None, request_timeout_s: float = 1800, stall_timeout_s: float | None = 60,
        alive: Alive | None = None, finish_grace_s: float = 2.0,
        counters_budget_s: float = COUNTERS_BUDGET_S, stop: Stop | None = None,
        time_scale: float = 1.0, before_window: Callable[[], object] | None = None) -> BenchResult:
    """One cell. A request ends at request_timeout_s; earlier when it has received no byte for stall_timeout_s
    while `alive()` fails (default: the endpoint's /health; stall_timeout_s=None turns the detector off). The
    server-counter snapshots before and after the window take counters_budget_s at most, together. The whole cell
    ends as soon as `stop()` gives a reason (an error), which it raises. time_scale: wall seconds per second of a
    rehearsal's night (Patience.time_scale). before_window: called once the warmup is done (Patience)."""
    ensure_open_files(load.concurrency)
    if endpoint.kind:
        sampling = engines.engine(endpoint.kind).request_sampling(sampling)
    model = endpoint.model or discover_model(endpoint)
    patience = Patience(request_timeout_s, stall_timeout_s, alive or endpoint.api.alive, finish_grace_s,
                        counters_budget_s, stop, time_scale, before_window)
    return asyncio.run(_run(endpoint, model, workload, sampling, load, on_done, patience))


def _on_night_clock(records: list[RequestRecord], start: float, end: float, scale: float) -> tuple[float, float]:
    """Every stamp of the records and the window, stretched from the window's start by 1 / scale (in place)."""

    def night(t: float) -> float:
        return start + (t - start) / scale

    for r in records:
        r.start, r.end = night(r.start), night(r.end)
        r.first_chunk = None if r.first_chunk is None else night(r.first_chunk)
        r.first_token = None if r.first_token is None else night(r.first_token)
        r.first_content = None if r.first_content is None else night(r.first_content)
        r.chunk_times = [night(t) for t in r.chunk_times]
    return start, night(end)


def _relative(record: RequestRecord, origin: float) -> dict[str, Any]:
    data = record.as_dict()
    for key in ("start", "end", "first_chunk", "first_token", "first_content"):
        if data[key] is not None:
            data[key] = round(data[key] - origin, 6)
    data["chunk_times"] = [round(t - origin, 6) for t in record.chunk_times]
    return data


def _result(endpoint: Endpoint, model: str, workload: Workload, sampling: Sampling, load: Load,
            records: list[RequestRecord], window: tuple[float, float], before: dict[str, Any],
            after: dict[str, Any]) -> BenchResult:
    summary = metrics.summarize(records, window)
    counters = engines.window(before, after, endpoint.kind)
    return {
        "schema": SCHEMA,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "endpoint": endpoint.root,
        "model": model,
        "workload": {"name": workload.name, "description": workload.description,
                     "prompts": len(workload.prompts), "content_hash": workload.content_hash},
        "sampling": asdict(sampling),
        "load": asdict(load),
        "measurement": {
            "window": "from the first measured request's start to the last one's end (client perf_counter)",
            "window_s": window[1] - window[0],
            "warmup_requests_excluded": load.warmup,
            "prefix_cache": "reset after warmup where the engine allows it (a sparklab-started server)",
            "token_source": summary["token_sources"],
            "client": f"sparklab {__version__}: {TRANSPORT}",
            "definitions": metrics.__doc__,
            "server_counters": "snapshots after warmup and after the window; deltas only",
        },
        "summary": summary,
        "speculative": counters["speculative"],
        "server_latency": counters["server_latency"],
        "prefix_cache": counters["prefix_cache"],
        "server": {"before": before, "after": after},
        "requests": [_relative(r, window[0]) for r in records],
        "outputs": [r.answer(whole=_graded(workload, r.prompt_id)) for r in records],
    }


def _graded(workload: Workload, prompt_id: str) -> bool:
    """An answer to a graded task is kept whole: it is graded from the store, after the window."""
    prompt = workload.by_id(prompt_id)
    return prompt is not None and prompt.task is not None
