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


def test_bench_sglang_reads_server_info_and_the_accept_len_log_lines(cli: Cli, tmp_path) -> None:
    up = cli.run("up", "dspark", "--engine", "sglang", "--detach", *cli.launch_args(
        free_port(), "-e", "STANDIN_TOKENS_PER_CHUNK=1,3,2", "-e", "STANDIN_TOKEN_DELAY=0.002"))
    assert up.returncode == 0, up.stderr
    name = field(up.stdout, "container")
    try:
        out = tmp_path / "cell.json"
        done = cli.run("bench", "--container", name, "-n", "4", "--warmup", "1", "--max-tokens", "24",
                       "--ignore-eos", "--json", str(out))
        assert done.returncode == 0, done.stderr
        result = json.loads(out.read_text())
        assert result["speculative"] is None  # no vLLM counters on SGLang
        assert result["server"]["after"]["sglang_avg_spec_accept_length"] == pytest.approx(2.0)
        log = result["speculative_log"]
        assert log["samples"] == 4 and log["median"] == pytest.approx(2.0)  # the warmup's line is outside the window
        assert "accept len" in done.stdout
    finally:
        assert cli.run("down", name).returncode == 0
