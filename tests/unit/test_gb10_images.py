"""Images that can run on a Spark: docker/llamacpp-gb10/Dockerfile (parsed by BuildKit's own Dockerfile parser, the
`dockerfile` package, since this CPU-only machine cannot build CUDA for arm64), the recipe that runs it, and what
`sparklab check` says of an image's platform and CUDA targets against the host (imagecheck.platform_notes)."""

from __future__ import annotations

from pathlib import Path

import dockerfile
import pytest

from sparklab.engines.llamacpp import BUILD
from sparklab.recipes.render import LaunchOptions, render
from sparklab.recipes.schema import load_recipe, recipes_dir
from sparklab.runtimes.imagecheck import CUDA_LABEL, platform_notes

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "llamacpp-gb10" / "Dockerfile"


def _commands() -> list[dockerfile.Command]:
    return list(dockerfile.parse_file(str(DOCKERFILE)))


def _args(commands: list[dockerfile.Command]) -> dict[str, str]:
    return dict(c.value[0].split("=", 1) for c in commands if c.cmd == "ARG" and "=" in c.value[0])


def test_the_dockerfile_parses_and_builds_build_b11669_for_arm64_and_sm_121() -> None:
    commands = _commands()  # BuildKit's parser: a syntax error raises here
    stages = [c for c in commands if c.cmd == "FROM"]
    assert len(stages) == 2 and all("--platform=linux/arm64" in c.flags for c in stages)
    assert all(c.value[0].startswith("nvidia/cuda:${CUDA_VERSION}-") for c in stages)
    args = _args(commands)
    assert args["LLAMACPP_BUILD"] == BUILD == "b11669"  # the build the adapter was read from
    assert args["CUDA_ARCHITECTURES"].startswith("121") and args["CUDA_VERSION"].startswith("13.")
    cmake = next(c.value[0] for c in commands if c.cmd == "RUN" and "cmake -B build" in c.value[0])
    assert '-DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES}"' in cmake and "-DGGML_CUDA=ON" in cmake
    clone = next(c.value[0] for c in commands if c.cmd == "RUN" and "git clone" in c.value[0])
    assert '--branch "${LLAMACPP_BUILD}"' in clone
    label = next(c for c in commands if c.cmd == "LABEL")
    assert CUDA_LABEL in label.value and "${CUDA_ARCHITECTURES}" in label.original
    (entry,) = (c for c in commands if c.cmd == "ENTRYPOINT")
    assert entry.json and entry.value == ("/app/llama-server",)


def test_the_gb10_recipe_runs_the_image_this_dockerfile_builds() -> None:
    recipe = load_recipe(recipes_dir() / "llamacpp-gb10.yaml")
    spec = render(recipe, "llamacpp", "draft", LaunchOptions())
    assert spec.image == f"sparklab/llamacpp-gb10:{BUILD}" and spec.image_alternatives == ()
    assert f"docker build -t {spec.image} docker/llamacpp-gb10" in DOCKERFILE.read_text()
    assert spec.platform == "linux/arm64" and spec.entrypoint == ("/app/llama-server",) and spec.gpus


@pytest.mark.parametrize(("image_arch", "labels", "cap", "says"), [
    ("arm64", {CUDA_LABEL: "121a-real"}, 12.1, []),
    ("arm64", {CUDA_LABEL: "sm_121"}, 12.1, []),
    ("arm64", {CUDA_LABEL: "50;61;70;75;80;86;89;90"}, 12.1, ["is built for sm_50, sm_61", "not this GPU's sm_121"]),
    ("arm64", {}, 12.1, ["does not declare its CUDA architectures", "sm_121"]),
    ("amd64", {}, 12.1, ["is linux/amd64 but this host is linux/arm64: it cannot run here"]),
    ("arm64", {CUDA_LABEL: "121a-real"}, None, ["no GPU answered nvidia-smi here", "(sm_121a)"]),
    ("arm64", None, 12.1, ["is not here, so its CUDA architectures could not be compared with this GPU's sm_121"]),
])
def test_check_says_when_an_image_does_not_fit_the_host(image_arch: str, labels: dict[str, str] | None,
                                                        cap: float | None,
                                                        says: list[str]) -> None:
    spec = render(load_recipe(recipes_dir() / "llamacpp-gb10.yaml"), "llamacpp", "draft", LaunchOptions())
    notes = platform_notes(spec, image_arch, "aarch64", labels, cap)
    text = " | ".join(notes)
    assert all(s in text for s in says), text
    assert bool(notes) is bool(says)
