"""Task suites and their grading: every check can fail, and the graders agree with known right and wrong answers.

Code answers run here through a local stand-in for the sandbox (a python3 subprocess in a temporary directory,
the same runner and the same commands); the real sandbox container is tested in tests/docker/test_sandbox.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparklab.bench.codegrade import expected_tests, parse_results, repo_changes, solution_code
from sparklab.bench.grading import agent_checks, grade, grade_answers, instruction_checks, json_check
from sparklab.bench.workloads import load_workload
from sparklab.errors import RecipeError
from sparklab.outputs import tool_call_summary

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "grading"
REFERENCE = yaml.safe_load((FIXTURES / "reference_answers.yaml").read_text())


@dataclass(frozen=True)
class Ran:
    exit_code: int | None
    output: str
    seconds: float
    timed_out: bool = False
    oom_killed: bool = False
    error: str | None = None


class LocalSandbox:
    """The files in a temporary directory and the command as a python3 subprocess (no isolation: tests only)."""

    def __init__(self, per_test_s: float = 2.0, timeout_s: float = 30.0) -> None:
        self.per_test_s = per_test_s
        self.timeout_s = timeout_s
        self.runs: list[dict[str, str]] = []

    def describe(self) -> str:
        return "a local subprocess (tests only)"

    def run(self, files: dict[str, str], command: list[str]) -> Ran:
        self.runs.append(files)
        with tempfile.TemporaryDirectory() as root:
            for name, text in files.items():
                path = Path(root, name)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
            started = time.monotonic()
            try:
                done = subprocess.run([sys.executable, *command[1:]], cwd=root, capture_output=True, text=True,
                                      timeout=self.timeout_s)
            except subprocess.TimeoutExpired as exc:
                out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
                return Ran(None, out, time.monotonic() - started, timed_out=True)
            return Ran(done.returncode, done.stdout + done.stderr, time.monotonic() - started)


def _answer(prompt_id: str, content: str, **extra: Any) -> dict[str, Any]:
    return {"ok": True, "warmup": False, "prompt_id": prompt_id, "content": content, **extra}


def _task(suite: str, prompt_id: str) -> dict[str, Any]:
    prompt = load_workload(suite).by_id(prompt_id)
    assert prompt is not None and prompt.task is not None
    return prompt.task


# -- the shipped suites -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "kind", "count"), [("tasks-en", "instruction", 6), ("tasks-ja", "instruction", 6),
                                                     ("code", "code", 6), ("agent", "agent", 6)])
def test_each_shipped_suite_loads_with_a_grading_spec_per_prompt(name: str, kind: str, count: int) -> None:
    workload = load_workload(name)
    assert workload.graded and len(workload.prompts) == count
    assert all(p.task and p.task["kind"] == kind for p in workload.prompts)
    assert len({p.id for p in workload.prompts}) == count


def test_the_grading_spec_is_part_of_the_content_hash(tmp_path: Path) -> None:
    """Two runs compare prompt by prompt only if they graded the same way: a changed check changes the hash."""
    text = (Path(__file__).resolve().parents[2] / "sparklab" / "bench" / "tasks" / "tasks-en.yaml").read_text()
    changed = tmp_path / "en.yaml"
    changed.write_text(text.replace("max_words: 2\n      required: [Paris]", "max_words: 3\n      required: [Paris]"))
    assert load_workload(str(changed)).content_hash != load_workload("tasks-en").content_hash
    same = tmp_path / "same.yaml"
    same.write_text(text)
    assert load_workload(str(same)).content_hash == load_workload("tasks-en").content_hash


def test_agent_probes_send_their_tools_and_tool_choice() -> None:
    prompts = {p.id: p for p in load_workload("agent").prompts}
    assert len(prompts["agent-right-tool-cron"].extra["tools"]) == 40
    names = [t["function"]["name"] for t in prompts["agent-right-tool-cron"].extra["tools"]]
    assert len(set(names)) == 40 and "create_cron_job" in names and "list_directory" in names
    assert prompts["agent-required-runaway"].extra["tool_choice"] == "required"
    save = prompts["agent-hard-arguments"].extra["tools"][0]["function"]["parameters"]
    assert save["properties"]["tags"] == {"type": "array", "items": {"type": "string"}}


@pytest.mark.parametrize(("doc", "where"), [
    ({"name": "s", "description": "d", "kind": "instruction", "tasks": [{"id": "a", "prompt": "p", "checks": {}}]},
     r"tasks\[0\]\.checks: .*at least one check"),
    ({"name": "s", "description": "d", "kind": "instruction",
      "tasks": [{"id": "a", "prompt": "p", "checks": {"max_word": 3}}]}, r"tasks\[0\]\.checks\.max_word: "),
    ({"name": "s", "description": "d", "kind": "code", "tasks": [{"id": "a", "prompt": "p", "entry": "x.py"}]},
     r"tasks\[0\]: .*either entry and tests"),
    ({"name": "s", "description": "d", "kind": "code",
      "tasks": [{"id": "a", "prompt": "p", "repo": {"../escape.py": "", "tests/test_a.py": ""}}]},
     r"tasks\[0\]: .*inside the repository"),
    ({"name": "s", "description": "d", "kind": "agent", "toolsets": {},
      "tasks": [{"id": "a", "prompt": "p", "tools": "none", "expect": {"tool": "x"}}]}, r"tasks\[0\]\.tools: no toolset"),
    ({"name": "s", "description": "d", "kind": "agent", "toolsets": {"t": {"f": ["d", {"x": "strin"}]}},
      "tasks": [{"id": "a", "prompt": "p", "tools": "t", "expect": {"tool": "f"}}]}, r"toolsets\.t\.f\.x: unknown type"),
    ({"name": "s", "description": "d", "kind": "agent", "toolsets": {"t": {"f": ["d", {}]}},
      "tasks": [{"id": "a", "prompt": "p", "tools": "t", "expect": {"tool": "f", "no_call": {}}}]},
     r"tasks\[0\]\.expect: .*exactly one"),
    ({"name": "s", "description": "d", "kind": "instruction",
      "tasks": [{"id": "a", "prompt": "p", "checks": {"max_words": 1}}, {"id": "a", "prompt": "q",
                                                                      "checks": {"max_words": 1}}]},
     r"tasks\[1\]\.id: duplicate id"),
])
def test_a_bad_suite_file_names_the_file_and_the_key(tmp_path: Path, doc: dict[str, Any], where: str) -> None:
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(RecipeError, match=rf"{path}: {where}") as caught:
        load_workload(str(path))
    assert "\n" not in caught.value.message and caught.value.hint


# -- instruction checks -------------------------------------------------------------------------------------------


def test_every_instruction_check_passes_and_fails() -> None:
    task = {"kind": "instruction", "checks": {"min_words": 2, "max_words": 4, "max_lines": 1, "required": ["Paris"],
                                              "forbidden": ["London"], "entities": ["Île-de-France"]}}
    good = instruction_checks(task, "Paris, Île-de-France.")
    assert all(ok for _, ok, _ in good), good
    bad = dict((name, ok) for name, ok, _ in instruction_checks(task, "London\nis not parisian at all, oh"))
    assert bad == {"at least 2 words": True, "at most 4 words": False, "at most 1 lines": False,
                   "contains 'Paris'": False, "avoids 'London'": False, "keeps 'Île-de-France'": False}


def test_words_match_whole_words_case_insensitively_unless_asked() -> None:
    task = {"kind": "instruction", "checks": {"required": ["HELLO"], "case_sensitive": True}}
    assert instruction_checks(task, "HELLO")[0][1] and not instruction_checks(task, "hello")[0][1]
    loose = {"kind": "instruction", "checks": {"required": ["red"]}}
    assert instruction_checks(loose, "Red.")[0][1] and not instruction_checks(loose, "redo")[0][1]


def test_japanese_counts_characters_and_matches_substrings() -> None:
    task = _task("tasks-ja", "ja-required-words")
    assert grade(0, task, _answer("ja-required-words", "春の入学式で桜が咲いた。"), None).passed
    missing = grade(0, task, _answer("ja-required-words", "春の入学式です。"), None)
    assert not missing.passed and ("contains '桜'", False, "") in missing.checks
    fifty = _task("tasks-ja", "ja-50-chars")
    assert not grade(0, fifty, _answer("ja-50-chars", "東京" * 26), None).passed  # 52 characters


@pytest.mark.parametrize(("text", "ok", "detail"), [
    ('{"name": "Alice Moreau", "age": 34}', True, ""),
    ('```json\n{"name": "Alice Moreau", "age": 34}\n```', True, ""),
    ('Here: {"name": "Alice", "age": 34}', False, "not JSON"),
    ('{"name": "Alice", "age": "34"}', False, "schema: age: '34' is not of type 'integer'"),
    ('{"name": "Alice"}', False, "'age' is a required property"),
    ('{"name": "Bob", "age": 34}', False, "schema: name: 'Bob' does not match 'Alice'"),
])
def test_json_must_parse_whole_and_fit_the_schema(text: str, ok: bool, detail: str) -> None:
    schema = _task("tasks-en", "en-json-person")["checks"]["json"]
    _, passed, said = json_check(text, schema)
    assert passed is ok and detail in said


def test_a_failed_request_or_a_warmup_is_not_graded() -> None:
    workload = load_workload("tasks-en")
    answers = [{**_answer("en-uppercase", "HELLO"), "warmup": True}, _answer("en-uppercase", "HELLO"),
               {**_answer("en-uppercase", ""), "ok": False}, {"ok": True, "prompt_id": "en-uppercase", "text": "HELLO"}]
    grades = grade_answers(workload, answers, None)
    assert [(g.index, g.status, g.passed) for g in grades] == [(1, "graded", True), (2, "ungraded", None),
                                                               (3, "ungraded", None)]
    assert "request failed" in grades[1].note and "not kept whole" in grades[2].note


# -- agent probes -------------------------------------------------------------------------------------------------


def _calls(*calls: tuple[str, Any], finish: str = "tool_calls") -> dict[str, Any]:
    listed = [{"name": n, "arguments": a if isinstance(a, str) else json.dumps(a)} for n, a in calls]
    return {"tool_calls": tool_call_summary(listed, whole=True), "finish_reason": finish}


def _agent(prompt_id: str, content: str = "", **calls: Any) -> tuple[bool, list[tuple[str, bool, str]]]:
    answer = _answer(prompt_id, content, **calls)
    result = grade(0, _task("agent", prompt_id), answer, None)
    assert result.status == "graded"
    return bool(result.passed), list(result.checks)


def test_parallel_calls_need_both_cities_in_one_answer() -> None:
    assert _agent("agent-parallel-calls", **_calls(("get_weather", {"city": "Tokyo"}),
                                                   ("get_weather", {"city": "Osaka, Japan"})))[0]
    ok, checks = _agent("agent-parallel-calls", **_calls(("get_weather", {"city": "Tokyo"})))
    assert not ok and ("covers Tokyo, Osaka", False, "covered Tokyo") in checks
    assert not _agent("agent-parallel-calls", "I will check Tokyo, then Osaka.")[0]  # described, not called


def test_the_right_tool_among_forty() -> None:
    assert _agent("agent-right-tool-cron", **_calls(("create_cron_job", {"schedule": "0 9 * * *",
                                                                        "command": "/opt/report.sh"})))[0]
    ok, checks = _agent("agent-right-tool-cron", **_calls(("list_directory", {"path": "/opt"})))
    assert not ok and ("first call is create_cron_job", False, "called list_directory") in checks


def test_calls_must_parse_fit_their_schema_and_leave_no_markup() -> None:
    args = {"title": 'He said "hi"', "body": 'print("hi")\nx = {"a": [1, 2]}', "tags": ["code", "python"]}
    assert _agent("agent-hard-arguments", **_calls(("save_note", args)))[0]
    broken, checks = _agent("agent-hard-arguments", **_calls(("save_note", '{"title": "He said "hi""}')))
    assert not broken and "arguments are not JSON" in dict((n, d) for n, _, d in checks)[
        "every call names an offered tool, with arguments that parse and fit"]
    assert not _agent("agent-hard-arguments", **_calls(("save_note", {**args, "tags": "code"})))[0]  # not an array
    assert not _agent("agent-hard-arguments", **_calls(("delete_note", args)))[0]  # not an offered tool
    lost = '<tool_call>{"name": "save_note", "arguments": {"title": "x"}}</tool_call>'
    assert not _agent("agent-hard-arguments", lost, **_calls(("save_note", args)))[0]


def test_the_required_runaway_probe_fails_a_loop() -> None:
    once = _calls(("get_weather", {"city": "Tokyo"}))
    assert _agent("agent-required-runaway", **once)[0]
    loop = _calls(*[("get_weather", {"city": "Tokyo"})] * 159, finish="length")
    ok, checks = _agent("agent-required-runaway", **loop)
    assert not ok and any("159 calls" in d for _, _, d in checks)


def test_no_tool_needed_means_no_call_and_the_answer() -> None:
    assert _agent("agent-no-tool-needed", "4")[0]
    assert not _agent("agent-no-tool-needed", "4", **_calls(("get_weather", {"city": "Tokyo"})))[0]
    assert not _agent("agent-no-tool-needed", "five")[0]


def test_agent_checks_on_an_answer_without_calls() -> None:
    checks = agent_checks(_task("agent", "agent-right-tool-cron"), _answer("agent-right-tool-cron", "ok"))
    assert ("made a tool call", False, "0 call(s)") in checks


# -- code ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("prompt_id", [p.id for p in load_workload("code").prompts])
def test_a_right_answer_passes_every_test_and_an_empty_one_fails_them(prompt_id: str) -> None:
    task = _task("code", prompt_id)
    good = grade(0, task, _answer(prompt_id, REFERENCE[prompt_id]), LocalSandbox())
    assert good.status == "graded" and good.passed, (good.tests, good.note)
    assert good.tests and set(good.tests.values()) == {"pass"}
    bad = grade(0, task, _answer(prompt_id, "I cannot do that."), LocalSandbox())
    assert bad.status == "graded" and not bad.passed and set(bad.tests) == set(good.tests)


def test_the_bug_fix_repository_fails_six_of_ten_tests_as_shipped() -> None:
    task = _task("code", "code-bugfix-shop")
    result = grade(0, task, _answer("code-bugfix-shop", "No change needed."), LocalSandbox())
    failing = sorted(t.split(".", 2)[2] for t, v in result.tests.items() if v != "pass")
    assert len(result.tests) == 10 and failing == [
        "Pages.test_count_partial", "Pages.test_first_page", "Pages.test_last_page", "Pricing.test_no_discount",
        "Pricing.test_quarter_off", "Pricing.test_total_quantities"]
    assert "changed no file" in result.note


def test_an_answer_never_replaces_the_tests() -> None:
    task = _task("code", "code-bugfix-shop")
    cheat = "```python\n# tests/test_pages.py\nimport unittest\n```\n"
    assert repo_changes(cheat, task["repo"]) == {}
    sandbox = LocalSandbox()
    grade(0, task, _answer("code-bugfix-shop", cheat), sandbox)
    assert sandbox.runs[0]["tests/test_pages.py"] == task["repo"]["tests/test_pages.py"]


def test_code_is_taken_from_the_first_python_block_or_the_whole_answer() -> None:
    assert solution_code("text\n```python\nA = 1\n```\n```python\nB = 2\n```") == "A = 1\n"
    assert solution_code("```\nC = 3\n```") == "C = 3\n"
    assert solution_code("D = 4") == "D = 4"


def test_a_looping_test_times_out_alone_and_the_others_still_count() -> None:
    task = {"kind": "code", "entry": "solution.py", "tests": (
        "import unittest\nfrom solution import f\n"
        "class T(unittest.TestCase):\n"
        "    def test_ok(self):\n        self.assertEqual(f(1), 1)\n"
        "    def test_loop(self):\n        f(-1)\n")}
    answer = "```python\ndef f(x):\n    while x < 0:\n        try:\n            pass\n        except Exception:\n" \
             "            pass\n    return x\n```"
    result = grade(0, task, _answer("t", answer), LocalSandbox(per_test_s=1.0))
    assert result.tests == {"test_solution.T.test_loop": "timeout", "test_solution.T.test_ok": "pass"}
    assert not result.passed


def test_an_answer_that_never_returns_fails_every_test_at_the_time_cap() -> None:
    task = {"kind": "code", "entry": "solution.py", "tests": (
        "import unittest\nfrom solution import f\nclass T(unittest.TestCase):\n"
        "    def test_a(self):\n        f()\n    def test_b(self):\n        f()\n")}
    stubborn = ("```python\nimport signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
                "def f():\n    while True:\n        pass\n```")
    started = time.monotonic()
    result = grade(0, task, _answer("t", stubborn), LocalSandbox(per_test_s=0.5, timeout_s=2.0))
    assert time.monotonic() - started < 20
    assert result.tests == {"test_solution.T.test_a": "timeout", "test_solution.T.test_b": "timeout"}
    assert not result.passed and "time cap" in result.note


def test_an_answer_that_does_not_import_fails_every_test_as_error() -> None:
    task = _task("code", "code-fizzbuzz")
    result = grade(0, task, _answer("code-fizzbuzz", "```python\ndef fizzbuzz(n) -> list[str]\n```"),
                   LocalSandbox())
    assert set(result.tests.values()) == {"error"} and len(result.tests) == 4


def test_without_a_sandbox_code_is_ungraded_not_failed() -> None:
    result = grade(0, _task("code", "code-fizzbuzz"), _answer("code-fizzbuzz", "x"), None)
    assert (result.status, result.passed) == ("ungraded", None) and "no sandbox" in result.note


def test_test_ids_come_from_the_test_files_and_results_from_the_nonce_line() -> None:
    files = {"tests/test_a.py": "import unittest\nclass A(unittest.TestCase):\n    def test_x(self): pass\n"
                                "    def helper(self): pass\n", "a.py": "def test_not_a_test(): pass\n"}
    assert expected_tests(files) == ["tests.test_a.A.test_x"]
    out = 'SPARKLAB-1 {"t.A.test_x": "pass"}\nnoise\nSPARKLAB-2 {"t.A.test_x": "pass", "t.A.test_y": "weird"}\n'
    assert parse_results(out, "SPARKLAB-2") == {"t.A.test_x": "pass", "t.A.test_y": "error"}
    assert parse_results("no line", "SPARKLAB-2") is None


def test_the_same_code_answer_twice_in_a_cell_runs_its_tests_once() -> None:
    """At temperature 0 every repeat of a code prompt gives the same answer: its tests run once per cell (on a Spark
    each run is a sandbox container's start), and the copy's grade names the answer whose run it shares. A different
    answer to the same prompt runs again."""
    workload = load_workload("code")
    sandbox = LocalSandbox(per_test_s=2.0)
    text = "```python\ndef is_palindrome(s):\n    t = [c.lower() for c in s if c.isalnum()]\n    return t == t[::-1]\n```"
    answers = [_answer("code-palindrome", text), _answer("code-palindrome", text), _answer("code-palindrome", "no"),
               _answer("code-palindrome", text)]
    grades = grade_answers(workload, answers, sandbox)
    assert len(sandbox.runs) == 2  # the three identical answers once, the different one once
    assert [g.index for g in grades] == [0, 1, 2, 3]
    assert grades[0].tests == grades[1].tests == grades[3].tests and grades[0].passed == grades[1].passed
    assert grades[2].passed is False
    assert "the same answer as #0" in grades[1].note and "the same answer" not in grades[0].note


def test_a_suite_file_edited_between_loads_is_read_again(tmp_path: Path) -> None:
    """Suites are parsed once per text (a sweep loads them for every cell): an edit between two loads still shows."""
    text = (Path(__file__).resolve().parents[2] / "sparklab" / "bench" / "tasks" / "tasks-en.yaml").read_text()
    path = tmp_path / "en.yaml"
    path.write_text(text)
    before = load_workload(str(path))
    assert load_workload(str(path)) is before  # the same text: parsed once
    path.write_text(text.replace("max_words: 2\n      required: [Paris]", "max_words: 3\n      required: [Paris]"))
    after = load_workload(str(path))
    assert after.content_hash != before.content_hash
