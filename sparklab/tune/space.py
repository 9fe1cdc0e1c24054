"""A sweep file as `sparklab tune`'s space (pure): what tune takes from each of its settings, and what it says it
leaves out. The search runs over method x K of one engine and one workload; everything else is the sweep's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sparklab.errors import RecipeError
from sparklab.recipes.sweep_file import load_sweep

# Any: a sweep file's document as YAML gives it (validated by load_sweep, kept as the user wrote it)


def load_space(text: str) -> dict[str, Any] | None:
    """A sweep file's document when text names one (a path, or a name under recipes/sweeps), else None.

    The search is over method x K of one engine and one workload: of a sweep file that names several engines
    (cpu-demo: vLLM and llama.cpp), the first, with the exclusions that concern the others dropped; of several
    workloads (seed004), the first (`--workload` picks another). Every other setting is the sweep's own (see
    `space_notes` for what tune does with each)."""
    found = sweep_document(text)
    return None if found is None else one_engine(found[0], None)


def sweep_document(text: str) -> tuple[dict[str, Any], Path] | None:
    from sparklab.recipes.schema import recipes_dir

    for candidate in (Path(text), recipes_dir() / "sweeps" / f"{text}.yaml"):
        if candidate.suffix in (".yaml", ".yml") and candidate.is_file():
            document = load_sweep(candidate).model_dump(exclude_unset=True)
            recipe = Path(document["recipe"])
            if recipe.suffix in (".yaml", ".yml") and not recipe.is_absolute():
                document["recipe"] = str((candidate.parent / recipe).resolve())
            return document, candidate
    return None


def one_engine(document: dict[str, Any], chosen: str | None) -> dict[str, Any]:
    engines = document.get("engines") or []
    if chosen is None and len(engines) <= 1:
        return document
    engine_name = chosen or engines[0]
    document = {**document, "engines": [engine_name]}
    document["exclude"] = [m for m in document.get("exclude", []) if m.get("engine") in (None, engine_name)]
    return document


def space_notes(document: dict[str, Any], engine_name: str | None, workload: str | None,
                objective: str | None = None) -> list[str]:
    """What tune does with a sweep file's settings that a grid sweep uses differently, said once in the plan.

    Everything else carries over as the sweep runs it: recipe, set/overrides/exclude, requests or duration_s,
    warmup, stream, sampling, max_attempts, require_ok, the timeouts, memory_floor_gib, load_stall_s and hosts."""
    notes = []
    engines = document.get("engines") or []
    if len(engines) > 1 and engine_name is None:
        notes.append(f"the sweep file names {len(engines)} engines; tune searches {engines[0]} (the first; "
                     f"--engine picks another of {', '.join(engines)})")
    workloads = document.get("workloads") or []
    if len(workloads) > 1 and workload is None:
        notes.append(f"the sweep file names {len(workloads)} workloads; tune searches {workloads[0]} (the first; "
                     f"--workload picks another of {', '.join(workloads)})")
    if objective is None and document.get("headline", "seed000") == "seed000" and len(document["concurrency"]) > 1:
        notes.append("the sweep's headline is per-request tok/s at C=1 and aggregate tok/s above; tune maximises "
                     "one objective at every concurrency: aggregate tok/s (--objective per-request for C=1's)")
    if document.get("repeats") == "auto":
        auto = {"min": 3, "max": 8, **document.get("auto_repeats", {})}
        notes.append(f"repeats: auto: {auto['min']} repeat(s) per measured config, up to {auto['max']} where its "
                     "interval overlaps the best's; auto_repeats.target is not used (tune stops repeating once a "
                     "pick is told apart from the rest, or at the maximum)")
    return notes


def repeats_of(space: dict[str, Any], given: int | None, given_max: int | None) -> tuple[int, int]:
    """(repeats, max_repeats): the flags, else the sweep file's (`auto`: auto_repeats.min and .max), else 2 and
    twice --repeats."""
    auto = {"min": 3, "max": 8, **space.get("auto_repeats", {})} if space.get("repeats") == "auto" else None
    repeats = given or (auto["min"] if auto else int(space.get("repeats", 2)))
    max_repeats = given_max or (max(repeats, auto["max"]) if auto else 2 * repeats)
    if max_repeats < repeats:
        raise RecipeError(f"tune: --max-repeats {max_repeats} is below --repeats {repeats}",
                          "Give --max-repeats at least --repeats (equal: no extra repeats).")
    return repeats, max_repeats
