"""Every llamacpp recipe, rendered, uses only flags llama-server b11669 lists in its own `--help`, and none it
lists as removed (the real llama.cpp CPU image, run with `--network none`; no server starts)."""

from __future__ import annotations

import re
import subprocess

import pytest

from sparklab.recipes.render import LaunchOptions, render
from sparklab.recipes.schema import list_recipes, load_recipe

pytestmark = pytest.mark.contract


def _help_flags(image: str) -> set[str]:
    done = subprocess.run(["docker", "run", "--rm", "--network", "none", image, "--help"],
                          capture_output=True, text=True, timeout=60)
    flags: set[str] = set()
    for line in (done.stdout + done.stderr).splitlines():
        # a flag line: "-m,    --model FNAME", "--spec-draft-model, -md, --model-draft FNAME"
        head = re.match(r"^((?:-{1,2}[\w-]+(?:,\s*)?)+)", line)
        if head:
            flags.update(f.strip() for f in head.group(1).split(",") if f.strip())
    return flags


def test_every_llamacpp_recipe_flag_is_in_llama_server_help(llamacpp_cpu_image: str) -> None:
    known = _help_flags(llamacpp_cpu_image)
    assert {"--model", "-md", "--spec-type", "--spec-draft-n-max", "--metrics"} <= known
    removed = {"--draft-max", "--draft-min"} & known
    assert removed  # still listed, as "the argument has been removed": the recipe check below must not use them
    cases = 0
    for path in list_recipes():
        recipe = load_recipe(path)
        for engine_name, spec in recipe.engines.items():
            if spec.kind != "llamacpp":
                continue
            for method in spec.methods:
                launch = render(recipe, engine_name, method, LaunchOptions(run_id="contract"))
                flags = [a.split("=", 1)[0] for a in launch.argv if a.startswith("-") and not _number(a)]
                unknown = sorted(set(flags) - known)
                assert not unknown, f"{recipe.name}:{engine_name}:{method}: llama-server has no {unknown}"
                assert not set(flags) & removed, f"{recipe.name}:{method} uses a removed flag"
                cases += 1
    assert cases >= 6


def _number(arg: str) -> bool:
    try:
        float(arg)
        return True
    except ValueError:
        return False
