"""What an adapter knows of its engine, fact by fact, and which engine versions each fact was read from.

Every engine fact sparklab relies on (a flag, a readiness path, a fatal or startup log line, an acceptance line or
counter, a cache variable, the command that starts the server) was read in some version's source or binary. A
`Fact` names it, the versions it was read in and where (file:line per version). An image whose engine version lies
outside a fact's versions is one whose behaviour there nobody has read: `Knowledge.unverified` lists those facts,
the adapter turns them into one warning before the start, and the report marks the numbers that rest on them.

A fact read in two versions is taken to hold between them (engines change a line once, not back and forth); a fact
whose shape differs between versions is one fact whose parser accepts both shapes, citing each.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

# The areas of engine knowledge, in the order a warning names them.
AREAS = ("command", "flags", "readiness path", "endpoints", "startup lines", "fatal lines", "acceptance lines",
         "acceptance counters", "cache variables")

VersionKey = tuple[int, ...]
VersionKeyFn = Callable[[str | None], "VersionKey | None"]
_DOTTED = re.compile(r"v?(\d+(?:\.\d+)*)")


def dotted_key(version: str | None) -> VersionKey | None:
    """`0.27.1+cpu` → (0, 27, 1); `v0.5.23.post1` → (0, 5, 23); None when no number leads the text. A local or
    post-release suffix does not change which source the version was built from, so it is not compared."""
    if not version:
        return None
    m = _DOTTED.match(version.strip())
    if m is None:
        return None
    parts = tuple(int(p) for p in m.group(1).split("."))
    return parts[:3] if len(parts) >= 3 else parts + (0,) * (3 - len(parts))


@dataclass(frozen=True)
class Fact:
    """One piece of engine knowledge: what it is, the versions it was read in, and where (file:line per version)."""

    area: str
    what: str
    read_in: tuple[str, ...]
    source: str

    def __post_init__(self) -> None:
        if self.area not in AREAS:
            raise ValueError(f"unknown knowledge area {self.area!r}; one of {', '.join(AREAS)}")
        if not self.read_in:
            raise ValueError(f"{self.what}: a fact must name the version(s) it was read in")


@dataclass(frozen=True)
class Knowledge:
    """An adapter's facts. `key` turns a version string into something comparable (dotted numbers by default;
    llama.cpp counts builds)."""

    facts: tuple[Fact, ...]

    def read_from(self) -> tuple[str, ...]:
        """Every version any fact was read in, oldest first (by their numbers; unparsable ones last)."""
        versions = {v for fact in self.facts for v in fact.read_in}
        return tuple(sorted(versions, key=lambda v: (dotted_key(v) is None, dotted_key(v) or (), v)))

    def holds(self, fact: Fact, version: str | None, key: VersionKeyFn = dotted_key) -> bool | None:
        """Whether the fact was read in a version range holding `version` (None: the version is unknown)."""
        here = key(version)
        if here is None:
            return None
        ends = [k for v in fact.read_in if (k := key(v)) is not None]
        return bool(ends) and min(ends) <= here <= max(ends)

    def unverified(self, version: str | None, key: VersionKeyFn = dotted_key) -> list[Fact]:
        """The facts nobody read for this version (every fact when the version is unknown)."""
        return [f for f in self.facts if not self.holds(f, version, key)]

    def in_area(self, area: str) -> list[Fact]:
        return [f for f in self.facts if f.area == area]


def summary(facts: Iterable[Fact]) -> str:
    """`fatal lines (EngineCore failed to start, …); startup lines (…)`: the facts grouped by area, in AREAS order."""
    by_area: dict[str, list[str]] = {}
    for fact in facts:
        by_area.setdefault(fact.area, []).append(fact.what)
    return "; ".join(f"{area} ({', '.join(by_area[area])})" for area in AREAS if area in by_area)


def version_warning(label: str, knowledge: Knowledge, version: str | None, where: str,
                    key: VersionKeyFn = dotted_key, why_unknown: str = "") -> str | None:
    """One warning for an engine version outside what the adapter's knowledge was read from (None: inside)."""
    read = ", ".join(knowledge.read_from())
    if version is None:
        because = f" ({why_unknown})" if why_unknown else ""
        return (f"{where}: the {label} version could not be read{because}, so none of sparklab's {label} knowledge "
                f"(read from {read}) is known to hold for it: {summary(knowledge.facts)}")
    missing = knowledge.unverified(version, key)
    if not missing:
        return None
    return (f"{where}: {label} {version} is outside the versions sparklab's {label} knowledge was read from "
            f"({read}); these checks may not hold: {summary(missing)}")
