"""Graded task suites: workloads whose every prompt carries how its answer is graded (pure; reads local files).

Four ship with sparklab, as YAML under `sparklab/bench/tasks/` (written for it; nothing is fetched at run time):
`tasks-en` and `tasks-ja` (instruction tasks with mechanical checks), `code` (write-from-spec tasks and a bug-fix
mini repository, graded by running their tests in a sandbox container) and `agent` (tool-use probes). A user's own
suite is a YAML file of the same shape (`workloads: [my-suite.yaml]`). A suite is sent like any workload, round
robin; the answers are graded after the window (sparklab.bench.grading), never inside it.

The task spec each prompt carries (`Prompt.task`, part of the workload's content hash) is plain JSON:
- instruction: {"kind", "checks": {min_chars, max_chars, min_words, max_words, min_lines, max_lines, required,
  forbidden, entities, case_sensitive, json}, "match": "word" | "substring"}
- code: {"kind", "entry", "tests"} (write from spec) or {"kind", "repo": {path: text}} (fix the repository)
- agent: {"kind", "expect": {one of parallel, tool, parseable, no_runaway, no_call}, "tools": [OpenAI tools]}
"""

from __future__ import annotations

import functools
import importlib.resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sparklab.bench.prompts import Prompt, Workload, approx_tokens
from sparklab.errors import RecipeError
from sparklab.inputs import parse_yaml, read_utf8

# name -> its one-line description (the YAML's own `description`, read when listed)
BUILTIN: dict[str, str] = {
    "tasks-en": "6 English instruction tasks with mechanical checks (length, required/forbidden words, names kept, "
                "JSON schema), graded after the window",
    "tasks-ja": "6 Japanese instruction tasks with mechanical checks (length in characters, required/forbidden "
                "words, names kept, JSON schema), graded after the window",
    "code": "5 write-from-spec Python tasks and a bug-fix mini repository, graded by running their unittest tests in "
            "a sandbox container",
    "agent": "6 tool-use probes: parallel calls, the right tool among 40 (twice), hard arguments, the tool_choice "
             "required runaway, no tool needed",
}
_HINT = ("A suite file has name, description, kind (instruction, code or agent) and tasks; see the bundled suites "
         "in sparklab/bench/tasks/ for every key.")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Checks(_Strict):
    min_chars: int | None = Field(default=None, ge=0)
    max_chars: int | None = Field(default=None, ge=1)
    min_words: int | None = Field(default=None, ge=0)
    max_words: int | None = Field(default=None, ge=1)
    min_lines: int | None = Field(default=None, ge=0)
    max_lines: int | None = Field(default=None, ge=1)
    required: list[str] = Field(default_factory=list)
    forbidden: list[str] = Field(default_factory=list)
    entities: list[str] = Field(default_factory=list)
    case_sensitive: bool = False
    json_schema: dict[str, Any] | None = Field(default=None, alias="json")

    @model_validator(mode="after")
    def _something(self) -> Checks:
        if not self.model_dump(exclude_defaults=True, exclude={"case_sensitive"}):
            raise ValueError("a task needs at least one check")
        return self


class InstructionTask(_Strict):
    id: str = Field(min_length=1)
    prompt: str = Field(min_length=1)
    checks: Checks


class CodeTask(_Strict):
    id: str = Field(min_length=1)
    prompt: str = Field(min_length=1)
    entry: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*\.py$")
    tests: str | None = None
    repo: dict[str, str] | None = None

    @model_validator(mode="after")
    def _one_shape(self) -> CodeTask:
        if (self.repo is None) == (self.entry is None or self.tests is None):
            raise ValueError("give either entry and tests (write from a spec) or repo (fix a repository)")
        for path in self.repo or {}:
            if path.startswith("/") or ".." in Path(path).parts:
                raise ValueError(f"repo path {path!r} must be relative, inside the repository")
        if self.repo is not None and not any(_is_test(p) for p in self.repo):
            raise ValueError("a repository task needs test files (tests/test_*.py)")
        return self


class Expect(_Strict):
    parallel: dict[str, Any] | None = None  # {tool, argument, values}
    tool: str | None = None
    parseable: dict[str, Any] | None = None  # {tool}
    no_runaway: dict[str, Any] | None = None  # {tool}
    no_call: dict[str, Any] | None = None  # {answer_contains}

    @model_validator(mode="after")
    def _exactly_one(self) -> Expect:
        if len(self.model_dump(exclude_none=True)) != 1:
            raise ValueError("expect takes exactly one of parallel, tool, parseable, no_runaway, no_call")
        return self


class AgentTask(_Strict):
    id: str = Field(min_length=1)
    prompt: str = Field(min_length=1)
    tools: str
    tool_choice: Literal["auto", "required", "none"] = "auto"
    expect: Expect


class Suite(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = Field(min_length=1)
    kind: Literal["instruction", "code", "agent"]
    match: Literal["word", "substring"] = "word"
    toolsets: dict[str, dict[str, list[Any]]] = Field(default_factory=dict)
    tasks: list[dict[str, Any]] = Field(min_length=1)


def _is_test(path: str) -> bool:
    return Path(path).name.startswith("test") and path.endswith(".py")


def load_suite(spec: str) -> Workload:
    """A bundled suite by name, or a suite file (YAML); every problem is a RecipeError naming the file and key."""
    if spec in BUILTIN:
        source = f"sparklab/bench/tasks/{spec}.yaml"
        text = importlib.resources.files("sparklab.bench").joinpath("tasks").joinpath(f"{spec}.yaml").read_text("utf-8")
    else:
        source = spec
        try:
            text = read_utf8(Path(spec), allow_bom=True)
        except OSError as exc:
            raise RecipeError(f"{spec}: cannot read the suite file ({exc.strerror or exc})", _HINT) from None
    return _parse(source, text)


@functools.lru_cache(maxsize=32)
def _parse(source: str, text: str) -> Workload:
    """The suite in `text` (read fresh by each load, so an edited file is parsed again): parsed and checked once
    per text - a sweep loads its suites for every cell and every grading (parse_yaml: 0.2-1.5 ms per shipped
    suite, 2.3-8.7 ms by safe_load; then validation).
    Workload and Prompt are frozen; callers copy a prompt's task before changing it."""
    try:
        data = parse_yaml(text)
    except yaml.YAMLError as exc:
        raise RecipeError(f"{source}: not valid YAML ({exc})", _HINT) from None
    suite = _validate(Suite, data, source, "")
    ids: set[str] = set()
    prompts = []
    for i, raw in enumerate(suite.tasks):
        prompt = _prompt(suite, raw, source, f"tasks[{i}]")
        if prompt.id in ids:
            raise RecipeError(f"{source}: tasks[{i}].id: duplicate id {prompt.id!r}", "Give every task its own id.")
        ids.add(prompt.id)
        prompts.append(prompt)
    return Workload(suite.name, suite.description, tuple(prompts))


def _validate(model: type[_Strict], data: Any, source: str, where: str) -> Any:
    if not isinstance(data, dict):
        raise RecipeError(f"{source}: {where or 'top level'}: expected a mapping", _HINT)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        key = ".".join(str(part) for part in (*([where] if where else []), *error["loc"])) or "top level"
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise RecipeError(f"{source}: {key}: {error['msg']}{more}", _HINT) from None


def _prompt(suite: Suite, raw: dict[str, Any], source: str, where: str) -> Prompt:
    extra: dict[str, Any] | None = None
    shape = suite.kind  # what the task is (not an engine's kind)
    if shape == "instruction":
        task = _validate(InstructionTask, raw, source, where)
        text = task.prompt
        spec: dict[str, Any] = {"kind": "instruction", "match": suite.match,
                                "checks": task.checks.model_dump(exclude_defaults=True, by_alias=True)}
        if task.checks.case_sensitive:
            spec["checks"]["case_sensitive"] = True
    elif shape == "code":
        task = _validate(CodeTask, raw, source, where)
        if task.repo is not None:
            text = task.prompt.rstrip() + "\n\n" + _render_repo(task.repo)
            spec = {"kind": "code", "repo": dict(task.repo)}
        else:
            text = task.prompt
            spec = {"kind": "code", "entry": task.entry, "tests": task.tests}
    else:
        task = _validate(AgentTask, raw, source, where)
        if task.tools not in suite.toolsets:
            raise RecipeError(f"{source}: {where}.tools: no toolset {task.tools!r}",
                              f"Toolsets of this suite: {', '.join(suite.toolsets) or 'none'}.")
        tools = [_tool(name, short, source, f"toolsets.{task.tools}.{name}")
                 for name, short in suite.toolsets[task.tools].items()]
        extra = {"tools": tools, "tool_choice": task.tool_choice}
        text = task.prompt
        spec = {"kind": "agent", "expect": task.expect.model_dump(exclude_none=True), "tools": tools}
    messages = ({"role": "user", "content": text},)
    return Prompt(task.id, messages, approx_tokens(messages), extra, spec)


def _render_repo(repo: dict[str, str]) -> str:
    """The repository's files, each under its path in a fenced block (how the model sees them)."""
    parts = []
    for path, content in repo.items():
        parts.append(f"{path}:\n```python\n{content.rstrip()}\n```" if content.strip() else f"{path}: (empty)")
    return "\n\n".join(parts)


_TYPES = {"string", "integer", "number", "boolean", "object"}


def _tool(name: str, short: list[Any], source: str, where: str) -> dict[str, Any]:
    """`name: [description, {parameter: type}]` as an OpenAI function tool; `type[]` is an array of type."""
    if len(short) != 2 or not isinstance(short[0], str) or not isinstance(short[1], dict):
        raise RecipeError(f"{source}: {where}: expected [description, {{parameter: type, ...}}]", _HINT)
    properties: dict[str, Any] = {}
    for parameter, kind in short[1].items():
        base = str(kind).removesuffix("[]")
        if base not in _TYPES:
            raise RecipeError(f"{source}: {where}.{parameter}: unknown type {kind!r}",
                              f"Use one of {', '.join(sorted(_TYPES))}, or TYPE[] for an array.")
        properties[parameter] = {"type": "array", "items": {"type": base}} if str(kind).endswith("[]") \
            else {"type": base}
    return {"type": "function", "function": {"name": name, "description": short[0], "parameters": {
        "type": "object", "properties": properties, "required": list(properties)}}}
