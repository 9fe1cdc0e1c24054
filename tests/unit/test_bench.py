"""A whole benchmark cell against the scripted server: warmup excluded, counters windowed, result stored."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from sparklab.bench import cell
from sparklab.bench.workloads import load_workload
from sparklab.errors import SparklabError
from sparklab.records import Sampling
from tests.scripted_server import Scripted, Step, chunk, usage


class Counters:
    """vLLM-style spec counters that move by a known amount per request."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = 0

    def script(self, body: dict[str, Any]) -> list[Step]:
        with self.lock:
            self.requests += 1
        return [(0.0, chunk(role="assistant")), (0.01, chunk(content="a", token_ids=[1])),
                (0.01, chunk(content="b c d", token_ids=[2, 3, 4])), (0.01, chunk(content="e f", token_ids=[5, 6])),
                (0.0, usage(6)), (0.0, b"data: [DONE]\n\n")]

    def text(self) -> str:
        n = self.requests  # per request: 2 drafts of K=3, 3 tokens accepted (2 at position 0, 1 at position 1)
        return (
            "# TYPE vllm:spec_decode_num_drafts_total counter\n"
            f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {2 * n}\n'
            f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {6 * n}\n'
            f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {3 * n}\n'
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="0"}} {2 * n}\n'
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="1"}} {1 * n}\n'
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="2"}} 0\n'
            f'vllm:generation_tokens_total{{engine="0",model_name="m"}} {6 * n}\n')


@pytest.fixture
def counters():
    c = Counters()
    server = Scripted(c.script, c.text)
    yield c, server
    server.close()


def test_a_cell_measures_only_its_window(counters) -> None:
    c, server = counters
    done: list[int] = []
    result = cell.run(cell.Endpoint.from_url(server.root + "/v1", api_key="sekret-key"), load_workload("seed"),
                       Sampling(max_tokens=6), cell.Load(concurrency=2, requests=5, warmup=2),
                       on_done=lambda r: done.append(r.index))
    assert c.requests == 7 and sorted(done) == [0, 1, 2, 3, 4]
    s = result["summary"]
    assert s["requests"]["measured"] == 5 and s["requests"]["warmup"] == 2 and s["requests"]["ok"] == 5
    assert s["output_tokens"] == 30 and s["tokens_per_chunk"] == pytest.approx(2.0)
    spec = result["speculative"]
    assert spec["drafts"] == 10 and spec["accepted_tokens"] == 15  # warmup's counters excluded
    assert spec["acceptance_length"] == pytest.approx(2.5) and spec["acceptance_rate"] == pytest.approx(0.5)
    assert spec["per_position_acceptance"] == pytest.approx([1.0, 0.5, 0.0])
    assert result["model"] == "scripted-model"  # discovered from /v1/models
    assert result["workload"]["name"] == "seed" and result["measurement"]["warmup_requests_excluded"] == 2
    # bench.py's order: warmup prompts 0..1, then measured prompts from 0 again, round robin.
    assert [r["prompt_id"] for r in result["requests"]] == ["seed-0", "seed-1", "seed-0", "seed-1", "seed-2",
                                                            "seed-3", "seed-0"]
    measured = [r for r in result["requests"] if not r["warmup"]]
    assert min(r["start"] for r in measured) >= 0.0  # times are relative to the window start
    connections = result["measurement"]["connections"]  # a keep-alive server: warmup's one, plus one for C=2
    assert (connections["opened"], connections["stale_resent"], connections["reused"]) == (2, 0, True)
    text = json.dumps(result)
    assert "sekret-key" not in text


def test_a_cell_asks_each_counter_path_once_per_snapshot(counters) -> None:
    """Without a kind every adapter reads the snapshot, but each path is fetched once and the text shared: vLLM,
    SGLang and llama.cpp all read /metrics, SGLang /server_info as well (4 GETs a snapshot before, /metrics 3 times)."""
    _, server = counters
    result = cell.run(cell.Endpoint.from_url(server.root, model="m"), load_workload("seed"), Sampling(max_tokens=6),
                       cell.Load(concurrency=1, requests=2, warmup=0))
    assert sorted(server.gets) == ["/metrics", "/metrics", "/server_info", "/server_info"]  # before and after
    assert result["speculative"]["drafts"] == 4  # vLLM's adapter read the shared /metrics text


@pytest.mark.parametrize(("kind", "paths"), [
    (None, ["/metrics", "/server_info"]), ("vllm", ["/metrics"]), ("sglang", ["/metrics", "/server_info"]),
    ("llamacpp", ["/metrics"]), ("trtedge", []),
])
def test_one_snapshot_fetches_each_path_at_most_once(counters, kind: str | None, paths: list[str]) -> None:
    from sparklab import engines
    from sparklab.engines.api import EngineAPI

    _, server = counters
    snap = engines.snapshot(EngineAPI(server.root), kind)
    assert sorted(server.gets) == paths
    assert ("spec" in snap) == (kind in (None, "vllm"))  # vLLM's counters, read from the one /metrics text


def test_duration_mode_stops_issuing_at_the_deadline(counters) -> None:
    _, server = counters
    result = cell.run(cell.Endpoint.from_url(server.root), load_workload("seed"), Sampling(max_tokens=6),
                       cell.Load(concurrency=1, requests=None, duration_s=0.3, warmup=0))
    n = result["summary"]["requests"]["measured"]
    assert 3 <= n <= 20 and result["summary"]["wall_s"] < 1.0


def test_poisson_arrivals(counters) -> None:
    c, server = counters
    result = cell.run(cell.Endpoint.from_url(server.root), load_workload("seed"), Sampling(max_tokens=6),
                       cell.Load(concurrency=4, requests=8, rate=50.0, warmup=0, seed=1))
    assert result["summary"]["requests"]["ok"] == 8 and c.requests == 8


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"concurrency": 0}, "--concurrency must be at least 1"),
    ({"requests": None}, "either a request count"),
    ({"requests": 0}, "--requests must be at least 1"),
    ({"rate": -1.0}, "--rate must be positive"),
])
def test_bad_load_settings(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(SparklabError, match=message):
        cell.Load(**kwargs)


def test_url_must_be_http() -> None:
    with pytest.raises(SparklabError, match="is not an http"):
        cell.Endpoint.from_url("localhost:8000")
    assert cell.Endpoint.from_url("http://h:1/v1/").root == "http://h:1"


# -- §3 of issue 11 ------------------------------------------------------------------------------------------------

_LIMITED_BENCH = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, {hard}))
from sparklab.bench import cell as bench
from sparklab.errors import SparklabError
from sparklab.records import Sampling
from sparklab.bench.workloads import load_workload
try:
    result = bench.run(bench.Endpoint.from_url(sys.argv[1], model="m"), load_workload("seed"), Sampling(max_tokens=6),
                       bench.Load(concurrency={concurrency}, requests=2, warmup=0), request_timeout_s=20)
    print(json.dumps({{"ok": result["summary"]["requests"]["ok"],
                      "soft": resource.getrlimit(resource.RLIMIT_NOFILE)[0]}}))
except SparklabError as exc:
    print(json.dumps({{"error": str(exc)}}))
"""


def _bench_with_limit(root: str, soft: int, hard: int, concurrency: int) -> dict[str, Any]:
    import subprocess
    import sys

    code = _LIMITED_BENCH.format(soft=soft, hard=hard, concurrency=concurrency)
    done = subprocess.run([sys.executable, "-c", code, root], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_concurrency_beyond_the_open_file_limit_is_refused_up_front(counters) -> None:
    _, server = counters
    out = _bench_with_limit(server.root, soft=64, hard=64, concurrency=100)
    assert "error" in out, out
    assert "--concurrency 100" in out["error"] and "ulimit -n" in out["error"]


def test_the_soft_open_file_limit_is_raised_when_the_hard_limit_allows(counters) -> None:
    _, server = counters
    out = _bench_with_limit(server.root, soft=64, hard=1024, concurrency=100)
    assert out.get("ok") == 2 and 64 < out["soft"] <= 1024, out


def test_a_stall_on_a_dead_engine_ends_the_cell_early() -> None:
    """bench.run passes the stall timeout and the health check down to every request."""
    from tests.scripted_server import SSE_HEAD, Hostile, http_chunk, sse

    held = Hostile(lambda body: [(0.0, SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\n"),
                                 (0.0, http_chunk(sse(chunk(content="a", token_ids=[1]))))], hold_s=30)
    started = time.monotonic()
    try:
        result = cell.run(cell.Endpoint.from_url(held.root, model="m"), load_workload("seed"), Sampling(max_tokens=6),
                           cell.Load(concurrency=2, requests=2, warmup=0), request_timeout_s=30,
                           stall_timeout_s=0.5, alive=lambda: False, counters_budget_s=1.0)
    finally:
        held.close()
    cell_s = time.monotonic() - started
    requests = result["summary"]["requests"]
    assert requests["failed"] == 2 and "stalled: no bytes for 0.5 s" in requests["first_errors"][0]
    assert result["summary"]["wall_s"] < 5
    # the whole cell: the window, and the counter snapshots (GETs the engine never finishes answering) within their
    # budget; it took 81 s here when every adapter asked for itself and each GET waited 10 s
    assert cell_s < 0.5 + 1.0 + 2.0, f"the cell took {cell_s:.1f} s for a {result['summary']['wall_s']:.1f} s window"
    assert "spent" in result["server"]["after"]["metrics_error"]  # the after snapshot was not asked: no time left


def test_a_cell_keeps_its_answers_and_prefix_cache_window_and_resets_the_cache_after_warmup() -> None:
    queried = {"n": 0}

    def script(body: dict[str, Any]) -> list[Step]:
        queried["n"] += 1
        return [(0.0, chunk(content="ab", token_ids=[1, 2])), (0.0, chunk(content=" c", token_ids=[3])),
                (0.0, {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}), (0.0, usage(3)),
                (0.0, b"data: [DONE]\n\n")]

    def metrics() -> str:
        n = queried["n"]
        return ("# TYPE vllm:prefix_cache_queries counter\n"
                f'vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {100 * n}\n'
                "# TYPE vllm:prefix_cache_hits counter\n"
                f'vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {10 * n}\n')

    server = Scripted(script, metrics)
    try:
        endpoint = cell.Endpoint(server.root, None, None, "vllm")  # a sparklab-started vLLM
        result = cell.run(endpoint, load_workload("seed"), Sampling(max_tokens=6),
                           cell.Load(concurrency=1, requests=3, warmup=2))
    finally:
        server.close()
    assert server.resets == [2]  # after the two warmup requests, before the window
    answers = result["outputs"]
    assert [a["token_ids"] for a in answers] == [[1, 2, 3]] * 5 and answers[0]["text"] == "ab c"
    assert [a["warmup"] for a in answers] == [True, True, False, False, False]
    assert "output_parts" not in result["requests"][0]
    window = result["prefix_cache"]
    assert window is not None and (window["queried_tokens"], window["hit_tokens"]) == (300.0, 30.0)
    assert result["workload"]["content_hash"] == load_workload("seed").content_hash


def test_an_engine_that_closes_after_each_stream_gets_one_connection_per_request() -> None:
    """llama-server closes every connection after a streamed response although its headers keep it alive
    (cpp-httplib, see sparklab/engines/llamacpp.py); its adapter says so, and bench then opens a connection per
    request: no request is sent into a closing socket and resent (stale_resent stays 0)."""
    from tests.scripted_server import SSE_HEAD, Hostile, http_chunk, sse

    stream = [(0.0, SSE_HEAD + b"Transfer-Encoding: chunked\r\nKeep-Alive: timeout=5, max=100\r\n\r\n"),
              *((0.0, http_chunk(sse(e))) for e in (chunk(content="a"), chunk(content="b", finish="stop"))),
              (0.0, http_chunk(sse("[DONE]"))), (0.0, b"0\r\n\r\n")]
    not_found = [(0.0, b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")]
    server = Hostile(lambda body: stream if body.get("messages") else not_found, hold_s=0.5)
    try:
        result = cell.run(cell.Endpoint(server.root, None, "m", "llamacpp"), load_workload("seed"),
                           Sampling(max_tokens=16), cell.Load(concurrency=1, requests=3, warmup=1))
    finally:
        server.close()
    assert [r["error"] for r in result["requests"]] == [None] * 4
    connections = result["measurement"]["connections"]
    assert (connections["opened"], connections["stale_resent"], connections["reused"]) == (4, 0, False)
    assert len([b for b in server.bodies if b.get("messages")]) == 4  # no request sent twice
