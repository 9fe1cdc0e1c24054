"""Every vLLM recipe, rendered, is parsed by vLLM 0.27.1's own `vllm serve` parser and validators.

sparklab/engines/probes/vllm_args.py runs inside the real vLLM CPU image, the way `sparklab check` and every
start's preflight run it (sparklab.engines.parsers.python_probe through containers.Docker.probe: no server, no
network): the serve subparser of FlexibleArgumentParser, validate_parsed_serve_args, the tool/reasoning parser
registries, AsyncEngineArgs.from_cli_args, MambaBackendEnum and SpeculativeConfig without a checkpoint.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from sparklab.engines.parsers import python_probe
from sparklab.recipes.render import LaunchOptions, render
from sparklab.recipes.schema import list_recipes, load_recipe
from sparklab.runtimes.containers import Docker

pytestmark = pytest.mark.contract

# What the CPU build cannot judge, each with why. A flag reported unchecked that is not listed here fails
# the test, so a new recipe flag is either judged by vLLM or consciously added below.
CANNOT_JUDGE = {
    "model": "the checkpoint is needed for existence, architecture, quantization and context length",
    "--max-model-len": "compared with the model's context and KV memory at engine start",
    "--gpu-memory-utilization": "memory feasibility needs the GPU",
    "--moe-backend": "the name is checked; whether it runs this quantization on this GPU is decided at kernel selection",
    "--kv-cache-dtype": "the name is checked; fp8 support is decided by the attention backend on the GPU",
    "--mamba-backend": "the enum member is checked; flashinfer kernels need CUDA and a hybrid model",
    "--mamba-cache-mode": "the name is checked; it applies to hybrid (Mamba) models only",
    "--reasoning-parser": "the name is checked in the registry; whether it suits the chat template is not",
    "--tool-call-parser": "the name is checked in the registry; whether it suits the tool-call format is not",
    "--speculative-config": "keys, types and method are checked; the draft checkpoint (n_predict, block size, "
                            "architecture) and GPU support are not",
}


def _recipe_cases() -> list[dict[str, Any]]:
    cases = []
    for path in list_recipes():
        recipe = load_recipe(path)
        for engine, spec in recipe.engines.items():
            if spec.kind != "vllm":
                continue
            for method in spec.methods:
                # a recipe across hosts: its head's serve command (tests/unit/test_multinode.py shows the head
                # runs exactly this after `ray start --head`; the other nodes run `ray start`, not vLLM)
                launch = render(recipe, engine, method, LaunchOptions(run_id="contract"))
                cases.append({"id": f"{recipe.name}:{engine}:{method}",
                              "argv": [*launch.entrypoint[1:], *launch.argv]})
    return cases


def _mutate(argv: list[str], flag: str, value: str | None) -> list[str]:
    out = list(argv)
    if flag in out and value is not None:
        out[out.index(flag) + 1] = value
    else:
        out += [flag] if value is None else [flag, value]
    return out


# Each must be rejected, naming the flag: (id, flag to change or add, new value, flag named in the error)
BAD = [
    ("unknown-flag", "--no-such-flag", None, "--no-such-flag"),
    ("moe-backend", "--moe-backend", "marlinn", "--moe-backend"),
    ("kv-cache-dtype", "--kv-cache-dtype", "fp7", "--kv-cache-dtype"),
    ("tool-parser", "--tool-call-parser", "qwen3_coderr", "--tool-call-parser"),
    ("reasoning-parser", "--reasoning-parser", "nemotron_v4", "--reasoning-parser"),
    ("mamba-backend", "--mamba-backend", "bogus", "--mamba-backend"),
    ("spec-method", "--speculative_config.method", "dsparkk", "speculative"),
    ("spec-key", "--speculative_config.num_spec_tokens", "3", "speculative"),
    # vLLM's parser accepts any MoE backend name here, marlin included; that the MTP drafter cannot run
    # marlin is only found at start-up, which is why sparklab's preflight checks it (tests/unit).
    ("spec-moe-backend", "--speculative_config.moe_backend", "tritonn", "speculative"),
    # Not here: --distributed-executor-backend rayy. vLLM 0.27.1's parser accepts any string there (a class
    # path, vllm/config/parallel.py:243-245) and fails only at start, so sparklab refuses a vLLM server across
    # hosts without `ray` itself (tests/unit/test_multinode.py).
]


@pytest.fixture(scope="module")
def verdicts(vllm_cpu_image: str) -> dict[str, dict[str, Any]]:
    cases = _recipe_cases()
    base = next(c for c in cases if c["id"] == "gb10:vllm:dspark")["argv"]
    cases += [{"id": f"bad:{name}", "argv": _mutate(base, flag, value)} for name, flag, value, _ in BAD]
    run = Docker().probe(vllm_cpu_image, python_probe("vllm", "vllm", "vllm_args.py", cases), timeout_s=300)
    assert run.stdout, (run.error, run.stderr[-3000:])
    result = json.loads(run.stdout)
    assert result["vllm_version"].startswith("0.27.1")
    return {case["id"]: case for case in result["cases"]}


def test_every_vllm_recipe_parses_under_vllm_0_27_1(verdicts) -> None:
    ids = [c["id"] for c in _recipe_cases()]
    assert {"gb10:vllm:none", "gb10:vllm:mtp", "gb10:vllm:dflash", "gb10:vllm:dspark",
            "gb10-modelcard:vllm:dspark", "cpu:vllm-cpu:ngram", "cpu:vllm-cpu:draft_model",
            "gb10-pair:vllm:none", "gb10-pair:vllm:dspark"} <= set(ids)
    rejected = {i: [f"{e['flag']}: {e['message']}" for e in verdicts[i]["errors"]] for i in ids if not verdicts[i]["ok"]}
    assert rejected == {}, f"vLLM 0.27.1 rejects these recipes (recipe:engine:method → flag: message): {rejected}"


def test_every_unjudged_flag_is_listed_with_its_reason(verdicts) -> None:
    for case_id in (c["id"] for c in _recipe_cases()):
        unknown = {u["flag"] for u in verdicts[case_id]["unchecked"]} - set(CANNOT_JUDGE)
        assert not unknown, f"{case_id}: check_args could not judge {unknown}; judge it or list it in CANNOT_JUDGE"


@pytest.mark.parametrize(("name", "flag", "value", "named"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_value_is_rejected_naming_the_flag(verdicts, name: str, flag: str, value: str | None,
                                                  named: str) -> None:
    verdict = verdicts[f"bad:{name}"]
    assert not verdict["ok"], f"{flag} {value} was accepted"
    text = " ".join(f"{e['flag']} {e['message']}" for e in verdict["errors"])
    assert named in text, text
