"""Every TensorRT Edge-LLM recipe, rendered, is parsed by Edge-LLM's own server parser and validation.

experimental/server/config.py of tensorrt-edgellm 0.11.0 (`parse_server_config`, config.py:376-430: argparse plus
SpeculativeConfig/ContextCacheConfig/ApiConfig validation) imports only the standard library, so it loads here
without a GPU or TensorRT. scripts/ci/edgellm-source.sh fetches it once (scripts/test.sh runs it); seed 004 names
0.11.1, which the package index does not hold, and whose `trtedge serve` is assumed to take the same flags.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from sparklab.engines.trtedge import METHODS, NEEDS_DRAFT, SPEC_KEYS
from sparklab.recipes.render import LaunchOptions, render
from sparklab.recipes.schema import list_recipes, load_recipe
from sparklab.spec import API_KEY_PLACEHOLDER

DEFAULT_SRC = Path(os.environ.get("SPARKLAB_CACHE", Path.home() / ".cache" / "sparklab")) / "edgellm-src" / "0.11.0"


@pytest.fixture(scope="module")
def source() -> Path:
    path = Path(os.environ.get("SPARKLAB_TEST_EDGELLM_SRC") or DEFAULT_SRC)
    if not (path / "experimental" / "server" / "config.py").is_file():
        message = f"no Edge-LLM source at {path}: run `bash scripts/ci/edgellm-source.sh` (scripts/test.sh does)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="module")
def config(source: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("edgellm_server_config", source / "experimental/server/config.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cases() -> list[tuple[str, list[str], str]]:
    cases = []
    for path in list_recipes():
        recipe = load_recipe(path)
        for engine, spec in recipe.engines.items():
            if spec.kind != "trtedge":
                continue
            for method in spec.methods:
                launch = render(recipe, engine, method, LaunchOptions(run_id="contract"))
                argv = [*launch.entrypoint[1:], *launch.argv]
                program = Path(launch.entrypoint[0]).name
                if program == "trtedge":  # seed 004's 0.11.1 command: `trtedge serve` then the server's own flags
                    assert argv[0] == "serve"
                    argv = argv[1:]
                cases.append((f"{recipe.name}:{engine}:{method}", argv, program))
    return cases


CASES = _cases()


def test_there_are_edgellm_recipes_to_check() -> None:
    ids = {case[0] for case in CASES}
    assert {"gb10:edgellm:none", "gb10:edgellm:dspark", "gb10:edgellm-0.11.0:dspark"} <= ids


@pytest.mark.parametrize(("argv", "program"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_edgellm_parses_every_recipe(config: ModuleType, argv: list[str], program: str) -> None:
    parsed: Any = config.parse_server_config([a.replace(API_KEY_PLACEHOLDER, "k") for a in argv])
    assert parsed.model.model == "nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4"
    assert parsed.model.max_batch_size == 1  # seed 004: batch 1
    assert parsed.api.host == "127.0.0.1" and parsed.api.api_key == "k"
    speculative = parsed.model.speculative_config
    if "--speculative-config" in argv:
        assert (speculative.method, speculative.num_speculative_tokens) == ("dspark", 3)
        assert speculative.draft_model == "nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4-DSpark"
    else:
        assert speculative is None


def test_the_console_script_the_recipe_runs_is_the_packages(source: Path) -> None:
    """0.11.0 installs `tensorrt-edgellm-serve` (entry_points.txt) and no `trtedge`; engine edgellm-0.11.0 runs
    the former, engine edgellm seed 004's `trtedge serve` (0.11.1)."""
    scripts = dict(line.split(" = ", 1) for line in (source / "entry_points.txt").read_text().splitlines()
                   if " = " in line)
    assert scripts["tensorrt-edgellm-serve"] == "experimental.server.cli:main"
    assert "trtedge" not in scripts
    assert {program for _, _, program in CASES} == {"tensorrt-edgellm-serve", "trtedge"}


def test_the_adapter_knows_the_parsers_methods_and_keys(config: ModuleType) -> None:
    """What sparklab's preflight refuses, Edge-LLM refuses too (so the adapter's lists are not stale)."""
    for method in METHODS:
        raw = json.dumps({"method": method, "model": "d"})
        assert config.SpeculativeConfig.parse(raw).method == method
    for method in NEEDS_DRAFT:
        with pytest.raises(config.ServerConfigError, match="requires"):
            config.SpeculativeConfig.parse(json.dumps({"method": method}))
    with pytest.raises(config.ServerConfigError, match="unsupported"):
        config.SpeculativeConfig.parse('{"method": "dspark", "model": "d", "draft_tensor_parallel_size": 1}')
    assert config.SpeculativeConfig.parse('{"method": "mtp"}').method == "mtp"
    assert config.SpeculativeConfig.parse(json.dumps(dict.fromkeys(SPEC_KEYS, "d") | {
        "method": "dspark", "num_speculative_tokens": 3})).num_speculative_tokens == 3  # every key we allow it allows


def test_a_wrong_flag_is_refused_by_the_parser(config: ModuleType) -> None:
    """The contract can fail: a vLLM spelling Edge-LLM does not have is an argparse error."""
    with pytest.raises(SystemExit):
        config.parse_server_config(["m", "--max-model-len", "4096"])
