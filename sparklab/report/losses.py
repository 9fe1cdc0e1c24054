"""Why acceptance does not become speed (pure): the gap between a drafting config's ideal speed-up (its acceptance
length) and its measured one, split into where it went.

Per drafting config at a concurrency, against the same engine's `none` there (decode figures, after the first
token, per sequence):
- t0 = 1 / none's decode tok/s per sequence: a plain decode step;
- tau = tokens / (tokens - accepted drafts): tokens per sequence-step (every step emits one token of its own plus
  the drafts it accepted; exact from the client's token count and the server's accepted counter). tau is below
  the acceptance length when some steps drafted nothing (an n-gram drafter finds no match);
- t_step = tau / the config's decode tok/s per sequence: its step, drafting and verifying;
- the verify step's extra cost over a plain decode step: what t_step - t0 is for a drafter that costs nothing to
  run, the run's n-gram (or synthetic, whose drafter is the n-gram lookup) config at the same K and concurrency,
  per step that drafted (its t_step - t0 over the share of its steps with a draft), times this config's share;
- the drafter's cost: the rest of t_step - t0 (0 for the n-gram reference itself: a lookup on the host);
- the scheduler's cap: vLLM's startup warning `max_num_scheduled_tokens is set to N` caps the tokens a step
  schedules, so at most N / C per sequence per step.

On the speed-up axis, from the ideal down to the measured: acceptance length -> capped at N / C (scheduler) ->
tau (steps without a draft) -> x t0 / (t0 + verify extra) (verify) -> x t0 / t_step (drafter) = the decode
speed-up -> the headline speed-up (other: prefill and TTFT in the headline, scheduling, noise). A negative part is
folded into "other" and said so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sparklab.report.document import Block, Para, Section, Table
from sparklab.report.model import Group, Report

REFERENCE_METHODS = ("ngram", "synthetic")  # a drafter run as a host-side lookup: its own cost taken as 0
PARTS = ("measured", "other", "drafter", "verify", "no-draft steps", "scheduler cap")


@dataclass(frozen=True)
class Loss:
    group: Group
    ideal: float  # acceptance length
    tau: float
    t0_ms: float
    step_ms: float
    verify_ms: float | None  # None: no reference to split drafting from verifying
    drafter_ms: float | None
    cap: float | None  # tokens per sequence per step the scheduler allows (N / C), None: no warning
    parts: dict[str, float]  # speed-up lost to each part, and the measured speed-up
    notes: tuple[str, ...] = ()


def _decode(g: Group) -> float | None:
    m = g.metrics.get("decode_tps") or g.metrics.get("per_request_tps")
    return m.mean if m and m.mean > 0 else None


def _counts(g: Group) -> tuple[float, float, float] | None:
    """(tokens, accepted drafts, steps with a draft) over the group's cells, from the client and the server."""
    tokens = accepted = drafts = 0.0
    for cell in g.cells:
        result = cell.result or {}
        spec = result.get("speculative") or {}
        out = (result.get("summary") or cell.summary or {}).get("output_tokens")
        if out is None or spec.get("accepted_tokens") is None:
            return None
        tokens += float(out)
        accepted += float(spec["accepted_tokens"])
        drafts += float(spec.get("drafts") or 0.0)
    return (tokens, accepted, drafts) if tokens > accepted else None


def _step(g: Group, r0: float) -> tuple[float, float, float] | None:
    """(tau, t_step ms, share of sequence-steps that drafted)."""
    rate, counts = _decode(g), _counts(g)
    al = g.metrics.get("acceptance_length")
    if rate is None or al is None:
        return None
    if counts is None:
        return al.mean, 1000 * al.mean / rate, 1.0
    tokens, accepted, drafts = counts
    steps = tokens - accepted
    return tokens / steps, 1000 * (tokens / steps) / rate, min(1.0, drafts / steps) if drafts else 1.0


def _baseline(g: Group, groups: list[Group]) -> Group | None:
    return next((b for b in groups if b.is_baseline and b.server.engine == g.server.engine
                 and b.workload == g.workload and b.concurrency == g.concurrency), None)


def _reference(g: Group, groups: list[Group]) -> Group | None:
    return next((r for r in groups if r.server.method in REFERENCE_METHODS and r.server.engine == g.server.engine
                 and r.server.k == g.server.k and r.workload == g.workload and r.concurrency == g.concurrency
                 and r.metrics.get("acceptance_length")), None)


def loss(g: Group, groups: list[Group]) -> Loss | None:
    base = _baseline(g, groups)
    al = g.metrics.get("acceptance_length")
    if g.is_baseline or base is None or al is None or g.speedup is None or (r0 := _decode(base)) is None:
        return None
    step = _step(g, r0)
    if step is None:
        return None
    tau, t_step, share = step
    t0 = 1000 / r0
    notes: list[str] = []
    ref = g if g.server.method in REFERENCE_METHODS else _reference(g, groups)
    verify = drafter = None
    if ref is g:
        verify, drafter = t_step - t0, 0.0
    elif ref is not None and (ref_step := _step(ref, r0)) is not None:
        # a verify through K+1 tokens costs no less than a decode step: a reference measured faster than none
        # is noise, taken as no extra cost
        verify = max(0.0, (ref_step[1] - t0) / ref_step[2]) * share
        drafter = t_step - t0 - verify
    limit = g.server.startup.get("max_num_scheduled_tokens")
    cap = float(limit) / g.concurrency if limit and limit > 0 else None
    ideal = al.mean
    capped = min(ideal, cap) if cap else ideal
    after_steps = min(tau, capped)
    parts: dict[str, float] = {"scheduler cap": ideal - capped, "no-draft steps": capped - after_steps}
    if verify is not None and drafter is not None:
        after_verify = after_steps * t0 / (t0 + verify)  # the reference's own: = decode, its drafter part 0
        decode = after_steps * t0 / t_step
        parts["verify"] = after_steps - after_verify
        parts["drafter"] = after_verify - decode
    else:
        decode = after_steps * t0 / t_step
        parts["verify"] = after_steps - decode  # drafting and verifying together: no reference to split them
        parts["drafter"] = 0.0
        notes.append("drafter and verify not separable (no n-gram config at this K and concurrency): both under "
                     "verify")
    parts["other"] = decode - g.speedup.value
    parts["measured"] = g.speedup.value
    for name in ("verify", "drafter", "no-draft steps", "scheduler cap"):
        if parts[name] < 0:
            notes.append(f"{name} came out {parts[name]:+.2f}x (noise): folded into other")
            parts["other"] += parts[name]
            parts[name] = 0.0
    return Loss(g, ideal, tau, t0, t_step, verify, drafter, cap, parts, tuple(notes))


def losses(report: Report) -> list[Loss]:
    return [x for g in report.groups if (x := loss(g, report.groups)) is not None]


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def section(report: Report) -> Section | None:
    rows = losses(report)
    if not rows:
        return None
    table = tuple((x.group.workload, str(x.group.concurrency), x.group.server.label, f"{x.ideal:.2f}x",
                   f"{x.tau:.2f}", _ms(x.t0_ms), _ms(x.step_ms), _ms(x.verify_ms), _ms(x.drafter_ms),
                   "-" if x.cap is None else f"{x.cap:g}",
                   *(f"{x.parts[p]:.2f}x" for p in reversed(PARTS)))
                  for x in rows)
    blocks: list[Block] = [
        Para("For each drafting config, the ideal speed-up (its acceptance length) and where the gap to the "
             "measured one went, in speed-up units that add up to the ideal: the scheduler's cap "
             "(max_num_scheduled_tokens / C tokens per sequence per step, from the startup warning); steps the "
             "drafter proposed nothing (tokens per step below the acceptance length); the verify step's extra cost "
             "over a plain decode step (t_step - t0, measured on the run's n-gram config at the same K and C, whose "
             "drafter is a host-side lookup); the drafter's own cost (the rest of t_step - t0); other (prefill and "
             "TTFT in the headline, scheduling). t0: none's decode step; t_step: this config's, per sequence."),
        Table(("workload", "C", "config", "ideal", "tokens/step", "t0 ms", "t_step ms", "verify extra ms",
               "drafter ms", "cap tokens/seq", *(f"{p}" for p in reversed(PARTS))), table,
              (False, True, False, *([True] * (7 + len(PARTS))))),
    ]
    notes = [f"{x.group.server.label} C={x.group.concurrency}: {n}" for x in rows for n in x.notes]
    if notes:
        blocks.append(Para("; ".join(notes) + "."))
    blocks.append(Para("The plot `losses.png` draws each config's parts as one stacked bar, up to its ideal."))
    return Section("Why acceptance does not become speed", blocks=blocks)


COLORS = {"measured": "#2b7bba", "other": "#bbbbbb", "drafter": "#e08214", "verify": "#d7301f",
          "no-draft steps": "#9e9ac8", "scheduler cap": "#41ab5d"}


def as_dict(x: Loss) -> dict[str, Any]:
    return {"config": x.group.server.label, "concurrency": x.group.concurrency, "ideal": x.ideal, "tau": x.tau,
            "t0_ms": x.t0_ms, "step_ms": x.step_ms, "verify_ms": x.verify_ms, "drafter_ms": x.drafter_ms,
            "cap": x.cap, **x.parts}
