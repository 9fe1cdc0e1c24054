"""One check on a report's verdict (pure): what it looked at, and its findings (none: passed)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    name: str
    looked_at: str  # what a pass means, one sentence
    findings: tuple[str, ...]
    not_checked: str | None = None  # why the run could not be checked (then no pass is claimed)
