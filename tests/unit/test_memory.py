"""Unified memory as the engine sees it (issue 12 §2, §5): /proc/meminfo, the container's cgroup, nvidia-smi,
the engines' memory fractions, freeing the model's page cache, the sampler and its floor, OOM wording."""

from __future__ import annotations

import os
import stat
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sparklab.engines.scrape import exit_code_meaning
from sparklab.host import memory, pagecache, preflight, watchdog
from sparklab.host.facts import ThisMachine
from sparklab.recipes.render import LaunchOptions, render
from sparklab.recipes.schema import Recipe, load_recipe, recipes_dir
from sparklab.spec import LaunchSpec

KB_PER_GIB = 1024 * 1024


def meminfo(path: Path, total: float, free: float, available: float, cached: float = 1.0) -> Path:
    """A /proc/meminfo in the kernel's format (kB), values given in GiB."""
    rows = [("MemTotal", total), ("MemFree", free), ("MemAvailable", available), ("Buffers", 0.1),
            ("Cached", cached), ("SwapCached", 0.0)]
    path.write_text("".join(f"{name}:{int(gib * KB_PER_GIB):>16} kB\n" for name, gib in rows))
    return path


def _gb10(engine_name: str = "vllm", hf_cache: Path | None = None,
          overrides: list[str] | None = None) -> tuple[LaunchSpec, Recipe]:
    recipe = load_recipe(recipes_dir() / "gb10.yaml", overrides)
    return render(recipe, engine_name, "dspark", LaunchOptions(hf_cache=hf_cache or Path("/"))), recipe


# -- /proc/meminfo and what the engine needs ---------------------------------------------------------------


def test_meminfo_gives_total_free_available_and_cached_in_gib(tmp_path: Path) -> None:
    host = memory.read_meminfo(meminfo(tmp_path / "meminfo", 119.7, 74.9, 115.0, 38.5))
    assert (host.total_gib, host.free_gib, host.available_gib) == pytest.approx((119.7, 74.9, 115.0), abs=1e-3)
    assert host.cached_gib == pytest.approx(38.5, abs=1e-3)


@pytest.mark.parametrize(("engine_name", "flag"), [("vllm", "--gpu-memory-utilization"),
                                                   ("sglang", "--mem-fraction-static")])
def test_the_engine_needs_its_fraction_of_memtotal(engine_name: str, flag: str) -> None:
    spec, _ = _gb10(engine_name)
    need = memory.engine_need(spec, 100.0)
    assert need is not None and need.flag == flag
    assert need.gib == pytest.approx(100.0 * need.fraction)


def test_unified_memory_is_judged_by_memfree_not_memavailable(tmp_path: Path) -> None:
    """vllm#48140: page cache left by the previous server's weights counts as used. MemAvailable (the old check)
    passes; MemFree is short: a warning that names the cause and says sparklab frees the cache first."""
    spec, recipe = _gb10(overrides=["gpu_memory_utilization=0.8"])
    info = meminfo(tmp_path / "meminfo", 100.0, 50.0, 95.0, 44.0)
    found = preflight.check_host(spec, recipe, port_busy=lambda h, p: False, meminfo=info)
    (finding,) = [f for f in found if "MemFree" in f.message]
    assert finding.level == "warning"
    assert "50.0 GiB free (MemFree)" in finding.message and "80.0 GiB" in finding.message
    assert "page cache" in finding.message and "--no-drop-caches" in (finding.hint or "")


def test_unified_memory_that_not_even_the_page_cache_covers_is_an_error(tmp_path: Path) -> None:
    spec, recipe = _gb10("sglang")
    fraction = memory.engine_need(spec, 100.0)
    assert fraction is not None
    info = meminfo(tmp_path / "meminfo", 100.0, 5.0, fraction.gib - 10)
    errors = [f for f in preflight.check_host(spec, recipe, port_busy=lambda h, p: False, meminfo=info)
              if f.level == "error"]
    assert errors and "--mem-fraction-static" in errors[0].message


def test_memory_that_fits_gives_no_finding(tmp_path: Path) -> None:
    spec, recipe = _gb10(overrides=["gpu_memory_utilization=0.5"])
    info = meminfo(tmp_path / "meminfo", 100.0, 60.0, 90.0)
    assert preflight.check_host(spec, recipe, port_busy=lambda h, p: False, meminfo=info) == []


# -- freeing the model's page cache -------------------------------------------------------------------------


def _hub_files(hub: Path, repo_id: str, names: list[str]) -> list[Path]:
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    blobs = repo / "blobs"
    blobs.mkdir(parents=True)
    snapshot = repo / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    out = []
    for i, name in enumerate(names):
        blob = blobs / f"blob{i}"
        blob.write_bytes(b"x" * 4096)
        (snapshot / name).symlink_to(blob)
        out.append(blob)
    return out


def test_model_files_are_the_blobs_of_the_target_and_its_draft(tmp_path: Path) -> None:
    spec, recipe = _gb10(hf_cache=tmp_path)
    target = _hub_files(tmp_path / "hub", recipe.model.id, ["model.safetensors", "config.json"])
    draft = _hub_files(tmp_path / "hub", recipe.model.drafts["dspark"].id, ["model.safetensors"])
    _hub_files(tmp_path / "hub", "someone/else", ["model.safetensors"])
    assert sorted(memory.model_files(recipe, spec)) == sorted(target + draft)


def test_freeing_advises_the_kernel_to_drop_each_model_file(tmp_path: Path, monkeypatch) -> None:
    spec, recipe = _gb10(hf_cache=tmp_path, overrides=["gpu_memory_utilization=0.8"])
    files = _hub_files(tmp_path / "hub", recipe.model.id, ["a.safetensors", "b.safetensors"])
    info = meminfo(tmp_path / "meminfo", 100.0, 50.0, 95.0, 44.0)
    advised: list[tuple[int, int]] = []

    def fadvise(fd: int, offset: int, length: int, advice: int) -> None:
        advised.append((os.fstat(fd).st_ino, advice))
        meminfo(info, 100.0, 90.0, 95.0, 4.0)  # what the kernel would do

    monkeypatch.setattr(os, "posix_fadvise", fadvise)
    said: list[str] = []
    done = pagecache.free_page_cache(recipe, spec, said.append, ThisMachine(meminfo=info, root=False, gpu=False))
    assert sorted(advised) == sorted((f.stat().st_ino, os.POSIX_FADV_DONTNEED) for f in files)
    assert done is not None and "posix_fadvise" in said[0] and "2 model files" in said[0]
    assert "50.0 → 90.0 GiB" in said[0]


def test_no_freeing_when_memfree_already_covers_the_need(tmp_path: Path, monkeypatch) -> None:
    spec, recipe = _gb10(hf_cache=tmp_path, overrides=["gpu_memory_utilization=0.5"])
    _hub_files(tmp_path / "hub", recipe.model.id, ["a.safetensors"])
    monkeypatch.setattr(os, "posix_fadvise", lambda *a: pytest.fail("nothing to free"))
    info = meminfo(tmp_path / "meminfo", 100.0, 60.0, 95.0)
    assert pagecache.free_page_cache(recipe, spec, lambda m: None, ThisMachine(meminfo=info, root=False, gpu=False)) is None


def test_a_short_memfree_the_model_files_do_not_cover_says_what_to_run(tmp_path: Path, monkeypatch) -> None:
    """Other files' page cache: without root sparklab says what would free it, and the engine decides."""
    spec, recipe = _gb10(hf_cache=tmp_path, overrides=["gpu_memory_utilization=0.8"])
    _hub_files(tmp_path / "hub", recipe.model.id, ["a.safetensors"])
    monkeypatch.setattr(os, "posix_fadvise", lambda *a: None)
    info = meminfo(tmp_path / "meminfo", 100.0, 50.0, 95.0, 44.0)
    said: list[str] = []
    pagecache.free_page_cache(recipe, spec, said.append, ThisMachine(meminfo=info, root=False, gpu=False))
    assert "still short" in said[-1] and "drop_caches" in said[-1]


# -- the container's own memory: cgroup v2 and v1 ------------------------------------------------------------


CONTAINER = "0123456789ab" * 5 + "cdef"


@pytest.mark.parametrize(("relative", "current", "peak"), [
    (f"system.slice/docker-{CONTAINER}.scope", "memory.current", "memory.peak"),  # v2, systemd driver
    (f"docker/{CONTAINER}", "memory.current", "memory.peak"),  # v2, cgroupfs driver
    (f"memory/docker/{CONTAINER}", "memory.usage_in_bytes", "memory.max_usage_in_bytes"),  # v1 (this host)
    (f"memory/system.slice/docker-{CONTAINER}.scope", "memory.usage_in_bytes", "memory.max_usage_in_bytes"),
])
def test_container_memory_comes_from_its_cgroup(tmp_path: Path, relative: str, current: str, peak: str) -> None:
    directory = tmp_path / relative
    directory.mkdir(parents=True)
    (directory / current).write_text(f"{3 * 2**30}\n")
    (directory / peak).write_text(f"{5 * 2**30}\n")
    cgroup = memory.container_cgroup(CONTAINER, root=tmp_path)
    assert cgroup is not None
    assert cgroup.read() == (3 * 2**30, 5 * 2**30)


def test_no_cgroup_for_an_unknown_container(tmp_path: Path) -> None:
    assert memory.container_cgroup(CONTAINER, root=tmp_path) is None


def test_a_cgroup_without_a_peak_file_gives_current_only(tmp_path: Path) -> None:
    directory = tmp_path / "docker" / CONTAINER
    directory.mkdir(parents=True)
    (directory / "memory.current").write_text("1024\n")
    cgroup = memory.container_cgroup(CONTAINER, root=tmp_path)
    assert cgroup is not None and cgroup.read() == (1024, None)


# -- nvidia-smi (a fake one first on PATH) -------------------------------------------------------------------


@pytest.fixture
def fake_smi(tmp_path: Path, monkeypatch):
    """Put a fake `nvidia-smi` first on PATH that prints `output` (or exits with `code`)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")

    def install(output: str, code: int = 0) -> Path:
        script = bin_dir / "nvidia-smi"
        script.write_text(f"#!/bin/sh\necho \"$@\" >> {bin_dir}/calls\ncat <<'EOF'\n{output}\nEOF\nexit {code}\n")
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
        return bin_dir / "calls"

    return install


def test_gpu_memory_from_nvidia_smi(fake_smi) -> None:
    calls = fake_smi("61440, 122880")
    assert memory.gpu_memory() == (61440.0, 122880.0)
    assert "--query-gpu=memory.used,memory.total" in calls.read_text()
    assert "--format=csv,noheader,nounits" in calls.read_text()


def test_gpu_memory_not_available_on_gb10(fake_smi) -> None:
    fake_smi("[N/A], [N/A]")
    assert memory.gpu_memory() is None


def test_no_nvidia_smi_is_no_gpu_reading(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert memory.gpu_memory() is None and memory.gpu_clocks() is None


def test_a_failing_nvidia_smi_is_no_gpu_reading(fake_smi) -> None:
    fake_smi("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", code=9)
    assert memory.gpu_memory() is None and memory.gpu_clocks() is None


def test_clock_temperature_and_power(fake_smi) -> None:
    calls = fake_smi("2405, 61, 38.52")
    assert memory.gpu_clocks() == {"sm_clock_mhz": 2405.0, "temperature_c": 61.0, "power_w": 38.52}
    assert "--query-gpu=clocks.sm,temperature.gpu,power.draw" in calls.read_text()


def test_clock_fields_that_say_na_are_none(fake_smi) -> None:
    fake_smi("2405, 61, [N/A]")
    assert memory.gpu_clocks() == {"sm_clock_mhz": 2405.0, "temperature_c": 61.0, "power_w": None}


# -- the sampler and the floor -------------------------------------------------------------------------------


def _sampler(tmp_path: Path, info: Path, **kwargs: Any) -> watchdog.Sampler:
    return watchdog.Sampler(meminfo=info, cgroup_root=tmp_path / "cgroup", interval_s=0.02, gpu=False, **kwargs)


def _wait(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_the_sampler_keeps_the_minimum_free_and_the_peak_used(tmp_path: Path) -> None:
    info = meminfo(tmp_path / "meminfo", 100.0, 60.0, 90.0)
    cgroup = tmp_path / "cgroup" / "docker" / CONTAINER
    cgroup.mkdir(parents=True)
    (cgroup / "memory.current").write_text(f"{2 * 2**30}\n")
    with _sampler(tmp_path, info, locate=lambda: CONTAINER) as sampler:
        mark = sampler.mark()
        _wait(lambda: sampler.count(mark) >= 2)
        meminfo(info, 100.0, 20.0, 30.0)
        (cgroup / "memory.current").write_text(f"{9 * 2**30}\n")
        _wait(lambda: sampler.stats(mark).min_available_gib < 31)
        meminfo(info, 100.0, 55.0, 85.0)
        _wait(lambda: sampler.latest() is not None and sampler.latest().host.free_gib > 50)
        stats = sampler.stats(mark)
    assert stats.min_free_gib == pytest.approx(20.0, abs=1e-3)
    assert stats.min_available_gib == pytest.approx(30.0, abs=1e-3)
    assert stats.peak_used_gib == pytest.approx(70.0, abs=1e-3)  # MemTotal - MemAvailable at its lowest
    assert stats.peak_container_gib == pytest.approx(9.0, abs=1e-3)
    assert stats.max_interval_s <= 1.0
    stored = stats.as_dict()
    assert stored["min_free_gib"] == 20.0 and stored["headroom_gib"] == 30.0 and stored["samples"] >= 3


def test_stats_of_a_mark_cover_only_what_came_after_it(tmp_path: Path) -> None:
    info = meminfo(tmp_path / "meminfo", 100.0, 10.0, 20.0)
    with _sampler(tmp_path, info) as sampler:
        _wait(lambda: sampler.count(0) >= 2)
        meminfo(info, 100.0, 60.0, 90.0)
        _wait(lambda: sampler.latest() is not None and sampler.latest().host.free_gib > 50)
        mark = sampler.mark()
        _wait(lambda: sampler.count(mark) >= 2)
        assert sampler.stats(mark).min_free_gib == pytest.approx(60.0, abs=1e-3)


def test_the_floor_stops_the_server_once_with_the_samples(tmp_path: Path) -> None:
    info = meminfo(tmp_path / "meminfo", 100.0, 40.0, 50.0)
    stopped = threading.Event()
    calls: list[int] = []

    def stop() -> None:
        calls.append(1)
        stopped.set()

    with _sampler(tmp_path, info, floor_gib=8.0, on_floor=stop) as sampler:
        _wait(lambda: sampler.count(0) >= 2)
        assert sampler.tripped is None
        meminfo(info, 100.0, 2.0, 7.5)
        assert stopped.wait(5.0)
        _wait(lambda: sampler.count(0) >= 6)
    assert calls == [1]
    assert sampler.tripped is not None and sampler.tripped.host.available_gib == pytest.approx(7.5, abs=1e-3)
    message, tail = watchdog.floor_failure(sampler, 8.0)
    assert "MemAvailable fell to 7.5 GiB" in message and "floor of 8.0 GiB" in message
    assert "MemAvailable" in tail and len(tail.splitlines()) >= 3


def test_the_floor_is_8_gib_for_unified_memory_recipes_unless_set() -> None:
    _, unified = _gb10()
    _, plain = _gb10(overrides=["unified_memory=false"])
    assert watchdog.floor_for(unified, None) == 8.0
    assert watchdog.floor_for(plain, None) is None
    assert watchdog.floor_for(plain, 2.5) == 2.5
    assert watchdog.floor_for(unified, 0) is None  # 0 turns it off


# -- exit 137/143 without a traceback ------------------------------------------------------------------------


@pytest.mark.parametrize("code", [137, 143])
def test_a_kill_without_a_traceback_says_oom_killer_or_earlyoom(code: int) -> None:
    text = exit_code_meaning(code, None, log_tail="INFO Loading weights\nINFO 60% done\n")
    assert "no Python traceback" in text and "earlyoom" in text and "OOM killer" in text


def test_a_kill_after_a_traceback_is_not_blamed_on_memory() -> None:
    text = exit_code_meaning(143, None, log_tail="Traceback (most recent call last):\n  ...\nValueError: x\n")
    assert "no Python traceback" not in text


def test_oom_evidence_reads_the_earlyoom_journal(tmp_path: Path, monkeypatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "journalctl"
    script.write_text("#!/bin/sh\necho 'Nov 29 02:14:07 spark earlyoom[811]: mem avail: 7812 of 121684 MiB "
                      "(6.42%), sending SIGTERM to process 40213 uid 0 \"python3\": badness 901'\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    evidence = memory.oom_evidence(kmsg=tmp_path / "no-kmsg")
    assert evidence is not None and "earlyoom" in evidence and "SIGTERM" in evidence


def test_oom_evidence_reads_the_kernel_log(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no journalctl
    kmsg = tmp_path / "kmsg"
    now_us = int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6)
    old_us = now_us - 3600 * 10**6
    kmsg.write_text(f"6,1,{old_us},-;eth0 up\n3,2,{old_us},-;Out of memory: Killed process 1111 (python3)\n"
                    f"3,3,{now_us},-;Out of memory: Killed process 40213 (python3) total-vm:1kB\n")
    evidence = memory.oom_evidence(kmsg=kmsg)
    assert evidence is not None and "Killed process 40213" in evidence
    # a kill an hour ago is another story; and when Docker says no OOM kill hit the container, none is quoted
    kmsg.write_text(f"3,2,{old_us},-;Out of memory: Killed process 1111 (python3) total-vm:1kB\n")
    assert memory.oom_evidence(kmsg=kmsg) is None
    kmsg.write_text(f"3,3,{now_us},-;Out of memory: Killed process 40213 (python3) total-vm:1kB\n")
    assert memory.oom_evidence(kmsg=kmsg, kernel=False) is None


def test_no_oom_evidence_where_nothing_is_readable(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert memory.oom_evidence(kmsg=tmp_path / "missing") is None


# -- the sweep's flags and sweep-file field -------------------------------------------------------------------


@pytest.mark.parametrize(("flags", "drop"), [([], None), (["--drop-caches"], True), (["--no-drop-caches"], False)])
def test_freeing_the_page_cache_is_the_default_and_can_be_turned_off(flags: list[str], drop: bool | None) -> None:
    from sparklab.cli.main import build_parser

    args = build_parser().parse_args(["sweep", "s.yaml", *flags])
    assert args.drop_caches is drop and args.memory_floor_gib is None


def test_the_floor_flag_and_the_sweep_file_field(tmp_path: Path) -> None:
    import yaml

    from sparklab.cli.main import build_parser
    from sparklab.recipes.sweep_file import load_sweep

    assert build_parser().parse_args(["sweep", "s.yaml", "--memory-floor-gib", "2.5"]).memory_floor_gib == 2.5
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "s", "recipe": "gb10", "methods": ["none"], "concurrency": [1],
                                    "memory_floor_gib": 4}))
    assert load_sweep(path).memory_floor_gib == 4


# -- the report: peak memory and headroom per config; clocks that fell ---------------------------------------


def _memory_facts(peak_used: float, available: float, container: float | None = None) -> dict[str, Any]:
    return {"samples": 10, "seconds": 9.0, "max_interval_s": 1.0, "total_gib": 119.7, "min_free_gib": 3.0,
            "min_available_gib": available, "peak_used_gib": peak_used, "headroom_gib": available,
            "peak_container_gib": container, "peak_gpu_used_mib": None, "gpu_total_mib": None}


def test_the_report_shows_peak_memory_and_headroom_per_config_and_flags_fallen_clocks(tmp_path: Path) -> None:
    import sqlite3

    from sparklab.report import content, from_store
    from sparklab.report.document import markdown
    from sparklab.sweep.store import Store
    from tests.reportkit import seed000_run

    path = seed000_run(tmp_path)
    with Store.open(path) as store:
        servers = store.server_configs()
        cells = store.cells("done")
    conn = sqlite3.connect(path)
    for i, server in enumerate(servers):
        facts = {**(server.startup_facts or {}), "memory": _memory_facts(17.62 + i, 100.0 - i)}
        conn.execute("UPDATE server_configs SET startup_facts_json = ? WHERE id = ?", (json_dumps(facts), server.id))
    slow = cells[0]
    for cell in cells:
        result = {**(cell.result or {}), "memory": _memory_facts(19.14, 98.5, 12.5)}
        if cell.id == slow.id:
            result["gpu_clocks"] = watchdog.cell_clocks(
                {"sm_clock_mhz": 2400.0, "temperature_c": 60.0, "power_w": 30.0},
                {"sm_clock_mhz": 2000.0, "temperature_c": 88.0, "power_w": 29.0})
        else:
            result["gpu_clocks"] = watchdog.cell_clocks({"sm_clock_mhz": 2400.0}, {"sm_clock_mhz": 2300.0})
        conn.execute("UPDATE cells SET result_json = ? WHERE id = ?", (json_dumps(result), cell.id))
    conn.commit()
    conn.close()
    with Store.open(path, readonly=True) as store:
        report = from_store.build(store, "seed000-published")
    text = markdown(content.document(report))
    section = text[text.index("## Memory"):]
    first = report.servers[0]
    assert f"| {first.label} " in section
    assert "19.14" in section and "17.62" in section and "98.5" in section and "12.5" in section
    flagged = [line for line in section.splitlines() if "17% lower" in line]
    assert len(flagged) == 1 and "2400 → 2000 MHz" in flagged[0] and "88" in flagged[0]
    assert "2300" not in section  # a 4% fall is not flagged


def test_a_report_without_memory_samples_has_no_memory_section(tmp_path: Path) -> None:
    from sparklab.report import content, from_store
    from sparklab.report.document import markdown
    from sparklab.sweep.store import Store
    from tests.reportkit import seed000_run

    with Store.open(seed000_run(tmp_path), readonly=True) as store:
        text = markdown(content.document(from_store.build(store, "x")))
    assert "## Memory" not in text


def json_dumps(value: Any) -> str:
    import json

    return json.dumps(value)
