"""A sweep grades its task suites after each cell's window (never inside it), and stores a grade per answer.

The cell's answers are graded from what the store keeps (sparklab.outputs.kept, whole for graded prompts), so the
bench's clock has stopped before the first check runs; code answers run in the sandbox container
(sparklab.runtimes.sandbox) on this machine's Docker engine. A sweep without a code suite needs no sandbox.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sparklab.bench import grading
from sparklab.bench.workloads import load_workload
from sparklab.recipes.plan import Plan
from sparklab.records import BenchResult

log = logging.getLogger(__name__)


def needs_sandbox(plan: Plan) -> bool:
    return any(p.task and p.task.get("kind") == "code" for w in plan.sweep.workloads for p in load_workload(w).prompts)


def make_sandbox(plan: Plan, docker: Callable[[], Any]) -> Any:
    """The code suite's sandbox on this machine's Docker engine (its image checked now, before any server), or
    None when the sweep has no code suite. `docker` gives that engine (None: the default one) and is called only
    for a code suite: a host-process engine's sweep runs on a machine without a Docker daemon."""
    if not needs_sandbox(plan):
        return None
    from sparklab.runtimes.containers import Docker
    from sparklab.runtimes.sandbox import DockerSandbox, Limits

    g = plan.sweep.grading
    engine = docker()
    sandbox = DockerSandbox(engine if engine is not None else Docker(),
                            Limits(image=g.sandbox_image, timeout_s=g.timeout_s, per_test_s=g.per_test_s,
                                   memory_mib=g.memory_mib, cpus=g.cpus))
    sandbox.check(f"{plan.source}: grading.sandbox_image")
    return sandbox


def grade_cell(workload_name: str, result: BenchResult, sandbox: Any) -> list[dict[str, Any]] | None:
    """The grades of one finished cell's answers (None for a workload that is not a task suite)."""
    workload = load_workload(workload_name)
    if not workload.graded:
        return None
    return [g.as_dict() for g in grading.grade_answers(workload, result.get("outputs") or [], sandbox)]


def summary(grades: list[dict[str, Any]]) -> str:
    graded = [g for g in grades if g["status"] == "graded"]
    passed = sum(1 for g in graded if g["passed"])
    ungraded = len(grades) - len(graded)
    return f"{passed}/{len(graded)} passed" + (f", {ungraded} ungraded" if ungraded else "")


def grade_safely(name: str, workload_name: str, result: BenchResult, sandbox: Any,
                 say: Any) -> list[dict[str, Any]] | None:
    """A task suite's grades; a fault in grading loses the grades (said, and logged with its traceback in the
    run's log), never the cell's numbers."""
    from sparklab.errors import DiskFullError, SparklabError
    from sparklab.sweep import rundir

    try:
        return grade_cell(workload_name, result, sandbox)
    except (KeyboardInterrupt, DiskFullError):
        raise
    except Exception as exc:
        text = exc.message if isinstance(exc, SparklabError) else f"{type(exc).__name__}: {exc}"
        reason = (text.strip().splitlines() or [""])[0][:300]
        rundir.faults.error("grading %s: %s", name, reason, exc_info=exc)
        say(f"cell {name}: not graded ({reason})")
        return None
