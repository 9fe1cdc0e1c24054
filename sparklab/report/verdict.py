"""One check on a report's verdict (pure): what it looked at, and its findings (none: passed)."""

from __future__ import annotations

from dataclasses import dataclass

GroupKey = tuple[str, str, int]  # report.model.Group.key: server config id, workload (and variant), concurrency


@dataclass(frozen=True)
class Check:
    name: str
    looked_at: str  # what a pass means, one sentence
    findings: tuple[str, ...]
    not_checked: str | None = None  # why the run could not be checked (then no pass is claimed)
    flagged: frozenset[GroupKey] = frozenset()  # the groups whose numbers or answers a finding is about


def flags(checks: list[Check]) -> dict[GroupKey, list[str]]:
    """Per group, the names of the checks that flagged it, in the checks' order."""
    out: dict[GroupKey, list[str]] = {}
    for check in checks:
        for key in check.flagged:
            out.setdefault(key, []).append(check.name)
    return out
