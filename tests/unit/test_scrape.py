"""Startup-log facts in the engines' real formats (read by each engine's adapter), and explanations of known
deaths."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparklab.engines import engine
from sparklab.engines.scrape import exit_code_meaning

VLLM_LOG = """\
(APIServer pid=1) INFO 11-29 13:05:01 [api_server.py:1900] vLLM API server version 0.27.1
(EngineCore pid=37) INFO 11-29 13:05:20 [gpu_model_runner.py:2000] Model loading took 17.6200 GiB memory and 61.532100 seconds
(EngineCore pid=37) INFO 11-29 13:05:40 [gpu_worker.py:300] Available KV cache memory: 84.21 GiB
(EngineCore pid=37) INFO 11-29 13:05:41 [kv_cache_utils.py:1087] GPU KV cache size: 18,448,384 tokens
(EngineCore pid=37) INFO 11-29 13:05:41 [kv_cache_utils.py:1091] Maximum concurrency for 65,536 tokens per request: 281.50x
(EngineCore pid=37) WARNING 11-29 13:05:42 [vllm.py:1648] max_num_scheduled_tokens is set to 2032 based on the speculative decoding settings. This may lead to suboptimal performance. Consider increasing max_num_batched_tokens to accommodate the additional draft token slots, or decrease num_speculative_tokens or max_num_seqs.
(APIServer pid=1) INFO:     Application startup complete.
"""

SGLANG_LOG = """\
[2026-11-29 13:05:01] Load weight end. elapsed=61.20 s, type=NemotronHForCausalLM, dtype=torch.bfloat16, avail mem=100.00 GB, mem usage=17.62 GB.
[2026-11-29 13:05:10] KV Cache is allocated. #tokens: 5,440,000, K size: 10.00 GB, V size: 10.00 GB
[2026-11-29 13:05:11] max_total_num_tokens=5440000, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=48, context_len=1048576
[2026-11-29 13:05:30] The server is fired up and ready to roll!
"""


def test_vllm_facts() -> None:
    facts = engine("vllm").parse_startup(VLLM_LOG)
    assert facts.kv_cache_tokens == 18_448_384
    assert facts.max_concurrency == 281.50
    assert facts.concurrency_tokens_per_request == 65_536
    assert facts.model_load_gib == 17.62
    assert facts.model_load_seconds == 61.5321
    assert facts.kv_cache_memory_gib == 84.21
    assert facts.max_num_scheduled_tokens == 2032
    assert facts.startup_complete
    assert "raise --max-num-batched-tokens" in facts.advice[0]
    assert len(facts.warnings) == 1 and facts.warnings[0].startswith("max_num_scheduled_tokens is set to 2032")
    assert facts.source == "vllm startup log"


def test_vllm_older_load_line_and_missing_facts() -> None:
    facts = engine("vllm").parse_startup("Model loading took 0.2534 GiB and 1.234567 seconds\n")
    assert facts.model_load_gib == 0.2534 and facts.model_load_seconds == 1.234567
    assert facts.kv_cache_tokens is None and not facts.startup_complete and facts.advice == []


def test_sglang_facts() -> None:
    facts = engine("sglang").parse_startup(SGLANG_LOG)
    assert facts.kv_cache_tokens == 5_440_000
    assert facts.max_concurrency == 48
    assert facts.concurrency_tokens_per_request == 1_048_576
    assert facts.model_load_gib == 17.62
    assert facts.model_load_seconds == 61.20
    assert facts.startup_complete


def test_known_deaths_are_explained() -> None:
    tail = ("ValueError: Model config must specify `dflash_config.mask_token_id`, `mask_token_id`, "
            "`dspark_noise_token_id`, `pard_token`, or `ptd_token_id` for parallel drafting.")
    assert "Name the draft with --speculative_config.model" in (engine("vllm").explain_failure(tail) or "")
    shm = "RuntimeError: Insufficient space in /dev/shm: 160 MiB required, 64 MiB free."
    assert "ipc: host" in (engine("vllm").explain_failure(shm) or "")
    assert engine("vllm").explain_failure("all good") is None


def test_exit_codes() -> None:
    assert "out of memory" in exit_code_meaning(137)
    assert exit_code_meaning(1) == ""
    assert exit_code_meaning(None) == ""


def test_metrics_are_parsed_with_prometheus_client() -> None:
    from sparklab.engines.scrape import parse_metrics

    text = (
        "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.\n"
        "# TYPE vllm:spec_decode_num_drafts_total counter\n"
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 21.0\n'
        "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter\n"
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 20.0\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 15.0\n'
    )
    values = parse_metrics(text)
    assert values["vllm:spec_decode_num_drafts_total"] == 21.0
    assert values["vllm:spec_decode_num_accepted_tokens_per_pos_total"] == 35.0


SAMPLES = Path(__file__).resolve().parents[2] / "docker" / "vllm-cpu" / "sample-logs"


def test_real_vllm_0_27_1_cpu_startup_log() -> None:
    """Lines captured from the real engine (docker/vllm-cpu/sample-logs), not written by hand."""
    facts = engine("vllm").parse_startup((SAMPLES / "ngram-startup.log").read_text())
    assert facts.kv_cache_tokens == 46_592
    assert facts.max_concurrency == 22.75 and facts.concurrency_tokens_per_request == 2_048
    assert facts.model_load_seconds == 0.33 and facts.model_load_gib is None  # the CPU build omits GiB
    assert facts.kv_cache_memory_gib == 2.0
    assert facts.engine_init_seconds == 5.71
    assert facts.max_num_scheduled_tokens == 2048 and len(facts.advice) == 1
    assert facts.startup_complete
    assert sum("max_num_scheduled_tokens" in w for w in facts.warnings) == 1  # deduplicated across processes
    plain = engine("vllm").parse_startup((SAMPLES / "plain-startup.log").read_text())
    assert plain.kv_cache_tokens == 46_592 and plain.max_num_scheduled_tokens is None and plain.startup_complete


def test_sglang_accept_len_log_lines() -> None:
    from sparklab.engines.sglang import log_acceptance

    text = "\n".join(
        f"[2026-11-29 13:10:0{i} TP0] Decode batch, #running-req: 1, #full token: 900, full token usage: 0.01, "
        f"mamba num: 2, mamba usage: 0.01, accept len: {v:.2f}, accept rate: 0.76, cuda graph: True, "
        f"gen throughput (token/s): 115.75, #queue-req: 0, " for i, v in enumerate([3.27, 3.50, 2.90, 4.00]))
    found = log_acceptance(text)
    assert found is not None
    assert found["samples"] == 4 and found["median"] == pytest.approx(3.385) and found["max"] == 4.0
    assert log_acceptance("no speculative decoding here") is None
