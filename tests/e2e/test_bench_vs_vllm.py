"""`sparklab bench` against the real engine agrees with `vllm bench serve` (vLLM 0.27.1), and its acceptance
length equals the one computed from the engine's own counters."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import requests

from sparklab.scrape import spec_counters
from tests.dockerkit import Cli, field, free_port

pytestmark = pytest.mark.engine

# Eight prompts, each sent once by both tools in file order after one warmup of the first: with greedy
# decoding the engine then drafts and accepts exactly the same tokens for both.
PROMPTS = [
    "Count from 1 to 60, separated by commas.",
    "List the first 30 even numbers, separated by commas.",
    "Write the alphabet in order, with a comma after each letter, three times.",
    "Repeat the sentence 'The quick brown fox jumps over the lazy dog.' ten times.",
    "Count down from 50 to 1, separated by commas.",
    "List the multiples of 5 up to 200, separated by commas.",
    "Write the days of the week, in order, four times.",
    "Repeat the phrase 'hello world' twenty times.",
]
REQUESTS, MAX_TOKENS, WARMUP = len(PROMPTS), 64, 1


def _vllm_bench(image: str, port: int, key: str, prompts: Path, out: Path) -> dict:
    done = subprocess.run(
        ["docker", "run", "--rm", "--network", "host", "-e", f"OPENAI_API_KEY={key}",
         "-v", f"{prompts.parent}:/data:ro", "-v", f"{out}:/out", "--entrypoint", "vllm", image,
         "bench", "serve", "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
         "--base-url", f"http://127.0.0.1:{port}", "--model", "smollm2-135m",
         "--tokenizer", "/models/SmolLM2-135M-Instruct", "--dataset-name", "custom",
         "--dataset-path", f"/data/{prompts.name}", "--skip-chat-template", "--disable-shuffle", "--custom-output-len", str(MAX_TOKENS),
         "--num-prompts", str(REQUESTS), "--max-concurrency", "1", "--num-warmups", str(WARMUP),
         "--ignore-eos", "--temperature", "0", "--save-result", "--result-dir", "/out",
         "--result-filename", "vllm.json", "--disable-tqdm"],
        capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"vllm bench serve failed:\n{done.stderr[-4000:]}"
    return json.loads((out / "vllm.json").read_text())


def test_sparklab_bench_agrees_with_vllm_bench_serve(engine_cli: Cli, tmp_path: Path, measured) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    port = free_port()
    # No prefix caching: the second tool would otherwise find the first one's prompts cached (lower TTFT).
    up = engine_cli.run("up", "ngram", "-t", "cpu", "--detach", "--image", engine_cli.image, "--port", str(port),
                        "--serve-arg=--no-enable-prefix-caching", timeout=900)
    assert up.returncode == 0, up.stderr
    name, key = field(up.stdout, "container"), field(up.stdout, "api key")
    try:
        out = tmp_path / "out"
        out.mkdir()
        ours_path = tmp_path / "sparklab.json"
        before_ours = spec_counters(requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text)
        done = engine_cli.run("bench", "--container", name, "-w", str(prompts), "-c", "1", "-n", str(REQUESTS),
                              "--warmup", str(WARMUP), "--max-tokens", str(MAX_TOKENS), "--ignore-eos",
                              "--temperature", "0", "--thinking", "default", "--json", str(ours_path), timeout=900)
        assert done.returncode == 0, done.stderr
        after_ours = spec_counters(requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text)
        theirs = _vllm_bench(engine_cli.image, port, key, prompts, out)
    finally:
        assert engine_cli.run("down", name).returncode == 0

    ours = json.loads(ours_path.read_text())
    s = ours["summary"]
    assert s["requests"]["ok"] == REQUESTS and theirs["completed"] == REQUESTS
    assert s["output_tokens"] == theirs["total_output_tokens"] == REQUESTS * MAX_TOKENS
    pairs = {
        "TTFT ms (mean)": (s["ttft_ms"]["mean"], theirs["mean_ttft_ms"]),
        "TPOT ms (mean)": (s["tpot_ms"]["mean"], theirs["mean_tpot_ms"]),
        "output tok/s": (s["aggregate_tps"], theirs["output_throughput"]),
    }
    for label, (a, b) in pairs.items():
        measured[f"vs vllm bench serve: {label}"] = f"sparklab {a:.2f}, vllm {b:.2f}, diff {100 * (a / b - 1):+.2f}%"
    for label, (a, b) in pairs.items():
        assert a == pytest.approx(b, rel=0.03), f"{label}: sparklab {a:.3f} vs vllm bench serve {b:.3f}"

    # Acceptance length from the engine's counters: sparklab's window closed when its last request ended (the
    # counters this test reads afterwards have not moved), and it matches vLLM's own bench computation.
    spec, server = ours["speculative"], ours["server"]
    assert spec["drafts"] > 0
    assert server["after"]["spec"] == after_ours
    assert before_ours["drafts"] < server["before"]["spec"]["drafts"]  # the warmup ran before the window
    measured["ngram K=3: acceptance length sparklab / vllm bench serve"] = (
        f"{spec['acceptance_length']:.3f} / {theirs['spec_decode_acceptance_length']:.3f}")
    assert spec["acceptance_length"] == pytest.approx(theirs["spec_decode_acceptance_length"], rel=1e-9)
    assert spec["drafts"] == theirs["spec_decode_num_drafts"]
