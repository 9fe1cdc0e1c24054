"""`sparklab pull RECIPE|METHOD|SWEEP`: images and model checkpoints fetched before any server's clock starts.

The same rendering as `up` and `sweep` decides what is needed (one code path up to the first side effect);
images go through a `pull_image(ref)` callable (containers.Docker.ensure_image in the CLI, a fake in tests)
and checkpoints through hub.py. A sweep calls `pull()` first and records `Pulled.revisions()` with the run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparklab.errors import ImageUnavailableError
from sparklab.host import downloads as hub
from sparklab.recipes.plan import build_plan
from sparklab.recipes.render import LaunchOptions, render
from sparklab.recipes.schema import Recipe, load_recipe, read_yaml, recipes_dir, resolve
from sparklab.spec import LaunchSpec

PullImage = Callable[[str], Any]  # pulls one image ref; returns something with a `digest`, or raises
Say = Callable[[str], None]
Server = tuple[Recipe, LaunchSpec]


@dataclass
class Pulled:
    images: dict[str, str | None] = field(default_factory=dict)  # the ref pulled → its digest
    models: list[hub.Fetched] = field(default_factory=list)

    def revisions(self) -> dict[str, str]:
        """Repository → the commit it resolved to: what a run records next to its image digests."""
        return {f.checkpoint.repo_id: f.commit for f in self.models}


# ---------------------------------------------------------------------------------------------------
# What is needed (pure)


def sweep_file(text: str) -> Path | None:
    """The sweep file SPEC names (a path to one, or a name under recipes/sweeps/), else None."""
    path = Path(text)
    if path.is_file() and path.suffix in (".yaml", ".yml"):
        data = read_yaml(path)
        return path if isinstance(data, dict) and "recipe" in data and "model" not in data else None
    named = recipes_dir() / "sweeps" / f"{text}.yaml"
    return named if ":" not in text and named.is_file() else None


def servers_for(text: str, *, target: str | None = None, engine: str | None = None,
                overrides: Iterable[str] = (), hf_cache: Path | None = None,
                all_methods: bool = False) -> list[Server]:
    """Every server a sweep starts, or the one `up SPEC` starts (every engine x method with all_methods)."""
    sweep = sweep_file(text)
    if sweep is not None:
        return [(s.recipe, s.spec) for s in build_plan(sweep).servers]
    path, method = resolve(text, target)
    recipe = load_recipe(path, list(overrides))
    options = LaunchOptions(hf_cache=hf_cache) if hf_cache else LaunchOptions()
    if not all_methods:
        return [(recipe, render(recipe, engine, method, options))]
    engines = [engine] if engine else list(recipe.engines)
    return [(recipe, render(recipe, e, m, options)) for e in engines for m in recipe.engine(e)[1].methods]


# ---------------------------------------------------------------------------------------------------
# Fetching


def pull(servers: list[Server], *, pull_image: PullImage | None, models: bool = True,
         on_progress: hub.ProgressCallback | None = None, say: Say | None = None,
         endpoint: str | None = None) -> Pulled:
    """Pull each distinct image (trying its alternatives), then download each distinct checkpoint."""
    say = say or (lambda _message: None)
    pulled = Pulled()
    if pull_image is not None:
        seen: set[tuple[str, ...]] = set()
        for _, spec in servers:
            candidates = (spec.image, *spec.image_alternatives)
            if spec.runtime == "process":  # a program on this host: nothing to pull
                continue
            if candidates not in seen:
                seen.add(candidates)
                ref, digest = _pull_first_available(candidates, pull_image, say)
                pulled.images[ref] = digest
    if not models:
        return pulled
    for recipe, spec in servers:
        model_id = recipe.model_of(spec.engine).id
        if hub.host_hub_cache(spec) is None and hub.is_hub_id(model_id):
            say(f"{spec.engine}/{spec.method}: the container sees no host Hugging Face cache "
                f"(mount_hf_cache off, or HF_HOME outside the mount), so {model_id} cannot be pulled for it")
    for checkpoint in hub.plan_checkpoints(servers):
        say(f"{checkpoint.repo_id} → {checkpoint.cache_dir}")
        fetched = hub.download(checkpoint, on_progress, endpoint=endpoint)
        pulled.models.append(fetched)
        got = f"{fetched.bytes_received / 2**20:.1f} MiB in {fetched.seconds:.1f} s" if fetched.bytes_received \
            else "already in the cache"
        say(f"{checkpoint.repo_id} at {fetched.commit[:12]}: {got}")
    return pulled


def _pull_first_available(candidates: tuple[str, ...], pull_image: PullImage, say: Say) -> tuple[str, str | None]:
    for i, ref in enumerate(candidates):
        say(f"image {ref}")
        try:
            info = pull_image(ref)
        except ImageUnavailableError as exc:
            if i == len(candidates) - 1:
                raise
            say(f"{exc.message}; trying {candidates[i + 1]}")
            continue
        return ref, getattr(info, "digest", None)
    raise AssertionError("unreachable: an image always has at least one candidate")


# ---------------------------------------------------------------------------------------------------
# The command
