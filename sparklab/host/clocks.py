"""GPU clocks under load: the SM clock, its maximum, power, temperature and the active clock event (throttle)
reasons, read from `nvidia-smi` (the command is an argument: PATH's by default, a fake in tests), and what one
cell's window of such readings says: did the clock fall under load, and why.

The fields are nvidia-smi's `--query-gpu` names: `clocks.sm` (MHz), `clocks.max.sm` (MHz), `power.draw` (W),
`temperature.gpu` (°C) and `clocks_event_reasons.active`, the bitmask of active clock event reasons (drivers
before R535 call it `clocks_throttle_reasons.active`; nvidia-smi prints it as hex, 0x0000000000000040). Its
bits are NVML's (NVML API reference, "NvmlClocksEventReasons", docs.nvidia.com/deploy/nvml-api/
group__nvmlClocksEventReasons.html): 0x1 GPU idle, 0x2 applications clocks setting, 0x4 SW power cap, 0x8 HW
slowdown, 0x10 sync boost, 0x20 SW thermal slowdown, 0x40 HW thermal slowdown, 0x80 HW power brake slowdown,
0x100 display clock setting. A reading with the idle bit is an idle moment, not load; the power cap and the
four slowdowns are throttling. Fields a GPU does not report print `[N/A]` and read as None.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from typing import Any

FIELDS = ("clocks.sm", "clocks.max.sm", "power.draw", "temperature.gpu")
REASON_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")  # R535+ and older drivers
REASONS = {
    0x1: ("gpu_idle", "GPU idle"), 0x2: ("applications_clocks_setting", "applications clocks setting"),
    0x4: ("sw_power_cap", "SW power cap"), 0x8: ("hw_slowdown", "HW slowdown"), 0x10: ("sync_boost", "sync boost"),
    0x20: ("sw_thermal_slowdown", "SW thermal slowdown"), 0x40: ("hw_thermal_slowdown", "HW thermal slowdown"),
    0x80: ("hw_power_brake_slowdown", "HW power brake slowdown"),
    0x100: ("display_clock_setting", "display clock setting"),
}
IDLE = 0x1
THROTTLING = 0x4 | 0x8 | 0x20 | 0x40 | 0x80
# A cell whose SM clock under load fell by more than this from the window's highest is flagged: boost clocks move
# a few % with load and temperature; a tenth is beyond that (the report's "Memory and clocks" uses the same 10%).
CLOCK_FALL_FLAG = 0.10
LABELS = {name: label for name, label in REASONS.values()}


@dataclass(frozen=True)
class GpuClocks:
    sm_mhz: float | None
    max_sm_mhz: float | None
    power_w: float | None
    temperature_c: float | None
    reasons: int | None  # the active clock event reasons' bitmask; None where the driver did not say

    @property
    def reason_names(self) -> tuple[str, ...]:
        return tuple(name for bit, (name, _) in REASONS.items() if self.reasons and self.reasons & bit)

    @property
    def idle(self) -> bool:
        return bool(self.reasons and self.reasons & IDLE)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:  # [N/A], [Not Supported]
        return None


def _bitmask(text: str) -> int | None:
    try:
        return int(text, 16) if text.lower().startswith("0x") else int(text)
    except ValueError:
        return None


def read_gpu_clocks(nvidia_smi: str | None, reason_field: str = REASON_FIELDS[0],
                    timeout_s: float = 5.0) -> GpuClocks | None:
    """One reading of the first GPU through `nvidia_smi` (a path; None: there is none); None when it is absent,
    fails (a field this driver does not know included) or says nothing."""
    if nvidia_smi is None:
        return None
    try:
        done = subprocess.run([nvidia_smi, f"--query-gpu={','.join((*FIELDS, reason_field))}",
                               "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.strip().splitlines()
    parts = [p.strip() for p in lines[0].split(",")] if lines else []
    if done.returncode != 0 or len(parts) != len(FIELDS) + 1:
        return None
    sm, max_sm, power, temperature = (_number(p) for p in parts[:4])
    if sm is None and temperature is None and power is None:
        return None
    return GpuClocks(sm, max_sm, power, temperature, _bitmask(parts[4]))


_LOOKUP = object()


class GpuClockProbe:
    """Reads the clocks on each call: which reason field the driver knows is found once and remembered; after
    the binary is missing or every field set fails, it stops spawning nvidia-smi (GB10 without a driver here)."""

    def __init__(self, nvidia_smi: Any = _LOOKUP) -> None:
        self.binary: str | None = shutil.which("nvidia-smi") if nvidia_smi is _LOOKUP else nvidia_smi
        self._fields = list(REASON_FIELDS)
        self._failures = 0

    def __call__(self) -> GpuClocks | None:
        if self.binary is None:
            return None
        for field in list(self._fields):
            reading = read_gpu_clocks(self.binary, field)
            if reading is not None:
                self._fields = [field]
                self._failures = 0
                return reading
        self._failures += 1
        if self._failures >= 3:  # absent GPU, a driver that knows none of the fields: stop asking
            self.binary = None
        return None

    @property
    def source(self) -> str:
        field = self._fields[0] if len(self._fields) == 1 else REASON_FIELDS[0]
        return f"nvidia-smi --query-gpu={','.join((*FIELDS, field))}"


class ClockWindow:
    """The readings of one window (a cell, a server start), reduced as they come: load samples only (idle
    moments skipped), their clock range, the hottest and most power-hungry moment, and each reason's count."""

    def __init__(self) -> None:
        self.samples = 0
        self.loaded = 0
        self.sm: list[float] = []
        self.max_sm: float | None = None
        self.power: list[float] = []
        self.temperature: list[float] = []
        self.reasons: dict[str, int] = {}
        self.first: GpuClocks | None = None
        self.last: GpuClocks | None = None

    def add(self, reading: GpuClocks) -> None:
        self.samples += 1
        if reading.idle:
            return
        self.loaded += 1
        self.first = self.first or reading
        self.last = reading
        if reading.sm_mhz is not None:
            self.sm.append(reading.sm_mhz)
        if reading.max_sm_mhz is not None:
            self.max_sm = max(self.max_sm or 0.0, reading.max_sm_mhz)
        if reading.power_w is not None:
            self.power.append(reading.power_w)
        if reading.temperature_c is not None:
            self.temperature.append(reading.temperature_c)
        for name in reading.reason_names:
            self.reasons[name] = self.reasons.get(name, 0) + 1

    # Any: JSON stored with the cell (figures and the source's name)
    def stats(self, source: str) -> dict[str, Any] | None:
        if not self.samples:
            return None
        drop = (1 - min(self.sm) / max(self.sm)) if self.sm and max(self.sm) > 0 else None
        throttled = [name for bit, (name, _) in REASONS.items() if bit & THROTTLING and name in self.reasons]
        return {
            "source": f"{source}, sampled with the memory at most 1 s apart during the window (idle readings, "
                      "with the GPU-idle reason, left out)",
            "samples": self.samples, "loaded_samples": self.loaded,
            "sm_clock_mhz": _range(self.sm), "max_sm_clock_mhz": self.max_sm,
            "power_w": _range(self.power), "temperature_c": _range(self.temperature),
            "reasons": dict(self.reasons), "throttled": throttled,
            "sm_clock_drop": None if drop is None else round(drop, 4),
            "fell_under_load": drop is not None and drop > CLOCK_FALL_FLAG,
            "start": _point(self.first), "end": _point(self.last),
        }


def _range(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"min": min(values), "max": max(values), "mean": round(sum(values) / len(values), 3)}


def _point(reading: GpuClocks | None) -> dict[str, float | None] | None:
    if reading is None:
        return None
    return {"sm_clock_mhz": reading.sm_mhz, "temperature_c": reading.temperature_c, "power_w": reading.power_w}


# Any: a cell's clock figures as stored (JSON)
def describe(facts: dict[str, Any]) -> str | None:
    """One line for a flagged window (a clock that fell under load, or throttle reasons set); None if neither."""
    parts = []
    sm = facts.get("sm_clock_mhz") or {}
    if facts.get("fell_under_load") and sm:
        parts.append(f"SM clock fell {100 * (facts.get('sm_clock_drop') or 0):.0f}% under load ({sm['max']:.0f} → "
                     f"{sm['min']:.0f} MHz)")
    loaded = facts.get("loaded_samples") or 0
    for name in facts.get("throttled") or []:
        parts.append(f"{LABELS.get(name, name)} in {facts['reasons'].get(name, 0)} of {loaded} samples")
    if not parts:
        return None
    heat = []
    if facts.get("temperature_c"):
        heat.append(f"up to {facts['temperature_c']['max']:.0f} °C")
    if facts.get("power_w"):
        heat.append(f"{facts['power_w']['max']:.1f} W")
    return "; ".join(parts) + (f" ({', '.join(heat)})" if heat else "")
