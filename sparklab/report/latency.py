"""The latency objective (pure): which configs meet an SLO, the best among them per concurrency, and the highest
concurrency of the run at which any config meets it (`report --slo`, or the sweep file's `slo:`).

Each term's statistic (e.g. TPOT p90) is taken per cell from its stored per-request records (sparklab.bench.slo),
so one value per repeat; a config meets the SLO when the 95% interval of every term lies under its bound. The best
among those is picked by the report's own rule (median - sd of the headline; a config that is not the target
model made faster, grouping.never_named, is never named).
"""

from __future__ import annotations

from dataclasses import dataclass

from sparklab.bench import slo as slos
from sparklab.report.document import Bullets, Para, Section, Table
from sparklab.report.formats import DASH
from sparklab.report.grouping import never_named
from sparklab.report.model import Group, Report


@dataclass(frozen=True)
class SloRow:
    group: Group
    meets: bool
    verdicts: tuple[slos.TermVerdict, ...]


def _values(group: Group, term: slos.Term) -> list[float]:
    return [v for c in group.cells if (v := slos.cell_value(c.result or {"summary": c.summary}, term)) is not None]


def rows(report: Report, terms: tuple[slos.Term, ...]) -> list[SloRow]:
    out = []
    for g in report.groups:
        meets, verdicts = slos.judge({t.key: _values(g, t) for t in terms}, terms)
        out.append(SloRow(g, meets, tuple(verdicts)))
    return out


def _score(g: Group) -> float:
    return g.headline.median - g.headline.sd if g.headline else float("-inf")


def best_under(report: Report, terms: tuple[slos.Term, ...]) -> tuple[dict[tuple[str, int], Group | None],
                                                                        dict[str, tuple[int, Group] | None]]:
    """Per (workload, concurrency): the best config that meets the SLO (None: none does); per workload: the
    highest concurrency where some config meets it, with the best there."""
    lossy = report.lossy  # derived from the lossless verdicts: once, not per row
    meeting = [r.group for r in rows(report, terms) if r.meets and not never_named(r.group, lossy)]
    best: dict[tuple[str, int], Group | None] = {}
    for workload in report.workloads:
        for c in report.concurrencies(workload):
            here = [g for g in meeting if g.workload == workload and g.concurrency == c and g.headline]
            best[(workload, c)] = max(here, key=_score) if here else None
    reach: dict[str, tuple[int, Group] | None] = {}
    for workload in report.workloads:
        met = [(c, g) for (w, c), g in best.items() if w == workload and g is not None]
        reach[workload] = max(met, key=lambda m: m[0]) if met else None
    return best, reach


def section(report: Report, text: str | None) -> Section | None:
    terms = slos.parse(text)
    if not terms:
        return None
    table = []
    for r in rows(report, terms):
        g = r.group
        table.append((g.workload, str(g.concurrency), g.server.label,
                      *(v.describe().split(": ", 1)[-1] if v.mean is not None else DASH for v in r.verdicts),
                      "yes" if r.meets else "no"))
    best, reach = best_under(report, terms)
    items = []
    for (workload, c), chosen in best.items():
        items.append(f"{workload}, C={c}: " + (f"{chosen.server.label} ({chosen.headline.mean:,.2f} tok/s)"
                                                if chosen and chosen.headline
                                                else "no config meets the SLO"))
    for workload, hit in reach.items():
        items.append(f"{workload}: " + (f"met up to C={hit[0]} (the highest concurrency of this run where any config "
                                        f"meets it), by {hit[1].server.label}" if hit else
                                        "no config meets it at any concurrency of this run"))
    return Section(f"Latency objective: {slos.describe(terms)}", blocks=[
        Para("Each term's statistic per cell from the stored per-request records (warmup excluded), one value per "
             "repeat; a config meets the objective when the 95% interval of every term is at or under its bound "
             "(a single run: its value). Best among those: the report's score (median - sd of the headline tok/s); "
             "synthetic acceptance, and a config whose answers are not the target's, is never named."),
        Table(("workload", "C", "config", *(t.key + " ms (95% upper)" for t in terms), "meets"), tuple(table),
              (False, True, False, *([False] * len(terms)), False)),
        Para("Best per concurrency under the objective, and how far it reaches:"),
        Bullets(tuple(items))])
