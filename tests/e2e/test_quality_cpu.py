"""Beyond speed on the real vLLM 0.27.1 CPU engine (issue 26): recipes/sweeps/cpu-quality.yaml runs the graded suites
(English instructions and code; the agent suite is graded in the unit tier, and ran here until the suite had to fit CI's
90 minutes on a slow host) at temperature 1.0 with none, ngram, draft_model and a known-lossy control (topk5; the
shipped file's negative control, plain, is left out for the same reason: ngram and draft_model must pass the check too);
the shipped file's temperature-0 cells are left out too (half the sweep's cells, about 140 s of the engine tier beside
the Docker tier): at temperature 0 a lossless drafter changes no token, which the CPU demo checks on every drafting
config of both engines (tests/e2e/test_sweep_cpu.py), and identical answers get identical grades
(tests/unit/test_quality_sweep.py grades and compares per task);
every answer is graded after its window (code in the sandbox container), every sampled answer scored under the target on
none's server; the report gives pass rates with intervals, per-task agreement and McNemar p-values. The lossless check
flags the lossy control and passes ngram and draft_model. It runs on the image whose CPU expand kernel is fixed (engine
vllm-cpu-synthetic): on the stock build drafting at temperature > 0 does not sample the target's distribution (word
salad, e.g. "BienfirehoseTYPESceptives taxpay bureaucraticiagnosed" at -15.6 nats per token:
sparklab.engines.vllm_synthetic.cpu_sampling_defects; the plan storing that defect and the report naming it are
tests/unit/test_lossless.py's). vLLM's synthetic
rejection sampling, the lossy method the issue names, is flagged by tests/e2e/test_synthetic_cpu.py on the same image.
Then `sparklab compare` on two real CPU runs: that vLLM run against llama.cpp b11669 on the same suites, sampling and
concurrency.

Cheap by sharing: the one quality run (a module fixture) serves both tests, so the comparison adds only two llama.cpp
servers (about 1 s to start each) instead of two vLLM ones. Measured: see the timeout marks."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from sparklab.recipes.schema import recipes_dir
from sparklab.sweep.store import Store
from tests.dockerkit import Cli, make_cli
from tests.e2e.conftest import MEASURED  # the module fixture's figure (the measured fixture is per test)

pytestmark = pytest.mark.engine
# The quality sweep's own bound. Measured on this 2-core machine (2026-12-01, 19:26 UTC): the module took 540 s, the
# quality sweep (5 servers x 6 cells, grading and scoring) 406 s in the first test's setup, the comparison's own
# part (2 llama.cpp servers x 4 cells, compare, report) 130 s.
# On a slower 2-core host (AVX2 only, 2026-12-02) vLLM CPU decodes about 4x slower: the same 30 cells took about
# 300 s per server, so the bound is a slow host's, and the sweep runs two suites and four methods (16 cells, not 30).
# There, 20 cells (five methods) took 1371 s, in a fresh-clone CI run that ended 2 min inside its 90. Since 2026-12-05
# the sweep runs at temperature 1.0 only: 8 cells.
QUALITY_TIMEOUT_S = 2400


@dataclass(frozen=True)
class QualityRun:
    cli: Cli
    runs: Path  # the runs directory (the llama.cpp run of the comparison joins it)
    db: Path


METHODS = ["ngram", "draft_model", "topk5", "none"]  # none last: it scores every sampled answer
SUITES = ["tasks-en", "code"]  # instruction and code; tasks-ja's and agent's checks are the unit tier's
SAMPLED = 1.0  # the shipped file's temperatures are [0, 1.0]; both runs here take the sampled one (module docstring)


def _quality_sweep(root: Path, image: str) -> Path:
    """recipes/sweeps/cpu-quality.yaml as shipped, with one instruction suite instead of two (English: tasks-ja is
    graded by the same checks, tests/unit/test_grading.py), no agent suite, no plain control and no temperature 0,
    to keep the engine tier short."""
    document = yaml.safe_load((recipes_dir() / "sweeps" / "cpu-quality.yaml").read_text())
    assert document["engines"] == ["vllm-cpu-synthetic"]  # the fixed expand kernel: lossless drafting at T > 0
    assert document["methods"] == ["ngram", "draft_model", "topk5", "plain", "none"]
    assert document["sampling"]["temperature"] == [0, 1.0]
    document.update({"recipe": str(recipes_dir() / "cpu.yaml"), "workloads": SUITES, "methods": METHODS,
                     "sampling": {**document["sampling"], "temperature": SAMPLED},
                     "set": [f"engines.vllm-cpu-synthetic.image={image}"]})
    path = root / "cpu-quality.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


@pytest.fixture(scope="module")
def quality_run(vllm_cpu_synthetic_image: str, tmp_path_factory: pytest.TempPathFactory) -> QualityRun:
    """The quality sweep once, on the real vLLM CPU engine (its expand kernel fixed), for both tests of this module."""
    root = tmp_path_factory.mktemp("quality")
    cli = make_cli(vllm_cpu_synthetic_image, root)
    sweep = _quality_sweep(root, vllm_cpu_synthetic_image)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "sparklab", "sweep", str(sweep), "--runs-dir", str(root / "runs")],
                          capture_output=True, text=True, timeout=QUALITY_TIMEOUT_S, env=cli.env())
    assert done.returncode == 0, done.stderr[-4000:]
    MEASURED["quality: sweep wall time (s), 4 servers x 2 cells, grading and scoring included"] = round(
        time.monotonic() - started, 1)
    (db,) = (root / "runs").glob("cpu-quality-*/results.sqlite")
    return QualityRun(cli, root / "runs", db)


@pytest.mark.timeout(QUALITY_TIMEOUT_S + 300)  # the module's quality sweep runs in this test's setup
def test_cpu_quality_sweep(quality_run: QualityRun, tmp_path: Path, measured) -> None:
    db = quality_run.db
    with Store.open(db, readonly=True) as store:
        assert store.counts()["done"] == 8 and not store.failures()
        grades = store.grades()
        scores = store.scores()
        cells = store.cells("done")
        outputs = store.outputs()
    every = [g for rows in grades.values() for g in rows]
    assert len(every) == 8 * 6 and all(g["status"] == "graded" for g in every), \
        [g["note"] for g in every if g["status"] != "graded"][:3]
    code = [g for g in every if g["kind"] == "code"]
    assert len(code) == 4 * 6 and all(len(g["tests"]) >= 4 for g in code)  # ran in the sandbox, pass/fail per test
    sampled = [c for c in cells if c.settings["sampling"]["temperature"] > 0]
    expected = sum(1 for c in sampled for a in outputs[c.id] if not a["warmup"] and a["ok"])
    assert len(scores) == expected == 4 * 2 * 6 and all(s.status == "scored" for s in scores.values())
    measured["quality: answers graded / sampled answers scored"] = f"{len(every)} / {len(scores)}"

    out = tmp_path / "report"
    shown = subprocess.run([sys.executable, "-m", "sparklab", "report", str(db.parent), "-o", str(out)],
                           capture_output=True, text=True, timeout=300)
    assert shown.returncode == 0, shown.stderr[-4000:]
    doc = json.loads((out / "report.json").read_text())
    md = (out / "report.md").read_text()
    assert "## Graded answers: pass rate and agreement with none" in md and "McNemar p" in md
    assert "### Per task: workload tasks-en, C=4" in md
    groups = {(g["method"], g["workload"]): g for g in doc["groups"]}
    for (method, workload), g in sorted(groups.items()):
        measured[f"quality: pass rate {method} {workload}"] = (
            f"{g['pass_rate']:.2f} [{g['pass_rate_ci95_low']:.2f}, {g['pass_rate_ci95_high']:.2f}] of {g['graded']}"
            + (f", tests {g['tests_passed']}/{g['tests']}" if g["tests"] else "")
            + ("" if method == "none" else f"; same verdict {g['same_verdict_as_none']}/{g['verdict_pairs']}, "
                                           f"McNemar p {g['mcnemar_p']:.3g}"))
        assert g["graded"] == 6 and g["pass_rate_ci95_low"] is not None
        if method != "none":
            assert g["mcnemar_p"] is not None and g["verdict_pairs"] == 6
    assert set(groups) == {(method, workload) for method in METHODS for workload in SUITES}, sorted(groups)
    verdicts = {}
    for g in doc["groups"]:
        if g.get("lossless") and g["method"] not in verdicts:
            verdicts[g["method"]] = g
            low, high = g["logprob_diff_ci95"]
            measured[f"quality: lossless {g['method']} (T=1)"] = (
                f"{g['lossless']}; log-likelihood/token diff {g['logprob_diff']:+.3f} [{low:+.3f}, {high:+.3f}] "
                f"p {g['logprob_p']:.2g}; answer tokens diff {g['length_diff']:+.1f} p {g['length_p']:.2g}")
    assert verdicts["topk5"]["lossless"].startswith("LOSSY") and verdicts["topk5"]["logprob_diff"] > 0  # too likely
    for method in ("ngram", "draft_model"):  # real drafters, the expand kernel fixed: the target's distribution
        g = verdicts[method]
        assert not g["sampling_defects"], g  # no known engine defect stored for this image's servers
        low, high = g["logprob_diff_ci95"]
        assert low <= g["logprob_diff"] <= high and 0 <= g["logprob_p"] <= 1 and 0 <= g["length_p"] <= 1, g
        # Passes: the report's verdict tests at 0.05 over its 8 tests (Bonferroni, 0.00625 each), so a lossless
        # drafter is flagged by chance about 1 time in 80; asserted here at 0.001 per test (1 in 250 for both tests of
        # both drafters) so CI does not flake on chance, which still fails the stock kernel by far: on that build
        # this sweep measured ngram -3.318 nats per token, p 5.3e-09, and answers 27.7 tokens short, p 1.4e-05.
        assert g["logprob_p"] > 1e-3 and g["length_p"] > 1e-3, g
    checks = md[md.index("## Checks on the verdict"):md.index("## How far to trust this")]
    lossless = checks[checks.index("lossless at temperature > 0:"):checks.index("thinking budget:")]
    assert "topk5" in lossless
    shown = {"draft_model": ("draft model", "draft_model")}  # the report's name for it, or its key
    assert all(any(name in lossless for name in shown.get(method, (method,)))
               == verdicts[method]["lossless"].startswith("LOSSY") for method in verdicts), lossless
    assert "a known engine defect" not in md and not any(verdicts[m]["sampling_defects"] for m in verdicts)
    (Path.home() / ".cache" / "sparklab" / "measurements").mkdir(parents=True, exist_ok=True)
    (Path.home() / ".cache" / "sparklab" / "measurements" / "cpu-quality-report.md").write_text(md)


def _llamacpp_sweep(tmp_path: Path) -> Path:
    """cpu-quality's suites, sampling and concurrency on llama.cpp b11669: its none and its Q4_0 draft (none last, so
    it takes the lossless check's turn right after its cells: llama.cpp cannot score, and the report says why).
    Not the code suite: the comparison must refuse the cells only one run has before --force sets the rest side by
    side. Temperature 1.0 only, as the vLLM run (_quality_sweep)."""
    document = yaml.safe_load((recipes_dir() / "sweeps" / "cpu-quality.yaml").read_text())
    document.update({"name": "cpu-quality-llamacpp", "recipe": str(recipes_dir() / "cpu.yaml"),
                     "engines": ["llamacpp-cpu"], "methods": ["draft_model", "none"],
                     "workloads": ["tasks-en"], "overrides": [],
                     "sampling": {**document["sampling"], "temperature": SAMPLED}})
    path = tmp_path / "llamacpp-quality.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


@pytest.mark.timeout(QUALITY_TIMEOUT_S + 900)  # its own part: two llama.cpp servers, 2 cells (+ the sweep, run alone)
def test_compare_vllm_with_llamacpp(quality_run: QualityRun, llamacpp_cpu_image: str, tmp_path: Path,
                                    measured) -> None:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "sparklab", "sweep", str(_llamacpp_sweep(tmp_path)),
                           "--runs-dir", str(quality_run.runs)], capture_output=True, text=True, timeout=600,
                          env=quality_run.cli.env())
    assert done.returncode == 0, done.stderr[-3000:]
    measured["compare: llama.cpp quality run wall time (s), 2 servers x 1 cell"] = round(time.monotonic() - started, 1)
    (run,) = quality_run.runs.glob("cpu-quality-llamacpp-*")
    runs = [quality_run.db.parent.name, run.name]
    compare = [sys.executable, "-m", "sparklab", "compare", *runs, "--runs-dir", str(quality_run.runs)]
    refused = subprocess.run(compare, capture_output=True, text=True, timeout=300)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "do not measure the same cells" in refused.stderr and "code" in refused.stderr, refused.stderr
    out = tmp_path / "compare"
    shown = subprocess.run([*compare, "--force", "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert shown.returncode == 0, shown.stderr[-3000:]
    md = (out / "compare.md").read_text()
    differences = md[md.index("What differs"):md.index("## Side by side")]
    assert "- engine: " in differences and "- image: " in differences and "- engine version: " in differences
    assert "sampling:" not in differences
    doc = json.loads((out / "compare.json").read_text())
    rows = {(r["cell"], r["config"], r["run"]): r for r in doc["rows"]}
    cells = {cell for cell, _, _ in rows}
    assert len(cells) == 1 and not any(cell.startswith("code") for cell in cells), cells  # 1 suite, 1 temperature
    for cell in cells:  # llama.cpp's none against vLLM's; pass rates where both graded
        theirs, ours = rows[(cell, "none", runs[1])], rows[(cell, "none", runs[0])]
        # one run per cell (repeats: 1): a ratio without an interval, as the report gives one run no interval
        assert theirs["vs_first_run"] > 0 and theirs["n"] == 1 and theirs["vs_first_run_ci95"] == [None, None], theirs
        assert ours["pass_rate"] is not None and theirs["pass_rate"] is not None
        assert rows[(cell, "draft model K=3", runs[1])]["vs_own_none"] is not None
    with Store.open(quality_run.runs / run.name / "results.sqlite", readonly=True) as store:
        scores = store.scores()
    assert scores and all(s.status == "unscorable" and "27174" in (s.detail or "") for s in scores.values())
    report = subprocess.run([sys.executable, "-m", "sparklab", "report", run.name, "--runs-dir",
                             str(quality_run.runs)], capture_output=True, text=True, timeout=300)
    assert report.returncode == 0 and "not checkable" in report.stdout
    for (cell, config, run_id), r in sorted(rows.items()):
        if r["mean"] is not None and config == "none":
            versus = f", {100 * r['vs_first_run']:.1f}% of vLLM's" if run_id == runs[1] else ""
            measured[f"compare: {run_id.split('-2')[0]} {cell} none C=4 tok/s"] = (
                f"{r['mean']:.2f} [{r['ci95_low']}, {r['ci95_high']}], pass rate {r['pass_rate']:.2f}{versus}")
    (Path.home() / ".cache" / "sparklab" / "measurements").mkdir(parents=True, exist_ok=True)
    (Path.home() / ".cache" / "sparklab" / "measurements" / "cpu-compare.md").write_text(md)
