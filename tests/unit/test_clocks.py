"""Clocks under load (issue 23): SM clock, power, temperature and throttle reasons are sampled during each
cell's window by the memory sampler's thread, from a fake `nvidia-smi` that throttles mid-window, and a cell
whose clock fell under load or whose throttle reasons were set is flagged, naming the reason, in its stored
facts and in the report's checks."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from sparklab.host import clocks, watchdog
from tests.fake_smi import IDLE, NORMAL, THERMAL, fake_nvidia_smi

KB_PER_GIB = 1024 * 1024


def _meminfo(path: Path) -> Path:
    path.write_text(f"MemTotal: {100 * KB_PER_GIB} kB\nMemFree: {60 * KB_PER_GIB} kB\n"
                    f"MemAvailable: {90 * KB_PER_GIB} kB\n")
    return path


def _sampler(tmp_path: Path, **kwargs: Any) -> watchdog.Sampler:
    return watchdog.Sampler(meminfo=_meminfo(tmp_path / "meminfo"), cgroup_root=tmp_path / "cg", interval_s=0.01,
                            **kwargs)


def test_one_reading_gives_clock_power_temperature_and_reasons(tmp_path: Path) -> None:
    calls = fake_nvidia_smi(tmp_path / "bin", [THERMAL])
    reading = clocks.read_gpu_clocks(str(tmp_path / "bin" / "nvidia-smi"))
    assert reading is not None
    assert (reading.sm_mhz, reading.max_sm_mhz, reading.power_w, reading.temperature_c) == (1702, 2418, 71.25, 91)
    assert reading.reasons == 0x40 and reading.reason_names == ("hw_thermal_slowdown",)
    assert ("--query-gpu=clocks.sm,clocks.max.sm,power.draw,temperature.gpu,clocks_event_reasons.active "
            "--format=csv,noheader,nounits") in calls.read_text()


def test_an_older_driver_answers_the_throttle_reasons_field(tmp_path: Path) -> None:
    calls = fake_nvidia_smi(tmp_path / "bin", [THERMAL], event_field="clocks_throttle_reasons.active")
    probe = clocks.GpuClockProbe(str(tmp_path / "bin" / "nvidia-smi"))
    first, second = probe(), probe()
    assert first is not None and second is not None and first.reasons == second.reasons == 0x40
    asked = calls.read_text().splitlines()
    assert "clocks_event_reasons.active" in asked[0] and "clocks_throttle_reasons.active" in asked[1]
    assert "clocks_event_reasons.active" not in asked[2]  # the field that works is remembered


def test_no_nvidia_smi_no_clock_samples(tmp_path: Path) -> None:
    probe = clocks.GpuClockProbe(None)
    assert probe() is None
    with _sampler(tmp_path, clocks=probe) as sampler:
        mark = sampler.mark()
        sampler.tick()
        assert sampler.clock_stats(mark) is None


def test_the_sampler_sees_the_clock_fall_and_the_reason_mid_window(tmp_path: Path) -> None:
    fake_nvidia_smi(tmp_path / "bin", [IDLE, NORMAL, NORMAL, NORMAL, THERMAL, THERMAL, IDLE])
    sampler = _sampler(tmp_path, clocks=clocks.GpuClockProbe(str(tmp_path / "bin" / "nvidia-smi")))
    mark = sampler.mark()
    for _ in range(7):
        sampler.tick()
    facts = sampler.clock_stats(mark)
    assert facts is not None
    assert facts["samples"] == 7 and facts["loaded_samples"] == 5  # the two idle moments are not load
    assert facts["sm_clock_mhz"]["max"] == 2405 and facts["sm_clock_mhz"]["min"] == 1702
    assert facts["sm_clock_drop"] == pytest.approx(1 - 1702 / 2405, abs=1e-4)
    assert facts["max_sm_clock_mhz"] == 2418 and facts["temperature_c"]["max"] == 91
    assert facts["reasons"] == {"hw_thermal_slowdown": 2} and facts["throttled"] == ["hw_thermal_slowdown"]
    assert facts["fell_under_load"] is True
    assert "nvidia-smi" in facts["source"] and "clocks_event_reasons.active" in facts["source"]


def test_a_steady_window_is_not_flagged(tmp_path: Path) -> None:
    fake_nvidia_smi(tmp_path / "bin", [NORMAL, "2380, 2418, 95.0, 63, 0x0000000000000000", NORMAL])
    sampler = _sampler(tmp_path, clocks=clocks.GpuClockProbe(str(tmp_path / "bin" / "nvidia-smi")))
    mark = sampler.mark()
    for _ in range(3):
        sampler.tick()
    facts = sampler.clock_stats(mark)
    assert facts is not None and facts["throttled"] == [] and facts["fell_under_load"] is False


def test_the_sweeps_cell_facts_come_from_the_window(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner's path: nvidia-smi found on PATH (the fake), sampled by the sampler's own thread."""
    fake_nvidia_smi(tmp_path / "bin", [NORMAL, NORMAL, THERMAL])
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")
    with _sampler(tmp_path) as sampler:  # the default probe: nvidia-smi on PATH
        mark = sampler.mark()
        deadline = 200
        while sampler.count(mark) < 4 and deadline:
            import time

            time.sleep(0.02)
            deadline -= 1
        result: dict[str, Any] = {}
        watchdog.add_cell_facts(result, sampler, mark)
    assert result["gpu_clocks"]["throttled"] == ["hw_thermal_slowdown"]
    assert result["memory"]["samples"] >= 4


def _store_with_clocks(tmp_path: Path, facts: dict[str, Any]) -> Path:
    from sparklab.sweep.store import Store
    from tests.reportkit import seed000_run

    path = seed000_run(tmp_path)
    with Store.open(path) as store:
        cells = store.cells("done")
    conn = sqlite3.connect(path)
    first = cells[0]
    conn.execute("UPDATE cells SET result_json = ? WHERE id = ?",
                 (json.dumps({**(first.result or {}), "gpu_clocks": facts}), first.id))
    conn.commit()
    conn.close()
    return path


def test_the_report_checks_name_the_throttle_reason(tmp_path: Path) -> None:
    from sparklab import report
    from sparklab.report.checks import run_checks
    from sparklab.sweep.store import Store

    fake_nvidia_smi(tmp_path / "bin", [NORMAL, NORMAL, THERMAL, THERMAL])
    sampler = _sampler(tmp_path, clocks=clocks.GpuClockProbe(str(tmp_path / "bin" / "nvidia-smi")))
    mark = sampler.mark()
    for _ in range(4):
        sampler.tick()
    path = _store_with_clocks(tmp_path / "run", sampler.clock_stats(mark) or {})
    with Store.open(path, readonly=True) as store:
        built = report.build(store, "r")
    (check,) = [c for c in run_checks(built) if c.name == "clocks under load"]
    assert len(check.findings) == 1
    finding = check.findings[0]
    assert "HW thermal slowdown" in finding and "2 of 4" in finding
    assert "2405 → 1702 MHz" in finding and "29%" in finding and "91 °C" in finding
    text = report.render(built, "md")
    assert "clocks under load" in text and "HW thermal slowdown" in text


def test_a_run_without_clock_samples_says_the_check_could_not_run(tmp_path: Path) -> None:
    from sparklab import report
    from sparklab.report.checks import run_checks
    from sparklab.sweep.store import Store
    from tests.reportkit import seed000_run

    with Store.open(seed000_run(tmp_path), readonly=True) as store:
        built = report.build(store, "r")
    (check,) = [c for c in run_checks(built) if c.name == "clocks under load"]
    assert check.findings == () and check.not_checked and "nvidia-smi" in check.not_checked


def test_the_memory_and_clocks_section_shows_the_fall_from_the_highest_to_the_lowest_reading(tmp_path: Path) -> None:
    from sparklab import report
    from sparklab.sweep.store import Store

    fake_nvidia_smi(tmp_path / "bin", [NORMAL, THERMAL, NORMAL])  # ends where it began: start/end would hide it
    sampler = _sampler(tmp_path, clocks=clocks.GpuClockProbe(str(tmp_path / "bin" / "nvidia-smi")))
    mark = sampler.mark()
    for _ in range(3):
        sampler.tick()
    path = _store_with_clocks(tmp_path / "run", sampler.clock_stats(mark) or {})
    with Store.open(path, readonly=True) as store:
        text = report.render(report.build(store, "r"), "md")
    section = text[text.index("## Memory and clocks"):]
    assert "29% lower (2405 → 1702 MHz), temperature 61 → 91 °C" in section


def test_a_window_shorter_than_the_sampling_interval_still_has_a_reading(tmp_path: Path) -> None:
    """A cell of 0.1 s under a 1 s sampler: before, its memory said 0 samples (all zeros stored, the report's memory
    check blind); the window's close takes one reading of its own."""
    sampler = watchdog.Sampler(meminfo=_meminfo(tmp_path / "meminfo"), cgroup_root=tmp_path / "cg", interval_s=1.0,
                               gpu=False)
    with sampler:
        sampler.tick()  # the thread's first reading, before the cell
        mark = sampler.mark()
        result: dict[str, Any] = {}
        watchdog.add_cell_facts(result, sampler, mark)
    assert result["memory"]["samples"] == 1
    assert result["memory"]["min_available_gib"] == 90 and result["memory"]["total_gib"] == 100
