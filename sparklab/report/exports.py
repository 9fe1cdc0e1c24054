"""Machine-readable exports of a report: one CSV row per measurement, and the whole report as JSON. Pure."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict
from typing import Any

from sparklab.bench.metrics import Estimate, Ratio
from sparklab.report.checks import flagged_by, run_checks
from sparklab.report.losses import as_dict, losses
from sparklab.report.model import METRICS, Group, Report, headline_name

SCHEMA = "sparklab.report/1"


def _estimate(e: Estimate | None) -> dict[str, Any] | None:
    if e is None:
        return None
    low, high = _interval(e)
    return {"n": e.n, "mean": e.mean, "ci95_low": low, "ci95_high": high, "identical_repeats": e.identical,
            "median": e.median, "sd": e.sd, "mad": e.mad, "cv": e.cv, "values": list(e.values)}


def _interval(e: Estimate | Ratio | None) -> tuple[float | None, float | None]:
    """The measured interval; identical repeats measured none (low = high would read as certainty)."""
    if e is None or e.identical:
        return None, None
    return e.low, e.high


def _quality(report: Report) -> dict[int, dict[str, Any]]:
    """Per group (by identity): its graded answers, agreement with none, lossless verdict and thinking budget."""
    from sparklab.report import lossless, quality, thinking

    out: dict[int, dict[str, Any]] = {id(g): {} for g in report.groups}
    for r in quality.pass_rates(report):
        out[id(r.group)].update(graded=r.rate.n, pass_rate=r.rate.rate, pass_rate_ci95_low=r.rate.low,
                                pass_rate_ci95_high=r.rate.high, tests_passed=r.tests_passed, tests=r.tests,
                                ungraded=r.ungraded)
    for a in quality.agreements(report):
        out[id(a.group)].update(same_verdict_as_none=a.test.agree, verdict_pairs=a.test.pairs,
                                mcnemar_p=a.test.p_value)
    verdicts = {(r.server.id, r.sampling): r for r in report.lossless}
    for g in report.groups:
        label = model_variant(g)
        found = verdicts.get((g.server.id, label))
        if found is not None:
            d, n = found.logprob, found.length
            out[id(g)].update(lossless=lossless.verdict(found), logprob_diff=d.difference if d else None,
                              logprob_diff_ci95=[d.low, d.high] if d else None, logprob_p=d.p_value if d else None,
                              length_diff=n.difference if n else None, length_p=n.p_value if n else None,
                              sampling_defects=list(found.known))
        if g.answers:
            b = thinking.budget(g)
            out[id(g)].update(answer_rate=b.answer_rate, thinking_used_the_whole_budget=b.exhausted,
                              cut_after_thinking=b.cut, thinking_tokens_per_answer=b.thinking_tokens)
    return out


def model_variant(g: Group) -> str:
    from sparklab.report.model import variant_label

    sampling = {k: v for k, v in g.sampling.items() if v is not None}
    return variant_label(sampling, ["temperature", "top_p", "max_tokens"])


def _group_row(g: Group, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    row: dict[str, Any] = {"workload": g.workload, "concurrency": g.concurrency, "engine": g.server.engine,
                           "method": g.server.method, "k": g.server.k, "server_config_id": g.server.id, "n": g.n,
                           "headline": headline_name(g.concurrency, g.lead),
                           "headline_mean": g.headline.mean if g.headline else None}
    for name in METRICS:
        e = g.metrics[name]
        row[f"{name}_mean"] = e.mean if e else None
        row[f"{name}_ci95_low"], row[f"{name}_ci95_high"] = _interval(e)
    s = g.speedup
    speedup_low, speedup_high = _interval(s)
    row.update({"baseline": g.baseline, "speedup": s.value if s else None, "speedup_ci95_low": speedup_low,
                "speedup_ci95_high": speedup_high,
                "speedup_significant": s.significant if s else None, "failed_requests": g.failed_requests,
                "rests_on_partial": g.rests_on_partial})
    q = g.equality
    row.update({"equality": q.status if q else None, "outputs_compared": q.compared if q else None,
                "identical_to_none": q.share if q else None})
    r = g.roofline
    row.update({"roofline_bound_tps": r.bound_tps if r else None,
                "roofline_measured_tps": r.measured_tps if r else None,
                "roofline_percent": r.percent if r else None,
                "effective_gbps": r.effective_gbps if r else None})
    for key in QUALITY_COLUMNS:
        row[key] = (extra or {}).get(key)
    return row


QUALITY_COLUMNS = ("graded", "pass_rate", "pass_rate_ci95_low", "pass_rate_ci95_high", "tests_passed", "tests",
                   "ungraded", "same_verdict_as_none", "verdict_pairs", "mcnemar_p", "lossless", "logprob_diff",
                   "logprob_diff_ci95", "logprob_p", "length_diff", "length_p", "sampling_defects", "answer_rate",
                   "thinking_used_the_whole_budget", "cut_after_thinking", "thinking_tokens_per_answer")


def to_csv(report: Report) -> str:
    extra = _quality(report)
    rows = [_group_row(g, extra[id(g)]) for g in report.groups]
    out = io.StringIO()
    if rows:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return out.getvalue()


def to_json(report: Report) -> str:
    groups = []
    extra = _quality(report)
    checks = run_checks(report)
    for g in report.groups:
        groups.append({**{k: v for k, v in _group_row(g, extra[id(g)]).items() if not k.startswith(tuple(METRICS))},
                       "metrics": {name: _estimate(e) for name, e in g.metrics.items()},
                       "per_position_acceptance": list(g.per_position), "ttft_ms": list(g.ttft_ms),
                       "token_sources": list(g.token_sources), "acceptance_sources": list(g.acceptance_sources),
                       "roofline": asdict(g.roofline) if g.roofline else None,
                       "loads": g.loads, "load_noise": g.load_noise,
                       "cells": [c.id for c in g.cells]})
    doc = {
        "schema": SCHEMA, "run_id": report.run_id, "sweep": report.sweep, "meta": report.meta, "host": report.host,
        "counts": report.counts,
        "servers": [{"id": s.id, "label": s.label, "engine": s.engine, "method": s.method, "k": s.k,
                     "recipe": s.recipe, "overrides": list(s.overrides), "serve_args": list(s.serve_args),
                     "image": s.image, "image_digest": s.image_digest, "engine_version": s.engine_version,
                     "ready_s": s.ready_s, "startup": s.startup, "model": s.model,
                     "device": asdict(s.device) if s.device else None, "up_command": s.up_command,
                     "synthetic_acceptance": list(s.synthetic) if s.synthetic is not None else None}
                    for s in report.servers],
        "groups": groups,
        "best": [{"workload": b.workload, "concurrency": b.concurrency, "server_config_id": b.group.server.id,
                  "label": b.group.server.label, "score": b.score, "top_score_label": b.best_score_group.server.label,
                  "candidates": b.candidates, "up_command": b.group.server.up_command, "one_load": b.one_load,
                  "synthetic_skipped": [g.server.label for g in b.synthetic_skipped],
                  "changed_output": [g.server.label for g in b.changed_output],
                  "lossy": [g.server.label for g in b.lossy],
                  "flagged_by": flagged_by(b, report, checks)} for b in report.best],
        "losses": [as_dict(x) for x in losses(report)],
        "slo": report.slo,
        "cells": [{"id": c.id, "server_config_id": c.server_config_id, "workload": c.workload,
                   "concurrency": c.concurrency, "repeat": c.repeat, "status": c.status, "host": c.host}
                  for g in report.groups for c in g.cells],
        "failures": [asdict(f) for f in report.failures],
        "roofline_notes": report.roofline_notes,
    }
    return json.dumps(doc, indent=1, default=str) + "\n"
