"""Memory and clocks as the run sampled them (pure): per server config, its peak memory use and the lowest
headroom at its start and over its cells (`sparklab.host.memory`'s samples), and the cells whose SM clock fell
by more than `CLOCK_DROP_FLAG` through their window (throttling). The report's "Memory and clocks" section
(`report.server_sections`) reads these.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sparklab.report.model import Group, Report, Server
from sparklab.sweep.store_rows import CellRow

CLOCK_DROP_FLAG = 0.10  # a cell whose SM clock fell by more than this from its start to its end is flagged


@dataclass(frozen=True)
class MemoryRow:
    """One server config's memory: at its start and over its cells (the samples' extremes, see memwatch)."""

    server: Server
    start_peak_used_gib: float | None
    cells_peak_used_gib: float | None
    headroom_gib: float | None  # the lowest MemAvailable seen, start and cells
    min_free_gib: float | None
    peak_container_gib: float | None
    peak_gpu_used_mib: float | None
    total_gib: float | None


def _extreme(values: list[float | None], pick: Callable[[list[float]], float]) -> float | None:
    present = [float(v) for v in values if v is not None]
    return pick(present) if present else None


def memory_rows(report: Report) -> list[MemoryRow]:
    """Per server config with memory samples: peak use and headroom (empty for runs from before sampling)."""
    rows = []
    for server in report.servers:
        start = server.startup.get("memory") or {}
        cells = [m for g in report.groups if g.server.id == server.id for c in g.cells
                 if (m := (c.result or {}).get("memory"))]
        if not start and not cells:
            continue
        every = [start, *cells] if start else cells
        rows.append(MemoryRow(
            server, start.get("peak_used_gib"), _extreme([m.get("peak_used_gib") for m in cells], max),
            _extreme([m.get("min_available_gib") for m in every], min),
            _extreme([m.get("min_free_gib") for m in every], min),
            _extreme([m.get("peak_container_gib") for m in every], max),
            _extreme([m.get("peak_gpu_used_mib") for m in every], max),
            _extreme([m.get("total_gib") for m in every], max)))
    return rows


@dataclass(frozen=True)
class ClockDrop:
    group: Group
    cell: CellRow
    drop: float
    start: dict[str, Any]
    end: dict[str, Any]


def clock_drops(report: Report, threshold: float = CLOCK_DROP_FLAG) -> list[ClockDrop]:
    """Cells whose SM clock fell by more than `threshold` between their start and end (throttling)."""
    out = []
    for group in report.groups:
        for cell in group.cells:
            clocks = (cell.result or {}).get("gpu_clocks") or {}
            drop = clocks.get("sm_clock_drop")
            if drop is None or drop <= threshold:
                continue
            if clocks.get("sm_clock_mhz"):  # read through the window: its highest clock to its lowest, and so on
                sm, heat, power = (clocks.get(k) or {} for k in ("sm_clock_mhz", "temperature_c", "power_w"))
                out.append(ClockDrop(group, cell, float(drop),
                                     {"sm_clock_mhz": sm.get("max"), "temperature_c": heat.get("min"),
                                      "power_w": power.get("min")},
                                     {"sm_clock_mhz": sm.get("min"), "temperature_c": heat.get("max"),
                                      "power_w": power.get("max")}))
            else:  # runs before issue 23: read at the cell's start and end
                out.append(ClockDrop(group, cell, float(drop), clocks.get("start") or {}, clocks.get("end") or {}))
    return out

