"""Issue 27 item 10: bad input fails early, as one paragraph naming the file and the key, never as a traceback
or after a model has loaded; and every file a user hands sparklab is read with a bound."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparklab.bench.workloads import load_workload
from sparklab.cli.main import main
from sparklab.errors import RecipeError
from sparklab.recipes.hosts import parse_hosts
from sparklab.recipes.schema import load_recipe, recipes_dir
from tests.dockerkit import free_port
from tests.tmpfs import tmpfs


@pytest.fixture(autouse=True)
def _state(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SPARKLAB_STATE", str(tmp_path / "state"))  # sweep locks and logs: never the real home


def _sweep(tmp_path: Path, **changes: Any) -> Path:
    doc: dict[str, Any] = {"name": "faults", "recipe": "cpu", "methods": ["none"], "concurrency": [1],
                           "requests": 2, **changes}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _cli(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.err + captured.out


def _one_paragraph(text: str) -> None:
    assert "Traceback" not in text and "Error:" not in text.replace("error:", ""), text


# -- a lone surrogate in a prompts file or a recipe ----------------------------------------------------------------

@pytest.mark.parametrize("line", [
    '"\\ud800"',
    '{"prompt": "ok \\udfff here"}',
    '{"messages": [{"role": "user", "content": "x\\ud800y"}]}',
    '{"messages": [{"role": "user", "content": "x", "name": "\\ud800"}]}',
    '{"id": "\\ud800", "prompt": "fine"}',
], ids=["string", "prompt", "content", "name", "id"])
def test_a_lone_surrogate_in_a_prompts_file_is_refused_when_it_loads(tmp_path: Path, line: str) -> None:
    """json.loads accepts "\\ud800"; no server can receive it (UTF-8 cannot encode it): every cell failed after
    the model loaded. It is refused where the file is read, naming the file and line."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('"a fine prompt"\n' + line + "\n")
    with pytest.raises(RecipeError, match=rf"{prompts}:2: .*lone surrogate"):
        load_workload(str(prompts))


def test_a_surrogate_pair_is_a_character_and_loads(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('"smile \\ud83d\\ude00"\n')
    assert load_workload(str(prompts)).prompts[0].messages[0]["content"] == "smile \U0001f600"


def test_a_sweeps_dry_run_refuses_a_prompts_file_with_a_lone_surrogate(tmp_path: Path, capsys) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "\\ud800"}\n')
    code, text = _cli(capsys, "sweep", str(_sweep(tmp_path, workloads=[str(prompts)])), "--dry-run",
                      "--runs-dir", str(tmp_path / "runs"))
    assert code == 2 and f"{prompts}:1" in text and "lone surrogate" in text
    _one_paragraph(text)


def test_a_lone_surrogate_in_a_recipe_is_refused_naming_the_key(tmp_path: Path) -> None:
    doc = yaml.safe_load((recipes_dir() / "cpu.yaml").read_text())
    doc["engines"]["vllm-cpu"]["env"]["X"] = "a\ud800b"
    path = tmp_path / "surrogate.yaml"
    path.write_text(yaml.safe_dump(doc, allow_unicode=False))  # written as the escape "\uD800"
    assert "\\uD800" in path.read_text()
    with pytest.raises(RecipeError, match=r"surrogate\.yaml: engines\.vllm-cpu\.env\.X: .*lone surrogate"):
        load_recipe(path)


# -- every user file read with a bound ------------------------------------------------------------------------------

def test_a_workload_linked_to_dev_zero_is_refused_at_once(tmp_path: Path) -> None:
    link = tmp_path / "prompts.jsonl"
    link.symlink_to("/dev/zero")
    started = time.monotonic()
    with pytest.raises(RecipeError, match=rf"{link}: not a regular file"):
        load_workload(str(link))
    assert time.monotonic() - started < 1.0


@pytest.mark.parametrize("which", ["sweep", "recipe"])
def test_a_sweep_or_recipe_file_linked_to_dev_zero_is_refused(tmp_path: Path, capsys, which: str) -> None:
    link = tmp_path / f"{which}.yaml"
    link.symlink_to("/dev/zero")
    argv = (["sweep", str(link), "--dry-run", "--runs-dir", str(tmp_path)] if which == "sweep"
            else ["render", str(link)])
    started = time.monotonic()
    code, text = _cli(capsys, *argv)
    assert code == 2 and f"{link}: not a regular file" in text.replace("\n", " "), text
    assert time.monotonic() - started < 2.0
    _one_paragraph(text)


def test_a_huge_prompts_file_is_refused_by_its_size(tmp_path: Path) -> None:
    """A sparse file of 64 MiB + 1 byte: only the bound is read, and the error says it."""
    from sparklab.inputs import MAX_PROMPTS_BYTES

    huge = tmp_path / "huge.jsonl"
    with huge.open("wb") as f:
        f.truncate(MAX_PROMPTS_BYTES + 1)
    with pytest.raises(RecipeError, match=rf"{huge}: larger than 64 MiB"):
        load_workload(str(huge))
    assert MAX_PROMPTS_BYTES == 64 * 2**20


def test_a_huge_recipe_file_is_refused_by_its_size(tmp_path: Path) -> None:
    from sparklab.inputs import MAX_TEXT_BYTES

    huge = tmp_path / "huge.yaml"
    huge.write_text("name: x\n# " + "x" * MAX_TEXT_BYTES + "\n")
    with pytest.raises(RecipeError, match=rf"{huge}: larger than 4 MiB"):
        load_recipe(huge)
    assert MAX_TEXT_BYTES == 4 * 2**20


# -- names, hosts and directories ------------------------------------------------------------------------------------

def test_a_300_character_sweep_name_is_refused_at_dry_run(tmp_path: Path, capsys) -> None:
    code, text = _cli(capsys, "sweep", str(_sweep(tmp_path, name="n" * 300)), "--dry-run",
                      "--runs-dir", str(tmp_path / "runs"))
    assert code == 2 and "name" in text and "at most 100 characters" in text, text
    _one_paragraph(text)


def test_a_100_character_sweep_name_makes_a_run_directory(tmp_path: Path, capsys) -> None:
    """The longest name allowed fits every path sparklab makes of it (run dir, tune dir, lock, log files)."""
    code, text = _cli(capsys, "sweep", str(_sweep(tmp_path, name="n" * 100)), "--dry-run",
                      "--runs-dir", str(tmp_path / "runs"))
    assert code == 0, text
    from sparklab.sweep import rundir

    for name in ("n" * 100, "tune-" + "n" * 100):  # a sweep's run, and a tune's of the same space
        run, _ = rundir.resolve(tmp_path / "runs", name, None, True)
        (run / "logs").mkdir(parents=True)
        with rundir.RunLock(run):
            (run / "logs" / ("0123456789ab-" + "e" * 60 + "-" + "m" * 60 + ".log")).write_text("fits")


@pytest.mark.parametrize("url", ["tcp://[::1", "ssh://me@[fe80::1", "tcp://spark-2:99999", "tcp://spark-2:port",
                                 "ssh://[::1]:abc"])
def test_a_malformed_host_url_is_a_one_paragraph_error(tmp_path: Path, capsys, url: str) -> None:
    with pytest.raises(RecipeError, match=r"--host: hosts\[0\]: .*is not a Docker host URL"):
        parse_hosts([url], "--host")
    code, text = _cli(capsys, "sweep", str(_sweep(tmp_path)), "--dry-run", "--host", url,
                      "--runs-dir", str(tmp_path / "runs"))
    assert code == 2 and url in text, text
    _one_paragraph(text)


def test_a_read_only_runs_directory_is_a_one_paragraph_error(tmp_path: Path, capsys) -> None:
    with tmpfs(tmp_path / "ro", "1m") as mounted:
        import subprocess

        subprocess.run(["mount", "-o", "remount,ro", str(mounted)], check=True)
        code, text = _cli(capsys, "sweep", str(_sweep(tmp_path)), "--no-download",
                          "--runs-dir", str(mounted / "runs"))
        assert code == 1 and str(mounted / "runs") in text and "read-only" in text, text
        _one_paragraph(text)
        assert not (mounted / "runs").exists()


# -- bench's sampling flags refuse what the sweep file refuses --------------------------------------------------------

@pytest.mark.parametrize("flags", [["--temperature", "nan"], ["--temperature", "inf"], ["--temperature", "-1"],
                                   ["--temperature", "101"], ["--top-p", "2"], ["--top-p", "0"],
                                   ["--top-p", "nan"]])
def test_bench_refuses_sampling_a_sweep_refuses(capsys, flags: list[str]) -> None:
    """`--temperature nan` went out as JSON null (the server's default applied silently); --top-p 2 was sent."""
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--url", "http://127.0.0.1:9/v1", *flags])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert flags[0] in err and "expected a number" in err, err


@pytest.mark.parametrize(("key", "value"), [("temperature", float("nan")), ("top_p", 2.0), ("top_p", 0.0)])
def test_the_sweep_refuses_the_same_sampling(tmp_path: Path, capsys, key: str, value: float) -> None:
    path = tmp_path / "sweep.yaml"
    doc = {"name": "s", "recipe": "cpu", "methods": ["none"], "concurrency": [1], "sampling": {key: value}}
    path.write_text(json.dumps(doc).replace("NaN", ".nan"))
    code, text = _cli(capsys, "sweep", str(path), "--dry-run", "--runs-dir", str(tmp_path / "runs"))
    assert code == 2 and f"sampling.{key}" in text, text


# -- a secret's value written into a file or an override -------------------------------------------------------------

SECRET = "hf_live_d3adb33fd3adb33fd3adb33f"  # a token-shaped value that must appear nowhere


@pytest.mark.parametrize("sets", [
    ["engines.vllm-cpu.env.HF_TOKEN=" + SECRET],
    ["engines.vllm-cpu.methods.ngram.env.VLLM_API_KEY=" + SECRET],
    ["engines.vllm-cpu.env={HF_TOKEN: " + SECRET + "}"],
], ids=["engine-env", "method-env", "whole-env"])
def test_a_sweep_files_set_holding_a_secret_is_refused_before_anything_is_stored(tmp_path: Path, capsys,
                                                                                 sets: list[str]) -> None:
    """A token in a sweep file's `set:` went into results.sqlite (the sweep document, each server's overrides) and
    into every printed command. It is refused, naming the sweep file, the key and the way to pass a secret; the value
    is printed nowhere, and no run is made."""
    path = _sweep(tmp_path, methods=["none", "ngram"], num_speculative_tokens=[1], set=sets)
    for dry in (["--dry-run"], []):
        code, text = _cli(capsys, "sweep", str(path), "--runs-dir", str(tmp_path / "runs"), *dry)
        assert code == 2, text
        assert SECRET not in text and str(path) in text, text
        name = "VLLM_API_KEY" if "VLLM_API_KEY" in sets[0] else "HF_TOKEN"
        assert f"{name}: a secret" in text and ("passes through" if name == "HF_TOKEN" else f"--env {name}") in text
        _one_paragraph(text)
        assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("results.sqlite"))


@pytest.mark.parametrize("where", ["engine", "method"])
def test_a_recipe_holding_a_secret_in_env_is_refused_naming_the_key(tmp_path: Path, where: str) -> None:
    doc = yaml.safe_load((recipes_dir() / "cpu.yaml").read_text())
    engine = doc["engines"]["vllm-cpu"]
    (engine if where == "engine" else engine["methods"]["ngram"]).setdefault("env", {})["HF_TOKEN"] = SECRET
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(doc))
    key = "engines.vllm-cpu.env.HF_TOKEN" if where == "engine" else "engines.vllm-cpu.methods.ngram.env.HF_TOKEN"
    with pytest.raises(RecipeError) as exc:
        load_recipe(path)
    text = str(exc.value) + " " + (exc.value.hint or "")
    assert f"{path}: {key}: a secret" in text and SECRET not in text, text


def test_up_set_holding_a_secret_is_refused_and_not_echoed(tmp_path: Path, capsys) -> None:
    code, text = _cli(capsys, "up", "cpu:none", "--dry-run", "--port", str(free_port()),
                      "--set", "engines.vllm-cpu.env.HF_TOKEN=" + SECRET)
    assert code == 2 and SECRET not in text and "HF_TOKEN: a secret" in text, text
    _one_paragraph(text)


def test_a_name_that_only_ends_like_a_secret_word_is_not_one(tmp_path: Path, capsys) -> None:
    """STANDIN_REASONING_TOKENS, VLLM_MAX_TOKENS_PER_KEYS: plain settings, passed and shown as before."""
    code, text = _cli(capsys, "up", "cpu:none", "--dry-run", "--port", str(free_port()), "--set",
                      "engines.vllm-cpu.env.STANDIN_REASONING_TOKENS='3'")
    assert code == 0 and "STANDIN_REASONING_TOKENS=3" in text, text


def test_a_secret_in_one_match_of_a_sweeps_overrides_is_refused_naming_where(tmp_path: Path, capsys) -> None:
    path = _sweep(tmp_path, methods=["none", "ngram"], num_speculative_tokens=[1],
                  overrides=[{"match": {"method": "ngram"}, "set": ["engines.vllm-cpu.env.HF_TOKEN=" + SECRET]}])
    code, text = _cli(capsys, "sweep", str(path), "--dry-run", "--runs-dir", str(tmp_path / "runs"))
    assert code == 2 and SECRET not in text, text
    assert f"{path}: set: or overrides: set: engines.vllm-cpu.env.HF_TOKEN: a secret" in text, text
    _one_paragraph(text)


def test_a_sweep_files_set_naming_no_key_names_the_sweep_file(tmp_path: Path, capsys) -> None:
    path = _sweep(tmp_path, set=["max_len=5"])
    code, text = _cli(capsys, "sweep", str(path), "--dry-run", "--runs-dir", str(tmp_path / "runs"))
    assert code == 2 and f"{path}: set: max_len=5: 'max_len' is neither a variable" in text, text
    _one_paragraph(text)
