"""`sparklab bench` against a `sparklab up` server (the stand-in) found by container name."""

from __future__ import annotations

import json

import pytest

from tests.dockerkit import Cli, field, free_port

pytestmark = pytest.mark.docker


def test_bench_a_running_up_server_with_multi_token_chunks_and_reasoning(cli: Cli, tmp_path) -> None:
    up = cli.run("up", "mtp", "--detach", *cli.launch_args(
        free_port(), "-e", "STANDIN_TOKENS_PER_CHUNK=1,3,2", "-e", "STANDIN_REASONING_TOKENS=4",
        "-e", "STANDIN_TOKEN_DELAY=0.004"))
    assert up.returncode == 0, up.stderr
    name = field(up.stdout, "container")
    try:
        out = tmp_path / "cell.json"
        done = cli.run("bench", "--container", name, "-c", "2", "-n", "6", "--warmup", "2", "--max-tokens", "30",
                       "--ignore-eos", "--temperature", "0", "--json", str(out))
        assert done.returncode == 0, done.stderr
        result = json.loads(out.read_text())
        s = result["summary"]
        assert s["requests"] == {"measured": 6, "ok": 6, "failed": 0, "warmup": 2, "first_errors": []}
        assert s["output_tokens"] == 6 * 30
        assert s["token_sources"] == {"server token_ids per chunk": 6}
        assert s["tokens_per_chunk"] == pytest.approx(30 / 15)  # chunks of 1,3,2,1,3,2,...: 15 chunks
        assert s["ttfa_ms"]["mean"] > s["ttft_ms"]["mean"]  # 4 reasoning tokens come first
        spec = result["speculative"]
        # The stand-in counts each chunk of k tokens as a draft step with k-1 accepted: the server's
        # acceptance length must equal what the client saw per chunk.
        assert spec["acceptance_length"] == pytest.approx(s["tokens_per_chunk"])
        assert "aggregate" in done.stdout and "acceptance length 2.00" in done.stdout
        key = field(up.stdout, "api key")
        assert key not in out.read_text() and key not in done.stdout
    finally:
        assert cli.run("down", name).returncode == 0


@pytest.mark.parametrize("metrics", [False, True], ids=["log-lines", "enable-metrics"])
def test_bench_sglang_acceptance_is_the_windows_own_with_a_rate(cli: Cli, tmp_path, metrics: bool) -> None:
    """Earlier traffic with 1-token chunks (acceptance length 1) before the window's 1,3,2 chunks (2.0): the
    window's log lines and /metrics differences say 2.0 and count only the window's steps. /server_info's
    average is cumulative, but bench's cache reset after warmup (/flush_cache) restarts it, as SGLang does. Every
    log line reaches the container's log 0.1 s late (a busy dockerd's copier): the window is still read whole."""
    extra = ["--serve-arg=--enable-metrics"] if metrics else []
    up = cli.run("up", "dspark", "--engine", "sglang", "--detach", *cli.launch_args(
        free_port(), "-e", "STANDIN_TOKENS_PER_CHUNK=1,3,2", "-e", "STANDIN_TOKEN_DELAY=0.002",
        "-e", "STANDIN_LOG_LAG=0.1", "--set", "mem_fraction_static=0.01", *extra))
    assert up.returncode == 0, up.stderr
    name = field(up.stdout, "container")
    try:
        # earlier traffic the window must not count: 3 single-token chunks (acceptance length 1.0 each)
        warm_out = tmp_path / "warm.json"
        warm = cli.run("bench", "--container", name, "-n", "2", "--warmup", "0", "--max-tokens", "1",
                       "--ignore-eos", "--json", str(warm_out))
        assert warm.returncode == 0, warm.stderr
        out = tmp_path / "cell.json"
        done = cli.run("bench", "--container", name, "-n", "4", "--warmup", "1", "--max-tokens", "24",
                       "--ignore-eos", "--json", str(out))
        assert done.returncode == 0, done.stderr
        result = json.loads(out.read_text())
        before_flush = json.loads(warm_out.read_text())["server"]["after"]["sglang_avg_spec_accept_length"]
        assert before_flush == pytest.approx(1.0)  # the earlier single-token requests, cumulative
        after = result["server"]["after"]["sglang_avg_spec_accept_length"]
        assert after == pytest.approx(2.0)  # /flush_cache after the warmup restarted the average
        log = result["speculative_log"]
        assert log["samples"] == 4 and log["median"] == pytest.approx(2.0)  # the warmup's line is outside the window
        assert log["rate"] == pytest.approx((2.0 - 1) / 3, abs=0.005)  # DSpark K=3: 1 of 3 drafts accepted per step (.2f)
        if metrics:
            spec = result["speculative"]
            assert spec["verify_steps"] == 4 * 12 and spec["acceptance_length"] == pytest.approx(2.0)
            assert "sglang:spec_verify_calls_total" in spec["source"]
        else:
            assert result["speculative"] is None  # SGLang serves /metrics only with --enable-metrics
        assert "accept len" in done.stdout and "rate 33.0%" in done.stdout
    finally:
        assert cli.run("down", name).returncode == 0
