"""Grading a task suite's answers, after the window (pure, but for code tasks' sandbox, which is passed in).

A grade is mechanical: no model judges another. Each answer gets a list of checks (name, passed, detail) and,
for code, pass/fail per test; it passes when every check passes. Answers are graded from what the store keeps
(sparklab.outputs.kept with whole=True: the visible text apart from the reasoning, every tool call), so a run can
be graded again, offline, by a later sparklab.

- instruction: length bounds (characters, words, lines), required and forbidden words (whole words, or
  substrings for languages written without spaces), named entities kept exactly, JSON that parses (alone, or
  as the answer's only fenced block) and fits a JSON schema (Draft 2020-12, the `jsonschema` package).
- agent: the tool calls the server parsed. Every call must name an offered tool and carry arguments that parse
  as JSON and fit its parameters; then the probe's own expectation: two calls covering both cities (parallel
  calls), the right tool first (one among 40), calls that parse with no tool-call markup left in the text
  (unparseable calls), no runaway (seed 002's `tool_choice: required` loop), or no call at all.
- code: sparklab.bench.codegrade (the tests run in a sandbox container).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable
from typing import Any

from sparklab.bench.codegrade import Sandbox, grade_code
from sparklab.bench.grades import Grade
from sparklab.outputs import runaway

# Any: answers, tool calls and graded JSON are JSON as the engine sent them and the store keeps them

# Tool-call syntax that a server's parser should have turned into calls: left in the text, the call was lost.
_MARKUP = re.compile(r"<tool_call>|</tool_call>|<function=|\[TOOL_CALLS\]|<\|python_tag\|>|<\|tool_call")


def grade_answers(workload: Any, answers: Iterable[dict[str, Any]], sandbox: Sandbox | None) -> list[Grade]:
    """Every measured answer of a cell to a graded prompt (warmups are not graded). A code answer the cell gave
    before, word for word, shares that answer's test run (at temperature 0 every repeat is the same answer, and each
    run is a sandbox container's start); a run cut at the time cap, or one that could not run, is not shared."""
    out = []
    ran: dict[tuple[str, str], Grade] = {}
    for index, answer in enumerate(answers):
        if answer.get("warmup"):
            continue
        prompt = workload.by_id(str(answer.get("prompt_id")))
        if prompt is None or not prompt.task:
            continue
        key = (str(answer.get("prompt_id")), str(answer.get("content")))
        code = prompt.task.get("kind") == "code"  # the task's kind: instruction, agent or code
        first = ran.get(key) if code and answer.get("ok") else None
        if first is not None:
            shared = f"the same answer as #{first.index}, whose test run this is"
            out.append(dataclasses.replace(first, index=index, note="; ".join(n for n in (first.note, shared) if n)))
            continue
        graded = grade(index, prompt.task, answer, sandbox)
        if code and graded.status == "graded" and "timeout" not in graded.tests.values():
            ran[key] = graded
        out.append(graded)
    return out


def grade(index: int, task: dict[str, Any], answer: dict[str, Any], sandbox: Sandbox | None) -> Grade:
    shape = str(task.get("kind"))  # instruction, agent or code
    prompt_id = str(answer.get("prompt_id"))
    if not answer.get("ok"):
        return Grade(index, prompt_id, shape, "ungraded", None, note="the request failed: there is no answer")
    if "content" not in answer:
        return Grade(index, prompt_id, shape, "ungraded", None, note="the answer was not kept whole")
    graders = {"instruction": lambda: instruction_checks(task, str(answer["content"])),
               "agent": lambda: agent_checks(task, answer)}
    if shape == "code":
        return grade_code(index, prompt_id, task, answer, sandbox)
    if shape not in graders:
        return Grade(index, prompt_id, shape, "ungraded", None, note=f"unknown task kind {shape!r}")
    checks = graders[shape]()
    return Grade(index, prompt_id, shape, "graded", all(ok for _, ok, _ in checks), tuple(checks))


# -- instruction tasks --------------------------------------------------------------------------------------------


def _words(text: str) -> int:
    return len(text.split())


def _lines(text: str) -> int:
    return sum(1 for line in text.strip().splitlines() if line.strip())


def _found(word: str, text: str, substring: bool, case_sensitive: bool) -> bool:
    flags = 0 if case_sensitive else re.IGNORECASE
    pattern = re.escape(word) if substring else rf"(?<!\w){re.escape(word)}(?!\w)"
    return re.search(pattern, text, flags) is not None


def instruction_checks(task: dict[str, Any], content: str) -> list[tuple[str, bool, str]]:
    checks = task.get("checks") or {}
    text = content.strip()
    substring = task.get("match") == "substring"
    case = bool(checks.get("case_sensitive"))
    out: list[tuple[str, bool, str]] = []
    for unit, count in (("chars", len(text)), ("words", _words(text)), ("lines", _lines(text))):
        low, high = checks.get(f"min_{unit}"), checks.get(f"max_{unit}")
        if low is not None:
            out.append((f"at least {low} {unit}", count >= low, f"{count} {unit}"))
        if high is not None:
            out.append((f"at most {high} {unit}", count <= high, f"{count} {unit}"))
    for word in checks.get("required") or []:
        out.append((f"contains {word!r}", _found(word, text, substring, case), ""))
    for word in checks.get("forbidden") or []:
        found = _found(word, text, substring, case)
        out.append((f"avoids {word!r}", not found, "used" if found else ""))
    for name in checks.get("entities") or []:
        out.append((f"keeps {name!r}", name in text, ""))
    if checks.get("json") is not None:
        out.append(json_check(text, checks["json"]))
    return out


_FENCE = re.compile(r"^```[A-Za-z0-9_-]*[ \t]*\n(.*?)\n?```$", re.DOTALL)


def json_check(text: str, schema: dict[str, Any]) -> tuple[str, bool, str]:
    """The whole answer (or its one fenced block) parses as JSON and fits the schema."""
    from jsonschema import Draft202012Validator

    fenced = _FENCE.match(text.strip())
    body = fenced.group(1) if fenced else text
    try:
        value = json.loads(body)
    except json.JSONDecodeError as exc:
        return ("JSON that parses and fits the schema", False, f"not JSON: {exc.msg} at line {exc.lineno} column "
                                                                f"{exc.colno}")
    errors = sorted(Draft202012Validator(schema).iter_errors(value), key=lambda e: list(e.path))
    if errors:
        where = "/".join(str(p) for p in errors[0].path) or "the value"
        return ("JSON that parses and fits the schema", False, f"schema: {where}: {errors[0].message[:200]}")
    return ("JSON that parses and fits the schema", True, "")


# -- tool and agent probes ----------------------------------------------------------------------------------------


def _schemas(task: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["function"]["name"]: t["function"].get("parameters") or {} for t in task.get("tools") or []}


def call_problem(call: dict[str, Any], schemas: dict[str, dict[str, Any]]) -> str | None:
    """Why a parsed call is unusable, or None: its name is an offered tool, its arguments JSON that fits."""
    from jsonschema import Draft202012Validator

    name = str(call.get("name") or "")
    if name not in schemas:
        return f"calls {name or '(no name)'!r}, not an offered tool"
    try:
        arguments = json.loads(call.get("arguments") or "{}")
    except json.JSONDecodeError as exc:
        return f"{name}: arguments are not JSON ({exc.msg})"
    errors = list(Draft202012Validator(schemas[name]).iter_errors(arguments))
    return f"{name}: {errors[0].message[:160]}" if errors else None


def agent_checks(task: dict[str, Any], answer: dict[str, Any]) -> list[tuple[str, bool, str]]:
    summary = answer.get("tool_calls") or {}
    calls: list[dict[str, Any]] = list(summary.get("calls") or [])
    content = str(answer.get("content") or "")
    schemas = _schemas(task)
    expect = task.get("expect") or {}
    problems = [p for c in calls if (p := call_problem(c, schemas))]
    out: list[tuple[str, bool, str]] = []
    names = ", ".join(str(c.get("name")) for c in calls[:6]) + (" …" if len(calls) > 6 else "")
    if "no_call" in expect:
        out.append(("no tool call", not calls, f"{len(calls)} call(s): {names}" if calls else ""))
        wanted = str(expect["no_call"].get("answer_contains", ""))
        if wanted:
            out.append((f"answer contains {wanted!r}", wanted in content, ""))
        return out
    out.append(("made a tool call", bool(calls), f"{len(calls)} call(s)" + (f": {names}" if calls else "")))
    out.append(("every call names an offered tool, with arguments that parse and fit", not problems,
                "; ".join(problems[:3])))
    if "tool" in expect:
        first = str(calls[0].get("name")) if calls else "-"
        out.append((f"first call is {expect['tool']}", first == expect["tool"], f"called {first}"))
    elif "parallel" in expect:
        spec = expect["parallel"]
        values = [_argument(c, spec["argument"]) for c in calls if c.get("name") == spec["tool"]]
        covered = [v for v in spec["values"] if any(v.lower() in got.lower() for got in values)]
        out.append((f"{len(spec['values'])} {spec['tool']} calls in one answer",
                    len(values) >= len(spec["values"]), f"{len(values)} {spec['tool']} call(s)"))
        out.append((f"covers {', '.join(spec['values'])}", len(covered) == len(spec["values"]),
                    f"covered {', '.join(covered) or 'none'}"))
    elif "parseable" in expect:
        markup = _MARKUP.search(content)
        out.append(("no tool-call markup left in the text", markup is None,
                    f"found {markup.group(0)!r}" if markup else ""))
    elif "no_runaway" in expect:
        ran_away = runaway(answer)
        out.append(("no runaway (a call repeated 3 times, 10 calls, or the length limit while calling)",
                    not ran_away, f"{summary.get('count', 0)} calls, the same one up to "
                                  f"{summary.get('max_identical', 0)} times, finish {answer.get('finish_reason')}"))
    return out


def _argument(call: dict[str, Any], name: str) -> str:
    try:
        value = json.loads(call.get("arguments") or "{}")
    except json.JSONDecodeError:
        return ""
    return str(value.get(name, "")) if isinstance(value, dict) else ""
