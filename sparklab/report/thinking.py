"""Thinking budgets in the report (pure): answers whose reasoning used the whole max_tokens, and answer rates by
budget (seed 002: at 4,096 tokens the thinking ate three tasks' whole budget; at NVIDIA's 16,000 the answers came).

Per measured answer, from what the client saw (reasoning_content chunks apart from content):
- thinking used the whole budget: finish_reason `length`, reasoning, and no visible answer at all;
- cut after thinking: finish_reason `length`, reasoning, and a visible answer cut short;
- truncated: finish_reason `length` without reasoning (ordinary truncation, the truncation check's);
- answered: it finished on its own with a visible answer (or tool calls).
With `sampling.max_tokens` as a sweep axis, the table shows at which budget answers appear.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sparklab.report.document import Para, Section, Table
from sparklab.report.model import Group, Report
from sparklab.report.verdict import Check

DASH = "-"


@dataclass(frozen=True)
class Budget:
    group: Group
    answers: int
    answered: int
    exhausted: int  # reasoning used the whole budget, nothing visible
    cut: int  # reasoning, then a visible answer cut at the budget
    truncated: int  # cut at the budget without reasoning
    thinking_tokens: float | None  # mean reasoning tokens per answer (where the engine counted them)
    thinking_chars: float  # mean reasoning characters per answer

    @property
    def answer_rate(self) -> float | None:
        return self.answered / self.answers if self.answers else None


def _content_chars(answer: dict[str, Any]) -> int:
    if "content_chars" in answer:
        return int(answer["content_chars"])
    return int(answer.get("text_len") or 0)  # no reasoning: the text is the answer


def budget(group: Group) -> Budget:
    answers = [a for a in group.answers if a.get("ok")]
    exhausted = cut = truncated = answered = 0
    tokens: list[float] = []
    chars = 0
    for a in answers:
        reasoning = int(a.get("reasoning_chars") or 0)
        visible = _content_chars(a) > 0 or bool(a.get("tool_calls"))
        chars += reasoning
        if a.get("reasoning_tokens") is not None:
            tokens.append(float(a["reasoning_tokens"]))
        if a.get("finish_reason") == "length":
            if reasoning and not visible:
                exhausted += 1
            elif reasoning:
                cut += 1
            else:
                truncated += 1
        elif visible:
            answered += 1
    n = len(answers)
    return Budget(group, n, answered, exhausted, cut, truncated, sum(tokens) / len(tokens) if tokens else None,
                  chars / n if n else 0.0)


def thinking_ended(group: Group) -> int:
    """Answers of the group that hit max_tokens while or after thinking (not ordinary truncation)."""
    b = budget(group)
    return b.exhausted + b.cut


def _thought(report: Report) -> bool:
    return any(a.get("reasoning_chars") for g in report.groups for a in g.answers)


def sections(report: Report) -> list[Section]:
    budgets_vary = len({g.sampling.get("max_tokens") for g in report.groups}) > 1
    if not (_thought(report) or budgets_vary):
        return []
    rows = []
    ordered = sorted(report.groups, key=lambda g: (g.workload_name, g.concurrency, g.server.seq,
                                                   g.sampling.get("temperature") or 0, g.sampling.get("max_tokens")))
    for g in ordered:
        b = budget(g)
        rate = b.answer_rate
        rows.append((g.workload_name, str(g.concurrency), g.server.label, str(g.sampling.get("max_tokens", DASH)),
                     str(b.answers), DASH if rate is None else f"{100 * rate:.0f}% ({b.answered}/{b.answers})",
                     str(b.exhausted), str(b.cut), str(b.truncated),
                     DASH if b.thinking_tokens is None else f"{b.thinking_tokens:,.0f}", f"{b.thinking_chars:,.0f}"))
    return [Section("Thinking budgets: answers by max_tokens", blocks=[
        Para("Per config and budget (max_tokens): answers that finished with a visible answer; answers whose "
             "reasoning used the whole budget and showed nothing; answers cut after some reasoning; ordinary "
             "truncation (no reasoning); and the reasoning each answer spent (tokens where the engine sent token "
             "ids, characters always)."),
        Table(("workload", "C", "config", "max_tokens", "answers", "answer rate", "thinking used the whole budget",
               "cut after thinking", "truncated, no thinking", "thinking tokens/answer", "thinking chars/answer"),
              tuple(rows), (False, True, False, True, True, True, True, True, True, True, True))])]


def check(report: Report) -> Check:
    findings = []
    for g in report.groups:
        b = budget(g)
        if b.exhausted or b.cut:
            findings.append(f"{g.server.label} C={g.concurrency} {g.workload}: {b.exhausted} of {b.answers} answers "
                            f"spent the whole max_tokens ({g.sampling.get('max_tokens')}) thinking and showed nothing"
                            + (f", {b.cut} more were cut after thinking" if b.cut else "")
                            + " - the budget, not the model, decided them; raise max_tokens (or sweep it)")
    return Check("thinking budget", "no answer's reasoning used the whole max_tokens (finish_reason length with an "
                 "empty or cut visible answer)", tuple(findings),
                 None if _thought(report) else "no answer carried reasoning (the model did not think, or thinking "
                                               "was off)")
