"""The user-facing parser check (`sparklab check`, every start's preflight) against real engine parsers that run on
this host: SGLang 0.5.23's prepare_server_args in the parser venv, and TensorRT Edge-LLM 0.11.0's server CLI from a
venv laid out as `pip install tensorrt-edgellm` would (its source and its package metadata). Each goes through the
same path a user's check takes: the adapter's probe, the POSIX-sh bootstrap that finds the engine's Python, the
process runtime, the adapter's verdicts; vLLM and llama.cpp, which need their images: tests/e2e."""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from pathlib import Path

import pytest

from sparklab.engines import engine
from sparklab.engines.parsers import ACCEPTED, REJECTED
from sparklab.errors import PreflightError
from sparklab.recipes.render import LaunchOptions, render
from sparklab.recipes.schema import load_recipe, recipes_dir
from sparklab.runtimes import imagecheck
from sparklab.runtimes.processes import Processes
from tests.contract.test_sglang_parser_contract import parser_python

pytestmark = pytest.mark.contract

GB10 = recipes_dir() / "gb10.yaml"
EDGELLM_SRC = Path(os.environ.get("SPARKLAB_TEST_EDGELLM_SRC") or Path(
    os.environ.get("SPARKLAB_CACHE", Path.home() / ".cache" / "sparklab")) / "edgellm-src" / "0.11.0")


def test_sglangs_own_parser_through_the_users_path_accepts_the_recipe_and_refuses_a_misspelt_flag(
        tmp_path: Path) -> None:
    python = parser_python()
    good = render(load_recipe(GB10), "sglang", "dspark", LaunchOptions())
    good = dataclasses.replace(good, entrypoint=(python, *good.entrypoint[1:]))  # the venv's Python, not the image's
    bad = dataclasses.replace(good, argv=(*good.argv, "--speculative-confg", "3"))
    checks = imagecheck.check([good, bad], Processes(), None, cache=imagecheck.Cache(tmp_path))
    assert [c.verdict.status for c in checks] == [ACCEPTED, REJECTED]
    assert checks[0].version == "0.5.23" and checks[0].warnings == []
    assert "unrecognized arguments: --speculative-confg 3" in checks[1].verdict.message
    assert 0 < checks[0].seconds < 120  # both in one run of the parser


def _edgellm_venv(tmp_path: Path, version: str = "0.11.0") -> Path:
    """bin/python (this interpreter), the server command, and site/ holding Edge-LLM's `experimental` package and
    a dist-info with the wheel's console scripts, as `pip install tensorrt-edgellm==0.11.0` lays them out."""
    if not (EDGELLM_SRC / "experimental" / "server" / "config.py").is_file():
        message = f"no Edge-LLM source at {EDGELLM_SRC}: run `bash scripts/ci/edgellm-source.sh`"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    for script in ("tensorrt-edgellm-serve", "trtedge"):  # a stray `trtedge` on the path: not this version's
        (venv / "bin" / script).write_text(f"#!{venv / 'bin' / 'python'}\n")
        (venv / "bin" / script).chmod(0o755)
    site = venv / "site"
    shutil.copytree(EDGELLM_SRC / "experimental", site / "experimental")
    info = site / f"tensorrt_edgellm-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: tensorrt-edgellm\nVersion: {version}\n")
    shutil.copy(EDGELLM_SRC / "entry_points.txt", info / "entry_points.txt")
    return venv


def _edgellm(engine_name: str, venv: Path, method: str = "dspark") -> object:
    spec = render(load_recipe(GB10, [f"vars.edgellm_venv={venv}"]), engine_name, method, LaunchOptions())
    return dataclasses.replace(spec, env={**spec.env, "PYTHONPATH": str(venv / "site")})


def test_edgellms_own_server_parser_runs_with_the_venvs_python_and_reads_its_version(tmp_path: Path) -> None:
    venv = _edgellm_venv(tmp_path)
    spec = _edgellm("edgellm-0.11.0", venv)
    (checked,) = imagecheck.check([spec], Processes(), None, cache=imagecheck.Cache(tmp_path / "cache"))
    assert checked.verdict.status == ACCEPTED, checked.verdict
    assert checked.version == "0.11.0" and "tensorrt-edgellm-serve" in checked.verdict.facts["console_scripts"]
    assert checked.warnings == []
    bad = dataclasses.replace(spec, argv=(*spec.argv, "--max-model-len", "4096"))  # vLLM's spelling, not Edge-LLM's
    with pytest.raises(PreflightError, match="unrecognized arguments: --max-model-len 4096"):
        imagecheck.preflight_one(bad, Processes(), None, cache=imagecheck.Cache(tmp_path / "cache"))


def test_edgellm_refuses_a_command_its_version_does_not_install(tmp_path: Path) -> None:
    """Seed 004's `trtedge serve` against an Edge-LLM 0.11.0 venv: the flags parse, but 0.11.0 installs only
    `tensorrt-edgellm-serve`, which the refusal names (the adapter follows the version, sparklab.engines.trtedge)."""
    venv = _edgellm_venv(tmp_path)
    (checked,) = imagecheck.check([_edgellm("edgellm", venv)], Processes(), None, cache=imagecheck.Cache(tmp_path))
    assert checked.verdict.status == REJECTED
    assert "0.11.0 installs no `trtedge`" in checked.verdict.message
    assert "its server command is `tensorrt-edgellm-serve`" in checked.verdict.message
    assert engine("trtedge").version_warning(checked.version, "x") is None  # 0.11.0 is what it was read from
