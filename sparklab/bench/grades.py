"""One answer's grade (pure): the record graders make and the store keeps, one per request."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

GRADER = "sparklab.grading/1"


@dataclass(frozen=True)
class Grade:
    """One answer's verdict. status: "graded", or "ungraded" (then passed is None and note says why)."""

    index: int  # its position among the cell's stored answers (outputs.idx)
    prompt_id: str
    kind: str
    status: str
    passed: bool | None
    checks: tuple[tuple[str, bool, str], ...] = ()
    tests: dict[str, str] = field(default_factory=dict)  # code: test id -> pass | fail | error | timeout
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"index": self.index, "prompt_id": self.prompt_id, "kind": self.kind, "status": self.status,
                "passed": self.passed, "checks": [list(c) for c in self.checks], "tests": dict(self.tests),
                "note": self.note, "grader": GRADER}
