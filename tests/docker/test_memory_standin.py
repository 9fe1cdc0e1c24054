"""Unified memory against the stand-in (issue 12 §2): the page cache of the model's files makes a GB10 engine
refuse to start (vLLM's exact ValueError) unless sparklab frees it first, which it does by default; a server
whose memory climbs to the floor is stopped, recorded as `memory-floor` with its samples, and the sweep goes on.

The machine is shared and small (24 GiB): the page cache is one 3 GiB file in a tmp dir, dropped after, and
the floor sits a few hundred MiB under MemAvailable, so that little allocation trips it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparklab.host import memory
from sparklab.recipes.schema import load_recipe, recipes_dir
from tests.docker.test_sweep_standin import _store, _sweep, ulimit_flags
from tests.dockerkit import OURS, Cli, free_port, listed

pytestmark = pytest.mark.docker

CACHE_FILE_GIB = 3
NAME = "memory-standin"  # the sweeps' name: their containers' run ids start with it


def _mine(docker_client) -> set[str]:
    return {c.name for c in listed(docker_client, OURS)
            if c.labels.get("sparklab.run_id", "").startswith(NAME + "-")}


@pytest.fixture(autouse=True)
def no_container_left_behind(request, docker_client) -> Iterator[None]:
    """The tier's check, narrowed to this module's sweeps: on a shared host the tier's own fixture sees (and
    removes) sparklab containers other people start meanwhile."""
    yield
    left = _mine(docker_client)
    for name in left:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)
    assert not left, f"{request.node.name} left containers behind: {sorted(left)}"


def _run(cli: Cli, path: Path, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = cli.env(HOME=str(home))  # the sweep's Hugging Face cache is ~/.cache/huggingface
    return subprocess.run([sys.executable, "-m", "sparklab", "sweep", str(path), "--runs-dir",
                           str(path.parent / "runs"), "--no-download", *ulimit_flags(), *args],
                          capture_output=True, text=True, timeout=300, env=env, cwd=path.parent)


@pytest.fixture
def cached_model(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(home, the model's one blob): a Hub cache under a tmp HOME holding the gb10 target, 3 GiB, not cached."""
    home = tmp_path / "home"
    repo_id = load_recipe(recipes_dir() / "gb10.yaml").model.id
    repo = home / ".cache" / "huggingface" / "hub" / ("models--" + repo_id.replace("/", "--"))
    (repo / "blobs").mkdir(parents=True)
    (repo / "snapshots" / "main").mkdir(parents=True)
    blob = repo / "blobs" / "weights"
    chunk = os.urandom(1 << 24)  # written 64 times per GiB: the page cache holds every page all the same
    with blob.open("wb") as f:
        for _ in range(CACHE_FILE_GIB * 64):
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
    (repo / "snapshots" / "main" / "model.safetensors").symlink_to(blob)
    memory.evict([blob])
    yield home, blob
    memory.evict([blob])
    blob.unlink()


def _fill_page_cache(blob: Path) -> float:
    """Read the blob so its pages sit in the page cache; returns MemFree (GiB) afterwards."""
    with blob.open("rb") as f:
        while f.read(1 << 24):
            pass
    return memory.read_meminfo().free_gib


def _unified_sweep(tmp_path: Path, cli: Cli, util: float) -> Path:
    # The fraction is sized to this small machine's MemFree (the stand-in takes none of it), which leaves no room
    # for a memory floor (issue 23: preflight would refuse it); the floor is beside this test's point: off.
    return _sweep(tmp_path, cli.image, name=NAME, methods=["none"], concurrency=[1], requests={1: 2}, max_attempts=1,
                  memory_floor_gib=0,
                  set=[f"engines.vllm.image={cli.image}", "engines.vllm.gpus=none",
                       "engines.vllm.ulimits={stack: 67108864}", f"engines.vllm.port={free_port()}",
                       f"gpu_memory_utilization={util:.4f}", "engines.vllm.env={STANDIN_UNIFIED_MEMORY: '1'}"])


def test_page_cache_of_the_model_fails_the_engine_unless_sparklab_frees_it(cli: Cli, tmp_path: Path,
                                                                           cached_model) -> None:
    home, blob = cached_model
    total = memory.read_meminfo().total_gib

    # 1. --no-drop-caches: MemFree is short by half the cached file, and the engine says so in vLLM's words.
    free = _fill_page_cache(blob)
    (tmp_path / "kept").mkdir()
    kept = _unified_sweep(tmp_path / "kept", cli, (free + CACHE_FILE_GIB / 2) / total)
    done = _run(cli, kept, home, "--no-drop-caches")
    assert done.returncode != 0, done.stderr
    assert "posix_fadvise" not in done.stderr
    with _store(kept) as store:
        (failure,) = [f for f in store.failures() if f.server_config_id]
        assert store.counts()["done"] == 0
    assert failure.log_tail and "ValueError: Free memory on device cuda:0 (" in failure.log_tail
    assert "GiB) on startup is less than desired GPU memory utilization (" in failure.log_tail
    assert "Decrease GPU memory utilization or reduce GPU memory used by other processes." in failure.log_tail

    # 2. The default: sparklab drops the model files' page cache first (no root), says so, and the engine starts.
    free = _fill_page_cache(blob)
    (tmp_path / "freed").mkdir()
    freed = _unified_sweep(tmp_path / "freed", cli, (free + CACHE_FILE_GIB / 2) / total)
    done = _run(cli, freed, home)
    assert done.returncode == 0, done.stderr
    assert "dropped the page cache of 1 model files" in done.stderr and "posix_fadvise" in done.stderr
    with _store(freed) as store:
        assert store.counts()["done"] == 1
        (server,) = store.server_configs()
        start = server.startup_facts["memory"]
        (cell,) = store.cells("done")
    assert start["samples"] >= 1 and start["min_free_gib"] > 0
    assert cell.result["memory"]["samples"] >= 1 and cell.result["memory"]["max_interval_s"] <= 1.5


def test_a_server_that_climbs_to_the_memory_floor_is_stopped_and_the_sweep_goes_on(cli: Cli, tmp_path: Path) -> None:
    """The first server (DSpark K=2) allocates 500 MiB/s after ready (bounded at 3.5 GiB, held); the floor is
    2 GiB under what is available just before, so the climb trips it within about 4 s, while the other servers
    would need 2 GiB of drift from outside to trip it (with 0.5 GiB of margin, a CI run on a shared host once
    saw the none server trip it too)."""
    grow = {"match": {"method": "dspark", "num_speculative_tokens": 2},
            "set": ["engines.vllm.env={STANDIN_GROW_MIB_PER_S: '500', STANDIN_GROW_MAX_MIB: '3500', "
                    "STANDIN_TOKEN_DELAY: '0.5'}"]}
    available = memory.read_meminfo().available_gib
    assert available > 8, f"this test needs 8 GiB available to climb 3.5 GiB safely; the host has {available:.1f}"
    floor = available - 2.0
    path = _sweep(tmp_path, cli.image, name=NAME, methods=["dspark", "none"], concurrency=[1], requests={1: 2},
                  max_attempts=1, overrides=[grow], memory_floor_gib=round(floor, 2))
    done = _run(cli, path, Path.home())
    assert done.returncode != 0, done.stderr
    assert "failed (memory-floor): MemAvailable fell to" in done.stderr
    assert "Traceback" not in done.stderr
    with _store(path) as store:
        labels = {s.id: (s.method, s.k) for s in store.server_configs()}
        done_cells = {labels[c.server_config_id] for c in store.cells("done")}
        (failure,) = [f for f in store.failures() if f.kind == "memory-floor"]
        assert labels[failure.server_config_id] == ("dspark", 2)
        assert done_cells == {("none", None), ("dspark", 3)}
        assert store.counts()["running"] == 0
    assert failure.log_tail and "memory samples" in failure.log_tail and "MemAvailable" in failure.log_tail
