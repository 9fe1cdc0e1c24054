"""Where the memory floor goes on unified memory: the headroom a recipe's memory fraction leaves, and the floor
below it (pure: the host comes in as a HostMemory, measured from /proc/meminfo or modelled from
recipes/hardware.yaml, so a host-facts source can be swapped in).

The floor protects the host from a wedge (GB10 hosts can hang until a power cycle after NV_ERR_NO_MEMORY,
vllm-project/vllm#46307); it must not stop an engine that does exactly what its recipe asked. So:

    expected MemAvailable under load = MemTotal - baseline - fraction x base - drafter - outside
      baseline  MemTotal - MemAvailable before the server: OS, Docker, desktop, other work (measured at the
                sweep's start; before `up`, now)
      base      what the engine's fraction is of: MemTotal, or the memory free at its start (each adapter's
                `memory_fraction_of`, with the engine source it was read from)
      drafter   0 for the engines here: their fraction holds every model they load, the drafter included
                (cited beside `memory_fraction_flag` in each adapter)
      outside   OUTSIDE_BUDGET_GIB, the engine's memory outside its fraction: its API server process, CUDA
                graphs it does not count in the fraction (vllm.py says when), request buffers. Assumed, not
                measured on a GB10 here.

The default floor is the users' 8 GiB where that room allows, else the room itself; below MIN_FLOOR_GIB the
fraction is refused before the server starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sparklab.engines import engine
from sparklab.host.memory import HostMemory, engine_need
from sparklab.recipes.schema import Recipe
from sparklab.spec import LaunchSpec

USERS_FLOOR_GIB = 8.0  # what GB10 users set (huggingface.co/nvidia/GLM-5.3-Flash-FP4-Local/discussions/7)
# The least MemAvailable the floor keeps for the host itself (sshd, dockerd, the kernel's reclaim): 4x the
# 512 MiB at which the community's earlyoom kills (eugr/spark-vllm-docker launch-cluster.sh: earlyoom -M 524288).
MIN_FLOOR_GIB = 2.0
OUTSIDE_BUDGET_GIB = 3.0  # the margin: the engine's memory outside its fraction (see the module docstring)


@dataclass(frozen=True)
class Headroom:
    """What one server's memory fraction leaves of a unified-memory host, term by term (GiB)."""

    total_gib: float
    baseline_gib: float
    engine_gib: float
    fraction: float
    flag: str
    base: str  # what the fraction is of: "MemTotal" or "the memory free at its start"
    drafter_gib: float = 0.0
    outside_gib: float = OUTSIDE_BUDGET_GIB

    @property
    def expected_available_gib(self) -> float:
        """MemAvailable once the engine holds its fraction (at ready)."""
        return self.total_gib - self.baseline_gib - self.engine_gib - self.drafter_gib

    @property
    def room_gib(self) -> float:
        """MemAvailable under load, with the engine's memory outside its fraction at the margin: the floor goes
        at or below this."""
        return self.expected_available_gib - self.outside_gib

    @property
    def default_floor_gib(self) -> float:
        """The users' 8 GiB where the room allows, else the room rounded down to a quarter GiB; never under
        MIN_FLOOR_GIB (a fraction leaving less is refused by preflight, and trips this if it starts anyway)."""
        return max(MIN_FLOOR_GIB, min(USERS_FLOOR_GIB, math.floor(4 * self.room_gib) / 4))

    def max_fraction(self, floor_gib: float) -> float:
        """The largest fraction that leaves `floor_gib` under load on this host (rounded down to 0.01)."""
        of = self.total_gib if self.base == "MemTotal" else self.total_gib - self.baseline_gib
        free = self.total_gib - self.baseline_gib - self.drafter_gib - self.outside_gib - floor_gib
        return max(0.0, int(100 * free / of) / 100) if of > 0 else 0.0

    def explain(self) -> str:
        return (f"{self.flag} {self.fraction:g} of {self.base} takes {self.engine_gib:.1f} GiB of {self.total_gib:.1f} "
                f"GiB unified memory; with the host's baseline of {self.baseline_gib:.1f} GiB (MemTotal - "
                f"MemAvailable before the server) {self.expected_available_gib:.1f} GiB stay available at ready, "
                f"and {self.room_gib:.1f} GiB under load once the engine's memory outside its fraction reaches "
                f"{self.outside_gib:.1f} GiB")


def headroom(spec: LaunchSpec, recipe: Recipe, host: HostMemory,
             available_at_start: float | None = None) -> Headroom | None:
    """The headroom of one launch on a unified-memory host; None when the recipe is not unified or its engine
    takes no memory fraction (llama.cpp, Edge-LLM). available_at_start: MemAvailable measured at the sweep's
    start (the baseline), else the host's MemAvailable now."""
    if not recipe.unified_memory:
        return None
    need = engine_need(spec, host.total_gib)
    if need is None:
        return None
    available = host.available_gib if available_at_start is None else available_at_start
    baseline = max(0.0, host.total_gib - available)
    if engine(spec.kind).memory_fraction_of == "free":
        return Headroom(host.total_gib, baseline, need.fraction * available, need.fraction, need.flag,
                        "the memory free at its start")
    return Headroom(host.total_gib, baseline, need.gib, need.fraction, need.flag, "MemTotal")


def max_fraction_text(h: Headroom, floor_gib: float) -> str:
    return f"{h.max_fraction(floor_gib):.2f}"


def refusal(h: Headroom, floor_gib: float | None = None) -> tuple[str, str] | None:
    """(message, fix) when the fraction leaves less than the floor: the configured one, else MIN_FLOOR_GIB; a
    floor configured to 0 (no watchdog, the user's explicit choice) refuses nothing."""
    if floor_gib == 0:
        return None
    floor = floor_gib if floor_gib is not None else MIN_FLOOR_GIB
    if h.room_gib >= floor:
        return None
    which = "the memory floor" if floor_gib is not None else "the least memory floor sparklab keeps"
    message = (f"{h.explain()}: less than {which} of {floor:.1f} GiB, so the watchdog would stop this server "
               "(or the host could wedge without it)")
    fix = (f"Lower {h.flag} to {max_fraction_text(h, floor)} or less on this host (--set, or the recipe's var), or "
           "free memory first (MemTotal - MemAvailable is the baseline: stop other servers and desktop work, "
           "`sparklab ps`).")
    return message, fix
