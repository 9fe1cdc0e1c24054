"""Issue 11 §5: bad input fails at load, before any server starts, in one paragraph naming file, key and fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from sparklab.bench.workloads import load_workload
from sparklab.cli.main import main
from sparklab.errors import RecipeError
from sparklab.recipes.plan import build_plan
from sparklab.recipes.render import LaunchOptions, render
from sparklab.recipes.schema import load_recipe, recipes_dir
from sparklab.recipes.sweep_file import load_sweep

BASE: dict[str, Any] = {"name": "t", "recipe": "cpu", "methods": ["none"], "concurrency": [1, 4], "requests": 4}


def _write(tmp_path: Path, doc: dict[str, Any], name: str = "sweep.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize(("change", "where"), [
    ({"concurrency": [0]}, r"concurrency\[0\]: .*greater than or equal to 1"),
    ({"concurrency": [1, -4]}, r"concurrency\[1\]: .*greater than or equal to 1"),
    ({"concurrency": [5000]}, r"concurrency\[0\]: .*less than or equal to 4096"),
    ({"concurrency": [1.5]}, r"concurrency\[0\]: .*integer"),
    ({"concurrency": [4.0]}, r"concurrency\[0\]: .*integer"),
    ({"concurrency": [True]}, r"concurrency\[0\]: .*integer"),
    ({"requests": 0}, r"requests: .*greater than or equal to 1"),
    ({"requests": -3}, r"requests: .*greater than or equal to 1"),
    ({"requests": 1e29}, r"requests: "),
    ({"requests": 2_000_000}, r"requests: .*less than or equal to 1000000"),
    ({"requests": 2.5}, r"requests: .*integer"),
    ({"requests": {1: 4, 4: 0}}, r"requests\[4\]: .*greater than or equal to 1"),
    ({"requests": {1: 4, 4: 1e29}}, r"requests\[4\]: "),
    ({"requests": {0: 4}}, r"requests\[0\] \(the key\): .*greater than or equal to 1"),
    ({"repeats": 0}, r"repeats: .*expected a whole number of runs per load \(1 to 1000\) or auto"),
    ({"repeats": 100_000}, r"repeats: .*expected a whole number of runs per load \(1 to 1000\) or auto"),
    ({"duration_s": -1}, r"duration_s: .*greater than 0"),
    ({"duration_s": 8 * 86400}, r"duration_s: .*less than or equal to 604800"),
    ({"duration_s": float("inf")}, r"duration_s: "),
    ({"warmup": -1}, r"warmup: .*greater than or equal to 0"),
    ({"warmup": 10**9}, r"warmup: .*less than or equal to"),
    ({"max_attempts": 0}, r"max_attempts: .*greater than or equal to 1"),
    ({"num_speculative_tokens": [0]}, r"num_speculative_tokens\[0\]: .*greater than or equal to 1"),
    ({"num_speculative_tokens": [2.5]}, r"num_speculative_tokens\[0\]: .*integer"),
    ({"sampling": {"max_tokens": 0}}, r"sampling\.max_tokens: .*greater than or equal to 1"),
    ({"sampling": {"max_tokens": 10**12}}, r"sampling\.max_tokens: .*less than or equal to"),
    ({"sampling": {"max_tokens": 64.5}}, r"sampling\.max_tokens: .*integer"),
    ({"sampling": {"min_tokens": 0}}, r"sampling\.min_tokens: .*greater than or equal to 1"),
    ({"sampling": {"temperature": -1}}, r"sampling\.temperature: .*greater than or equal to 0"),
    ({"sampling": {"top_p": 0}}, r"sampling\.top_p: .*greater than 0"),
])
def test_out_of_range_sweep_values_name_file_and_key(tmp_path: Path, change: dict[str, Any], where: str) -> None:
    path = _write(tmp_path, {**BASE, **change})
    with pytest.raises(RecipeError, match=rf"{path}: {where}") as info:
        build_plan(path)
    assert info.value.hint


def test_a_sweep_range_error_is_one_paragraph_at_dry_run(tmp_path: Path, capsys) -> None:
    path = _write(tmp_path, {**BASE, "concurrency": [-2]})
    assert main(["sweep", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "concurrency[0]" in err and "Traceback" not in err and "ETA" not in err


@pytest.mark.parametrize(("key", "value", "message"), [
    ("engines.vllm-cpu.port", 0, r"engines\.vllm-cpu\.port: .*greater than or equal to 1"),
    ("engines.vllm-cpu.port", 70000, r"engines\.vllm-cpu\.port: .*less than or equal to 65535"),
    ("engines.vllm-cpu.port", 8000.5, r"engines\.vllm-cpu\.port: .*integer"),
    ("engines.vllm-cpu.ready_timeout_s", -5, r"engines\.vllm-cpu\.ready_timeout_s: .*greater than 0"),
    ("model.drafts.dspark.block_size", 0, r"model\.drafts\.dspark\.block_size: .*greater than or equal to 1"),
])
def test_out_of_range_recipe_values(key: str, value: Any, message: str) -> None:
    with pytest.raises(RecipeError, match=message):
        load_recipe(recipes_dir() / "cpu.yaml", [f"{key}={value}"])


@pytest.mark.parametrize("port", [0, -1, 65536, 99999])
def test_render_refuses_an_impossible_port(port: int) -> None:
    recipe = load_recipe(recipes_dir() / "cpu.yaml")
    with pytest.raises(RecipeError, match=rf"port {port}"):
        render(recipe, options=LaunchOptions(port=port))


@pytest.mark.parametrize(("argv", "message"), [
    (["render", "cpu:none", "--port", "0"], "argument --port: expected a whole number from 1 to 65535, got 0"),
    (["render", "cpu:none", "--port", "99999"], "argument --port: expected a whole number from 1 to 65535"),
    (["up", "cpu:none", "--dry-run", "--port", "x"], "argument --port: expected a whole number"),
    (["render", "cpu:ngram", "-k", "0"], "argument -k/--num-speculative-tokens: expected a whole number from 1"),
    (["bench", "--url", "http://x", "-c", "0"], "argument -c/--concurrency: expected a whole number from 1 to 4096"),
    (["bench", "--url", "http://x", "-c", "1.5"], "argument -c/--concurrency: expected a whole number"),
    (["bench", "--url", "http://x", "-n", "-1"], "argument -n/--requests: expected a whole number from 1"),
    (["bench", "--url", "http://x", "-n", "1e29"], "argument -n/--requests: expected a whole number"),
    (["bench", "--url", "http://x", "--duration", "0"], "argument --duration: expected a number above 0"),
    (["bench", "--url", "http://x", "--duration", "nan"], "argument --duration: expected a number above 0"),
    (["bench", "--url", "http://x", "--max-tokens", "0"], "argument --max-tokens: expected a whole number from 1"),
    (["bench", "--url", "http://x", "--min-tokens", "0"], "argument --min-tokens: expected a whole number from 1"),
    (["bench", "--url", "http://x", "--warmup", "-1"], "argument --warmup: expected a whole number from 0"),
    (["bench", "--url", "http://x", "--rate", "-2"], "argument --rate: expected a number above 0"),
    (["bench", "--url", "http://x", "--request-timeout", "0"], "argument --request-timeout: expected a number"),
    (["up", "cpu:none", "--ready-timeout", "-1"], "argument --ready-timeout: expected a number above 0"),
])
def test_cli_numbers_are_checked_by_argparse(argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_cli_port_is_used_as_given() -> None:
    recipe = load_recipe(recipes_dir() / "cpu.yaml")
    assert render(recipe, options=LaunchOptions(port=1)).port == 1


# -- files that are not UTF-8 ----------------------------------------------------------------------------------


def test_a_sweep_file_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes((yaml.safe_dump(BASE) + "description: café\n").encode("latin-1"))
    with pytest.raises(RecipeError, match=rf"{path}: not UTF-8 text: byte 0xe9 at offset \d+") as info:
        load_sweep(path)
    assert "UTF-8" in (info.value.hint or "")


def test_a_recipe_file_that_is_not_utf8(tmp_path: Path, capsys) -> None:
    path = tmp_path / "cpu-latin1.yaml"
    path.write_bytes((recipes_dir() / "cpu.yaml").read_bytes() + "# Señor\n".encode("latin-1"))
    with pytest.raises(RecipeError, match=r"not UTF-8 text: byte 0xf1 at offset \d+"):
        load_recipe(path)
    assert main(["render", str(path)]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_a_workload_file_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(b'"hello"\n"\xff\xfe oops"\n')
    with pytest.raises(RecipeError, match=rf"{path}: not UTF-8 text: byte 0xff at offset 9 \(line 2\)"):
        load_workload(str(path))


# -- workload files are checked when the sweep is planned ---------------------------------------------------------


@pytest.mark.parametrize(("content", "problem"), [
    (None, "no such prompts file"),
    (b"", "no prompts"),
    (b'"ok"\n{not json\n', r"prompts.jsonl:2: not valid JSON"),
    (b'"ok"\n\xff\n', "not UTF-8 text"),
])
def test_every_workload_of_a_sweep_loads_at_plan_time(tmp_path: Path, content: bytes | None, problem: str,
                                                      monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    if content is not None:
        (tmp_path / "prompts.jsonl").write_bytes(content)
    path = _write(tmp_path, {**BASE, "workloads": ["seed", "prompts.jsonl"]})
    with pytest.raises(RecipeError, match=rf"{path}: workloads\[1\]: .*{problem}"):
        build_plan(path)
    assert main(["sweep", str(path), "--dry-run", "--runs-dir", str(tmp_path / "runs")]) == 2
    assert "workloads[1]" in capsys.readouterr().err


def test_an_unknown_builtin_workload_is_a_plan_error(tmp_path: Path) -> None:
    path = _write(tmp_path, {**BASE, "workloads": ["sede"]})
    with pytest.raises(RecipeError, match=rf"{path}: workloads\[0\]: unknown workload 'sede'"):
        build_plan(path)
