"""`sparklab compare RUN RUN …`: several runs side by side (pure over their built reports).

Runs compare only where they measured the same thing. A cell of one run matches a cell of another when they sent
the same prompts (the workload's content hash, stored with every cell), with the same sampling, at the same
concurrency. Every run is first normalised to its own `none` (each config's speedup, with its interval, as
`sparklab report` computes it), then set beside the others: the headline figure of each run, its speedup over its
own baseline, and each later run against the first (ratio of means, 95% interval by the delta method, as the report
does for speedups). Whatever differs between the runs (models, engines and their versions, images, hosts and
platform, sampling, workload hashes) is listed first. A cell one run has and another lacks stops the comparison with
the reason, unless `force` is given: then the matched cells are compared and the others listed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sparklab.bench.metrics import Estimate, Ratio, ratio
from sparklab.errors import SparklabError
from sparklab.report.content import fmt, fmt_ratio, platform_line
from sparklab.report.document import Block, Bullets, Document, Para, Section, Table
from sparklab.report.model import Group, Report, headline_name, variant_label
from sparklab.report.quality import fmt_rate, pass_rates

# Any: a comparison's rows are JSON-like report data (the report model's stored results)

DASH = "-"
Key = tuple[str, str, int]  # (workload content hash, or "name:WORKLOAD" when none was stored; sampling; concurrency)


@dataclass(frozen=True)
class Cell:
    """One matched (workload, sampling, concurrency): each run's groups there, by config."""

    key: Key
    label: str
    groups: tuple[dict[str, Group], ...]  # per run: config label -> group


@dataclass
class Comparison:
    run_ids: list[str]
    reports: list[Report]
    differences: list[str]
    cells: list[Cell]
    unmatched: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def configs(self) -> list[str]:
        return list(dict.fromkeys(c for cell in self.cells for groups in cell.groups for c in groups))


def config_label(g: Group) -> str:
    return g.server.method_name + (f" K={g.server.k}" if g.server.k is not None else "")


def _hash(g: Group) -> str | None:
    for cell in g.cells:
        found = ((cell.result or {}).get("workload") or {}).get("content_hash")
        if found:
            return str(found)
    return None


def key_of(g: Group) -> Key:
    sampling = json.dumps(g.sampling, sort_keys=True)
    return (_hash(g) or f"name:{g.workload_name or g.workload}", sampling, g.concurrency)


def _describe(key: Key, workload: str) -> str:
    sampling = json.loads(key[1]) if key[1] else {}
    shown = variant_label(sampling, [k for k in ("temperature", "max_tokens") if k in sampling])
    digest = key[0][:19] if not key[0].startswith("name:") else "no content hash stored"
    return f"{workload} ({digest}) at C={key[2]}" + (f", {shown}" if shown else "")


def compare(run_ids: list[str], reports: list[Report], force: bool = False) -> Comparison:
    if len(reports) < 2:
        raise SparklabError("compare needs at least two runs", "sparklab compare RUN RUN [RUN ...]")
    per_run: list[dict[Key, dict[str, Group]]] = []
    names: dict[Key, str] = {}
    for report in reports:
        found: dict[Key, dict[str, Group]] = {}
        for g in report.groups:
            key = key_of(g)
            names.setdefault(key, g.workload_name or g.workload)
            found.setdefault(key, {})[config_label(g)] = g
        per_run.append(found)
    keys = list(dict.fromkeys(k for found in per_run for k in found))
    matched = [k for k in keys if all(k in found for found in per_run)]
    unmatched = []
    for k in keys:
        if k in matched:
            continue
        lacking = [run_ids[i] for i, found in enumerate(per_run) if k not in found]
        unmatched.append(f"{_describe(k, names[k])}: not in {', '.join(lacking)}" + _nearest(k, lacking, run_ids,
                                                                                              per_run, names))
    if unmatched and not force:
        raise SparklabError(
            f"the runs do not measure the same cells: {len(unmatched)} cell(s) are in some runs only, e.g. "
            f"{unmatched[0]}",
            "Cells match on the workload's content hash, the sampling and the concurrency. Compare runs of the same "
            "sweep settings, or pass --force to compare the cells they share and list the rest.")
    if not matched:
        raise SparklabError("the runs share no cell (workload content hash, sampling and concurrency all equal)",
                            "Nothing to put side by side: check that they ran the same workloads and sampling.")
    cells = [Cell(k, f"{names[k]} C={k[2]}" + _sampling_suffix(k, keys), tuple(found[k] for found in per_run))
             for k in matched]
    notes = []
    if any(k[0].startswith("name:") for k in matched):
        notes.append("some cells stored no workload content hash (runs from before it was kept): they were matched "
                     "by workload name only")
    return Comparison(run_ids, reports, differences(run_ids, reports), cells, unmatched if force else [], notes)


def _sampling_suffix(key: Key, keys: list[Key]) -> str:
    samplings = {k[1] for k in keys}
    if len(samplings) < 2:
        return ""
    sampling = json.loads(key[1])
    varying = [name for name in sampling if len({json.dumps(json.loads(k[1]).get(name)) for k in keys}) > 1]
    return f" ({variant_label(sampling, varying)})"


def _nearest(key: Key, lacking: list[str], run_ids: list[str], per_run: list[dict[Key, dict[str, Group]]],
             names: dict[Key, str]) -> str:
    """What the first run lacking this cell has for the same workload name and concurrency, and how it differs."""
    i = run_ids.index(lacking[0])
    near = [k for k in per_run[i] if names.get(k) == names[key] and k[2] == key[2]]
    if not near:
        return ""
    other = near[0]
    why = []
    if other[0] != key[0]:
        why.append(f"workload hash {other[0][:19]} there")
    if other[1] != key[1]:
        mine, theirs = json.loads(key[1]), json.loads(other[1])
        why += [f"{k} {theirs.get(k)!r} there, {mine.get(k)!r} here" for k in sorted({*mine, *theirs})
                if mine.get(k) != theirs.get(k)]
    return f" ({'; '.join(why)})" if why else ""


def _values(reports: list[Report], read: Any) -> list[str]:
    return [", ".join(sorted({str(v) for v in read(r) if v not in (None, "")})) or "unknown" for r in reports]


def differences(run_ids: list[str], reports: list[Report]) -> list[str]:
    """Each attribute whose value differs between the runs, as 'what: run-a: x; run-b: y'."""
    def hashes(r: Report) -> set[str]:
        return {f"{g.workload_name}={(_hash(g) or '?')[:19]}" for g in r.groups}

    attributes = [
        ("model", lambda r: {s.model.get("id") for s in r.servers}),
        ("recipe", lambda r: {s.recipe for s in r.servers}),
        ("engine", lambda r: {s.engine for s in r.servers}),
        ("engine version", lambda r: {f"{s.engine} {s.engine_version}" for s in r.servers if s.engine_version}),
        ("image", lambda r: {s.image for s in r.servers}),
        ("image digest", lambda r: {s.image_digest for s in r.servers}),
        ("host", lambda r: {r.host.get("hostname"), *((r.host.get("docker_hosts") or {}).keys())}),
        ("platform", lambda r: {platform_line(r.host["platform"])} if r.host.get("platform") else set()),
        ("sampling", lambda r: {json.dumps({k: v for k, v in g.sampling.items() if v is not None}, sort_keys=True)
                                for g in r.groups}),
        ("workload hash", hashes),
        ("sparklab", lambda r: {r.meta.get("sparklab_version")}),
    ]
    out = []
    for name, read in attributes:
        values = _values(reports, read)
        if len(set(values)) > 1:
            out.append(f"{name}: " + "; ".join(f"{run}: {v}" for run, v in zip(run_ids, values, strict=True)))
    return out


def _headline(g: Group | None) -> Estimate | None:
    return g.headline if g is not None else None


def versus_first(cell: Cell, config: str, i: int) -> Ratio | None:
    first, other = _headline(cell.groups[0].get(config)), _headline(cell.groups[i].get(config))
    return ratio(other, first) if first is not None and other is not None else None


def _ratio_text(r: Ratio | None) -> str:
    if r is None:
        return DASH
    text = f"{100 * r.value:.1f}%"
    if r.low is not None and r.high is not None:
        text += f" [{100 * r.low:.1f}, {100 * r.high:.1f}]" + ("" if r.significant else " n.s.")
    return text


def rows(comparison: Comparison) -> list[dict[str, Any]]:
    """One row per matched cell, config and run (CSV and JSON)."""
    out = []
    for cell in comparison.cells:
        for config in dict.fromkeys(c for groups in cell.groups for c in groups):
            for i, run in enumerate(comparison.run_ids):
                g = cell.groups[i].get(config)
                h, s, v = _headline(g), g.speedup if g else None, versus_first(cell, config, i)
                rate = _rate_of(comparison.reports[i], g)
                out.append({
                    "cell": cell.label, "workload_hash": cell.key[0], "sampling": json.loads(cell.key[1]),
                    "concurrency": cell.key[2], "config": config, "run": run,
                    "headline": headline_name(cell.key[2], comparison.reports[i].lead),
                    "mean": h.mean if h else None, "ci95_low": h.low if h else None, "ci95_high": h.high if h else None,
                    "n": h.n if h else 0, "vs_own_none": s.value if s else None,
                    "vs_own_none_ci95": [s.low, s.high] if s else None,
                    "vs_first_run": v.value if v else None, "vs_first_run_ci95": [v.low, v.high] if v else None,
                    "pass_rate": rate.rate.rate if rate else None,
                    "pass_rate_ci95": [rate.rate.low, rate.rate.high] if rate else None})
    return out


def document(comparison: Comparison, plots: list[tuple[str, Any]] | None = None) -> Document:
    from sparklab.report.document import Image

    runs = comparison.run_ids
    top: list[Block] = [Bullets(tuple(f"{run}: sweep `{r.sweep.get('name', '?')}`, {len(r.servers)} server configs, "
                                      f"created {r.meta.get('created_at', '?')}" for run, r in
                                      zip(runs, comparison.reports, strict=True)))]
    top.append(Para("What differs between the runs:" if comparison.differences else
                    "Nothing recorded differs between the runs (models, engines, images, hosts, sampling, workloads)."))
    if comparison.differences:
        top.append(Bullets(tuple(comparison.differences)))
    sections = [Section("Runs compared", blocks=top)]
    method = Para("Cells match on the workload's content hash, the sampling and the concurrency. Each run: its "
                  "headline figure (mean ± 95% interval over repeats) and its speedup over its own `none` ([95% "
                  "interval]). Later runs also against the first run, config by config: the ratio of means with "
                  "its 95% interval (delta method; n.s. = includes 100%).")
    for cell in comparison.cells:
        configs = list(dict.fromkeys(c for groups in cell.groups for c in groups))
        accept = [any(g.metrics.get("acceptance_length") for g in groups.values()) for groups in cell.groups]
        header = ["config"]
        for i, run in enumerate(runs):
            header += [f"{run}: {headline_name(cell.key[2], comparison.reports[i].lead)}", f"{run}: vs own none"]
            if accept[i]:
                header.append(f"{run}: accept len")
            if i:
                header.append(f"{run} vs {runs[0]}")
        table_rows = []
        for config in configs:
            row = [config]
            for i in range(len(runs)):
                g = cell.groups[i].get(config)
                row += [fmt(_headline(g)) if g else DASH, fmt_ratio(g) if g else DASH]
                if accept[i]:
                    row.append(fmt(g.metrics.get("acceptance_length")) if g else DASH)
                if i:
                    row.append(_ratio_text(versus_first(cell, config, i)))
            table_rows.append(tuple(row))
        blocks: list[Block] = [method] if cell is comparison.cells[0] else []
        blocks.append(Table(tuple(header), tuple(table_rows), (False, *([True] * (len(header) - 1)))))
        graded = _graded_table(comparison, cell, configs)
        if graded is not None:
            blocks += [Para("Graded answers (pass rate, Wilson 95% interval):"), graded]
        sections.append(Section(f"Side by side: {cell.label}", blocks=blocks))
    extra = [*comparison.notes]
    if comparison.unmatched:
        extra.append("cells left out (--force): " + "; ".join(comparison.unmatched))
    if extra:
        sections.append(Section("Notes", blocks=[Bullets(tuple(extra))]))
    if plots:
        sections.append(Section("Plots", blocks=[Image(title, path) for title, path in plots]))
    return Document("sparklab compare: " + " vs ".join(runs), sections)


def _rate_of(report: Report, g: Group | None) -> Any:
    if g is None or not g.grades:
        return None
    return next((p for p in pass_rates(report) if p.group is g), None)


def _graded_table(comparison: Comparison, cell: Cell, configs: list[str]) -> Table | None:
    if not any(g.grades for groups in cell.groups for g in groups.values()):
        return None
    table_rows = []
    for config in configs:
        row = [config]
        for i, report in enumerate(comparison.reports):
            found = _rate_of(report, cell.groups[i].get(config))
            row.append(fmt_rate(found.rate) if found is not None else DASH)
        table_rows.append(tuple(row))
    return Table(("config", *comparison.run_ids), tuple(table_rows), (False, *([True] * len(comparison.run_ids))))


FORMATS = ("md", "csv", "json", "html")


def render(comparison: Comparison, fmt_name: str, plot_dir: Any = None) -> str:
    """One format as text, as `sparklab report` renders its own; HTML embeds the plots drawn into plot_dir."""
    from sparklab.report.document import markdown, to_html

    if fmt_name == "md":
        return markdown(document(comparison))
    if fmt_name == "csv":
        return to_csv(comparison)
    if fmt_name == "json":
        return to_json(comparison)
    if fmt_name == "html":
        from sparklab.report.plots import compare_plots

        return to_html(document(comparison, compare_plots(comparison, plot_dir)))
    raise ValueError(f"unknown format {fmt_name!r}")


def write_all(comparison: Comparison, out: Any) -> list[Any]:
    """compare.md (linking plots/*.png), compare.csv, compare.json and the self-contained compare.html."""
    from sparklab.report.document import markdown, to_html
    from sparklab.report.plots import compare_plots

    out.mkdir(parents=True, exist_ok=True)
    plots = compare_plots(comparison, out / "plots")
    doc = document(comparison, plots)
    files = {"compare.md": markdown(doc, base=out), "compare.csv": to_csv(comparison),
             "compare.json": to_json(comparison), "compare.html": to_html(doc)}
    for name, text in files.items():
        (out / name).write_text(text, encoding="utf-8")
    return [out / name for name in files] + [path for _, path in plots]


def to_csv(comparison: Comparison) -> str:
    import csv
    import io

    out = io.StringIO()
    data = rows(comparison)
    if data:
        flat = [{k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in row.items()} for row in data]
        writer = csv.DictWriter(out, fieldnames=list(flat[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(flat)
    return out.getvalue()


def to_json(comparison: Comparison) -> str:
    doc = {"schema": "sparklab.compare/1", "runs": comparison.run_ids, "differences": comparison.differences,
           "cells": [c.label for c in comparison.cells], "rows": rows(comparison),
           "unmatched": comparison.unmatched, "notes": comparison.notes}
    return json.dumps(doc, indent=1, default=str) + "\n"
