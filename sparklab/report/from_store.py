"""A run's store → the report's `Report` (pure, reads only): its server configs with their model facts and
device (a stored run's own, else today's recipe file, each corrected by `report --fact`/`--hardware`), its done
and partial cells grouped per server config, workload, concurrency and swept sampling, then each group's
baseline, roofline, load noise and answers (`report.grouping`) and the best config per concurrency.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from sparklab import engines
from sparklab.report import lossless
from sparklab.report.grouping import (
    best_configs,
    group_of,
    note,
    with_baseline,
    with_load_noise,
    with_outputs,
    with_roofline,
)
from sparklab.report.model import (
    METHOD_NAMES,
    Overrides,
    Report,
    Server,
    cell_sampling,
    variant_label,
)
from sparklab.report.roofline import Device
from sparklab.sweep.store import Store
from sparklab.sweep.store_rows import CellRow


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
    note(notes, f"this run did not store its model facts and device: they come from {path} as it is today "
                 "(check them, or give --fact / --hardware)")
    return facts


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
                              row.downloads, row.started_at, config.get("runtime"),
                              _texts(config.get("sampling_defects"))))
    return servers


def _texts(value: Any) -> tuple[str, ...]:
    """A stored list of sentences; anything else a crafted file holds there: none."""
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()


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
        note(notes, f"{engine} {METHOD_NAMES.get(method, method)}: weights at {bits:g} bits per parameter, as the "
                     f"engine states for the file it loaded ({said}){was}")
    stated = {**facts, "weight_bits": float(bits)}
    params = weights.get("params")
    if params and facts.get("active_params_b") in (None, facts.get("total_params_b")):  # dense: every weight read
        stated["active_params_b"] = stated["total_params_b"] = params / 1e9
    return stated



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
        groups.append(replace(group_of(by_id[sid], shown, c, rows), lead=lead, workload_name=workload,
                              sampling=cell_sampling(rows[0])))
    groups = [with_roofline(with_baseline(g, groups), notes) for g in groups]
    groups = with_load_noise(groups)
    outputs = store.outputs()
    grades = store.grades()
    groups = [with_outputs(g, groups, outputs, grades) for g in groups]
    if not any(s.device for s in servers):
        notes.append("no device bandwidth is known for this run (the recipe names no hardware in "
                     "recipes/hardware.yaml): no roofline. Give one with --hardware NAME or --bandwidth-gbps GBPS.")
    sweep = store.sweep()
    slo = sweep.get("slo") if overrides.slo is None else overrides.slo or None  # `--slo ''`: none, not the file's
    report = Report(run_id, sweep, store.meta(), store.host_facts(), store.counts(), servers, groups, [],
                    store.failures(), notes, slo, store.scores())
    report.lossless = tuple(lossless.results(report))  # the lossless check reads the scores
    report.best = best_configs(groups, report.lossy)
    return report
