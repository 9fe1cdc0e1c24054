"""What `sparklab tune` was asked (TuneChoices) turned into what it runs (TuneRequest): a sweep file's space with the
flags laid over it, or a recipe's space made of the flags alone; the settings of its search, the SLO checked."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparklab.bench import slo as slos
from sparklab.errors import RecipeError
from sparklab.recipes.hosts import entry_of
from sparklab.sweep import runner
from sparklab.tune import search
from sparklab.tune.space import one_engine, repeats_of, space_notes, sweep_document


@dataclass(frozen=True)
class TuneRequest:
    space: dict[str, Any]  # a sweep file's document: the space to search
    settings: search.Settings
    objective: str = "aggregate"
    runs_dir: Path = Path("runs")
    resume: str | None = None
    new: bool = False
    options: runner.Options = field(default_factory=runner.Options)
    download: bool = True
    ulimits: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # what tune took from the sweep file, or left out of it, and why
    source: str = ""  # the space as given (a sweep file's path or name, or a recipe): what errors name



@dataclass(frozen=True)
class TuneChoices:
    """What `sparklab tune` was asked, before the space is read: a sweep file (a path, or a name under
    recipes/sweeps) whose space these narrow, or a recipe whose space they make (then methods and concurrency are
    needed). Empty or None means: the sweep file's value, else the default `request_for` names."""

    space: str
    engine: str | None = None  # default: the sweep file's first engine, else the recipe's default
    methods: tuple[str, ...] = ()
    k: tuple[int, ...] = ()  # num_speculative_tokens to consider (default 1-3 on a recipe)
    concurrency: tuple[int, ...] = ()
    workload: str | None = None
    objective: str | None = None  # default: decode for a sweep file with headline: decode, else aggregate
    ttft_max_ms: float | None = None
    slo: str | None = None  # "tpot_p90<=50ms,ttft_p90<=500ms": only configs that meet it (default: the sweep's)
    grid: bool = False  # load every config first (the full grid), then the same verdict rules
    repeats: int | None = None  # default: the sweep file's (auto_repeats.min for repeats: auto), else 2
    max_repeats: int | None = None  # default: auto_repeats.max for repeats: auto, else 2 x repeats
    requests: int | None = None
    max_tokens: int | None = None
    tolerance: float = 0.15
    runs_dir: Path = Path("runs")
    resume: str | None = None
    new: bool = False
    pull_policy: str = "missing"
    ulimits: tuple[str, ...] = ()
    download: bool = True
    hosts: tuple[str, ...] = ()  # --host: Docker hosts, as a sweep file's hosts:


def _one_sampling(space: dict[str, Any]) -> list[str]:
    """Tune picks a method and K for one sampling: a sampling value the sweep file lists (a load axis of a quality
    sweep: temperature, top_p, max_tokens) is searched at its first value, as the first workload is; said once."""
    sampling = dict(space.get("sampling") or {})
    notes = []
    for key, value in sampling.items():
        if isinstance(value, list):
            sampling[key] = value[0]
            if len(value) > 1:
                flag = "; --max-tokens picks another" if key == "max_tokens" else ""
                notes.append(f"sampling.{key} lists {len(value)} values; tune searches at {value[0]} (the first"
                             f"{flag}); `sparklab sweep` runs every value")
    if sampling:
        space["sampling"] = sampling
    return notes


def request_for(choices: TuneChoices) -> TuneRequest:
    """The request for these choices: a sweep file's space with the choices laid over it, or a recipe's space made
    of the choices alone."""
    found = sweep_document(choices.space)
    notes: list[str] = []
    if found is not None:
        notes = space_notes(found[0], choices.engine, choices.workload, choices.objective)
        space = one_engine(found[0], choices.engine)
    else:
        if not choices.methods or not choices.concurrency:
            raise RecipeError(f"tune {choices.space}: not a sweep file, so --methods and --concurrency give the space",
                              f"e.g. sparklab tune {choices.space} --methods none ngram --k 1-4 --concurrency 1 4")
        recipe = Path(choices.space)
        space = {"name": recipe.stem if recipe.suffix in (".yaml", ".yml") else choices.space,
                 "recipe": str(recipe.resolve()) if recipe.suffix in (".yaml", ".yml") else choices.space,
                 "num_speculative_tokens": [1, 2, 3], "repeats": 2}
        if choices.engine:
            space["engines"] = [choices.engine]
    for key, value in (("methods", list(choices.methods)), ("num_speculative_tokens", list(choices.k)),
                       ("concurrency", list(choices.concurrency)), ("requests", choices.requests)):
        if value:
            space[key] = value
    space["workloads"] = [choices.workload] if choices.workload else space.get("workloads", ["seed"])[:1]
    if choices.max_tokens:
        space["sampling"] = {**space.get("sampling", {}), "max_tokens": choices.max_tokens}
    notes += _one_sampling(space)
    if choices.hosts:
        space["hosts"] = [entry_of(text, "--host").model_dump(exclude_none=True) for text in choices.hosts]
    repeats, max_repeats = repeats_of(space, choices.repeats, choices.max_repeats)
    objective = choices.objective or ("decode" if space.get("headline") == "decode" else "aggregate")
    slo = choices.slo if choices.slo is not None else space.pop("slo", None)
    space.pop("slo", None)
    slos.check_flag(slo, f"tune {choices.space}: ")
    settings = search.Settings(repeats, max_repeats, choices.tolerance, choices.ttft_max_ms, slo,
                               "grid" if choices.grid else "search")
    return TuneRequest(space, settings, objective, choices.runs_dir, choices.resume, choices.new,
                       runner.Options(choices.pull_policy), download=choices.download, ulimits=choices.ulimits,
                       notes=tuple(notes), source=choices.space)
