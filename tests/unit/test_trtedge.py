"""TensorRT Edge-LLM: seed 004's command from the gb10 recipe, the adapter's preflight, and process-engine
recipes' validation (the runtime key)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from sparklab.errors import PreflightError, RecipeError
from sparklab.recipes.render import LaunchOptions, launch_command, render
from sparklab.recipes.schema import load_recipe, recipes_dir
from sparklab.runtimes.launch import checked

SEED004 = "trtedge serve nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4"
DSPARK = '{"method": "dspark", "num_speculative_tokens": 3, "model": "nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4-DSpark"}'


def _spec(method: str, engine: str = "edgellm", **options: Any):
    return render(load_recipe(recipes_dir() / "gb10.yaml"), engine, method, LaunchOptions(**options))


def test_render_reproduces_seed_004s_trtedge_serve_command() -> None:
    spec = _spec("none")
    assert spec.runtime == "process" and spec.kind == "trtedge"
    assert spec.entrypoint == (str(Path("~/.venvs/edgellm/bin/trtedge").expanduser()),)
    command = launch_command(spec, multiline=False)
    assert command.startswith("~/.venvs/edgellm/bin/" + SEED004 + " --max-batch-size 1 --host 127.0.0.1 --port 8000")
    assert command.endswith('--api-key "$SPARKLAB_API_KEY"') and "docker" not in command
    assert not spec.mounts and spec.image == spec.entrypoint[0]  # a host program: nothing mounted, no image


def test_dspark_k3_is_edgellms_own_speculative_config() -> None:
    spec = _spec("dspark")
    argv = list(spec.argv)
    assert argv[argv.index("--speculative-config") + 1] == DSPARK
    sp = spec.speculative
    assert sp and (sp.method, sp.num_speculative_tokens) == ("dspark", 3)
    pasted = shlex.split(launch_command(spec, multiline=False))[1:]  # paste-ready: the same argv, key as a variable
    assert pasted == [a.replace("<redacted:api-key>", "$SPARKLAB_API_KEY") for a in argv]
    assert _spec("dspark", num_speculative_tokens=5).speculative.num_speculative_tokens == 5  # type: ignore[union-attr]


def test_the_0_11_0_console_script_takes_the_model_first() -> None:
    spec = _spec("dspark", engine="edgellm-0.11.0")
    assert spec.entrypoint[0].endswith("/bin/tensorrt-edgellm-serve")
    assert spec.argv[0] == "nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4"


@pytest.mark.parametrize(("config", "message"), [
    ('{"method": "dspark", "num_speculative_tokens": 3}', "needs a draft model"),
    ('{"method": "dspark", "model": "d", "draft_tensor_parallel_size": 1}', "refuses --speculative-config keys"),
    ('{"method": "medusa", "model": "d"}', "has no speculative method 'medusa'"),
    ("{method: dspark}", "must be a JSON object"),
    ('{"method": "dspark", "model": "d", "num_speculative_tokens": 0}', "must be a positive integer"),
], ids=["no-draft", "unknown-key", "unknown-method", "not-json", "k0"])
def test_preflight_refuses_what_edgellm_refuses(gb10_doc: dict[str, Any], write_recipe, config: str,
                                                message: str) -> None:
    gb10_doc["engines"]["edgellm"]["methods"]["dspark"]["args"] = ["--speculative-config", config]
    recipe = load_recipe(write_recipe(gb10_doc))
    with pytest.raises(PreflightError, match=message):
        checked(recipe, render(recipe, "edgellm", "dspark"), check_host=False)


def test_a_process_engine_with_an_image_is_a_recipe_error(gb10_doc: dict[str, Any], write_recipe) -> None:
    gb10_doc["engines"]["edgellm"]["image"] = "nvcr.io/x:1"
    with pytest.raises(RecipeError, match=r"engines\.edgellm\.image: a process engine \(runtime: process\) runs no "
                                          r"image") as err:
        load_recipe(write_recipe(gb10_doc))
    assert "custom.yaml" in err.value.message and "Remove image" in (err.value.hint or "")


def test_a_container_engine_needs_an_image_and_no_venv(gb10_doc: dict[str, Any], write_recipe) -> None:
    del gb10_doc["engines"]["vllm"]["image"]
    with pytest.raises(RecipeError, match=r"engines\.vllm\.image: missing; a container engine needs an image"):
        load_recipe(write_recipe(gb10_doc))
    gb10_doc["engines"]["vllm"]["image"] = "x/y:1"
    gb10_doc["engines"]["vllm"]["venv"] = "/opt/v"
    with pytest.raises(RecipeError, match=r"engines\.vllm\.venv: only a process engine runs from a venv"):
        load_recipe(write_recipe(gb10_doc))


def test_an_unknown_runtime_names_the_key(gb10_doc: dict[str, Any], write_recipe) -> None:
    gb10_doc["engines"]["edgellm"]["runtime"] = "podman"
    with pytest.raises(RecipeError, match=r"engines\.edgellm\.runtime: Input should be 'container' or 'process'"):
        load_recipe(write_recipe(gb10_doc))


def test_startup_facts_and_known_failures_from_edgellms_own_lines() -> None:
    from sparklab.engines import engine

    adapter = engine("trtedge")
    log = ("12:00:01 INFO     edgellm.server: Loaded model=nvidia/N max_model_len=8192 kv_cache_dtype=fp8 "
           "speculative_decoding=True context_reuse=False\nINFO:     Application startup complete.\n")
    facts = adapter.parse_startup(log)
    assert facts.startup_complete and "speculative decoding True" in facts.advice[0]
    assert not adapter.parse_startup(log.splitlines()[0]).startup_complete
    assert "TensorRT or CUDA" in (adapter.explain_failure("TensorRT prerequisite error: libnvinfer") or "")
    assert "refused its command line" in (adapter.explain_failure("invalid server configuration: bad") or "")
    assert adapter.ready_path == "/health/ready" and not adapter.ready_needs_key


def test_seed004_sweep_plans_seed_004s_table() -> None:
    """recipes/sweeps/seed004.yaml: Edge-LLM as the seed ran it, none vs DSpark K=3, its three workloads at
    batch 1, output cap 128, thinking on, and seed 004's columns first in the report."""
    from sparklab.recipes.plan import build_plan

    plan = build_plan(recipes_dir() / "sweeps" / "seed004.yaml", run_id="t")
    assert [(s.engine, s.method, s.spec.speculative and s.spec.speculative.num_speculative_tokens)
            for s in plan.servers] == [("edgellm", "none", None), ("edgellm", "dspark", 3)]
    assert all(s.spec.runtime == "process" and s.spec.entrypoint[0].endswith("/bin/trtedge") for s in plan.servers)
    assert all(s.spec.argv[:2] == ("serve", "nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4")
               for s in plan.servers)
    cells = {(c.workload, c.concurrency) for c in plan.servers[0].cells}  # each repeated (repeats: auto)
    assert cells == {("speedbench-1k", 1), ("speedbench-2k", 1), ("humaneval", 1)}
    sampling = plan.sweep.sampling
    assert (sampling.max_tokens, sampling.enable_thinking) == (128, True)
    assert plan.sweep.headline == "decode"


def test_requests_to_edgellm_carry_only_fields_its_api_takes() -> None:
    from sparklab.engines import engine
    from sparklab.errors import SparklabError
    from sparklab.records import Sampling

    adapter = engine("trtedge")
    body = adapter.request_sampling(Sampling(max_tokens=128, enable_thinking=True)).body("m", [], stream=True)
    assert "return_token_ids" not in body and body["chat_template_kwargs"] == {"enable_thinking": True}
    assert Sampling(max_tokens=1).body("m", [], stream=True)["return_token_ids"] is True  # vLLM's is kept
    with pytest.raises(SparklabError, match="cannot force the output length"):
        adapter.request_sampling(Sampling(max_tokens=128, ignore_eos=True))
