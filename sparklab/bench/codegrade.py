"""Code tasks: the answer's code and the task's tests, run in a sandbox; pass/fail per test (pure but for `Sandbox`).

The sandbox is a protocol, so this layer never touches Docker: sparklab.runtimes.sandbox runs the files in a
throwaway container (network off, CPU, memory, processes and time capped, read-only root) and a test gives a
fake. What runs there is only the standard library: a small runner (RUNNER) discovers the unittest tests, runs
each under its own alarm (a looping test fails as `timeout` and the others still run), and prints one line of
results after a nonce. A run that ends without that line (killed at the time cap, out of memory) fails every
test, with the reason.

Which tests exist is read from the test files themselves (ast, on this side), so a test that never ran (its
module failed to import the answer) is a failure too, never a missing row.
"""

from __future__ import annotations

import ast
import json
import re
import secrets
from pathlib import PurePosixPath
from typing import Any, Protocol

from sparklab.bench.grades import Grade

RUNNER_FILE = "_sparklab_runner.py"
PER_TEST_S = 10.0  # a test that runs longer fails as "timeout" (SIGALRM inside the sandbox)
OUTCOMES = ("pass", "fail", "error", "timeout")

RUNNER = r'''
import json, signal, sys, unittest

nonce, per_test = sys.argv[1], float(sys.argv[2])
del sys.argv[1:]


class TimedOut(BaseException):  # not an Exception: an answer's `except Exception` cannot swallow it
    pass


def alarm(signum, frame):
    raise TimedOut()


signal.signal(signal.SIGALRM, alarm)


def flat(suite):
    for test in suite:
        if isinstance(test, unittest.TestSuite):
            yield from flat(test)
        else:
            yield test


results = {}
try:
    signal.setitimer(signal.ITIMER_REAL, per_test)
    tests = list(flat(unittest.defaultTestLoader.discover(".", pattern="test*.py", top_level_dir=".")))
    signal.setitimer(signal.ITIMER_REAL, 0)
except TimedOut:
    tests = []
    results["(discovery)"] = "timeout"
for test in tests:
    if type(test).__name__ == "_FailedTest":  # its module did not import (the answer's import failed)
        continue
    result = unittest.TestResult()
    try:
        signal.setitimer(signal.ITIMER_REAL, per_test)
        test.run(result)
        signal.setitimer(signal.ITIMER_REAL, 0)
    except TimedOut:
        results[test.id()] = "timeout"
        continue
    problems = [text for _, text in result.errors + result.failures]
    if any("TimedOut" in text for text in problems):
        results[test.id()] = "timeout"
    elif result.errors:
        results[test.id()] = "error"
    elif result.failures or result.skipped or result.unexpectedSuccesses:
        results[test.id()] = "fail"
    else:
        results[test.id()] = "pass"
sys.stdout.flush()
sys.stdout.write("\n" + nonce + " " + json.dumps(results) + "\n")
sys.stdout.flush()
'''


class SandboxRun(Protocol):
    """What one sandboxed command did. error: it could not run at all (no image, no Docker)."""

    @property
    def exit_code(self) -> int | None: ...
    @property
    def output(self) -> str: ...  # stdout and stderr, bounded by the sandbox
    @property
    def seconds(self) -> float: ...
    @property
    def timed_out(self) -> bool: ...
    @property
    def oom_killed(self) -> bool: ...
    @property
    def error(self) -> str | None: ...


class Sandbox(Protocol):
    """Runs a command over a directory of files in isolation (sparklab.runtimes.sandbox.DockerSandbox)."""

    per_test_s: float

    def run(self, files: dict[str, str], command: list[str]) -> SandboxRun: ...

    def describe(self) -> str: ...


def expected_tests(files: dict[str, str]) -> list[str]:
    """unittest ids (module.Class.test) of every test method in the test files, as discovery names them."""
    ids = []
    for path, text in sorted(files.items()):
        pure = PurePosixPath(path)
        if not (pure.name.startswith("test") and pure.suffix == ".py"):
            continue
        module = ".".join(pure.with_suffix("").parts)
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                ids += [f"{module}.{node.name}.{f.name}" for f in node.body
                        if isinstance(f, ast.FunctionDef) and f.name.startswith("test")]
    return ids


_BLOCK = re.compile(r"```[ \t]*([^\n`]*)\n(.*?)```", re.DOTALL)
_PATH_COMMENT = re.compile(r"^\s*#\s*(?:file:\s*)?([\w./-]+\.py)\s*$")


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(info string, body) of every fenced block, in order."""
    return [(m.group(1).strip(), m.group(2)) for m in _BLOCK.finditer(text)]


def solution_code(text: str) -> str:
    """The first Python block of the answer, or the whole answer when it has no fenced block."""
    blocks = code_blocks(text)
    python = [body for info, body in blocks if not info or info.split()[0].lower() in ("python", "py", "python3")]
    if python:
        return python[0]
    return blocks[0][1] if blocks else text


def repo_changes(text: str, repo: dict[str, str]) -> dict[str, str]:
    """Files of the repository the answer gives whole: blocks whose first line (or info string) names a path of
    the repository; test files are never taken from an answer."""
    changes: dict[str, str] = {}
    for info, body in code_blocks(text):
        first, _, rest = body.partition("\n")
        named = _PATH_COMMENT.match(first)
        path = named.group(1) if named else next((w for w in info.replace("=", " ").replace('"', " ").split()
                                                  if w in repo), None)
        if path is None or path not in repo or PurePosixPath(path).name.startswith("test"):
            continue
        changes[path] = body if not named else rest
    return changes


def task_files(task: dict[str, Any], content: str) -> tuple[dict[str, str], str]:
    """The files to run (the answer applied) and a note on what was taken from the answer."""
    if task.get("repo") is not None:
        repo = dict(task["repo"])
        changes = repo_changes(content, repo)
        repo.update(changes)
        note = f"changed {', '.join(sorted(changes))}" if changes else "the answer changed no file of the repository"
        return repo, note
    entry = str(task["entry"])
    return {entry: solution_code(content), f"test_{PurePosixPath(entry).stem}.py": str(task["tests"])}, ""


def parse_results(output: str, nonce: str) -> dict[str, str] | None:
    """The runner's results line (the last line starting with the nonce), or None when it never printed one."""
    for line in reversed(output.splitlines()):
        if line.startswith(nonce + " "):
            try:
                data = json.loads(line[len(nonce) + 1:])
            except json.JSONDecodeError:
                return None
            return {str(k): str(v) if v in OUTCOMES else "error" for k, v in data.items()} if isinstance(data, dict) \
                else None
    return None


def grade_code(index: int, prompt_id: str, task: dict[str, Any], answer: dict[str, Any],
               sandbox: Sandbox | None) -> Grade:
    if sandbox is None:
        return Grade(index, prompt_id, "code", "ungraded", None, note="no sandbox to run the tests in")
    files, note = task_files(task, str(answer.get("content") or ""))
    expected = expected_tests(files)
    nonce = "SPARKLAB-" + secrets.token_hex(8)
    files = {**files, RUNNER_FILE: RUNNER}
    run = sandbox.run(files, ["python3", "-B", "-s", RUNNER_FILE, nonce, f"{sandbox.per_test_s:g}"])
    if run.error is not None:
        return Grade(index, prompt_id, "code", "ungraded", None, note=f"the sandbox could not run: {run.error}")
    results = parse_results(run.output, nonce)
    if results is None:
        why = ("killed at the sandbox's time cap" if run.timed_out else "killed: out of memory" if run.oom_killed
               else f"exited with code {run.exit_code} before reporting")
        tail = " ".join(run.output.strip().splitlines()[-3:])[-300:]
        results = dict.fromkeys(expected, "timeout" if run.timed_out else "error")
        note = "; ".join(n for n in (note, f"the test run was {why}" + (f": {tail}" if tail else "")) if n)
    for test_id in expected:
        results.setdefault(test_id, "error")  # never ran: its module could not import the answer
    passed = sum(1 for v in results.values() if v == "pass")
    checks = (("every test passes", bool(results) and passed == len(results), f"{passed} of {len(results)} passed"),)
    return Grade(index, prompt_id, "code", "graded", checks[0][1], checks, results, note)
