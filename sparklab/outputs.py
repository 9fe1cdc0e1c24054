"""What each request answered, kept bounded, and whether two answers are the same (pure, no I/O).

Speculative decoding must not change the output: at temperature 0 a drafting server's answer to a prompt has
to equal the baseline's, token for token. The client collects every answer's token ids (vLLM's
`return_token_ids`, free with the stream) and its text; a run keeps, per request, a digest of the whole
answer and its first KEEP_TOKENS token ids / KEEP_CHARS characters, so the store stays small while equality is
exact (digests) and the first differing position is known whenever it falls inside the kept part. At most
about 40 KB per request (4,096 ids and 1,024 characters, or 16,384 characters without ids).

Token ids are compared when both answers carry them, the text otherwise (positions are then characters).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

KEEP_TOKENS = 4096
KEEP_CHARS = 16384  # when the answer has no token ids: the text is what gets compared
KEEP_CHARS_WITH_IDS = 1024  # with token ids the text is only for a human to look at
KEEP_GRADED_CHARS = 65536  # an answer to a graded task is kept whole up to this: it is graded from the store
KEEP_GRADED_CALLS = 64  # and its tool calls (name and arguments), each call's arguments up to KEEP_CALL_CHARS
KEEP_CALL_CHARS = 8192
# Any: answers and sampling settings are JSON records as results keep them (records.RequestRecord.answer)


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, separators=(",", ":")).encode()).hexdigest()[:16]


def kept(index: int, prompt_id: str, warmup: bool, ok: bool, finish_reason: str | None, text: str,
         token_ids: list[int] | None, whole: bool = False) -> dict[str, Any]:
    """One request's answer as results keep it: digests of the whole, the first KEEP_* of each (of a graded task's
    answer, whole: up to KEEP_GRADED_CHARS)."""
    limit = KEEP_GRADED_CHARS if whole else KEEP_CHARS if token_ids is None else KEEP_CHARS_WITH_IDS
    out: dict[str, Any] = {"index": index, "prompt_id": prompt_id, "warmup": warmup, "ok": ok,
                           "finish_reason": finish_reason, "text_len": len(text), "text_digest": _digest(text),
                           "text": text[:limit], "ids_len": None, "ids_digest": None, "token_ids": None}
    if token_ids is not None:
        out.update(ids_len=len(token_ids), ids_digest=_digest(token_ids), token_ids=token_ids[:KEEP_TOKENS])
    return out


@dataclass(frozen=True)
class Difference:
    """Two answers compared: identical, or where they first differ (None: beyond the kept part)."""

    identical: bool
    unit: str  # "token" or "character"
    first_diff: int | None = None
    at_least: int | None = None  # when first_diff is unknown: the kept parts agree up to here


def compare(a: dict[str, Any], b: dict[str, Any]) -> Difference:
    if a.get("ids_digest") and b.get("ids_digest"):
        return _compare(a["token_ids"] or [], b["token_ids"] or [], a["ids_len"], b["ids_len"],
                        a["ids_digest"] == b["ids_digest"], "token")
    return _compare(a.get("text") or "", b.get("text") or "", a.get("text_len") or 0, b.get("text_len") or 0,
                    a.get("text_digest") == b.get("text_digest"), "character")


def _compare(x: Any, y: Any, x_len: int, y_len: int, same: bool, unit: str) -> Difference:
    if same and x_len == y_len:
        return Difference(True, unit)
    for i, (p, q) in enumerate(zip(x, y, strict=False)):
        if p != q:
            return Difference(False, unit, i)
    shorter = min(len(x), len(y))
    if shorter == min(x_len, y_len):  # one whole answer is a prefix of the other
        return Difference(False, unit, shorter)
    return Difference(False, unit, None, shorter)


@dataclass(frozen=True)
class Equality:
    """A drafting cell set's answers against the baseline's, prompt by prompt.

    status: "checked"; "sampling" (temperature is not 0: equality cannot be checked); "no-baseline";
    "no-outputs" (a run stored before outputs were kept).
    """

    status: str
    compared: int = 0
    identical: int = 0
    first_diffs: tuple[Difference, ...] = ()
    baseline_variants: int = 0  # prompts whose baseline answers differ among themselves (baseline nondeterminism)
    temperature: float | None = None

    @property
    def share(self) -> float | None:
        return self.identical / self.compared if self.compared else None

    @property
    def differs(self) -> bool:
        return self.status == "checked" and self.compared > 0 and self.identical < self.compared

    def describe(self) -> str:
        if self.status == "sampling":
            t = "unset (server default)" if self.temperature is None else f"{self.temperature:g}"
            return f"not checkable (temperature {t})"
        if self.status != "checked" or not self.compared:
            return "-"
        text = f"{100 * self.identical / self.compared:.0f}% ({self.identical}/{self.compared})"
        if self.first_diffs:
            text += f", first diff at {_positions(self.first_diffs)}"
        return text


def _positions(diffs: Iterable[Difference]) -> str:
    diffs = list(diffs)
    unit = diffs[0].unit
    known = sorted(d.first_diff for d in diffs if d.first_diff is not None)
    parts = []
    if known:
        parts.append(f"{unit} {known[0]}" if len(known) == 1 or known[0] == known[-1]
                     else f"{unit} {known[0]}-{known[-1]}")
    unknown = [d.at_least for d in diffs if d.first_diff is None]
    if unknown:
        parts.append(f"beyond {unit} {min(u or 0 for u in unknown)}")
    return ", ".join(parts)


def checkable(sampling: dict[str, Any] | None) -> tuple[bool, float | None]:
    """Greedy decoding only: at temperature 0 every answer is determined by the model, drafting or not."""
    temperature = (sampling or {}).get("temperature")
    return temperature == 0, temperature


def equality(answers: Iterable[dict[str, Any]], baseline: Iterable[dict[str, Any]],
             sampling: dict[str, Any] | None) -> Equality:
    """A group's measured, successful answers against the baseline's answers to the same prompts."""
    ok, temperature = checkable(sampling)
    if not ok:
        return Equality("sampling", temperature=temperature)
    reference: dict[str, list[dict[str, Any]]] = {}
    for answer in baseline:
        if answer.get("ok") and not answer.get("warmup"):
            reference.setdefault(answer["prompt_id"], []).append(answer)
    answers = [a for a in answers if a.get("ok") and not a.get("warmup")]
    if not answers:
        return Equality("no-outputs", temperature=temperature)
    if not reference:
        return Equality("no-baseline", temperature=temperature)
    variants = sum(1 for refs in reference.values()
                   if len({(r.get("ids_digest"), r.get("text_digest")) for r in refs}) > 1)
    compared = identical = 0
    diffs: list[Difference] = []
    for answer in answers:
        refs = reference.get(answer["prompt_id"])
        if not refs:
            continue
        compared += 1
        results = [compare(answer, ref) for ref in refs]
        if any(r.identical for r in results):  # equal to one of the baseline's own answers
            identical += 1
        else:
            diffs.append(results[0])
    return Equality("checked", compared, identical, tuple(diffs), variants, temperature)


# -- tool calls (the runaway probe) ------------------------------------------------------------------------------

RUNAWAY_IDENTICAL = 3  # the same call (name and arguments) this often in one answer is a loop
RUNAWAY_CALLS = 10  # this many calls in one answer to a one-question probe is a runaway either way


def tool_call_summary(calls: list[dict[str, Any]], dropped: int = 0, whole: bool = False) -> dict[str, Any]:
    """One answer's tool calls: how many, how often the most repeated identical call, the first few (whole: the
    first KEEP_GRADED_CALLS, for grading)."""
    counts: dict[tuple[str, str], int] = {}
    for call in calls:
        key = (str(call.get("name", "")), str(call.get("arguments", "")))
        counts[key] = counts.get(key, 0) + 1
    out = {"count": len(calls) + dropped, "distinct": len(counts), "max_identical": max(counts.values(), default=0),
           "first": [{"name": c.get("name", "")[:80], "arguments": str(c.get("arguments", ""))[:200]}
                     for c in calls[:3]]}
    if whole:
        out["calls"] = [{"name": str(c.get("name", ""))[:200],
                         "arguments": str(c.get("arguments", ""))[:KEEP_CALL_CHARS]} for c in calls[:KEEP_GRADED_CALLS]]
    return out



def runaway(answer: dict[str, Any]) -> bool:
    calls = answer.get("tool_calls") or {}
    count = int(calls.get("count") or 0)
    return (int(calls.get("max_identical") or 0) >= RUNAWAY_IDENTICAL or count >= RUNAWAY_CALLS
            or (count >= 2 and answer.get("finish_reason") == "length"))


@dataclass(frozen=True)
class ToolCalls:
    """A group's answers to tool-call prompts, per prompt id (the probe sends tool_choice required / auto)."""

    prompt_id: str
    answers: int
    with_calls: int
    mean_calls: float
    max_calls: int
    max_identical: int
    finish_reasons: tuple[tuple[str, int], ...]
    runaways: int


def tool_calls(answers: Iterable[dict[str, Any]]) -> list[ToolCalls]:
    """Measured answers of prompts that offered tools (any answer with tool calls, or a tools-* prompt id)."""
    by_prompt: dict[str, list[dict[str, Any]]] = {}
    for a in answers:
        if a.get("warmup") or not a.get("ok"):
            continue
        if a.get("tool_calls") or str(a.get("prompt_id", "")).startswith("tools-"):
            by_prompt.setdefault(a["prompt_id"], []).append(a)
    out = []
    for prompt_id, group in sorted(by_prompt.items()):
        counts = [int((a.get("tool_calls") or {}).get("count") or 0) for a in group]
        reasons: dict[str, int] = {}
        for a in group:
            reasons[str(a.get("finish_reason"))] = reasons.get(str(a.get("finish_reason")), 0) + 1
        out.append(ToolCalls(prompt_id, len(group), sum(1 for c in counts if c), sum(counts) / len(counts),
                             max(counts), max(int((a.get("tool_calls") or {}).get("max_identical") or 0)
                                              for a in group),
                             tuple(sorted(reasons.items())), sum(1 for a in group if runaway(a))))
    return out
