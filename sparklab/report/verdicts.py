"""How far the report's verdicts reach (pure): load-to-load noise and synthetic acceptance, as report sections.

- Load noise: each cell keeps the server start it ran on. Where a config was reloaded, the noise between loads is
  estimated (sparklab.bench.noise) and every interval and speedup at that concurrency carries it; the share of a
  single run's variance that is between loads is printed per concurrency, and every verdict that rests on one load
  (the best or its runner-up never reloaded) is named.
- Synthetic acceptance: a server told to accept drafts at given rates (vLLM's synthetic rejection sampling) measures
  the engine's step cost at that acceptance; it is not a drafter. Its configs are listed with their profile, its
  answers are expected to differ from none's, and it is never named best.
"""

from __future__ import annotations

from sparklab.report.document import Bullets, Para, Section
from sparklab.report.model import Report, load_components


def synthetic_section(report: Report) -> Section | None:
    servers = [s for s in report.servers if s.is_synthetic]
    if not servers:
        return None
    items = []
    for s in servers:
        profile = " ".join(f"{r:.3g}" for r in s.synthetic or ()) or "not readable from its command"
        al = 1 + sum(s.synthetic or ())
        items.append(f"{s.label}: per-position acceptance {profile} (acceptance length {al:.2f} if every step "
                     "drafted)")
    return Section("Synthetic acceptance: not drafters", blocks=[
        Para("These servers accept draft tokens at set rates whatever the target says (vLLM's "
             "`rejection_sample_method: synthetic`, vllm/config/speculative.py:217-237): their speed is the "
             "engine's real step cost at that acceptance profile, their answers are not the target's (the "
             "equality check expects them to differ), and they are never named a best configuration."),
        Bullets(tuple(items))])


def load_noise_section(report: Report) -> Section:
    """The between-load share of variance per concurrency, and the verdicts that rest on one load."""
    comps = load_components(report.groups)
    items = []
    for (workload, c), comp in comps.items():
        if comp.between is None:
            continue
        share = comp.between_share
        within = (comp.within or 0.0) ** 0.5
        items.append(f"{workload}, C={c}: {comp.reloaded} config(s) reloaded; run-to-run sd within one load "
                     f"{100 * within:.1f}%, between loads {100 * comp.between ** 0.5:.1f}% "
                     f"(between-load share of a run's variance {100 * (share or 0):.0f}%; {comp.within_df} and "
                     f"{comp.between_df} degrees of freedom)")
    if not items:
        items.append("no config was reloaded in this run: intervals see the noise within one server start only "
                     "(on a shared machine loads drift more than runs: README measured 11-19% against 2-7%), so "
                     "every verdict rests on one load")
    single = [b for b in report.best if b.one_load]
    if single and any(g.loads >= 2 for g in report.groups):
        items.append("verdicts that rest on one load (the pick or its runner-up ran on one server start; its "
                     "between-load part is borrowed from the reloaded configs): "
                     + "; ".join(f"{b.workload} C={b.concurrency}: {b.group.server.label}" for b in single))
    return Section("Noise between server loads", blocks=[
        Para("Each cell keeps the server start (load) it ran on. Where a config was loaded more than once, the "
             "noise between loads is estimated (one-way random effects, pooled over the configs at the same "
             "concurrency) and the intervals and speedups above include it."),
        Bullets(tuple(items))])
