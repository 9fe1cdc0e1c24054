"""Stored results → the report's data (pure): repeats grouped, estimates, speedups, roofline, best configs.

A group is one server config at one (workload, concurrency): its repeats are the done cells. Every number
is a mean over repeats with a 95% interval (see `sparklab.metrics.estimate`); speedups compare a group with
the same engine's `none` group at the same workload and concurrency.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from sparklab import engines
from sparklab.bench import noise
from sparklab.bench.metrics import Estimate, Ratio, estimate, ratio
from sparklab.outputs import Equality, ToolCalls, equality, tool_calls
from sparklab.report.roofline import Device, RooflinePoint, bound, model_inputs
from sparklab.sweep.store import CellRow, FailureRow, Store

METHOD_NAMES = {"none": "none", "mtp": "MTP", "dflash": "DFlash", "dspark": "DSpark", "eagle": "EAGLE",
                "ngram": "ngram", "draft_model": "draft model"}
BASELINE = "none"
BEST_TIE = 0.01  # within 1% of the best score, the smaller K wins


DECODE_LEAD = "decode"  # a sweep file's `headline: decode` (seed 004's table)


def headline_metric(concurrency: int, lead: str = "seed000") -> str:
    """Seed 000's columns: per-request tok/s at C=1, aggregate tok/s above. Seed 004's (`headline: decode`):
    generation speed excluding TTFT, the mean over requests of decode tok/s."""
    if lead == DECODE_LEAD:
        return "generation tok/s (excl. TTFT)"
    return "per-request tok/s" if concurrency == 1 else "aggregate tok/s"


def headline_key(concurrency: int, lead: str = "seed000") -> str:
    if lead == DECODE_LEAD:
        return "decode_tps"
    return "per_request_tps" if concurrency == 1 else "aggregate_tps"


def headline_name(concurrency: int, lead: str = "seed000") -> str:
    return f"C={concurrency} {headline_metric(concurrency, lead)}"


def _summary(key: str, stat: str | None = None) -> Callable[[dict[str, Any]], float | None]:
    def read(result: dict[str, Any]) -> float | None:
        value = (result.get("summary") or {}).get(key)
        if stat is not None:
            value = (value or {}).get(stat)
        return None if value is None else float(value)
    return read


def acceptance(result: dict[str, Any]) -> tuple[float | None, str | None]:
    """Acceptance length and where it came from, as the engine's adapter reads its stored result (vLLM: its
    counters over the window; SGLang: its `accept len` log lines in the window, else /server_info)."""
    return engines.acceptance(result)


# metric → how to read it from one cell's stored result
METRICS: dict[str, Callable[[dict[str, Any]], float | None]] = {
    "aggregate_tps": _summary("aggregate_tps"),
    "per_request_tps": _summary("per_request_tps", "mean"),
    "decode_tps": _summary("decode_tps", "mean"),
    "ttft_p50_ms": _summary("ttft_ms", "p50"),
    "tpot_p50_ms": _summary("tpot_ms", "p50"),
    "acceptance_length": lambda result: acceptance(result)[0],
    "acceptance_rate": engines.acceptance_rate,
    "prompt_tokens": _summary("prompt_tokens", "mean"),
    "tokens_per_request": _summary("tokens_per_request"),
}


@dataclass(frozen=True)
class Server:
    """One server config as the report sees it (the stored row, with its label and up command)."""

    id: str
    seq: int
    engine: str
    method: str
    k: int | None
    recipe: str
    overrides: tuple[str, ...]
    serve_args: tuple[str, ...]
    image: str
    image_digest: str | None
    engine_version: str | None
    ready_s: float | None
    startup: dict[str, Any]
    model: dict[str, Any]
    device: Device | None
    kind: str | None = None  # the engine adapter's kind (vllm, llamacpp, ...); None in runs that did not store it
    image_check: dict[str, Any] | None = None  # its image's own parser on its command (None: runs before schema 5)
    # per-position acceptance the server was told to fake (synthetic rejection sampling), () when unreadable;
    # None: a real drafter (or none). Such a server benchmarks the engine's step cost, it is not a config to run.
    synthetic: tuple[float, ...] | None = None
    argv: tuple[str, ...] = ()  # the redacted serve command (what made it lossy, if anything)
    downloads: dict[str, Any] | None = None  # what it waited for before its latest start (schema 6)
    started_at: str | None = None

    @property
    def lossy_settings(self) -> list[str]:
        """Settings of its serve command that make drafting lossy by design (the engine adapter says which)."""
        return engines.ENGINES[self.kind].lossy_settings(self.argv) if self.kind in engines.ENGINES else []
    runtime: str | None = None  # "container" or "process"; None in runs that did not store it

    @property
    def is_process(self) -> bool:
        """A host-process engine: its image is the program it runs (older runs: a path is a program, never an
        image reference)."""
        return self.runtime == "process" or (self.runtime is None and self.image.startswith("/"))

    @property
    def streams_one_chunk_per_step(self) -> bool:
        """Whether each engine step streams one chunk (vLLM, SGLang); unknown engines are taken to."""
        return engines.ENGINES[self.kind].streams_one_chunk_per_step if self.kind in engines.ENGINES else True

    @property
    def method_name(self) -> str:
        name = METHOD_NAMES.get(self.method, self.method)
        if self.synthetic is not None and "synthetic" not in name.lower():
            name += " (synthetic)"
        return name

    @property
    def is_synthetic(self) -> bool:
        return self.synthetic is not None

    @property
    def schedule(self) -> str | None:
        """The K per batch size of a K-schedule server (`sparklab tune` measures one), as `1-1: K=3, 2-1024: K=1`."""
        import json

        for arg in self.serve_args:
            flag, _, value = arg.partition("=")
            if flag.endswith("num_speculative_tokens_per_batch_size") and value:
                try:
                    ranges = json.loads(value)
                    return ", ".join(f"{a}-{b}: K={k}" for a, b, k in ranges)
                except (ValueError, TypeError):
                    return value
        return None

    @property
    def label(self) -> str:
        k = f" K={self.k}" if self.k is not None else ""
        schedule = f" (K per batch size {self.schedule})" if self.schedule else ""
        return f"{self.engine} {self.method_name}{k}{schedule}"

    @property
    def up_command(self) -> str:
        """The ready-to-run command that starts this configuration on its own."""
        argv = ["sparklab", "up", f"{self.recipe}:{self.method}", "--engine", self.engine]
        if self.k is not None:
            argv += ["-k", str(self.k)]
        for override in self.overrides:
            argv += ["--set", override]
        for arg in self.serve_args:
            argv.append(f"--serve-arg={arg}")
        return shlex.join(argv)


@dataclass(frozen=True)
class Group:
    server: Server
    workload: str
    concurrency: int
    cells: tuple[CellRow, ...]
    metrics: dict[str, Estimate | None]
    per_position: tuple[float, ...]
    ttft_ms: tuple[float, ...]  # every measured request of every repeat
    token_sources: tuple[str, ...]
    acceptance_sources: tuple[str, ...]
    speedup: Ratio | None = None
    baseline: str | None = None  # the baseline group's server label
    roofline: RooflinePoint | None = None
    rests_on_partial: bool = False  # this group or its baseline has cells with failed requests
    lead: str = "seed000"  # which figure heads the tables and drives speedups and the best pick (headline_key)
    equality: Equality | None = None  # its answers against the baseline's (drafting groups only)
    tool_calls: tuple[ToolCalls, ...] = ()  # tool calls per answer, per tool-call prompt (the runaway probe)
    loads: int = 1  # server starts its cells ran on (stored per cell since issue 25; earlier runs: 1)
    load_noise: bool = False  # its headline interval and speedup include between-load variance (report.verdicts)
    workload_name: str = ""  # the workload itself; `workload` adds the sampling when the run sweeps it
    sampling: dict[str, Any] = field(default_factory=dict)  # its cells' concrete sampling
    answers: tuple[dict[str, Any], ...] = ()  # measured answers (outputs), each with its cell id, repeat and index
    grades: tuple[dict[str, Any], ...] = ()  # a graded suite's grades, each with its cell id, repeat and index

    @property
    def n(self) -> int:
        return len(self.cells)

    @property
    def failed_requests(self) -> int:
        """Measured requests that failed, over every cell of the group (0 for whole cells)."""
        return sum(int(((c.summary or {}).get("requests") or {}).get("failed") or 0) for c in self.cells)

    @property
    def partial(self) -> bool:
        """Some cell ended partial (kept after max_attempts) or counted failed requests."""
        return self.failed_requests > 0 or any(c.status == "partial" for c in self.cells)

    @property
    def headline(self) -> Estimate | None:
        return self.metrics[headline_key(self.concurrency, self.lead)]

    @property
    def is_baseline(self) -> bool:
        return self.server.method == BASELINE


@dataclass(frozen=True)
class Best:
    workload: str
    concurrency: int
    group: Group
    score: float
    best_score_group: Group  # the highest score before the smaller-K preference
    candidates: int
    runner_up: Group | None = None  # the next best config by score
    versus_runner_up: Ratio | None = None  # the chosen headline / the runner-up's, with its 95% interval
    synthetic_skipped: tuple[Group, ...] = ()  # synthetic configs that scored above the pick: never named best
    one_load: bool = False  # the pick or its runner-up ran on one server start only


@dataclass
class Report:
    run_id: str
    sweep: dict[str, Any]
    meta: dict[str, str]
    host: dict[str, Any]
    counts: dict[str, int]
    servers: list[Server]
    groups: list[Group]
    best: list[Best]
    failures: list[FailureRow]
    roofline_notes: list[str] = field(default_factory=list)
    slo: str | None = None  # the latency objective the report judges configs by (report --slo, else the sweep's)
    scores: dict[tuple[str, int], Any] = field(default_factory=dict)  # the lossless check's (cell id, index) -> Score

    @property
    def workloads(self) -> list[str]:
        return list(dict.fromkeys(g.workload for g in self.groups))

    def concurrencies(self, workload: str) -> list[int]:
        return sorted({g.concurrency for g in self.groups if g.workload == workload})

    @property
    def lead(self) -> str:
        return str(self.sweep.get("headline") or "seed000")

    def engines(self, workload: str) -> list[str]:
        return list(dict.fromkeys(g.server.engine for g in self.groups if g.workload == workload))


@dataclass(frozen=True)
class Overrides:
    """What the user corrects at report time: the device's bandwidth, or model facts (`--fact KEY=VALUE`)."""

    device: Device | None = None
    facts: dict[str, float] = field(default_factory=dict)
    slo: str | None = None  # `report --slo`: a latency objective in place of the sweep file's


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _recipe_facts(name: str, notes: list[str], engine: str | None = None) -> dict[str, Any]:
    """For runs stored before sparklab kept model facts and the device with them: today's recipe file."""
    from sparklab.errors import SparklabError
    from sparklab.recipes.schema import load_hardware, load_recipe, recipes_dir, stored_facts

    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", name):  # a name from the store, never a path
        return {}
    path = recipes_dir() / f"{name}.yaml"
    try:
        facts = stored_facts(load_recipe(path), load_hardware(), engine)
    except SparklabError:
        return {}
    _note(notes, f"this run did not store its model facts and device: they come from {path} as it is today "
                 "(check them, or give --fact / --hardware)")
    return facts


def _note(notes: list[str], text: str) -> None:
    if text not in notes:
        notes.append(text)


def _servers(store: Store, overrides: Overrides, notes: list[str]) -> list[Server]:
    servers = []
    for seq, row in enumerate(store.server_configs()):
        config = row.config or {}
        if "model" not in config:
            config = {**config, **_recipe_facts(str(config.get("recipe", "")), notes, row.engine)}
        stored = config.get("hardware")
        device = overrides.device or (Device(stored["name"], float(stored["bandwidth_gbps"]),
                                             _float(stored.get("usable_bandwidth_gbps")), stored.get("usable_source"))
                                      if stored and stored.get("bandwidth_gbps") else None)
        model = dict(config.get("model") or {})
        facts = _engine_stated(dict(model.get("facts") or {}), row.engine, row.method, row.startup_facts or {},
                               overrides, notes)
        model["facts"] = {**facts, **overrides.facts}
        kind = config.get("kind")
        synthetic = engines.ENGINES[kind].synthetic_acceptance(row.argv) if kind in engines.ENGINES else None
        servers.append(Server(row.id, seq, row.engine, row.method, row.k, str(config.get("recipe", "?")),
                              tuple(config.get("overrides", ())), tuple(config.get("serve_args", ())), row.image,
                              row.image_digest, row.engine_version, row.ready_s, row.startup_facts or {}, model,
                              device, kind, row.image_check, synthetic, tuple(str(a) for a in row.argv or ()),
                              row.downloads, row.started_at, config.get("runtime")))
    return servers


def _engine_stated(facts: dict[str, Any], engine: str, method: str, startup: dict[str, Any], overrides: Overrides,
                   notes: list[str]) -> dict[str, Any]:
    """The recipe's model facts, with the weights' bits per parameter the engine itself stated once ready
    (llama.cpp: its GGUF's tensor bytes over its parameters, Engine.served_facts) in place of the recipe's
    weight_bits, unless --fact gives one: a GGUF row is bounded by the bytes it really reads."""
    weights = startup.get("weights") or {}
    bits = weights.get("bits_per_param")
    if not bits or "weight_bits" in overrides.facts:
        return facts
    recipe_bits = facts.get("weight_bits")
    if recipe_bits != bits:
        kind = f" {weights['file_type']}" if weights.get("file_type") else ""
        was = f", not the recipe's {recipe_bits:g}" if recipe_bits else ""
        said = (f"{weights.get('source', 'the engine')}:{kind} {weights.get('bytes', 0):,} bytes for "
                f"{weights.get('params', 0):,} parameters")
        _note(notes, f"{engine} {METHOD_NAMES.get(method, method)}: weights at {bits:g} bits per parameter, as the "
                     f"engine states for the file it loaded ({said}){was}")
    stated = {**facts, "weight_bits": float(bits)}
    params = weights.get("params")
    if params and facts.get("active_params_b") in (None, facts.get("total_params_b")):  # dense: every weight read
        stated["active_params_b"] = stated["total_params_b"] = params / 1e9
    return stated


def _ttfts(cells: list[CellRow]) -> tuple[float, ...]:
    out = []
    for cell in cells:
        for request in (cell.result or {}).get("requests", []):
            if not request.get("warmup") and not request.get("error") and request.get("first_token") is not None:
                out.append(1000 * (request["first_token"] - request["start"]))
    return tuple(out)


def _per_position(cells: list[CellRow]) -> tuple[float, ...]:
    curves = [c for cell in cells
              if (c := ((cell.result or {}).get("speculative") or {}).get("per_position_acceptance"))]
    if not curves:
        return ()
    width = min(len(c) for c in curves)
    return tuple(sum(c[i] or 0.0 for c in curves) / len(curves) for i in range(width))


def _group(server: Server, workload: str, concurrency: int, cells: list[CellRow]) -> Group:
    results = [cell.result or {"summary": cell.summary} for cell in cells]
    metrics = {name: estimate(v for r in results if (v := read(r)) is not None) for name, read in METRICS.items()}
    sources = sorted({s for cell in cells for s in ((cell.summary or {}).get("token_sources") or {})})
    accepted = sorted({source for r in results if (source := acceptance(r)[1])})
    loads = len({_load_of(cell) for cell in cells}) or 1
    return Group(server, workload, concurrency, tuple(cells), metrics, _per_position(cells), _ttfts(cells),
                 tuple(sources), tuple(accepted), loads=loads)


def _baseline_of(group: Group, groups: list[Group]) -> Group | None:
    candidates = [g for g in groups if g.is_baseline and g.server.engine == group.server.engine
                  and g.workload == group.workload and g.concurrency == group.concurrency]
    # several baselines of one engine (different overrides): the one with the same overrides, else the first
    same = [g for g in candidates if g.server.overrides == group.server.overrides]
    return next(iter(same or candidates), None)


def _sampling(group: Group) -> dict[str, Any] | None:
    return ((group.cells[0].settings or {}).get("sampling") if group.cells else None)


def _tagged(group: Group, per_cell: dict[str, list[dict[str, Any]]], key: str) -> tuple[dict[str, Any], ...]:
    """Each cell's rows (answers or grades) of the measured requests, tagged with the cell and its repeat: the
    order in which a prompt's answers pair across configs (sparklab.report.quality)."""
    out = []
    for cell in group.cells:
        for i, row in enumerate(per_cell.get(cell.id, [])):
            if not row.get("warmup"):
                out.append({**row, "cell_id": cell.id, "repeat": cell.repeat, key: row.get(key, i)})
    return tuple(out)


def _with_outputs(group: Group, groups: list[Group], outputs: dict[str, list[dict[str, Any]]],
                  grades: dict[str, list[dict[str, Any]]] | None = None) -> Group:
    """Its tool calls, answers and grades; for a drafting group, its answers against its baseline's (same
    engine, workload, concurrency, sampling)."""
    answers = [a for c in group.cells for a in outputs.get(c.id, [])]
    group = replace(group, tool_calls=tuple(tool_calls(answers)),
                    answers=_tagged(group, {c: [{**a, "idx": i} for i, a in enumerate(rows)]
                                            for c, rows in outputs.items()}, "idx"),
                    grades=_tagged(group, grades or {}, "index"))
    if group.is_baseline:
        return group
    base = _baseline_of(group, groups)
    if base is None or _sampling(base) != _sampling(group):
        result = equality(answers, [], _sampling(group))
    else:
        result = equality(answers, [a for c in base.cells for a in outputs.get(c.id, [])], _sampling(group))
    return replace(group, equality=result)


def _with_baseline(group: Group, groups: list[Group]) -> Group:
    base = _baseline_of(group, groups)
    if base is group:
        return replace(group, speedup=Ratio(1.0, None, None), baseline=group.server.label,
                       rests_on_partial=group.partial)
    if base is None or group.headline is None or base.headline is None:
        return group
    return replace(group, speedup=ratio(group.headline, base.headline), baseline=base.server.label,
                   rests_on_partial=group.partial or base.partial)


def _with_roofline(group: Group, notes: list[str]) -> Group:
    server = group.server
    if server.device is None:
        return group
    inputs, missing = model_inputs(server.model.get("facts") or {}, server.device)
    if inputs is None:
        _note(notes, f"{server.label}: no roofline, the model facts lack {', '.join(missing)} (set them with --fact)")
        return group
    m = group.metrics
    accept = m["acceptance_length"].mean if m["acceptance_length"] else None
    if accept is None and not group.is_baseline:
        # tokens per step unknown: a bound at 1 token per step would not bound a drafting engine
        _note(notes, f"{server.label}: no roofline, no acceptance length was measured (tokens per target step "
                     "unknown)")
        return group
    context = None
    if m["prompt_tokens"] and m["tokens_per_request"]:
        context = m["prompt_tokens"].mean + m["tokens_per_request"].mean / 2
    if m["decode_tps"]:
        measured, source = m["decode_tps"].mean * group.concurrency, "decode tok/s x C"
    elif group.headline:
        measured, source = group.headline.mean, headline_metric(group.concurrency, group.lead) + " (incl. prefill)"
    else:
        return group
    # tokens through the target per step: K drafts and the bonus position per sequence, one without drafting
    per_sequence = 1 + (server.k or 0) if not group.is_baseline else 1
    return replace(group, roofline=bound(inputs, group.concurrency, accept or 1.0, context, measured, source,
                                         verify_tokens=group.concurrency * per_sequence))


CLOCK_DROP_FLAG = 0.10  # a cell whose SM clock fell by more than this from its start to its end is flagged


@dataclass(frozen=True)
class MemoryRow:
    """One server config's memory: at its start and over its cells (the samples' extremes, see memwatch)."""

    server: Server
    start_peak_used_gib: float | None
    cells_peak_used_gib: float | None
    headroom_gib: float | None  # the lowest MemAvailable seen, start and cells
    min_free_gib: float | None
    peak_container_gib: float | None
    peak_gpu_used_mib: float | None
    total_gib: float | None


def _extreme(values: list[float | None], pick: Callable[[list[float]], float]) -> float | None:
    present = [float(v) for v in values if v is not None]
    return pick(present) if present else None


def memory_rows(report: Report) -> list[MemoryRow]:
    """Per server config with memory samples: peak use and headroom (empty for runs from before sampling)."""
    rows = []
    for server in report.servers:
        start = server.startup.get("memory") or {}
        cells = [m for g in report.groups if g.server.id == server.id for c in g.cells
                 if (m := (c.result or {}).get("memory"))]
        if not start and not cells:
            continue
        every = [start, *cells] if start else cells
        rows.append(MemoryRow(
            server, start.get("peak_used_gib"), _extreme([m.get("peak_used_gib") for m in cells], max),
            _extreme([m.get("min_available_gib") for m in every], min),
            _extreme([m.get("min_free_gib") for m in every], min),
            _extreme([m.get("peak_container_gib") for m in every], max),
            _extreme([m.get("peak_gpu_used_mib") for m in every], max),
            _extreme([m.get("total_gib") for m in every], max)))
    return rows


@dataclass(frozen=True)
class ClockDrop:
    group: Group
    cell: CellRow
    drop: float
    start: dict[str, Any]
    end: dict[str, Any]


def clock_drops(report: Report, threshold: float = CLOCK_DROP_FLAG) -> list[ClockDrop]:
    """Cells whose SM clock fell by more than `threshold` between their start and end (throttling)."""
    out = []
    for group in report.groups:
        for cell in group.cells:
            clocks = (cell.result or {}).get("gpu_clocks") or {}
            drop = clocks.get("sm_clock_drop")
            if drop is None or drop <= threshold:
                continue
            if clocks.get("sm_clock_mhz"):  # read through the window: its highest clock to its lowest, and so on
                sm, heat, power = (clocks.get(k) or {} for k in ("sm_clock_mhz", "temperature_c", "power_w"))
                out.append(ClockDrop(group, cell, float(drop),
                                     {"sm_clock_mhz": sm.get("max"), "temperature_c": heat.get("min"),
                                      "power_w": power.get("min")},
                                     {"sm_clock_mhz": sm.get("min"), "temperature_c": heat.get("max"),
                                      "power_w": power.get("max")}))
            else:  # runs before issue 23: read at the cell's start and end
                out.append(ClockDrop(group, cell, float(drop), clocks.get("start") or {}, clocks.get("end") or {}))
    return out


def _load_of(cell: CellRow) -> str:
    return str(((cell.result or {}).get("server_load") or {}).get("id") or "")


def by_load(group: Group) -> list[list[float]]:
    """The group's headline values grouped by the server start they ran on, in load order."""
    read = METRICS[headline_key(group.concurrency, group.lead)]
    loads: dict[str, list[float]] = {}
    for cell in sorted(group.cells, key=_load_of):
        value = read(cell.result or {"summary": cell.summary})
        if value is not None:
            loads.setdefault(_load_of(cell), []).append(value)
    return list(loads.values())


def load_components(groups: list[Group]) -> dict[tuple[str, int], noise.Components]:
    """Within- and between-load noise of the headline per (workload, concurrency), pooled over its groups."""
    keys = dict.fromkeys((g.workload, g.concurrency) for g in groups)
    return {key: noise.components(by_load(g) for g in groups if (g.workload, g.concurrency) == key) for key in keys}


def _with_load_noise(groups: list[Group]) -> list[Group]:
    """Where some config was reloaded, every headline interval and speedup at that (workload, concurrency) carries
    between-load variance too (sparklab.bench.noise): the mean of load means, within + between. A run without
    reloads keeps its within-load intervals (its verdicts rest on one load, which the report says)."""
    if not any(g.loads >= 2 for g in groups):
        return groups
    comps = load_components(groups)
    out = []
    for g in groups:
        comp = comps[(g.workload, g.concurrency)]
        head = g.headline
        interval = noise.interval(by_load(g), comp)
        if comp.between is None or head is None or interval is None:
            out.append(g)
            continue
        metrics = dict(g.metrics)
        metrics[headline_key(g.concurrency, g.lead)] = replace(head, mean=interval.mean, low=interval.low,
                                                               high=interval.high)
        g = replace(g, metrics=metrics, load_noise=True)
        base = _baseline_of(g, groups)
        if base is not None and base is not g and g.speedup is not None:
            g = replace(g, speedup=noise.ratio(by_load(g), by_load(base), comp) or g.speedup)
        out.append(g)
    return out


def _best(groups: list[Group]) -> list[Best]:
    """Per (workload, concurrency): the highest median - sd of the headline over repeats (a config that is fast
    only sometimes scores lower; sd, not MAD, so that one slow run in three counts); within 1% of it, the
    smallest K (no drafting counts as 0). Synthetic acceptance is never named best (it is not a drafter); a
    runner-up comparison carries between-load noise where the run reloaded some config."""
    out = []
    comps = load_components(groups)
    keys = list(dict.fromkeys((g.workload, g.concurrency) for g in groups))
    for workload, concurrency in keys:
        every = [(g.headline.median - g.headline.sd, g) for g in groups
                 if g.workload == workload and g.concurrency == concurrency and g.headline]
        scored = [s for s in every if not s[1].server.is_synthetic]
        if not scored:
            continue
        top_score, top = max(scored, key=lambda s: s[0])
        close = [s for s in scored if s[0] >= top_score - abs(top_score) * BEST_TIE]  # a noisy top can be < 0
        score, chosen = min(close, key=lambda s: (s[1].server.k or 0, -s[0]))
        others = sorted((s for s in scored if s[1] is not chosen), key=lambda s: -s[0])
        second = others[0][1] if others else None
        skipped = tuple(g for s, g in sorted(every, key=lambda s: -s[0]) if g.server.is_synthetic and s > score)
        versus = None
        if second and chosen.headline and second.headline:
            comp = comps[(workload, concurrency)]
            versus = (noise.ratio(by_load(chosen), by_load(second), comp) if comp.between is not None
                      else ratio(chosen.headline, second.headline))
        one_load = any(g is not None and g.loads < 2 for g in (chosen, second))
        out.append(Best(workload, concurrency, chosen, score, top, len(scored), second, versus, skipped, one_load))
    return out


def cell_sampling(cell: CellRow) -> dict[str, Any]:
    return dict((cell.settings or {}).get("sampling") or {})


def variant_label(sampling: dict[str, Any], varying: list[str]) -> str:
    """The sampling keys a run sweeps over, as they read in a table: `temperature 1, max_tokens 256`."""
    return ", ".join(f"{k} {sampling.get(k):g}" if isinstance(sampling.get(k), (int, float))
                     else f"{k} {sampling.get(k)}" for k in varying)


def _varying(cells: list[CellRow]) -> list[str]:
    """Sampling keys whose value differs between the run's cells (a sweep over temperature or max_tokens)."""
    keys: dict[str, set[str]] = {}
    for cell in cells:
        for key, value in cell_sampling(cell).items():
            keys.setdefault(key, set()).add(repr(value))
    return [k for k, values in keys.items() if len(values) > 1]


def build(store: Store, run_id: str, overrides: Overrides | None = None) -> Report:
    overrides = overrides or Overrides()
    notes: list[str] = []
    servers = _servers(store, overrides, notes)
    by_id = {s.id: s for s in servers}
    kept = [*store.cells("done"), *store.cells("partial")]  # partial: kept after max_attempts, flagged
    varying = _varying(kept)
    cells: dict[tuple[str, str, int, str], list[CellRow]] = {}
    for cell in kept:
        label = variant_label(cell_sampling(cell), varying)
        cells.setdefault((cell.server_config_id, cell.workload, cell.concurrency, label), []).append(cell)
    ordered = sorted(cells, key=lambda key: (key[1], key[3], key[2], by_id[key[0]].seq))
    lead = str(store.sweep().get("headline") or "seed000")
    groups = []
    for sid, workload, c, label in ordered:
        rows = sorted(cells[(sid, workload, c, label)], key=lambda x: x.repeat)
        shown = f"{workload} ({label})" if label else workload
        groups.append(replace(_group(by_id[sid], shown, c, rows), lead=lead, workload_name=workload,
                              sampling=cell_sampling(rows[0])))
    groups = [_with_roofline(_with_baseline(g, groups), notes) for g in groups]
    groups = _with_load_noise(groups)
    outputs = store.outputs()
    grades = store.grades()
    groups = [_with_outputs(g, groups, outputs, grades) for g in groups]
    if not any(s.device for s in servers):
        notes.append("no device bandwidth is known for this run (the recipe names no hardware in "
                     "recipes/hardware.yaml): no roofline. Give one with --hardware NAME or --bandwidth-gbps GBPS.")
    sweep = store.sweep()
    return Report(run_id, sweep, store.meta(), store.host_facts(), store.counts(), servers, groups,
                  _best(groups), store.failures(), notes, overrides.slo or sweep.get("slo"), store.scores())
