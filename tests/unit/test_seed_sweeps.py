"""The seed sweeps say what the seeds did: seed 002's vLLM setup (KV dtype left to the engine, 0.85, 8 slots),
seed 004's thinking and its table's columns (generation speed excluding TTFT, TTFT median)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sparklab import report
from sparklab.recipes.plan import build_plan
from sparklab.recipes.schema import recipes_dir
from sparklab.sweep.store import Store
from tests.unit.test_checks import _run

SWEEPS = recipes_dir() / "sweeps"


def _flag(argv: tuple[str, ...] | list[str], name: str) -> str | None:
    argv = list(argv)
    for i, arg in enumerate(argv):
        if arg == name:
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def test_seed002_runs_vllm_as_the_seed_did() -> None:
    plan = build_plan(SWEEPS / "seed002.yaml")
    for server in plan.servers:
        argv = server.spec.argv
        if server.engine == "vllm":
            assert _flag(argv, "--kv-cache-dtype") == "auto"  # vLLM's default: the engine picks (fp8_e4m3)
            assert _flag(argv, "--gpu-memory-utilization") == "0.85"
            assert _flag(argv, "--max-num-seqs") == "8"
        else:
            assert _flag(argv, "--max-running-requests") == "8" and _flag(argv, "--mem-fraction-static") == "0.85"
        assert _flag(argv, "--max-model-len") in ("65536", None) and _flag(argv, "--context-length") in ("65536", None)
    assert plan.sweep.repeats == "auto"


def test_the_model_card_recipe_keeps_fp8_and_091() -> None:
    plan = build_plan(SWEEPS / "seed000.yaml")
    argv = plan.servers[0].spec.argv
    assert _flag(argv, "--kv-cache-dtype") == "fp8" and _flag(argv, "--gpu-memory-utilization") == "0.91"


def test_seed004_thinks_and_leads_with_generation_speed_and_ttft(tmp_path: Path) -> None:
    plan = build_plan(SWEEPS / "seed004.yaml")
    assert plan.sweep.sampling.enable_thinking is True and plan.sweep.headline == "decode"
    assert plan.sweep.sampling.max_tokens == 128 and not plan.sweep.sampling.ignore_eos  # Edge-LLM cannot force it

    def make(method: str, k: int | None, c: int, repeat: int) -> tuple[dict[str, Any], dict[str, Any]]:
        decode = {"none": 73.3, "dspark": 108.5}[method]
        return ({"aggregate_tps": 60.0, "per_request_tps": {"mean": 60.0}, "decode_tps": {"mean": decode},
                 "ttft_ms": {"p50": 201.0}}, {})

    path = _run(tmp_path, make, extra="headline: decode\n")
    with Store.open(path, readonly=True) as store:
        built = report.build(store, "r")
    text = report.render(built, "md")
    assert "| method | K | C=1 generation tok/s (excl. TTFT) | C=1 TTFT p50 ms | vs baseline C=1 |" in text
    assert "| DSpark | 3 | 108.50 | 201.0 | 148.02% |" in text  # 108.5 / 73.3, seed 004's SpeedBench 1K row
