"""Graded answers in the report (pure): pass rates with intervals, per-task agreement with `none`, McNemar's test.

Every graded answer (sparklab.bench.grading, stored per request) counts once. A config's pass rate is passed /
graded answers with a Wilson 95% interval; at temperature 0 a task's repeats are the same greedy answer, so the
interval there is narrower than the tasks alone would justify (it counts answers, not tasks).

A drafting config is compared with the same engine's `none` on the same workload, concurrency and sampling,
answer by answer: the k-th graded answer to a task under one config pairs with the k-th under the other (by
repeat, then request order). "Same verdict on 10 of 10" counts the pairs where both passed or both failed;
McNemar's exact test asks whether the pairs where only one passed lean one way more than chance allows (two-sided
binomial test of the discordant pairs at 1/2). A p-value under 0.05 is a warning on the verdict: drafting changed
what the model gets right.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from sparklab.bench.stats import McNemar, Proportion, mcnemar_exact, proportion
from sparklab.report.document import Block, Para, Section, Table
from sparklab.report.model import Group, Report
from sparklab.report.verdict import Check, GroupKey

SIGNIFICANT = 0.05
DASH = "-"


@dataclass(frozen=True)
class PassRate:
    group: Group
    rate: Proportion
    tests_passed: int
    tests: int
    ungraded: int
    why_ungraded: tuple[str, ...]


@dataclass(frozen=True)
class TaskAgreement:
    task: str
    pairs: int
    same: int
    base_passed: int
    passed: int


@dataclass(frozen=True)
class Agreement:
    group: Group
    baseline: Group
    tasks: tuple[TaskAgreement, ...]
    test: McNemar


def _graded(group: Group) -> list[dict[str, Any]]:
    return [g for g in group.grades if g.get("status") == "graded"]


def pass_rates(report: Report) -> list[PassRate]:
    out = []
    for group in report.groups:
        if not group.grades:
            continue
        graded = _graded(group)
        tests = [v for g in graded for v in (g.get("tests") or {}).values()]
        notes = tuple(dict.fromkeys(str(g.get("note") or "ungraded") for g in group.grades
                                    if g.get("status") != "graded"))
        out.append(PassRate(group, proportion(sum(1 for g in graded if g.get("passed")), len(graded)),
                            sum(1 for v in tests if v == "pass"), len(tests), len(group.grades) - len(graded), notes))
    return out


def _baseline(group: Group, groups: list[Group]) -> Group | None:
    if group.is_baseline:
        return None
    same = [g for g in groups if g.is_baseline and g.server.engine == group.server.engine
            and g.workload == group.workload and g.concurrency == group.concurrency and g.grades]
    return next((g for g in same if g.server.overrides == group.server.overrides), same[0] if same else None)


def _by_task(group: Group) -> dict[str, list[bool]]:
    """Each task's verdicts in pairing order: repeat, then request order."""
    out: dict[str, list[bool]] = defaultdict(list)
    for g in sorted(_graded(group), key=lambda g: (g.get("repeat", 0), g.get("index", 0))):
        out[str(g["prompt_id"])].append(bool(g.get("passed")))
    return out


def agreements(report: Report) -> list[Agreement]:
    out = []
    for group in report.groups:
        base = _baseline(group, report.groups) if group.grades else None
        if base is None:
            continue
        mine, theirs = _by_task(group), _by_task(base)
        tasks, pairs = [], []
        for task in dict.fromkeys([*theirs, *mine]):
            matched = list(zip(theirs.get(task, []), mine.get(task, []), strict=False))
            pairs += matched
            tasks.append(TaskAgreement(task, len(matched), sum(1 for a, b in matched if a == b),
                                       sum(1 for a, _ in matched if a), sum(1 for _, b in matched if b)))
        out.append(Agreement(group, base, tuple(tasks), mcnemar_exact(pairs)))
    return out


def fmt_rate(rate: Proportion) -> str:
    if not rate.n or rate.rate is None:
        return DASH
    text = f"{100 * rate.rate:.0f}% ({rate.successes}/{rate.n})"
    if rate.low is not None and rate.high is not None:
        text += f" [{100 * rate.low:.0f}, {100 * rate.high:.0f}]"
    return text


def _where(g: Group) -> str:
    return f"{g.server.label} C={g.concurrency} {g.workload}"


def sections(report: Report) -> list[Section]:
    rates = pass_rates(report)
    if not rates:
        return []
    agreed = {a.group.server.id + a.group.workload + str(a.group.concurrency): a for a in agreements(report)}
    rows = []
    for r in rates:
        g = r.group
        a = agreed.get(g.server.id + g.workload + str(g.concurrency))
        same = f"{a.test.agree} of {a.test.pairs}" if a else ("(baseline)" if g.is_baseline else DASH)
        p = f"{a.test.p_value:.3g}" + (" (!)" if a.test.p_value < SIGNIFICANT else "") if a else DASH
        rows.append((g.workload, str(g.concurrency), g.server.label, fmt_rate(r.rate),
                     f"{r.tests_passed}/{r.tests}" if r.tests else DASH, str(r.ungraded) if r.ungraded else "0",
                     same, p))
    blocks: list[Block] = [
        Para("Every measured answer of a task suite, graded after its window by mechanical checks (no model judges "
             "another; code by running its tests in a sandbox container). Pass rate: answers that passed every "
             "check, with a Wilson 95% interval over the answers. Same verdict: pairs of answers to the same task "
             "(k-th with k-th) where this config and `none` both passed or both failed. McNemar p: the exact test "
             f"of the pairs where only one passed; under {SIGNIFICANT:g} (!) drafting changed the verdicts."),
        Table(("workload", "C", "config", "pass rate [95%]", "tests passed", "ungraded", "same verdict as none",
               "McNemar p"), tuple(rows), (False, True, False, True, True, True, True, True))]
    ungraded = [r for r in rates if r.ungraded]
    if ungraded:
        blocks.append(Para("Not graded: " + "; ".join(f"{r.group.server.label} C={r.group.concurrency} "
                                                       f"{r.group.workload}: {r.ungraded} ({', '.join(r.why_ungraded)})"
                                                       for r in ungraded) + "."))
    out = [Section("Graded answers: pass rate and agreement with none", blocks=blocks)]
    out += _per_task(report, list(agreed.values()))
    return out


def _per_task(report: Report, agreed: list[Agreement]) -> list[Section]:
    """Per workload and concurrency: each task's verdicts under `none` and each drafting config."""
    sections = []
    keys = list(dict.fromkeys((a.baseline.workload, a.baseline.concurrency) for a in agreed))
    for workload, concurrency in keys:
        here = [a for a in agreed if (a.baseline.workload, a.baseline.concurrency) == (workload, concurrency)]
        base = here[0].baseline
        tasks = list(dict.fromkeys(t.task for a in here for t in a.tasks))
        header = ["task", f"{base.server.label} passed"]
        for a in here:
            header += [f"{a.group.server.label} passed", "same verdict"]
        rows = []
        for task in tasks:
            found = [next((t for t in a.tasks if t.task == task), None) for a in here]
            first = next((t for t in found if t is not None), None)
            row = [task, f"{first.base_passed}/{first.pairs}" if first else DASH]
            for t in found:
                row += [f"{t.passed}/{t.pairs}" if t else DASH, f"{t.same} of {t.pairs}" if t else DASH]
            rows.append(tuple(row))
        sections.append(Section(f"Per task: workload {workload}, C={concurrency}", level=3, blocks=[
            Table(tuple(header), tuple(rows), (False, *([True] * (len(header) - 1))))]))
    return sections


def check(report: Report) -> Check:
    findings = []
    flagged: set[GroupKey] = set()
    for a in agreements(report):
        if a.test.p_value < SIGNIFICANT:
            flagged.add(a.group.key)
            mine = proportion(a.test.both + a.test.only_second, a.test.pairs)
            theirs = proportion(a.test.both + a.test.only_first, a.test.pairs)
            findings.append(f"{_where(a.group)}: passed {fmt_rate(mine)} against `none`'s {fmt_rate(theirs)} on the "
                            f"same tasks; McNemar exact p = {a.test.p_value:.3g} ({a.test.only_first} pairs only none "
                            f"passed, {a.test.only_second} only this config) - drafting changed what the model gets "
                            "right")
    for r in pass_rates(report):
        if r.ungraded:
            findings.append(f"{_where(r.group)}: {r.ungraded} answer(s) not graded ({', '.join(r.why_ungraded)}) - "
                            "its pass rate leaves them out")
    graded = [g for g in report.groups if g.grades]
    return Check("graded answers vs none", f"no drafting config's verdicts differ from `none`'s on the same tasks "
                 f"(McNemar exact p >= {SIGNIFICANT:g}) and every answer was graded", tuple(findings),
                 None if graded else "no task suite in this run: add tasks-en, tasks-ja, code or agent to workloads",
                 frozenset(flagged))
