"""Seed 004's table (pure): generation speed excluding TTFT and TTFT median, without and with drafting.

A sweep file with `headline: decode` gets this table first. Generation speed is sparklab's decode tok/s (tokens
after the first chunk / the time after it, per request, mean over requests): the seed's "generation speed
excludes TTFT". TTFT median is the p50 over the cell's measured requests. One row per workload and engine at
C=1, one column pair per drafting configuration against the same engine's `none`.
"""

from __future__ import annotations

from sparklab.bench.metrics import Estimate
from sparklab.report.document import Para, Section, Table
from sparklab.report.formats import DASH, fmt
from sparklab.report.model import Group, Report


def _fmt(e: Estimate | None, digits: int) -> str:
    return fmt(e, digits)


def _ratio(base: Estimate | None, other: Estimate | None) -> str:
    if base is None or other is None or not base.mean:
        return DASH
    return f"{100 * other.mean / base.mean:.1f}%"


def _prompt(groups: list[Group]) -> str:
    sizes = [m.mean for g in groups if (m := g.metrics.get("prompt_tokens")) is not None]
    return f"{sum(sizes) / len(sizes):,.0f}" if sizes else DASH


def generation_sections(report: Report) -> list[Section]:
    """One table per engine: rows are workloads; columns none, each drafting config, its ratio, and TTFT p50."""
    sections: list[Section] = []
    for engine in dict.fromkeys(g.server.engine for g in report.groups if g.concurrency == 1):
        groups = [g for g in report.groups if g.server.engine == engine and g.concurrency == 1]
        drafting = list(dict.fromkeys(g.server.label for g in groups if not g.is_baseline))
        names = {g.server.label: f"{g.server.method_name}" + (f" K={g.server.k}" if g.server.k else "")
                 for g in groups}
        header = ["workload", "avg prompt tokens", "none tok/s"]
        for label in drafting:
            header += [f"{names[label]} tok/s", f"{names[label]} vs none"]
        header += ["TTFT p50 none ms", *(f"TTFT p50 {names[label]} ms" for label in drafting)]
        rows = []
        for workload in dict.fromkeys(g.workload for g in groups):
            here = [g for g in groups if g.workload == workload]
            base = next((g for g in here if g.is_baseline), None)
            by_label = {g.server.label: g for g in here if not g.is_baseline}
            base_speed = base.metrics["decode_tps"] if base else None
            row = [workload, _prompt(here), fmt(base_speed, 1)]
            for label in drafting:
                speed = by_label[label].metrics["decode_tps"] if label in by_label else None
                row += [fmt(speed, 1), _ratio(base_speed, speed)]
            row.append(fmt(base.metrics["ttft_p50_ms"] if base else None, 1))
            row += [fmt(by_label[label].metrics["ttft_p50_ms"] if label in by_label else None, 1)
                    for label in drafting]
            rows.append(tuple(row))
        numeric = (False, *([True] * (len(header) - 1)))
        sections.append(Section(f"Generation speed (excluding TTFT) and TTFT median: {engine}, C=1", blocks=[
            Para("Seed 004's columns. Generation speed: decode tok/s, tokens after the first chunk / the time after "
                 "it, mean over requests (TTFT excluded). TTFT p50: the median request's first token - start. "
                 "`vs none`: ratio of the means."),
            Table(tuple(header), tuple(rows), numeric)]))
    return sections
