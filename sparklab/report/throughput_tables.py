"""The report's throughput tables (pure): seed 000's table per engine and workload (the headline tok/s per
concurrency and its speedup against the same engine's `none`), every metric per concurrency, the speedup by K
when a method ran with several K, and acceptance per draft position; with the cell formats they share
(`fmt_ratio` for a speedup with its interval, `k_cell` for K) that the best-config section and `report.compare`
use too.
"""

from __future__ import annotations

from sparklab.bench.metrics import IDENTICAL_SHORT, Ratio
from sparklab.report import provenance
from sparklab.report.document import Para, Section, Table
from sparklab.report.formats import DASH, fmt
from sparklab.report.model import DECODE_LEAD, Group, Report, Server, headline_name


def fmt_ratio(group: Group) -> str:
    if group.is_baseline and group.baseline == group.server.label:
        return "100.00%"
    r: Ratio | None = group.speedup
    if r is None:
        return DASH
    text = f"{100 * r.value:.2f}%"
    if r.identical:
        text += f" ({IDENTICAL_SHORT})"
    elif r.low is not None and r.high is not None:
        text += f" [{100 * r.low:.1f}, {100 * r.high:.1f}]"
        if not r.significant:
            text += " n.s."
    if group.rests_on_partial:
        text += " (partial)"
    return text


def _n(group: Group) -> str:
    flag = " (spread)" if group.headline and group.headline.spread_is_large else ""
    return f"{group.n}{flag}"


def _identical(group: Group) -> str:
    if group.is_baseline:
        return "(baseline)"
    text = group.equality.describe() if group.equality else DASH
    if group.server.is_synthetic and group.equality and group.equality.status == "checked":
        text += " (synthetic: expected to differ)" if group.equality.differs else " (synthetic, yet identical!)"
    return text


def k_cell(server: Server) -> str:
    return DASH if server.k is None else str(server.k)


def seed_tables(report: Report) -> list[Section]:
    sections = []
    for workload in report.workloads:
        concs = report.concurrencies(workload)
        for engine in report.engines(workload):
            groups = [g for g in report.groups if g.workload == workload and g.server.engine == engine]
            servers = sorted({g.server.id: g.server for g in groups}.values(),
                             key=lambda s: (s.method != "none", s.seq))
            ttft = report.lead == DECODE_LEAD  # seed 004's table: generation speed, then TTFT median
            header = ("method", "K", *(headline_name(c, report.lead) for c in concs),
                      *((f"C={c} TTFT p50 ms" for c in concs) if ttft else ()),
                      *(f"vs baseline C={c}" for c in concs))
            rows = []
            for server in servers:
                by_c = {g.concurrency: g for g in groups if g.server.id == server.id}
                rows.append((server.method_name, k_cell(server),
                             *(fmt(by_c[c].headline) if c in by_c else DASH for c in concs),
                             *((fmt(by_c[c].metrics["ttft_p50_ms"], 1) if c in by_c else DASH for c in concs)
                               if ttft else ()),
                             *(fmt_ratio(by_c[c]) if c in by_c else DASH for c in concs)))
            numeric = (False, False, *([True] * (3 if ttft else 2) * len(concs)))
            sections.append(Section(f"Throughput vs baseline: {engine}, workload {workload}", blocks=[
                Table(header, tuple(rows), numeric)]))
    return sections


def detail_tables(report: Report) -> list[Section]:
    sections = []
    header = ("config", "K", "n", "aggregate tok/s", "per-request tok/s", "decode tok/s", "TTFT p50 ms",
              "accept len", "accept rate %", "vs baseline", "identical to none", "% of roofline")
    numeric = (False, False, True, True, True, True, True, True, True, True, False, True)
    for workload in report.workloads:
        for c in report.concurrencies(workload):
            rows = []
            for g in (g for g in report.groups if g.workload == workload and g.concurrency == c):
                m = g.metrics
                rows.append((f"{g.server.engine} {g.server.method_name}", k_cell(g.server), _n(g),
                             fmt(m["aggregate_tps"]), fmt(m["per_request_tps"]), fmt(m["decode_tps"]),
                             fmt(m["ttft_p50_ms"], 1), fmt(m["acceptance_length"]) + provenance.mark(g),
                             fmt(m["acceptance_rate"], 1, 100), fmt_ratio(g), _identical(g),
                             f"{g.roofline.percent:.1f}%" if g.roofline else DASH))
            sections.append(Section(f"All metrics: workload {workload}, C={c}", level=3,
                                    blocks=[Table(header, tuple(rows), numeric)]))
    return [Section("All metrics per concurrency"), *sections]


def k_pivot(report: Report) -> list[Section]:
    """Speedup by K, when some method ran with several K."""
    sections = []
    for workload in report.workloads:
        groups = [g for g in report.groups if g.workload == workload and g.server.k is not None]
        ks = sorted({g.server.k for g in groups if g.server.k is not None})
        methods = list(dict.fromkeys((g.server.engine, g.server.method_name) for g in groups))
        if len(ks) < 2:
            continue
        rows = []
        for c in report.concurrencies(workload):
            for engine, method in methods:
                by_k = {g.server.k: g for g in groups if g.concurrency == c
                        and (g.server.engine, g.server.method_name) == (engine, method)}
                if by_k:
                    rows.append((str(c), f"{engine} {method}", *(fmt_ratio(by_k[k]) if k in by_k else DASH
                                                                 for k in ks)))
        header = ("C", "config", *(f"K={k}" for k in ks))
        sections.append(Section(f"Speedup vs baseline by K: workload {workload}", blocks=[
            Para("Each cell: that method at that K against the same engine's `none` (the headline tok/s of the "
                 "tables above)."),
            Table(header, tuple(rows), (True, False, *([True] * len(ks))))]))
    return sections


def acceptance_section(report: Report) -> Section | None:
    """Per-position acceptance (vLLM's per-position counters), the table behind the acceptance plot."""
    shown = [g for g in report.groups if g.per_position]
    if not shown:
        return None
    width = max(len(g.per_position) for g in shown)
    rows = tuple((g.workload, str(g.concurrency), g.server.label, fmt(g.metrics["acceptance_length"]),
                  *(f"{g.per_position[i]:.3f}" if i < len(g.per_position) else DASH for i in range(width)))
                 for g in shown)
    header = ("workload", "C", "config", "accept len", *(f"pos {i + 1}" for i in range(width)))
    return Section("Acceptance per draft position", blocks=[
        Para("The share of drafts whose token at that position was accepted, from the server's per-position "
             "counters over each window, mean over repeats. Position 1's share is the chance the first draft "
             "token survives; a steep fall says a smaller K costs little."),
        Table(header, rows, (False, True, False, *([True] * (width + 1))))])
