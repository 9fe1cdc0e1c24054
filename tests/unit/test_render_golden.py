"""Every seed command renders flag for flag; printed commands are golden files."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from sparklab.recipes.render import LaunchOptions, docker_command, render, serve_command
from sparklab.recipes.schema import load_recipe, recipes_dir

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
SEEDS = yaml.safe_load((GOLDEN / "seed_commands.yaml").read_text())


def _render(recipe: str, engine: str, method: str, **options: object):
    loaded = load_recipe(recipes_dir() / f"{recipe}.yaml")
    return render(loaded, engine, method, LaunchOptions(
        hf_cache=Path("~/.cache/huggingface").expanduser(),
        engine_cache_root=Path("~/.cache/sparklab/engine-cache").expanduser(),  # whatever SPARKLAB_CACHE says
        **options))  # type: ignore[arg-type]


@pytest.mark.parametrize("name", [n for n, case in SEEDS.items() if "argv" in case])
def test_recipe_argv_is_the_seed_command_flag_for_flag(name: str) -> None:
    case = SEEDS[name]
    spec = _render(case["recipe"], case["engine"], case["method"])
    assert list(spec.argv[: spec.recipe_argv_len]) == case["argv"].split()


def test_sglang_dspark_carries_seed_002s_three_flags_in_order() -> None:
    case = SEEDS["seed002_sglang_dspark_flags"]
    spec = _render(case["recipe"], case["engine"], case["method"])
    wanted = case["contains"].split()
    argv = list(spec.argv)
    start = argv.index(wanted[0])
    assert argv[start : start + len(wanted)] == wanted


def test_sparklab_adds_only_the_listen_address_after_the_recipe_flags() -> None:
    spec = _render("gb10", "vllm", "dspark")
    assert list(spec.argv[spec.recipe_argv_len :]) == ["--host", "127.0.0.1", "--port", "8000"]
    public = _render("gb10", "vllm", "dspark", public=True)
    assert list(public.argv[public.recipe_argv_len :]) == ["--host", "0.0.0.0", "--port", "8000"]


def test_container_settings_match_the_seed_docker_run() -> None:
    # seed 000: docker run --rm -it --gpus all --ipc=host --network=host
    #   -v ~/.cache/huggingface:/root/.cache/huggingface --entrypoint /bin/bash vllm/vllm-openai:v0.27.1
    spec = _render("gb10", "vllm", "none")
    printed = docker_command(spec, multiline=False)
    for piece in ("--gpus all", "--ipc=host", "--network=host",
                  "-v ~/.cache/huggingface:/root/.cache/huggingface", "--ulimit memlock=-1",
                  "--ulimit stack=67108864", "--init"):
        assert piece in printed
    assert spec.image == "vllm/vllm-openai:v0.27.1-aarch64"


@pytest.mark.parametrize(("recipe", "engine", "method"), [
    ("gb10", "vllm", "none"), ("gb10", "vllm", "mtp"), ("gb10", "vllm", "dflash"), ("gb10", "vllm", "dspark"),
    ("gb10", "sglang", "none"), ("gb10", "sglang", "dspark"), ("gb10", "sglang", "eagle"),
    ("gb10-modelcard", "vllm", "dspark"),
])
def test_printed_command_matches_golden(recipe: str, engine: str, method: str, monkeypatch) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    spec = _render(recipe, engine, method)
    text = docker_command(spec) + "\n"
    golden = GOLDEN / "render" / f"{recipe}.{engine}.{method}.txt"
    if not golden.exists():  # first run writes it; review and commit
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
        pytest.fail(f"wrote new golden file {golden}; review it and run again")
    assert text == golden.read_text()
    # The printed command is valid shell that splits back into the same serve argv.
    assert shlex.split(serve_command(spec).replace('"$SPARKLAB_API_KEY"', "KEY"))[1:] == [
        "KEY" if a.startswith("<redacted") else a for a in spec.argv]


def test_digest_pin_and_image_override() -> None:
    digest = "sha256:" + "0f" * 32
    recipe = load_recipe(recipes_dir() / "gb10.yaml", [f"engines.vllm.digest={digest}"])
    assert render(recipe, "vllm", "none").image == f"vllm/vllm-openai:v0.27.1-aarch64@{digest}"
    assert render(recipe, "vllm", "none").image_alternatives == ("vllm/vllm-openai:v0.27.1",)
    override = render(recipe, "vllm", "none", LaunchOptions(image="my/img:1"))
    assert override.image == "my/img:1" and override.image_alternatives == ()


def test_sglang_cookbook_spelling_is_an_alternative() -> None:
    spec = _render("gb10", "sglang", "none")
    assert spec.image == "lmsysorg/sglang:dev-nemotron3-5-lightning"
    assert spec.image_alternatives == ("lmsysorg/sglang:dev-nemotron3-5-lighting",)


@pytest.mark.parametrize(("name", "secret"), [
    ("HF_TOKEN", True), ("HUGGING_FACE_HUB_TOKEN", True), ("VLLM_API_KEY", True), ("AWS_SECRET_ACCESS_KEY", True),
    ("DB_PASSWORD", True), ("STANDIN_REASONING_TOKENS", False), ("VLLM_CPU_KVCACHE_SPACE", False),
    ("MAX_TOKENS", False), ("KEYBOARD", False),
])
def test_secret_names(name: str, secret: bool) -> None:
    from sparklab.spec import is_secret_name

    assert is_secret_name(name) is secret


def test_secret_values_travel_to_the_launch_but_are_never_shown() -> None:
    spec = _render("gb10", "vllm", "none", env=("MY_API_KEY=sekret-123", "PLAIN=1", "PASSED"))
    assert spec.secret_values == {"MY_API_KEY": "sekret-123"}
    assert spec.env["PLAIN"] == "1" and "MY_API_KEY" not in spec.env
    assert {"MY_API_KEY", "PASSED"} <= set(spec.secret_env)
    assert "sekret-123" not in repr(spec) and "sekret-123" not in docker_command(spec)
