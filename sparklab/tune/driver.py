"""`sparklab tune`: run the search of `sparklab.tune` on the sweep machinery.

The space is a sweep file (methods x K x concurrency, one workload), written into the run directory as
`tune.yaml`; the search plans its cells as it goes (`sweep.register(only=…)`) and runs them with `sweep.run`:
the same store, resume, failures confined to their cell, and report. Each round loads only the servers that
have pending cells; the rounds, loads, wall time and predictions go into the store's meta under "tune".
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sparklab import __version__, outputs
from sparklab.bench import slo as slos
from sparklab.engines import acceptance, engine
from sparklab.errors import DiskFullError, IncompleteRunError, RecipeError, SparklabError
from sparklab.recipes.hosts import Host, parse_hosts
from sparklab.recipes.multinode import require_hosts
from sparklab.recipes.plan import Plan, ServerConfig, TimingModel, build_plan, estimate_seconds, variant
from sparklab.runtimes.base import HostRuntime
from sparklab.sweep import downloads, fleet, lossless, provenance, rundir, runner
from sparklab.sweep.store import Store
from sparklab.sweep.store_rows import HOST_LOST
from sparklab.tune import search, verdict
from sparklab.tune.request import TuneChoices, TuneRequest, request_for
from sparklab.tune.space import load_space, space_notes

# load_space and space_notes moved to tune/space.py, the request to tune/request.py; callers keep reaching them here
__all__ = ["TuneChoices", "TuneRequest", "dry_run", "load_space", "request_for", "run_tune", "space_notes"]

SPACE_FILE = "tune.yaml"
MAX_ROUNDS = 64
_DRIFT_FIX = ("Start a new tune for the changed setup (`sparklab tune SPACE --new`), or put the old recipe back to "
              "continue this one.")


@dataclass
class TuneOutcome:
    run_dir: Path
    state: dict[str, Any]
    interrupted: bool = False


# Any: a cell summary as stored (JSON)
def objective_value(summary: dict[str, Any], objective: str) -> float | None:
    """The objective from one cell's summary: aggregate tok/s, mean per-request tok/s or mean decode tok/s."""
    if objective == "aggregate":
        value = summary.get("aggregate_tps")
    else:
        value = (summary.get("per_request_tps" if objective == "per-request" else "decode_tps") or {}).get("mean")
    return None if value is None else float(value)


def _cell_obs(cells: list[Any], objective: str, terms: tuple[slos.Term, ...], changed: str | None = None
              ) -> search.CellObs:
    done = sorted((x for x in cells if x.status == "done" and x.summary), key=lambda x: x.repeat)
    pairs = [(x, v) for x in done if (v := objective_value(x.summary, objective)) is not None]
    ttft = [float(t["p50"]) for x in done if (t := (x.summary or {}).get("ttft_ms"))]
    positions = [p for x in done if (p := ((x.result or {}).get("speculative") or {})
                                     .get("per_position_acceptance"))]
    width = max((len(p) for p in positions), default=0)
    mean_positions = tuple(sum(float(p[i] or 0) for p in positions if i < len(p)) / len(positions)
                           for i in range(width))
    lengths = [a for x in done if (a := acceptance(x.result or {})[0]) is not None]
    loads = tuple(str(((x.result or {}).get("server_load") or {}).get("id") or "") for x, _ in pairs)
    slo = {term.key: tuple(v for x, _ in pairs if (v := slos.cell_value(x.result or {"summary": x.summary}, term))
                           is not None) for term in terms}
    return search.CellObs(
        tuple(v for _, v in pairs), tuple(ttft), mean_positions, sum(lengths) / len(lengths) if lengths else None,
        sum(1 for x in cells if x.status in ("done", "failed", "partial")), loads, slo, changed)


NO_DRAFTING: search.Config = ("none", None)  # the baseline a drafting config's answers must equal


def _changed(cells: list[Any], baseline: list[Any], answers: Callable[[], dict[str, list[dict[str, Any]]]]
             ) -> str | None:
    """How a drafting config's answers at one concurrency differ from the baseline's there at temperature 0 (the
    report's equality check, sparklab.outputs.equality), or None when they do not or cannot be compared. `answers`
    reads the stored ones, only when there is something to compare."""
    done = [x for x in cells if x.status == "done"]
    sampling = dict((done[0].settings or {}).get("sampling") or {}) if done else {}
    if not done or not baseline or not outputs.checkable(sampling)[0]:
        return None
    stored = answers()
    found = outputs.equality([a for x in done for a in stored.get(x.id, [])],
                             [a for x in baseline if x.status == "done" for a in stored.get(x.id, [])], sampling)
    return found.describe() if found.differs else None


def observations(store: Store, plan: Plan, objective: str, terms: tuple[slos.Term, ...] = (),
                 servers: list[ServerConfig] | None = None) -> dict[search.Config, dict[int, search.CellObs]]:
    """What the store holds per (method, K) and concurrency, as the search reads it (servers: only these); a
    drafting config whose answers differ from the baseline's at temperature 0 is marked (never a pick), but for
    synthetic acceptance, whose answers must differ (it keeps drafts the target would reject)."""
    by_server = {s.id: (s.method, s.num_speculative_tokens) for s in (servers or plan.servers)}
    synthetic = _synthetic_configs(plan)
    grouped: dict[tuple[search.Config, int], list[Any]] = {}
    for cell in store.cells():
        if cell.server_config_id in by_server:
            grouped.setdefault((by_server[cell.server_config_id], cell.concurrency), []).append(cell)
    answers = functools.cache(store.outputs)  # read once a round, and only at temperature 0
    out: dict[search.Config, dict[int, search.CellObs]] = {}
    for (config, c), cells in grouped.items():
        baseline = grouped.get((NO_DRAFTING, c), []) if config[1] is not None and config not in synthetic else []
        out.setdefault(config, {})[c] = _cell_obs(cells, objective, terms, _changed(cells, baseline, answers))
    return out


def _say_changed(obs: dict[search.Config, dict[int, search.CellObs]], state: dict[str, Any], say: runner.Say
                 ) -> None:
    """Once per config and concurrency: its answers changed, so the search passes it over however fast it is."""
    for config, by_c in obs.items():
        for c, cell in sorted(by_c.items()):
            where = f"{search.label(config)} at C={c}"
            if cell.changed and where not in state.setdefault("changed_output", []):
                say(f"tune: {where}: its answers differ from none's at temperature 0 (identical: {cell.changed}), "
                    "so it is not a candidate, however fast")
                state["changed_output"].append(where)


def space_of(plan: Plan) -> search.Space:
    sweep_file = plan.sweep
    if len(sweep_file.workloads) != 1:
        raise RecipeError(f"{plan.source}: workloads: tune searches one workload at a time, got "
                          f"{len(sweep_file.workloads)}", "Give one workload (--workload NAME).")
    drafting = {m: any(s.num_speculative_tokens is not None for s in plan.servers if s.method == m)
                for m in sweep_file.methods}
    return search.Space(tuple(sweep_file.methods), tuple(sorted(sweep_file.num_speculative_tokens)),
                      tuple(sorted(sweep_file.concurrency)), drafting)


# Any: the space file's YAML document
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


# Any: JSON kept in the tune's state file
def settings_dict(settings: search.Settings) -> dict[str, Any]:
    return dataclasses.asdict(settings)


def hosts_of(plan: Plan) -> list[Host] | None:
    """The space file's hosts (a sweep file's hosts: or --host), None for the local engine alone; a server
    across N hosts with fewer named is an error before anything else."""
    hosts = parse_hosts(plan.sweep.hosts, plan.source) if plan.sweep.hosts else None
    for server in plan.servers:
        require_hosts(server.recipe, server.engine, len(hosts or []))
    return hosts


def _new_plan(space_path: Path, request: TuneRequest, run_id: str) -> Plan:
    """The plan of a space tune has just written: its errors name the space as the user gave it, not the file tune
    derived from it (a scratch file for a dry run, gone by the time the error is read)."""
    try:
        return build_plan(space_path, run_id=run_id, ulimits=request.ulimits)
    except RecipeError as exc:
        derived = f"{space_path}: "
        if not request.source or not exc.message.startswith(derived):
            raise
        raise RecipeError(f"tune {request.source} (the space it searches): {exc.message[len(derived):]}",
                          exc.hint) from None


def run_tune(request: TuneRequest, say: runner.Say, runtime: HostRuntime | None = None,
             reach: fleet.Connect | None = None) -> TuneOutcome:
    """Start or continue a tune. Ctrl-C tears the current server down; the same command continues it.

    runtime: where the servers run (None: this machine's, containers and host processes, as `sparklab sweep`);
    reach: how the space's other hosts are reached (a rehearsal reaches its twins)."""
    name = f"tune-{request.space['name']}"
    run_dir, exists = rundir.resolve(request.runs_dir, name, request.resume, request.new)
    if not exists:  # a space that cannot run is refused before its run directory is made
        with tempfile.TemporaryDirectory() as scratch:
            _new_plan(write_space(Path(scratch), request.space, request.settings), request, run_dir.name)
    run_dir.mkdir(parents=True, exist_ok=True)
    with rundir.RunLock(run_dir), rundir.fault_log(run_dir):
        rundir.check_free_space(run_dir, request.options.min_free_mib, runner.controller_of(runtime))
        path = run_dir / "results.sqlite"
        if not exists:
            space_path = write_space(run_dir, request.space, request.settings)
            plan = _new_plan(space_path, request, run_dir.name)
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
            # the stored space fixes the sampling and overrides, but the servers render from the recipe file
            provenance.check_drift(plan, store, exists, False, say, _DRIFT_FIX)
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
    scoring_loads: int = 0  # the lossless check's `none` at the end (a sampled space), in max_loads


def dry_run(request: TuneRequest) -> DryRun:
    """The tune's plan without starting anything: the same run resolution, space file, plan and first decision as
    a run (a stored run's space and results when it would continue one).

    At most every config is loaded once at --repeats, then reloaded for the verdict (a reload adds --repeats runs
    up to --max-repeats per concurrency; reloads at several concurrencies in one round share a load, counted apart
    here), plus one server for a K schedule; failed starts retried by the sweep machinery are not counted. The
    ETA bound is those loads, each with every cell up to --max-repeats, on the sweep's timing model (its start
    time and tok/s, refined from earlier runs of the recipe)."""
    name = f"tune-{request.space['name']}"
    run_dir, exists = rundir.resolve(request.runs_dir, name, request.resume, request.new)
    obs: search.Observations = {}
    settings, objective = request.settings, request.objective
    with tempfile.TemporaryDirectory() as scratch:
        if exists:
            plan = build_plan(run_dir / SPACE_FILE, run_id=run_dir.name, ulimits=request.ulimits)
            with Store.open(run_dir / "results.sqlite", readonly=True) as store:
                refusal = provenance.drift_refusal(plan, store, _DRIFT_FIX)
                if refusal:  # what continuing it would meet
                    raise refusal
                state = _state(store)
                if state:
                    settings, objective = _settings(state), state["objective"]
                obs = observations(store, plan, objective, settings.terms)
        else:
            plan = _new_plan(write_space(Path(scratch), request.space, request.settings), request, run_dir.name)
    hosts = hosts_of(plan)
    space = space_of(plan)
    configs = len(plan.servers)
    # every config once, its reloads (at most max_loads - 1 per concurrency, merged when they come together),
    # and the K schedule's server
    reloads = configs * (settings.max_loads - 1) * len(space.concurrencies)
    # a sampled space's lossless check: `none` once more at the end, to score the answers no `none` load scored
    scoring = int(lossless.will_score(plan))
    max_loads = configs + reloads + 1 + scoring
    model = runner.timing_model(plan, sorted(request.runs_dir.glob("*/results.sqlite")))
    per_load = model.startup_s + model.teardown_s
    eta = estimate_seconds(plan, model) + (max_loads - configs) * per_load  # every cell at --max-repeats
    grid = tuple(dataclasses.replace(s, cells=tuple(c for c in s.cells if c.repeat < settings.repeats))
                 for s in plan.servers)
    grid_eta = estimate_seconds(dataclasses.replace(plan, servers=grid), model)  # the grid at --repeats
    return DryRun(plan, space, settings, objective, run_dir, exists, search.decide(space, settings, obs), max_loads,
                  eta, configs, grid_eta, model, () if exists else request.notes, hosts, scoring)


def _search(plan: Plan, store: Store, runtime: HostRuntime | None, run_dir: Path, request: TuneRequest,
            state: dict[str, Any], say: runner.Say, hosts: list[Host] | None = None,
            reach: fleet.Connect | None = None) -> TuneOutcome:
    settings, objective = _settings(state), state["objective"]
    space = space_of(plan)
    runner.register(plan, store, only=lambda server, cell: False)  # every server config, no cell yet
    downloaded = False
    started = time.monotonic()
    wall_before = float(state.get("wall_s", 0.0))
    last: tuple[Any, ...] | None = None
    try:
        for _ in range(MAX_ROUNDS):
            obs = observations(store, plan, objective, settings.terms)
            _say_changed(obs, state, say)
            decision = search.decide(space, settings, obs)
            if isinstance(decision, search.Done):
                state.update(_finish(space, settings, obs, decision))
                _mark_synthetic(plan, state)
                state["schedule"] = _schedule_args(plan, store, state["schedule"])
                if _schedule_pending(state):
                    _measure_schedule(plan, store, runtime, run_dir, request, state, say, obs, hosts, reach)
                _score_the_rest(_with_schedule(plan, state, run_dir), store, runtime, run_dir, request, state, say,
                                hosts, reach)
                break
            marker = (decision, store.counts()["done"], store.counts()["failed"])
            if marker == last:
                raise _cannot_go_on(plan, store, run_dir)
            last = marker
            for note in decision.notes:
                if note not in state.setdefault("notes", []):
                    say(f"tune: {note}")  # a drafter switched to measured mode: said once, when it is known
                    state["notes"].append(note)
            names = [f"{search.label(load.config)} (" + ", ".join(f"C={c}: to {n}" for c, n in load.upto) + " runs)"
                     for load in decision.loads]
            say(f"tune round {len(state['rounds']) + 1}: {decision.why}: load {'; '.join(names)}")
            state["rounds"].append({"why": decision.why, "configs": [search.label(c) for c in decision.configs],
                                    "repeats": decision.repeats, "loads": [],
                                    "started_s": round(wall_before + time.monotonic() - started, 1)})
            store.set_meta("tune", state)
            if request.download and not downloaded:
                downloads.download(plan, store, say)
                downloaded = True
            for load in decision.loads:  # one at a time, in order: a reload pair runs A B, then B A
                upto = dict(load.upto)
                config = load.config

                def wanted(server: Any, cell: Any, config: search.Config = config, upto: dict[int, int] = upto) -> bool:
                    return ((server.method, server.num_speculative_tokens) == config
                            and cell.repeat < upto.get(cell.concurrency, 0))

                runner.register(plan, store, only=wanted)
                pending = {c.server_config_id for c in store.pending_cells()}
                loading = [s.label for s in plan.servers if s.id in pending]
                state["rounds"][-1]["loads"] += loading
                state["loads"] = int(state.get("loads", 0)) + len(loading)
                store.set_meta("tune", state)
                if loading:  # the sampled answers a later `none` load does not score are scored at the end
                    ids = {s.id for s in plan.servers
                           if s.id in pending and (s.method, s.num_speculative_tokens) == config}
                    _serve_load(plan, store, ids, lambda: runner.run(plan, store, runtime, run_dir, request.options,
                                                                         say, hosts, reach=reach, score=False))
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


def _cannot_go_on(plan: Plan, store: Store, run_dir: Path) -> SparklabError:
    """A round that changed nothing: its loads' cells stayed pending (no host could take them: a host lost, a
    pair's worker gone). Names them and the last loss that concerned them; a round with nothing pending is a bug."""
    pending = {c.server_config_id for c in store.pending_cells()}
    stuck = [s.label for s in plan.servers if s.id in pending]
    if not stuck:
        return SparklabError("tune made no progress: a round measured nothing and left nothing pending",
                             f"This is a bug in the search; the run's results are kept in {run_dir}.")
    lost = [f.message.splitlines()[0] for f in store.failures()
            if f.kind == HOST_LOST and f.server_config_id in pending]
    why = lost[-1] if lost else "no host of the run could take them: the lines above say why"
    return IncompleteRunError(f"tune cannot go on: {', '.join(stuck)} stayed pending after a round ({why})",
                              f"What it measured is kept in {run_dir}. Run the same command again once the hosts are "
                              "back: it continues where it stopped.")


def _serve_load(plan: Plan, store: Store, servers: set[str], run: Callable[[], object]) -> None:
    """One load: run its servers; a start that failed with attempts left (its cells back to pending) is started
    again now, before the next load, so loads keep their order (a reload pair's A B B A) and a round whose one start
    failed is not taken for a round without progress. Stops when its cells are done or out of attempts, or when a
    run changed nothing (a host lost: the round's own check then says so)."""
    def state() -> list[tuple[str, str, int]]:
        return sorted((c.id, c.status, c.attempts) for c in store.cells() if c.server_config_id in servers)

    for _ in range(plan.sweep.max_attempts):
        before = state()
        run()
        if not any(c.server_config_id in servers for c in store.pending_cells()) or state() == before:
            return


def _ratio(r: Any) -> dict[str, Any] | None:
    return None if r is None else {"value": r.value, "low": r.low, "high": r.high}


def _finish(space: search.Space, settings: search.Settings, obs: search.Observations,
            done: search.Done) -> dict[str, Any]:
    """The picks, the predictions against what was measured, the SLO reach and the K schedule, as stored in meta."""
    picks = []
    for p in done.picks:
        e = p.estimate
        runs = getattr(e, "runs", None) or getattr(e, "n", 0)
        picks.append({"concurrency": p.concurrency, "method": p.config[0], "k": p.config[1],
                      "label": search.label(p.config), "mean": e.mean, "low": e.low, "high": e.high, "n": runs,
                      "loads": getattr(e, "loads", 1), "best_mean": search.label(p.best_mean),
                      "overlapping": [search.label(x) for x in p.overlapping], "note": p.note,
                      "tie_break": p.tie_break, "one_load": p.one_load,
                      "runner_up": search.label(p.runner_up) if p.runner_up else None,
                      "best_runner_up": search.label(p.best_runner_up) if p.best_runner_up else None,
                      "versus_runner_up": _ratio(p.versus_runner_up)})
    predicted = [{"method": guess.config[0], "k": guess.config[1], "concurrency": guess.concurrency,
                  "predicted": guess.value, "acceptance_length": guess.acceptance_length, "basis": guess.basis,
                  "measured": measured} for guess, measured in search.predictions(space, settings, obs)]
    schedule = search.k_schedule(done.picks)
    reach = done.slo_reach
    return {"picks": picks, "predictions": predicted, "notes": list(done.notes), "budget": settings.budget(),
            "slo": slos.describe(settings.terms) or None,
            "slo_reach": {"concurrency": reach.concurrency, "label": search.label(reach.config),
                          "method": reach.config[0], "k": reach.config[1], "mean": reach.value} if reach else None,
            "slo_missed": list(done.slo_missed),
            "schedule": {"method": schedule[0], "ranges": schedule[1]} if schedule else None}


def _synthetic_configs(plan: Plan) -> set[search.Config]:
    """The configs whose server fakes its acceptance (synthetic rejection sampling)."""
    return {(s.method, s.num_speculative_tokens) for s in plan.servers
            if engine(s.spec.kind).synthetic_acceptance(s.spec.argv) is not None}


def _mark_synthetic(plan: Plan, state: dict[str, Any]) -> None:
    """Picks whose server fakes its acceptance (synthetic rejection sampling): a benchmark of the engine's step cost
    at a chosen profile, never a config to run; the output says so instead of giving its command."""
    fake = _synthetic_configs(plan)
    for pick in state.get("picks", []):
        pick["synthetic"] = (pick["method"], pick["k"]) in fake
    if state.get("schedule") and any(p["synthetic"] for p in state.get("picks", [])):
        state["schedule"]["synthetic"] = True


def _schedule_server(plan: Plan, schedule: dict[str, Any], run_id: str) -> ServerConfig | None:
    """The server the schedule runs on: the method at the schedule's largest K, with its per-batch-size argument."""
    if not schedule.get("serve_args"):
        return None
    base = next(s for s in plan.servers if s.method == schedule["method"]
                and s.num_speculative_tokens == schedule["k"])
    return variant(plan, base, tuple(schedule["serve_args"]), run_id)


def _with_schedule(plan: Plan, state: dict[str, Any], run_dir: Path) -> Plan:
    """The plan with the K schedule's server when tune loaded one (its answers are scored as the others are)."""
    server = _schedule_server(plan, state.get("schedule") or {}, run_dir.name)
    return plan if server is None else dataclasses.replace(plan, servers=(*plan.servers, server))


def _score_the_rest(plan: Plan, store: Store, runtime: HostRuntime | None, run_dir: Path, request: TuneRequest,
                    state: dict[str, Any], say: runner.Say, hosts: list[Host] | None,
                    reach: fleet.Connect | None) -> None:
    """The lossless check's `none` once, when the search is done, for the sampled answers no `none` load scored
    while up (a sweep does it after its servers; tune's rounds leave it here, or each would load `none` again)."""
    if plan.sweep.lossless.enabled:
        lossless.settle_without_server(plan, store, say)
    if not lossless.engines_with_pending(plan, store):
        return
    state["loads"] = int(state.get("loads", 0)) + 1
    state["rounds"].append({"why": "the lossless check: none once more, to score the sampled answers left",
                            "configs": ["none"], "repeats": 0, "loads": ["none (scoring)"]})
    store.set_meta("tune", state)
    runner.run(plan, store, runtime, run_dir, request.options, say, hosts, reach=reach)


def _schedule_pending(state: dict[str, Any]) -> bool:
    schedule = state.get("schedule")
    return bool(schedule and schedule.get("serve_args") and "verdict" not in schedule)


def _measure_schedule(plan: Plan, store: Store, runtime: HostRuntime | None, run_dir: Path, request: TuneRequest,
                      state: dict[str, Any], say: runner.Say, obs: search.Observations,
                      hosts: list[Host] | None = None, reach: fleet.Connect | None = None) -> None:
    """Load the schedule server once, measure it at every concurrency of the space, and compare it with each
    concurrency's winner: only a schedule that loses nowhere beyond noise is recommended (verdict.schedule_verdict).
    """
    schedule = state["schedule"]
    server = _schedule_server(plan, schedule, run_dir.name)
    assert server is not None
    settings = _settings(state)
    with_schedule = dataclasses.replace(plan, servers=(*plan.servers, server))
    runner.register(with_schedule, store, only=lambda s, cell: s.id == server.id and cell.repeat < settings.repeats)
    ranges = ", ".join(f"{a}-{b}: K={k}" for a, b, k in schedule["ranges"])
    if any(c.server_config_id == server.id for c in store.pending_cells()):
        say(f"tune: measuring the K schedule ({ranges}) on one server at every concurrency before recommending it")
        state["loads"] = int(state.get("loads", 0)) + 1
        state["rounds"].append({"why": "the K schedule, measured before it is recommended", "configs":
                                [f"{schedule['method']} K per batch size"], "repeats": settings.repeats,
                                "loads": [server.label + " (schedule)"]})
        store.set_meta("tune", state)
        _serve_load(with_schedule, store, {server.id}, lambda: runner.run(with_schedule, store, runtime, run_dir,
                                                                            request.options, say, hosts,
                                                                            reach=reach, score=False))
    measured = observations(store, with_schedule, state["objective"], settings.terms, [server])
    cells = measured.get((server.method, server.num_speculative_tokens), {})
    space = space_of(plan)
    done = search.decide(space, settings, obs)
    assert isinstance(done, search.Done)
    result = verdict.schedule_verdict(search.State(space, settings, obs), done.picks, schedule["method"],
                                      schedule["ranges"], {c: cell.by_load() for c, cell in cells.items()})
    schedule["server_config_id"] = server.id
    schedule["verdict"] = {
        "recommended": result.recommended, "summary": result.summary(),
        "k0": verdict.K0_WHY if any(k == 0 for _, _, k in schedule["ranges"]) else None,
        "rows": [{"concurrency": r.concurrency, "k": r.k, "winner": search.label(r.winner),
                  "winner_mean": r.winner_interval.mean if r.winner_interval else None,
                  "winner_low": r.winner_interval.low if r.winner_interval else None,
                  "winner_high": r.winner_interval.high if r.winner_interval else None,
                  "winner_n": r.winner_interval.runs if r.winner_interval else 0,
                  "schedule_mean": r.schedule_interval.mean if r.schedule_interval else None,
                  "schedule_low": r.schedule_interval.low if r.schedule_interval else None,
                  "schedule_high": r.schedule_interval.high if r.schedule_interval else None,
                  "schedule_n": r.schedule_interval.runs if r.schedule_interval else 0,
                  "versus": _ratio(r.versus), "loses": r.loses} for r in result.rows]}
    say(f"tune: K schedule: {result.summary()}")
    store.set_meta("tune", state)


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
