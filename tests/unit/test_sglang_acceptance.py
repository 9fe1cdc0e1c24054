"""SGLang acceptance per window, with a rate, from SGLang 0.5.23's own formats (scripted data).

The lines and metric names are SGLang 0.5.23's (sglang/srt/managers/scheduler_components/metrics_reporter.py
:963-1042, observability/metrics_collector.py:1860-1869 and :2092-2112); see sparklab/engines/sglang.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from sparklab import engines
from sparklab.engines import engine
from sparklab.engines.sglang import log_acceptance, metrics_window


def decode_line(running: int, length: float, rate: float, extra: str = "") -> str:
    # metrics_reporter.py:963 (+ the hybrid pool's usage parts), :1005, :1009, :1040-1042; no trailing ", "
    return (f"[2026-11-30 10:00:00 TP0] Decode batch, #running-req: {running}, #full token: 900, full token usage: "
            f"0.01, mamba num: 2, mamba usage: 0.01, accept len: {length:.2f}, accept rate: {rate:.2f}, {extra}"
            f"cuda graph: True, gen throughput (token/s): 115.75, #queue-req: 0")


def test_the_window_lines_give_length_and_rate_weighted_by_batch_size() -> None:
    text = "\n".join([
        "[2026-11-30 10:00:00 TP0] Prefill batch, #new-seq: 1, #new-token: 64, #cached-token: 0, token usage: "
        "0.00, #running-req: 0, #queue-req: 0, ",
        decode_line(1, 3.00, 0.67),
        decode_line(3, 3.40, 0.80),
    ])
    found = log_acceptance(text)
    assert found is not None and found["samples"] == 2
    assert found["mean"] == pytest.approx((3.00 * 1 + 3.40 * 3) / 4)
    assert found["rate"] == pytest.approx((0.67 * 1 + 0.80 * 3) / 4)
    assert found["median"] == pytest.approx(3.20) and found["max"] == pytest.approx(3.40)
    assert "weighted by #running-req" in found["source"]


def test_block_accept_len_is_not_read_as_accept_len() -> None:
    # SGLANG_RAGGED_VERIFY_MODE=cap_accept adds "cap len" and "block accept len" after "accept rate" (:1006-1009)
    found = log_acceptance(decode_line(2, 2.50, 0.50, "cap len: 3.00, block accept len: 3.90, "))
    assert found is not None and found["mean"] == pytest.approx(2.50) and found["max"] == pytest.approx(2.50)
    assert log_acceptance("[x] block accept len: 3.90, cuda graph: True") is None


def test_an_older_line_without_accept_rate_still_gives_the_length() -> None:
    found = log_acceptance("Decode batch, #running-req: 2, #token: 10, token usage: 0.00, accept len: 2.25, "
                           "cuda graph: True, gen throughput (token/s): 10.00, #queue-req: 0, ")
    assert found is not None and found["mean"] == pytest.approx(2.25) and found["rate"] is None


def test_no_decode_lines_no_acceptance() -> None:
    assert log_acceptance("Decode batch, #running-req: 1, #token: 10, token usage: 0.00, cuda graph: True, "
                          "gen throughput (token/s): 10.00, #queue-req: 0") is None


METRICS = """\
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0",is_streaming="true"}} {gen}
sglang:generation_tokens_total{{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0",is_streaming="false"}} 0.0
# HELP sglang:spec_verify_calls_total Number of speculative decoding verification calls.
# TYPE sglang:spec_verify_calls_total counter
sglang:spec_verify_calls_total{{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0"}} {verify}
# HELP sglang:spec_accept_length Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward).
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0"}} 9.0
"""


class ScriptedAPI:
    """Answers GETs from a table, as engine_api.EngineAPI would (status, text, json())."""

    def __init__(self, pages: dict[str, tuple[int, Any]]) -> None:
        self.pages = pages

    def get(self, path: str, timeout_s: float = 10.0) -> Any:
        status, body = self.pages.get(path, (404, {"detail": "Not Found"}))
        text = body if isinstance(body, str) else ""
        return SimpleNamespace(status=status, text=text, json=lambda: body)


def snap(gen: float, verify: float, cumulative: float) -> dict[str, Any]:
    api = ScriptedAPI({"/metrics": (200, METRICS.format(gen=gen, verify=verify)),
                       "/server_info": (200, {"internal_states": [{"avg_spec_accept_length": cumulative}]})})
    return engines.snapshot(api, "sglang")  # type: ignore[arg-type]


def test_metrics_differences_give_the_window_not_the_server_life() -> None:
    # 1000 tokens over 500 verify steps before the window (warm-up, earlier cells); 1024 over 320 in it
    before, after = snap(1000, 500, 2.0), snap(2024, 820, 2.42)
    found = engines.window(before, after, "sglang")["speculative"]
    assert found["acceptance_length"] == pytest.approx(1024 / 320)
    assert found["verify_steps"] == 320 and found["generated_tokens"] == 1024
    result = {"speculative": found, "server": {"before": before, "after": after}}
    length, source = engines.acceptance(result)
    assert length == pytest.approx(3.2) and "/metrics" in source  # not vLLM's, not the cumulative 2.42


def test_without_enable_metrics_there_is_no_metrics_window() -> None:
    api = ScriptedAPI({"/server_info": (200, {"internal_states": [{"avg_spec_accept_length": 2.5}]})})
    before = after = engines.snapshot(api, "sglang")  # type: ignore[arg-type]
    assert "sglang_metrics" not in after and metrics_window(before, after) is None
    assert engines.window(before, after, "sglang")["speculative"] is None


def test_no_verify_step_in_the_window_is_no_acceptance() -> None:
    assert metrics_window(snap(100, 40, 2.5), snap(100, 40, 2.5)) is None


def test_acceptance_prefers_the_window_and_labels_the_cumulative_fallback() -> None:
    log = log_acceptance(decode_line(1, 3.27, 0.76))
    both = {"speculative": None, "speculative_log": log,
            "server": {"after": {"sglang_avg_spec_accept_length": 2.9}}}
    assert engines.acceptance(both)[0] == pytest.approx(3.27)
    assert "log lines in the window" in engines.acceptance(both)[1]
    assert engines.acceptance_rate(both) == pytest.approx(0.76)
    only_info = {"speculative": None, "server": {"after": {"sglang_avg_spec_accept_length": 2.9}}}
    length, source = engines.acceptance(only_info)
    assert length == 2.9 and "cumulative" in source
    assert engines.acceptance_rate(only_info) is None


def test_vllm_rate_still_comes_from_its_counters() -> None:
    result = {"speculative": {"drafts": 10, "acceptance_length": 2.5, "acceptance_rate": 0.5}}
    assert engines.acceptance_rate(result) == 0.5
    assert engines.acceptance(result)[1].startswith("vLLM")


# SGLang 0.5.23's startup lines (mem_cache/memory_pool.py:2087-2090, managers/scheduler.py:1268-1275,
# model_executor/model_runner.py:1372-1378, entrypoints/http_server.py:2600)
SGLANG_0_5_23_STARTUP = """\
[2026-11-30 10:00:01 TP0] Load weight end. elapsed=61.20 s, type=NemotronHForCausalLM, quant=modelopt_fp4, avail mem=100.00 GB, mem usage=17.62 GB.
[2026-11-30 10:00:10 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1234567, K size: 10.00 GB, V size: 10.00 GB
[2026-11-30 10:00:11 TP0] max_total_num_tokens=1234560, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=8, context_len=65536, available_gpu_mem=12.50 GB
[2026-11-30 10:00:30] The server is fired up and ready to roll!
"""


def test_the_startup_lines_of_sglang_0_5_23() -> None:
    facts = engine("sglang").parse_startup(SGLANG_0_5_23_STARTUP)
    assert facts.kv_cache_tokens == 1_234_567  # the KV line itself, not the max_total_num_tokens fallback
    assert facts.max_concurrency == 8 and facts.concurrency_tokens_per_request == 65_536
    assert facts.model_load_seconds == 61.20 and facts.model_load_gib == 17.62
    assert facts.startup_complete


def test_a_streamed_request_to_sglang_does_not_ask_for_token_ids() -> None:
    """SGLang 0.5.23 answers a streamed chat request carrying `return_token_ids` with HTTP 400 ("return_token_ids is
    not supported with streaming on /v1/chat/completions", entrypoints/openai/serving_chat.py:1315-1319); 0.5.9 and
    0.5.16 have no such field. sparklab asked for it on every request, so every SGLang cell failed on 0.5.23; the
    stand-in refuses it as 0.5.23 does (tests/docker/test_bench_standin.py failed on it before this)."""
    from sparklab.records import Sampling

    body = engine("sglang").request_sampling(Sampling(max_tokens=64, ignore_eos=True)).body("m", [], stream=True)
    assert "return_token_ids" not in body and body["ignore_eos"] is True and body["stream"] is True
    assert engine("vllm").request_sampling(Sampling(max_tokens=64)).body("m", [], stream=True)["return_token_ids"]
