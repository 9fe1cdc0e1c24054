"""Checks that protect a report's verdict (pure): is a faster configuration's number worth acting on?

Each check reads only the stored run and answers with findings (empty: passed). The report lists every check,
what it looked at, and its findings, so a clean report says so rather than saying nothing.

- equality: at temperature 0 a drafting config's answers must equal the baseline's, prompt by prompt.
- truncation: answers cut by max_tokens when the length was not forced, and answers far shorter than asked.
- prefix cache: prompt tokens served from the prefix cache during a window flatter TTFT.
- ceilings: numbers speculative decoding cannot produce (decode faster than (K+1) x the baseline, more than
  K+1 tokens per chunk) or that contradict each other (tokens per chunk vs the server's acceptance length).
- images: cells of one run measured on different image digests.
- tool-call runaways: answers that repeat one tool call or never stop calling (seed 002's `tool_choice:
  "required"` loop), from the toolcall-probe workload.
- clocks under load: cells whose SM clock fell, or whose GPU reported throttle reasons, during their window.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sparklab.report import lossless, quality, thinking
from sparklab.report.grouping import baseline_of
from sparklab.report.model import Best, Group, Report
from sparklab.report.thinking import thinking_ended
from sparklab.report.verdict import Check, GroupKey, flags

SHORT_TOKENS = 32  # answers this short make any speedup mostly prefill and scheduling
SHORT_SHARE = 0.25  # unforced answers averaging under this share of max_tokens are "far shorter than asked"
PREFIX_HIT_FLAG = 0.10  # prompt tokens served from the prefix cache over this share of those queried
CHUNK_SLACK = 1.05  # tokens per chunk may exceed K+1 by rounding only
# Each engine step streams one chunk of 1 + its accepted draft tokens, so the tokens beyond one per chunk at the
# client equal the accepted tokens the server counted (not the acceptance length: steps without a draft, as
# ngram has, count in chunks but not in drafts). Equal at C=1 but for answers cut mid-step; under batching a
# slow client may get two steps in one chunk (more tokens beyond one per chunk), never fewer.
AGREE_LOW = 0.75
AGREE_HIGH = {True: 1.25, False: 2.0}  # C=1, C>1
AGREE_MIN_ACCEPTED = 10  # fewer accepted tokens than this: too few to judge


def _where(g: Group) -> str:
    return f"{g.server.label} C={g.concurrency} {g.workload}"


def _sampling(g: Group) -> dict[str, Any]:
    return dict(((g.cells[0].settings or {}).get("sampling") or {}) if g.cells else {})


def forced_length(sampling: dict[str, Any]) -> bool:
    """ignore_eos, or min_tokens at max_tokens: every answer is exactly max_tokens long."""
    max_tokens = sampling.get("max_tokens")
    return bool(sampling.get("ignore_eos")) or (sampling.get("min_tokens") is not None and max_tokens is not None
                                                and sampling["min_tokens"] >= max_tokens)


def _results(g: Group) -> list[dict[str, Any]]:
    return [c.result or {"summary": c.summary or {}} for c in g.cells]


def equality(report: Report) -> Check:
    findings: list[str] = []
    flagged: set[GroupKey] = set()
    drafting = [g for g in report.groups if g.equality is not None]
    for g in drafting:
        e = g.equality
        assert e is not None
        if g.server.is_synthetic:  # accepts drafts without the target's test: its answers must differ
            if e.status == "checked" and e.compared and not e.differs:
                findings.append(f"{_where(g)}: synthetic acceptance left every answer identical to `none` "
                                f"({e.describe()}) - it accepts drafts the target would not, so it was not in "
                                "effect; its speed is not the profile's")
            continue
        if e.differs:
            findings.append(f"{_where(g)}: {e.describe()} identical to `none` - drafting changed the output "
                            "(a bug in the drafter or verifier, or numerics that differ with batch shape)")
            flagged.add(g.key)
        if e.status == "checked" and e.baseline_variants:
            findings.append(f"{_where(g)}: the baseline itself answered {e.baseline_variants} prompt(s) in more "
                            "than one way (not deterministic at temperature 0); an answer equal to any of them counts "
                            "as identical")
    unchecked = sorted({g.equality.describe() for g in drafting if g.equality and g.equality.status == "sampling"})
    for text in unchecked:
        findings.append(f"equality {text}: sampled answers differ run to run, drafting or not; run at temperature "
                        "0 to check that drafting keeps the output token for token (the lossless check compares "
                        "sampled answers as samples)")
    compared = [g for g in drafting if g.equality and g.equality.status in ("checked", "sampling")]
    why = None
    if not drafting:
        why = "no drafting config in this run"
    elif not compared:
        why = ("no answers to compare: the run stored none (made before sparklab kept them) or has no baseline "
               "with the same sampling")
    return Check("identical to none", "at temperature 0, every drafting config's answers equal the same engine's "
                 "`none` answers to the same prompts (token ids where the engine returns them, text otherwise); "
                 "synthetic acceptance, which keeps drafts the target would reject, must differ",
                 tuple(findings), why, frozenset(flagged))


def truncation(report: Report) -> Check:
    findings: list[str] = []
    flagged: set[GroupKey] = set()
    for g in report.groups:
        sampling = _sampling(g)
        max_tokens = sampling.get("max_tokens")
        reasons: dict[str, int] = {}
        for r in _results(g):
            for reason, n in ((r.get("summary") or {}).get("finish_reasons") or {}).items():
                reasons[reason] = reasons.get(reason, 0) + int(n)
        total = sum(reasons.values())
        forced = forced_length(sampling)
        cut = reasons.get("length", 0) - thinking_ended(g)  # thinking that ate the budget: the thinking check's
        if not forced and total and cut > 0:
            findings.append(f"{_where(g)}: {cut} of {total} answers "
                            f"({100 * cut / total:.0f}%) ended at max_tokens ({max_tokens}) - cut off, "
                            "so tokens per answer is the budget, not the model's; raise max_tokens")
            flagged.add(g.key)
        tokens = g.metrics.get("tokens_per_request")
        if tokens is None:
            continue
        if tokens.mean < SHORT_TOKENS:
            findings.append(f"{_where(g)}: answers average {tokens.mean:.0f} tokens - too short for a speedup to "
                            "mean much (prefill and scheduling dominate)")
            flagged.add(g.key)
        elif not forced and max_tokens and tokens.mean < SHORT_SHARE * max_tokens:
            findings.append(f"{_where(g)}: answers average {tokens.mean:.0f} tokens, "
                            f"{100 * tokens.mean / max_tokens:.0f}% of max_tokens {max_tokens} - far shorter than "
                            "asked")
            flagged.add(g.key)
    return Check("truncation and short answers", "no answer was cut at max_tokens unless the length was forced, "
                 f"and answers average at least {SHORT_TOKENS} tokens (and, unforced, {100 * SHORT_SHARE:.0f}% of "
                 "max_tokens)", tuple(findings), flagged=frozenset(flagged))


def prefix_cache(report: Report) -> Check:
    findings: list[str] = []
    flagged: set[GroupKey] = set()
    measured = 0
    for g in report.groups:
        windows = [p for r in _results(g) if (p := r.get("prefix_cache"))]
        queried = sum(float(p.get("queried_tokens") or 0) for p in windows)
        hits = sum(float(p.get("hit_tokens") or 0) for p in windows)
        measured += bool(windows)
        if queried > 0 and hits / queried > PREFIX_HIT_FLAG:
            findings.append(f"{_where(g)}: {100 * hits / queried:.0f}% of prompt tokens came from the prefix cache "
                            f"({hits:,.0f} of {queried:,.0f}) - its TTFT is flattered; use a workload with more "
                            "distinct prompts than requests, or turn prefix caching off")
            flagged.add(g.key)
    looked = ("the engine's prefix-cache counters served under "
              f"{100 * PREFIX_HIT_FLAG:.0f}% of each window's prompt tokens")
    return Check("prefix-cache hits", looked, tuple(findings),
                 None if measured else "no engine in this run reported prefix-cache counters", frozenset(flagged))


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _extra_tokens(g: Group) -> tuple[float | None, float | None]:
    """Over a group's cells: the client's tokens beyond one per chunk, and the server's accepted draft tokens."""
    extra = accepted = 0.0
    for r in _results(g):
        summary, spec = r.get("summary") or {}, r.get("speculative") or {}
        tokens, per_chunk = summary.get("output_tokens"), summary.get("tokens_per_chunk")
        if not tokens or not per_chunk or spec.get("accepted_tokens") is None:
            return None, None
        extra += float(tokens) * (1 - 1 / float(per_chunk))
        accepted += float(spec["accepted_tokens"])
    return (extra, accepted) if g.cells else (None, None)


def ceilings(report: Report) -> Check:
    findings: list[str] = []
    flagged: set[GroupKey] = set()
    for g in report.groups:
        k = g.server.k
        if g.is_baseline or k is None:
            continue
        base = next((b for b in report.groups if b.is_baseline and b.server.engine == g.server.engine
                     and b.workload == g.workload and b.concurrency == g.concurrency), None)
        decode, base_decode = g.metrics.get("decode_tps"), base.metrics.get("decode_tps") if base else None
        if decode and base_decode and base_decode.mean > 0 and decode.mean > (k + 1) * base_decode.mean:
            findings.append(f"{_where(g)}: decode {decode.mean:,.1f} tok/s is over (K+1) x the baseline's "
                            f"{base_decode.mean:,.1f} - impossible for K={k}: a measurement error")
            flagged.add(g.key)
        chunk = _mean([float(v) for r in _results(g) if (v := (r.get("summary") or {}).get("tokens_per_chunk"))])
        if chunk is not None and chunk > (k + 1) * CHUNK_SLACK:
            findings.append(f"{_where(g)}: {chunk:.2f} tokens per streamed chunk, more than K+1 = {k + 1} - the "
                            "server sends several steps per chunk, or its token counts are wrong")
            flagged.add(g.key)
        extra, accepted = _extra_tokens(g) if g.server.streams_one_chunk_per_step else (None, None)
        if extra is not None and accepted is not None and accepted >= AGREE_MIN_ACCEPTED:
            ratio = extra / accepted
            if ratio < AGREE_LOW or ratio > AGREE_HIGH[g.concurrency == 1]:
                findings.append(f"{_where(g)}: the client saw {extra:,.0f} tokens beyond one per chunk, the server "
                                f"counted {accepted:,.0f} accepted draft tokens - more than batching explains; one "
                                "of them is not measuring what it says")
                flagged.add(g.key)
    return Check("sanity ceilings", "no drafting config decodes faster than (K+1) x its baseline or streams more than "
                 "K+1 tokens per chunk, and, on engines that stream one chunk per step, the tokens it streams beyond "
                 "one per chunk agree with the draft tokens the server counted as accepted",
                 tuple(findings), flagged=frozenset(flagged))


def images(report: Report) -> Check:
    """Per engine: a run may compare engines (the CPU demo: vLLM and llama.cpp), each on its own image."""
    findings: list[str] = []
    flagged: set[GroupKey] = set()
    for engine in dict.fromkeys(g.server.engine for g in report.groups):
        groups = [g for g in report.groups if g.server.engine == engine]
        digests = {c.image_digest for g in groups for c in g.cells if c.image_digest}
        if len(digests) <= 1:
            continue
        for g in groups:
            mine = sorted({c.image_digest for c in g.cells if c.image_digest})
            if len(mine) > 1:
                findings.append(f"{_where(g)}: its repeats ran on {len(mine)} images ({', '.join(mine)})")
                flagged.add(g.key)
        per_server: dict[str, set[str]] = {}
        for g in groups:
            per_server.setdefault(g.server.label, set()).update(c.image_digest for c in g.cells if c.image_digest)
        findings.append(f"{engine}'s cells come from different image digests: "
                        + "; ".join(f"{label}: {', '.join(sorted(d))}" for label, d in per_server.items() if d))
    return Check("one image per engine", "each engine's cells ran on one image digest (stored per cell)",
                 tuple(findings), flagged=frozenset(flagged))


def tool_runaways(report: Report) -> Check:
    from sparklab.outputs import RUNAWAY_CALLS, RUNAWAY_IDENTICAL

    findings: list[str] = []
    flagged: set[GroupKey] = set()
    probed = [g for g in report.groups if g.tool_calls]
    for g in probed:
        for t in g.tool_calls:
            if t.runaways:
                reasons = ", ".join(f"{r} {n}" for r, n in t.finish_reasons)
                findings.append(f"{_where(g)} {t.prompt_id}: {t.runaways} of {t.answers} answers ran away (up to "
                                f"{t.max_calls} tool calls, the same call up to {t.max_identical} times; finish: "
                                f"{reasons}) - clients that require a tool call would loop on this config")
                flagged.add(g.key)
    looked = (f"no answer repeats one tool call {RUNAWAY_IDENTICAL} times, makes {RUNAWAY_CALLS} calls, or hits the "
              "length limit while calling tools")
    return Check("tool-call runaways", looked, tuple(findings),
                 None if probed else "no tool-call prompts in this run: add the `toolcall-probe` workload",
                 frozenset(flagged))


def clocks_under_load(report: Report) -> Check:
    """Cells whose SM clock fell under load or whose GPU reported throttle reasons during the window (sampled by
    the memory sampler's thread through each cell, sparklab/host/clocks.py): their numbers are lower than the
    config's, whatever it was that throttled."""
    from sparklab.host.clocks import CLOCK_FALL_FLAG, describe

    findings: list[str] = []
    flagged: set[GroupKey] = set()
    sampled = 0
    for g in report.groups:
        for cell in g.cells:
            facts = (cell.result or {}).get("gpu_clocks") or {}
            if "loaded_samples" not in facts:  # none, or read only at two idle moments (runs before issue 23)
                continue
            sampled += 1
            line = describe(facts)
            if line:
                findings.append(f"{_where(g)} #{cell.repeat}: {line} - its numbers are lower than the config's; "
                                "rerun it cooler, or with the power limit the others had")
                flagged.add(g.key)
    looked = (f"no cell's SM clock fell by more than {100 * CLOCK_FALL_FLAG:.0f}% under load, and no throttle reason "
              "(power cap, HW/SW slowdown, thermal, power brake) was active while it ran")
    return Check("clocks under load", looked, tuple(findings),
                 None if sampled else "no clock samples under load: nvidia-smi did not answer on the host that ran "
                                      "the cells (or the run was made before sparklab sampled clocks under load)",
                 frozenset(flagged))


CHECKS: tuple[Callable[[Report], Check], ...] = (equality, truncation, prefix_cache, ceilings, images, tool_runaways,
                                                 clocks_under_load)


def flagged_by(best: Best, report: Report, checks: list[Check]) -> list[str]:
    """The checks that flagged the pick's own number or its baseline's (its speed-up's denominator)."""
    by_group = flags(checks)
    base = baseline_of(best.group, report.groups)
    keys = [best.group.key] + ([base.key] if base is not None and base is not best.group else [])
    return list(dict.fromkeys(name for key in keys for name in by_group.get(key, [])))


def run_checks(report: Report) -> list[Check]:
    """Every check; those over graded answers, sampled answers and thinking live beside their report sections."""
    return [check(report) for check in (*CHECKS, quality.check, lossless.check, thinking.check)]
