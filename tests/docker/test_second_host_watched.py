"""The second Spark of a sweep is watched as this machine is (issue 23 §2): its memory is sampled through a helper
container on that Docker host, the page cache of the model's files is dropped there when MemFree is short, and a
server climbing to the floor there is stopped and recorded as `memory-floor` on that host.

The second host here is a second Docker daemon on this machine, reached over ssh (scripts/ci/second-host.sh): its
containers see this machine's /proc/meminfo, as a container on a real second Spark sees that Spark's. The machine
is shared and small (24 GiB): the page cache is one 1 GiB file in a tmp dir, dropped after; the floor sits 2 GiB
under MemAvailable, so only the growing stand-in (500 MiB/s up to 3.5 GiB) trips it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparklab.host import memory
from sparklab.recipes.schema import load_recipe, recipes_dir
from sparklab.sweep.store import Store
from tests.dockerkit import Cli, free_port, listed, ulimit_args

pytestmark = pytest.mark.docker

BLOB_GIB = 1


@pytest.fixture
def cached_model(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(the Hugging Face cache, the target's one blob): 1 GiB, read into the page cache by the test."""
    cache = tmp_path / "hf"
    repo_id = load_recipe(recipes_dir() / "gb10.yaml").model.id
    repo = cache / "hub" / ("models--" + repo_id.replace("/", "--"))
    (repo / "blobs").mkdir(parents=True)
    (repo / "snapshots" / "main").mkdir(parents=True)
    blob = repo / "blobs" / "weights"
    chunk = os.urandom(1 << 24)
    with blob.open("wb") as f:
        for _ in range(BLOB_GIB * 64):
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
    (repo / "snapshots" / "main" / "model.safetensors").symlink_to(blob)
    yield cache, blob
    memory.evict([blob])
    blob.unlink()


def _cached_gib(blob: Path) -> float:
    """How much of the blob the page cache holds, by mincore through fincore(1) where present, else None."""
    done = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", str(blob)], capture_output=True,
                          text=True)
    return int(done.stdout.split()[0]) / 2**30 if done.returncode == 0 and done.stdout.split() else float("nan")


def _sweep(tmp_path: Path, image: str, second: str, cache: Path, floor: float, util: float) -> Path:
    # the servers' port here and, moved by the second host's port_offset, there: both free, both under 65536
    port, other = sorted((free_port(), free_port()))
    while other == port:  # the kernel may hand the same free port twice
        port, other = sorted((port, free_port()))
    grow = {"match": {"method": "dspark"},
            "set": ["engines.vllm.env={STANDIN_GROW_MIB_PER_S: '500', STANDIN_GROW_MAX_MIB: '3500', "
                    "STANDIN_TOKEN_DELAY: '0.5'}"]}
    doc: dict[str, Any] = {
        "name": "second-host-watched", "recipe": "gb10", "methods": ["dspark", "none"], "num_speculative_tokens": [2],
        "concurrency": [1], "requests": {1: 2}, "warmup": 1, "max_attempts": 1, "memory_floor_gib": round(floor, 2),
        "sampling": {"max_tokens": 12, "temperature": 0, "top_p": None, "ignore_eos": True},
        "set": [f"engines.vllm.image={image}", "engines.vllm.gpus=none", "engines.vllm.engine_cache=false",
                "engines.vllm.ulimits={stack: 67108864}", f"engines.vllm.port={port}",
                f"gpu_memory_utilization={util:.4f}"],
        # the none server's cell lasts a few samplers' seconds (2 x 12 tokens at 0.2 s), so its window has samples
        "overrides": [grow, {"match": {"method": "none"}, "set": ["engines.vllm.env={STANDIN_TOKEN_DELAY: '0.2'}"]}],
        "hosts": [{"docker": second, "network": "host", "port_offset": other - port,
                   "hf_cache": str(cache)}],
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_the_second_host_is_watched_its_page_cache_dropped_and_its_floor_kept(
        cli: Cli, tmp_path: Path, second_host: str, second_client: Any, cached_model: tuple[Path, Path]) -> None:
    cache, blob = cached_model
    with blob.open("rb") as f:  # the previous server's weights, as the page cache keeps them
        while f.read(1 << 24):
            pass
    host = memory.read_meminfo()
    assert host.available_gib > 8, f"this test needs 8 GiB available; the host has {host.available_gib:.1f}"
    before = _cached_gib(blob)
    util = (host.free_gib + BLOB_GIB / 2) / host.total_gib  # short of MemFree by half the cached blob
    path = _sweep(tmp_path, cli.image, second_host, cache, host.available_gib - 2.0, util)
    done = subprocess.run([sys.executable, "-m", "sparklab", "sweep", str(path), "--runs-dir", str(tmp_path / "runs"),
                           "--no-download", "--drop-caches", *ulimit_args()], capture_output=True, text=True,
                          timeout=300, env=cli.env(), cwd=tmp_path)
    output = done.stdout + done.stderr
    name = second_host.split("@", 1)[1]
    assert done.returncode != 0, output  # the dspark server was lost at the floor
    assert "Traceback" not in output
    # the page cache of the model's files was dropped on that host, by a helper there
    assert f"[{name}] memory on {second_host}: MemFree" in output and "dropped the page cache of 1 model files" in output
    if before == before:  # fincore present: the kernel's own account agrees
        assert before > 0.9 * BLOB_GIB and _cached_gib(blob) < 0.1 * BLOB_GIB
    assert f"[{name}] server vllm/dspark K=2: failed (memory-floor): MemAvailable fell to" in output
    (db,) = sorted((tmp_path / "runs").glob("*/results.sqlite"))
    with Store.open(db) as store:
        (floor,) = [f for f in store.failures() if f.kind == "memory-floor"]
        assert floor.host == name
        assert floor.log_tail and "memory samples" in floor.log_tail
        (none,) = [s for s in store.server_configs() if s.method == "none"]
        watched = none.startup_facts["memory"]
        assert watched["samples"] >= 1 and "helper container" in watched["source"]
        assert watched["floor_gib"] == round(host.available_gib - 2.0, 2)
        (cell,) = store.cells("done")
        assert cell.host == name and cell.result["memory"]["samples"] >= 1
    helpers = [c for c in listed(second_client, {"label": "sparklab.role"})
               if c.labels.get("sparklab.run_id", "").startswith("second-host-watched")]
    assert helpers == []  # every helper of this run (the reader, the eviction) is gone with its server
