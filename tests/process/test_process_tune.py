"""`sparklab tune` with a host-process engine (the stand-in's Edge-LLM surface on the host, as seed 004 runs
TensorRT Edge-LLM): the search runs its servers where the recipe says, as a sweep does.

Before (issue 27, item 3) tune handed the sweep a Docker-only runtime, so every server failed with "pull of
…/bin/trtedge failed: invalid reference format" and the tune stopped with "tune made no progress"."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from sparklab.sweep.store import Store
from tests.dockerkit import free_port
from tests.process.conftest import RECIPE, STANDIN, HostCli


def _space(tmp_path: Path) -> Path:
    doc: dict[str, Any] = {
        "name": "process-tune", "recipe": str(RECIPE), "methods": ["none", "dspark"], "num_speculative_tokens": [3],
        "concurrency": [1], "requests": 3, "warmup": 1, "workloads": ["speedbench-1k"],
        "sampling": {"max_tokens": 12, "temperature": 0, "top_p": None, "enable_thinking": True},
        "set": [f"standin_dir={STANDIN}", f"engines.edgellm.port={free_port()}"],
    }
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_tune_runs_a_host_process_engine_where_its_recipe_says(host: HostCli, tmp_path: Path) -> None:
    path = _space(tmp_path)
    done = host.run("tune", str(path), "--runs-dir", str(tmp_path / "runs"), "--no-download", "--repeats", "1",
                    "--max-repeats", "1", "--objective", "decode", timeout=240, cwd=tmp_path)
    assert "invalid reference format" not in done.stderr and "no progress" not in done.stderr, done.stderr
    assert done.returncode == 0, done.stderr
    (db,) = sorted((tmp_path / "runs").glob("tune-process-tune-*/results.sqlite"))
    with Store.open(db) as store:
        state = json.loads(store.meta()["tune"])
        servers = store.server_configs()
        assert not store.failures(), [f.message for f in store.failures()]
        done_cells = store.cells("done")
    assert {s.method for s in servers if s.ready_s} == {"none", "dspark"}  # both served as host processes
    assert all(Path(s.log_path).read_text().count("Loaded model=standin/nemotron-lightning") == 1
               for s in servers if s.ready_s)
    assert len(done_cells) == 2 and all(c.result["summary"]["requests"]["ok"] == 3 for c in done_cells)
    assert [p["concurrency"] for p in state["picks"]] == [1]
    assert "C=1: sparklab up" in done.stdout, done.stdout  # the winner's command


def test_a_tune_continued_after_its_recipe_changed_is_refused(host: HostCli, tmp_path: Path) -> None:
    """A tune continues from the space it stored, but its servers render from the recipe file: an edit of that
    file between stop and resume (here the engine's environment, which no server id covers) would add cells of
    another setup to the search's, as a sweep's resume would without its drift check."""
    recipe = tmp_path / "standin-trtedge.yaml"
    recipe.write_text(RECIPE.read_text())
    path = _space(tmp_path)
    path.write_text(path.read_text().replace(str(RECIPE), str(recipe)))
    argv = ("tune", str(path), "--runs-dir", str(tmp_path / "runs"), "--no-download", "--repeats", "1",
            "--max-repeats", "2", "--objective", "decode")
    first = host.run(*argv, timeout=240, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    (db,) = sorted((tmp_path / "runs").glob("tune-process-tune-*/results.sqlite"))
    with Store.open(db, readonly=True) as store:
        before = len(store.cells("done"))
    text = recipe.read_text()
    assert 'STANDIN_TOKEN_DELAY: "0.002"' in text
    recipe.write_text(text.replace('STANDIN_TOKEN_DELAY: "0.002"', 'STANDIN_TOKEN_DELAY: "0.004"'))
    again = host.run(*argv, "--resume", db.parent.name, timeout=240, cwd=tmp_path)
    said = " ".join(again.stderr.split())
    assert again.returncode == 8, again.stderr  # DriftError: one paragraph, the fix named
    assert f"the recipe {recipe} changed" in said and "--new" in said and "Traceback" not in said, said
    assert "--allow-drift" not in said  # tune has no such flag
    dry = host.run(*argv, "--resume", db.parent.name, "--dry-run", timeout=240, cwd=tmp_path)
    assert dry.returncode == 8 and f"the recipe {recipe} changed" in " ".join(dry.stderr.split()), dry.stderr
    with Store.open(db, readonly=True) as store:
        assert len(store.cells("done")) == before
    recipe.write_text(text)  # put back: it continues
    assert host.run(*argv, "--resume", db.parent.name, timeout=240, cwd=tmp_path).returncode == 0
