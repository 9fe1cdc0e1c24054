"""The real llama.cpp server (b11669, CPU) through sparklab: readiness, startup facts, bench with acceptance
read from the server's own counters, version and slot erase (every llamacpp recipe against llama-server's flag
table is in tests/contract/test_llamacpp_flags_contract.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests

from sparklab.engines.llamacpp import spec_counters
from tests.dockerkit import Cli, field, free_port, sparklab_containers

pytestmark = pytest.mark.engine

PROMPTS = ["Continue the sequence exactly, separated by commas: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
           "List the days of the week, one per line.", "Write the alphabet in capital letters, comma-separated."]


def _up(cli: Cli, method: str, port: int, *extra: str) -> tuple[str, str, str]:
    done = cli.run("up", method, "-t", "llamacpp-cpu", "--detach", "--image", cli.image, "--port", str(port), *extra,
                   timeout=300)
    assert done.returncode == 0, done.stderr + done.stdout
    return done.stdout, field(done.stdout, "container"), field(done.stdout, "api key")


def _bench(cli: Cli, name: str, tmp: Path, tag: str) -> dict:
    prompts = tmp / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    out = tmp / f"{tag}.json"
    done = cli.run("bench", "--container", name, "-w", str(prompts), "-c", "1", "-n", "3", "--warmup", "1",
                   "--max-tokens", "32", "--temperature", "0", "--thinking", "default", "--json", str(out),
                   timeout=600)
    assert done.returncode == 0, done.stderr + done.stdout
    result = json.loads(out.read_text())
    # no request may be lost (a sweep lost 2 of 4 with "connection closed before the response ended"): b11669
    # closes every connection after a streamed response, so bench opens one per request and never sends a
    # request into a closing socket (none resent)
    assert [r["error"] for r in result["requests"]] == [None] * 4, result["requests"]
    connections = result["measurement"]["connections"]
    assert (connections["opened"], connections["stale_resent"], connections["reused"]) == (4, 0, False), connections
    return result


def test_draft_model_up_bench_acceptance_from_the_server(llamacpp_cli: Cli, docker_client, tmp_path: Path,
                                                          measured) -> None:
    port = free_port()
    out, name, key = _up(llamacpp_cli, "draft", port)
    try:
        # llama-server's own startup line: n_slots = 2, n_ctx_slot = 8192 (16384 / 2 slots)
        assert "max concurrency" in out and "8,192 tokens per request" in out, out
        assert requests.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 200
        headers = {"Authorization": f"Bearer {key}"}  # /metrics and /props need the key; /health does not
        result = _bench(llamacpp_cli, name, tmp_path, "draft")
        spec = result["speculative"]
        assert spec["source"].startswith("llamacpp:spec_decode_"), spec
        # the server's counters, read independently, agree with what the bench stored for its window
        after = spec_counters(requests.get(f"http://127.0.0.1:{port}/metrics", headers=headers, timeout=10).text)
        assert 0 < spec["drafts"] <= after["drafts"]
        assert 0 < spec["accepted_tokens"] <= spec["draft_tokens"]
        assert spec["acceptance_length"] == pytest.approx(1 + spec["accepted_tokens"] / spec["drafts"])
        assert 1 < spec["acceptance_length"] <= 4  # K = 3: at most 3 accepted + the bonus token per step
        measured["llama.cpp draft: acceptance length (server counters)"] = round(spec["acceptance_length"], 3)
        measured["llama.cpp draft: acceptance rate"] = round(spec["acceptance_rate"], 3)
        version = requests.get(f"http://127.0.0.1:{port}/props", headers=headers,
                               timeout=10).json()["build_info"]
        assert version.startswith("b11669")
    finally:
        assert llamacpp_cli.run("down", name).returncode == 0
    assert name not in sparklab_containers(docker_client)


def test_no_draft_has_no_speculative_window(llamacpp_cli: Cli, tmp_path: Path) -> None:
    port = free_port()
    _, name, _ = _up(llamacpp_cli, "none", port)
    try:
        result = _bench(llamacpp_cli, name, tmp_path, "none")
        assert result.get("speculative") is None
    finally:
        assert llamacpp_cli.run("down", name).returncode == 0


def _cached_tokens(port: int, key: str, prompt: str) -> int:
    """How many of the prompt's tokens the server took from its cache (the response's timings.cache_n)."""
    answer = requests.post(f"http://127.0.0.1:{port}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                           json={"model": "smollm2-135m", "max_tokens": 4, "temperature": 0,
                                 "messages": [{"role": "user", "content": prompt}]}, timeout=120).json()
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == answer["timings"]["cache_n"]
    return int(answer["timings"]["cache_n"])


@pytest.mark.parametrize("sweep_env", [False, True])
def test_the_prefix_cache_reset_is_whole_only_with_a_sweeps_environment(llamacpp_cli: Cli, sweep_env: bool,
                                                                        measured) -> None:
    """Prompt A, prompt B (A's slot goes to the RAM prompt cache), the adapter's reset, prompt A again. Without the
    sweep's environment the reset is refused (501, no --slot-save-path) and A comes from the cache; with it (slot
    save path, RAM cache off) A is computed afresh."""
    from sparklab.engines.api import EngineAPI
    from sparklab.engines.llamacpp import ENGINE

    port = free_port()
    env = [a for item in ENGINE.sweep_env() for a in ("--env", item)] if sweep_env else []
    _, name, key = _up(llamacpp_cli, "none", port, *env)
    try:
        a, b = PROMPTS[1], PROMPTS[2]
        first = _cached_tokens(port, key, a)
        assert _cached_tokens(port, key, a) > 0  # a repeated prompt comes from the cache
        _cached_tokens(port, key, b)
        ENGINE.reset_prefix_cache(EngineAPI(f"http://127.0.0.1:{port}", key))
        after = _cached_tokens(port, key, a)
        measured[f"llama.cpp prefix cache: prompt A cached tokens after reset, sweep env {sweep_env}"] = after
        assert first == 0 and (after == 0) is sweep_env
    finally:
        assert llamacpp_cli.run("down", name).returncode == 0
