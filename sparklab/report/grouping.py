"""Groups of a run's cells (pure): one server config's repeats at one (workload, concurrency), their baseline
and speedup, their answers against the baseline's, their roofline, the between-load noise of their headline
when some config was reloaded, and the best config per (workload, concurrency). `report.from_store` builds
the groups with these steps; `report.verdicts` and `scripts/bench_load_noise.py` read the load noise.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sparklab.bench import noise
from sparklab.bench.metrics import Ratio, estimate, ratio
from sparklab.outputs import equality, tool_calls
from sparklab.report.model import (
    BEST_TIE,
    METRICS,
    Best,
    Group,
    Server,
    acceptance,
    headline_key,
    headline_metric,
)
from sparklab.report.roofline import bound, model_inputs
from sparklab.report.verdict import GroupKey
from sparklab.sweep.store_rows import CellRow


def note(notes: list[str], text: str) -> None:
    """Add a note for the report once (several groups of one server config hit the same gap)."""
    if text not in notes:
        notes.append(text)


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


def group_of(server: Server, workload: str, concurrency: int, cells: list[CellRow]) -> Group:
    results = [cell.result or {"summary": cell.summary} for cell in cells]
    metrics = {name: estimate(v for r in results if (v := read(r)) is not None) for name, read in METRICS.items()}
    sources = sorted({s for cell in cells for s in ((cell.summary or {}).get("token_sources") or {})})
    accepted = sorted({source for r in results if (source := acceptance(r)[1])})
    loads = len({load_of(cell) for cell in cells}) or 1
    return Group(server, workload, concurrency, tuple(cells), metrics, _per_position(cells), _ttfts(cells),
                 tuple(sources), tuple(accepted), loads=loads)


def baseline_of(group: Group, groups: list[Group]) -> Group | None:
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


def with_outputs(group: Group, groups: list[Group], outputs: dict[str, list[dict[str, Any]]],
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
    base = baseline_of(group, groups)
    if base is None or _sampling(base) != _sampling(group):
        result = equality(answers, [], _sampling(group))
    else:
        result = equality(answers, [a for c in base.cells for a in outputs.get(c.id, [])], _sampling(group))
    return replace(group, equality=result)


def with_baseline(group: Group, groups: list[Group]) -> Group:
    base = baseline_of(group, groups)
    if base is group:
        return replace(group, speedup=Ratio(1.0, None, None), baseline=group.server.label,
                       rests_on_partial=group.partial)
    if base is None or group.headline is None or base.headline is None:
        return group
    return replace(group, speedup=ratio(group.headline, base.headline), baseline=base.server.label,
                   rests_on_partial=group.partial or base.partial)


def with_roofline(group: Group, notes: list[str]) -> Group:
    server = group.server
    if server.device is None:
        return group
    inputs, missing = model_inputs(server.model.get("facts") or {}, server.device)
    if inputs is None:
        note(notes, f"{server.label}: no roofline, the model facts lack {', '.join(missing)} (set them with --fact)")
        return group
    m = group.metrics
    accept = m["acceptance_length"].mean if m["acceptance_length"] else None
    if accept is None and not group.is_baseline:
        # tokens per step unknown: a bound at 1 token per step would not bound a drafting engine
        note(notes, f"{server.label}: no roofline, no acceptance length was measured (tokens per target step "
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



def load_of(cell: CellRow) -> str:
    return str(((cell.result or {}).get("server_load") or {}).get("id") or "")


def by_load(group: Group) -> list[list[float]]:
    """The group's headline values grouped by the server start they ran on, in load order."""
    read = METRICS[headline_key(group.concurrency, group.lead)]
    loads: dict[str, list[float]] = {}
    for cell in sorted(group.cells, key=load_of):
        value = read(cell.result or {"summary": cell.summary})
        if value is not None:
            loads.setdefault(load_of(cell), []).append(value)
    return list(loads.values())


def load_components(groups: list[Group]) -> dict[tuple[str, int], noise.Components]:
    """Within- and between-load noise of the headline per (workload, concurrency), pooled over its groups."""
    keys = dict.fromkeys((g.workload, g.concurrency) for g in groups)
    return {key: noise.components(by_load(g) for g in groups if (g.workload, g.concurrency) == key) for key in keys}


def with_load_noise(groups: list[Group]) -> list[Group]:
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
        base = baseline_of(g, groups)
        if base is not None and base is not g and g.speedup is not None:
            g = replace(g, speedup=noise.ratio(by_load(g), by_load(base), comp) or g.speedup)
        out.append(g)
    return out


def changed_output(g: Group) -> bool:
    """A drafting config whose answers differ from none's at temperature 0 (synthetic acceptance must differ)."""
    return g.equality is not None and g.equality.differs and not g.server.is_synthetic


def never_named(g: Group, lossy: frozenset[GroupKey]) -> bool:
    """Not the target model made faster: synthetic acceptance, answers that differ from none's at temperature 0,
    or sampled answers the lossless check found not the target's (`lossy`: Report.lossy)."""
    return g.server.is_synthetic or changed_output(g) or g.key in lossy


def best_configs(groups: list[Group], lossy: frozenset[GroupKey] = frozenset()) -> list[Best]:
    """Per (workload, concurrency): the highest median - sd of the headline over repeats (a config that is fast
    only sometimes scores lower; sd, not MAD, so that one slow run in three counts); within 1% of it, the
    smallest K (no drafting counts as 0). Only the target model made faster is named best: never synthetic
    acceptance (not a drafter), a config whose answers differ from none's at temperature 0, or one whose sampled
    answers the lossless check found not the target's (`lossy`, Report.lossy); a runner-up
    comparison carries between-load noise where the run reloaded some config."""
    out = []
    comps = load_components(groups)
    keys = list(dict.fromkeys((g.workload, g.concurrency) for g in groups))
    for workload, concurrency in keys:
        every = [(g.headline.median - g.headline.sd, g) for g in groups
                 if g.workload == workload and g.concurrency == concurrency and g.headline]
        scored = [s for s in every if not never_named(s[1], lossy)]
        if not scored:
            continue
        top_score, top = max(scored, key=lambda s: s[0])
        close = [s for s in scored if s[0] >= top_score - abs(top_score) * BEST_TIE]  # a noisy top can be < 0
        score, chosen = min(close, key=lambda s: (s[1].server.k or 0, -s[0]))
        others = sorted((s for s in scored if s[1] is not chosen), key=lambda s: -s[0])
        second = others[0][1] if others else None
        above = [g for s, g in sorted(every, key=lambda s: -s[0]) if s > score]
        skipped = tuple(g for g in above if g.server.is_synthetic)
        changed = tuple(g for g in above if changed_output(g))
        not_target = tuple(g for g in above if g.key in lossy and not changed_output(g) and not g.server.is_synthetic)
        versus = None
        if second and chosen.headline and second.headline:
            comp = comps[(workload, concurrency)]
            versus = (noise.ratio(by_load(chosen), by_load(second), comp) if comp.between is not None
                      else ratio(chosen.headline, second.headline))
        one_load = any(g is not None and g.loads < 2 for g in (chosen, second))
        out.append(Best(workload, concurrency, chosen, score, top, len(scored), second, versus, skipped, one_load,
                        changed, not_target))
    return out

