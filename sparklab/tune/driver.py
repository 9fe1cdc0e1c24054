"""`sparklab tune`: run the search of `sparklab.tune` on the sweep machinery.

The space is a sweep file (methods x K x concurrency, one workload), written into the run directory as
`tune.yaml`; the search plans its cells as it goes (`sweep.register(only=…)`) and runs them with `sweep.run`:
the same store, resume, failures confined to their cell, and report. Each round loads only the servers that
have pending cells; the rounds, loads, wall time and predictions go into the store's meta under "tune".
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sparklab import __version__
from sparklab.engines import acceptance, engine
from sparklab.errors import DiskFullError, RecipeError, SparklabError
from sparklab.recipes.hosts import Host, entry_of, parse_hosts
from sparklab.recipes.multinode import require_hosts
from sparklab.recipes.plan import Plan, TimingModel, build_plan, estimate_seconds
from sparklab.runtimes.base import HostRuntime
from sparklab.sweep import fleet, rundir, runner
from sparklab.sweep.store import Store
from sparklab.tune import search
from sparklab.tune.space import load_space, one_engine, repeats_of, space_notes, sweep_document

# load_space and space_notes moved to tune/space.py; callers keep reaching them here
__all__ = ["dry_run", "load_space", "request_for", "run_tune", "space_notes"]

SPACE_FILE = "tune.yaml"
MAX_ROUNDS = 64


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


@dataclass
class TuneOutcome:
    run_dir: Path
    state: dict[str, Any]
    interrupted: bool = False


def objective_value(summary: dict[str, Any], objective: str) -> float | None:
    """The objective from one cell's summary: aggregate tok/s, mean per-request tok/s or mean decode tok/s."""
    if objective == "aggregate":
        value = summary.get("aggregate_tps")
    else:
        value = (summary.get("per_request_tps" if objective == "per-request" else "decode_tps") or {}).get("mean")
    return None if value is None else float(value)


def observations(store: Store, plan: Plan, objective: str) -> dict[search.Config, dict[int, search.CellObs]]:
    """What the store holds per (method, K) and concurrency, as the search reads it."""
    by_server = {s.id: (s.method, s.num_speculative_tokens) for s in plan.servers}
    grouped: dict[tuple[search.Config, int], list[Any]] = {}
    for cell in store.cells():
        if cell.server_config_id in by_server:
            grouped.setdefault((by_server[cell.server_config_id], cell.concurrency), []).append(cell)
    out: dict[search.Config, dict[int, search.CellObs]] = {}
    for (config, c), cells in grouped.items():
        done = [x for x in cells if x.status == "done" and x.summary]
        values = [v for x in done if (v := objective_value(x.summary, objective)) is not None]
        ttft = [float(t["p50"]) for x in done if (t := (x.summary or {}).get("ttft_ms"))]
        positions = [p for x in done if (p := ((x.result or {}).get("speculative") or {})
                                         .get("per_position_acceptance"))]
        width = max((len(p) for p in positions), default=0)
        mean_positions = tuple(sum(float(p[i] or 0) for p in positions if i < len(p)) / len(positions)
                               for i in range(width))
        lengths = [a for x in done if (a := acceptance(x.result or {})[0]) is not None]
        out.setdefault(config, {})[c] = search.CellObs(
            tuple(values), tuple(ttft), mean_positions, sum(lengths) / len(lengths) if lengths else None,
            sum(1 for x in cells if x.status in ("done", "failed", "partial")))
    return out


def space_of(plan: Plan) -> search.Space:
    sweep_file = plan.sweep
    if len(sweep_file.workloads) != 1:
        raise RecipeError(f"{plan.source}: workloads: tune searches one workload at a time, got "
                          f"{len(sweep_file.workloads)}", "Give one workload (--workload NAME).")
    drafting = {m: any(s.num_speculative_tokens is not None for s in plan.servers if s.method == m)
                for m in sweep_file.methods}
    return search.Space(tuple(sweep_file.methods), tuple(sorted(sweep_file.num_speculative_tokens)),
                      tuple(sorted(sweep_file.concurrency)), drafting)


def write_space(run_dir: Path, space: dict[str, Any], settings: search.Settings) -> Path:
    """The space as a sweep file in the run directory: resuming reads it back, whatever the flags say then."""
    path = run_dir / SPACE_FILE
    document = {**space, "repeats": settings.max_repeats}
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def _state(store: Store) -> dict[str, Any]:
    text = store.meta().get("tune")
    return json.loads(text) if text else {}


def _settings(state: dict[str, Any]) -> search.Settings:
    return search.Settings(**state["settings"])


def settings_dict(settings: search.Settings) -> dict[str, Any]:
    return dataclasses.asdict(settings)


def hosts_of(plan: Plan) -> list[Host] | None:
    """The space file's hosts (a sweep file's hosts: or --host), None for the local engine alone; a server
    across N hosts with fewer named is an error before anything else."""
    hosts = parse_hosts(plan.sweep.hosts, plan.source) if plan.sweep.hosts else None
    for server in plan.servers:
        require_hosts(server.recipe, server.engine, len(hosts or []))
    return hosts


def run_tune(request: TuneRequest, say: runner.Say, runtime: HostRuntime | None = None,
             reach: fleet.Connect = fleet.docker_host) -> TuneOutcome:
    """Start or continue a tune. Ctrl-C tears the current server down; the same command continues it.

    runtime: where the servers run (None: this machine's, containers and host processes, as `sparklab sweep`);
    reach: how the space's other hosts are reached (a rehearsal reaches its twins)."""
    name = f"tune-{request.space['name']}"
    run_dir, exists = rundir.resolve(request.runs_dir, name, request.resume, request.new)
    run_dir.mkdir(parents=True, exist_ok=True)
    with rundir.RunLock(run_dir), rundir.fault_log(run_dir):
        rundir.check_free_space(run_dir, request.options.min_free_mib, runner.controller_of(runtime))
        path = run_dir / "results.sqlite"
        if not exists:
            space_path = write_space(run_dir, request.space, request.settings)
            plan = build_plan(space_path, run_id=run_dir.name, ulimits=request.ulimits)
            hosts_of(plan)  # a server across hosts without its hosts: said before any store is made
            store = Store.create(path, plan.sweep.model_dump(), __version__)
            with store:
                store.set_host_facts(runner.host_facts(runner.controller_of(runtime)))
                store.set_meta("tune", {"settings": settings_dict(request.settings), "objective": request.objective,
                                        "rounds": [], "loads": 0, "wall_s": 0.0})
        store = Store.open(path)
        with store:
            state = _state(store)
            if not state:
                raise SparklabError(f"{path}: a sweep's results, not a tune's", "Give a tune run to --resume.")
            plan = build_plan(run_dir / SPACE_FILE, run_id=run_dir.name, ulimits=request.ulimits)
            hosts = hosts_of(plan)
            if exists:
                say(f"continuing {run_dir} with its stored space and settings ({run_dir / SPACE_FILE})")
            for note in request.notes if not exists else ():
                say(f"tune: {note}")
            return _search(plan, store, runtime, run_dir, request, state, say, hosts, reach)


@dataclass(frozen=True)
class DryRun:
    """What `sparklab tune --dry-run` prints: the space, the next round, and bounds on loads and time."""

    plan: Plan
    space: search.Space
    settings: search.Settings
    objective: str
    run_dir: Path
    exists: bool
    next_step: search.Measure | search.Done
    max_loads: int
    eta_upper_s: float
    grid_loads: int
    grid_eta_s: float
    model: TimingModel  # the sweep's, behind both ETAs
    notes: tuple[str, ...] = ()  # what tune took from the sweep file, or left out of it
    hosts: list[Host] | None = None


def dry_run(request: TuneRequest) -> DryRun:
    """The tune's plan without starting anything: the same run resolution, space file, plan and first decision as
    a run (a stored run's space and results when it would continue one).

    At most every config is loaded once at --repeats and, if --max-repeats is larger, once more for the
    confirming repeats (a config is loaded again only when it has cells pending); failed starts retried by the
    sweep machinery are not counted. The ETA bound is those loads, each with every cell up to --max-repeats,
    on the sweep's timing model (its start time and tok/s, refined from earlier runs of the recipe)."""
    import tempfile

    name = f"tune-{request.space['name']}"
    run_dir, exists = rundir.resolve(request.runs_dir, name, request.resume, request.new)
    obs: search.Observations = {}
    settings, objective = request.settings, request.objective
    with tempfile.TemporaryDirectory() as scratch:
        if exists:
            plan = build_plan(run_dir / SPACE_FILE, run_id=run_dir.name, ulimits=request.ulimits)
            with Store.open(run_dir / "results.sqlite", readonly=True) as store:
                state = _state(store)
                if state:
                    settings, objective = _settings(state), state["objective"]
                obs = observations(store, plan, objective)
        else:
            space_path = write_space(Path(scratch), request.space, request.settings)
            plan = build_plan(space_path, run_id=run_dir.name, ulimits=request.ulimits)
    hosts = hosts_of(plan)
    space = space_of(plan)
    configs = len(plan.servers)
    max_loads = configs * (2 if settings.max_repeats > settings.repeats else 1)
    model = runner.timing_model(plan, sorted(request.runs_dir.glob("*/results.sqlite")))
    per_load = model.startup_s + model.teardown_s
    eta = estimate_seconds(plan, model) + (max_loads - configs) * per_load  # every cell at --max-repeats
    grid = tuple(dataclasses.replace(s, cells=tuple(c for c in s.cells if c.repeat < settings.repeats))
                 for s in plan.servers)
    grid_eta = estimate_seconds(dataclasses.replace(plan, servers=grid), model)  # the grid at --repeats
    return DryRun(plan, space, settings, objective, run_dir, exists, search.decide(space, settings, obs), max_loads,
                  eta, configs, grid_eta, model, () if exists else request.notes, hosts)


def _search(plan: Plan, store: Store, runtime: HostRuntime | None, run_dir: Path, request: TuneRequest,
            state: dict[str, Any], say: runner.Say, hosts: list[Host] | None = None,
            reach: fleet.Connect = fleet.docker_host) -> TuneOutcome:
    settings, objective = _settings(state), state["objective"]
    space = space_of(plan)
    runner.register(plan, store, only=lambda server, cell: False)  # every server config, no cell yet
    downloaded = False
    started = time.monotonic()
    wall_before = float(state.get("wall_s", 0.0))
    last: tuple[Any, ...] | None = None
    try:
        for _ in range(MAX_ROUNDS):
            obs = observations(store, plan, objective)
            decision = search.decide(space, settings, obs)
            if isinstance(decision, search.Done):
                state.update(_finish(space, settings, obs, decision))
                state["schedule"] = _schedule_args(plan, store, state["schedule"])
                break
            wanted = {config: decision.repeats for config in decision.configs}
            runner.register(plan, store, only=lambda server, cell, wanted=wanted: cell.repeat < wanted.get(
                (server.method, server.num_speculative_tokens), 0))
            pending = {c.server_config_id for c in store.pending_cells()}
            loading = [s.label for s in plan.servers if s.id in pending]
            marker = (decision, tuple(sorted(pending)), store.counts()["done"])
            if marker == last:
                raise SparklabError("tune made no progress: the same cells stayed pending after a round",
                                    f"See {run_dir / rundir.LOG_NAME}; run the same command again to retry.")
            last = marker
            for note in decision.notes:
                if note not in state.setdefault("notes", []):
                    say(f"tune: {note}")  # a drafter switched to measured mode: said once, when it is known
                    state["notes"].append(note)
            say(f"tune round {len(state['rounds']) + 1}: {decision.why}: load "
                f"{', '.join(loading) or 'nothing new'} ({decision.repeats} repeat(s))")
            state["rounds"].append({"why": decision.why, "configs": [search.label(c) for c in decision.configs],
                                    "repeats": decision.repeats, "loads": loading})
            state["loads"] = int(state.get("loads", 0)) + len(loading)
            store.set_meta("tune", state)
            if request.download and not downloaded:
                runner.download(plan, store, say)
                downloaded = True
            runner.run(plan, store, runtime, run_dir, request.options, say, hosts, reach=reach)
        else:
            raise SparklabError(f"tune stopped after {MAX_ROUNDS} rounds without an answer",
                                "This is a bug in the search; the run's results are kept.")
    except KeyboardInterrupt:
        store.reset_interrupted(plan.sweep.max_attempts)
        state["wall_s"] = wall_before + time.monotonic() - started
        store.set_meta("tune", state)
        return TuneOutcome(run_dir, state, interrupted=True)
    except DiskFullError:
        with contextlib.suppress(SparklabError):
            store.reset_interrupted(plan.sweep.max_attempts)
        raise
    state["wall_s"] = wall_before + time.monotonic() - started
    store.set_meta("tune", state)
    return TuneOutcome(run_dir, state)


def _finish(space: search.Space, settings: search.Settings, obs: search.Observations,
            done: search.Done) -> dict[str, Any]:
    """The picks, the predictions against what was measured, and the K schedule, as stored in meta."""
    picks = [{"concurrency": p.concurrency, "method": p.config[0], "k": p.config[1], "label": search.label(p.config),
              "mean": p.estimate.mean, "low": p.estimate.low, "high": p.estimate.high, "n": p.estimate.n,
              "best_mean": search.label(p.best_mean), "overlapping": [search.label(x) for x in p.overlapping],
              "note": p.note} for p in done.picks]
    predicted = [{"method": guess.config[0], "k": guess.config[1], "concurrency": guess.concurrency,
                  "predicted": guess.value, "acceptance_length": guess.acceptance_length, "basis": guess.basis,
                  "measured": measured} for guess, measured in search.predictions(space, settings, obs)]
    schedule = search.k_schedule(done.picks)
    return {"picks": picks, "predictions": predicted, "notes": list(done.notes),
            "schedule": {"method": schedule[0], "ranges": schedule[1]} if schedule else None}


def _schedule_args(plan: Plan, store: Store, schedule: dict[str, Any] | None) -> dict[str, Any] | None:
    """The engine's serve argument for the K schedule (None in "serve_args" when its version has none)."""
    if schedule is None:
        return None
    top = max(k for _, _, k in schedule["ranges"])
    server = next(s for s in plan.servers if s.method == schedule["method"] and s.num_speculative_tokens == top)
    versions = {row.id: row.engine_version for row in store.server_configs()}
    version = versions.get(server.id)
    adapter = engine(server.spec.kind)
    args = adapter.k_schedule_args([tuple(r) for r in schedule["ranges"]], version)
    return {**schedule, "k": top, "engine": server.engine, "engine_version": version, "serve_args": args,
            "why_not": None if args else adapter.k_schedule_why_not(version)}


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
    if choices.hosts:
        space["hosts"] = [entry_of(text, "--host").model_dump(exclude_none=True) for text in choices.hosts]
    repeats, max_repeats = repeats_of(space, choices.repeats, choices.max_repeats)
    objective = choices.objective or ("decode" if space.get("headline") == "decode" else "aggregate")
    settings = search.Settings(repeats, max_repeats, choices.tolerance, choices.ttft_max_ms)
    return TuneRequest(space, settings, objective, choices.runs_dir, choices.resume, choices.new,
                       runner.Options(choices.pull_policy), download=choices.download, ulimits=choices.ulimits,
                       notes=tuple(notes))
