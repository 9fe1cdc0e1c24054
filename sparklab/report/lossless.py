"""The lossless check at temperature > 0 in the report (pure): is a drafting config's sample the target's?

The sweep scored every sampled answer under the target model on a plain server of the same recipe
(sparklab.sweep.lossless). Per drafting config and sampling, its answers are compared with `none`'s answers to the
same workloads at the same concurrency and sampling, as two samples:
- log-likelihood per token: an answer's summed log-probability / its tokens;
- answer length: its tokens.
Each value is first centred on its task (the mean over both configs' answers to that prompt), so the comparison is
not drowned by how different the prompts are; then Welch's two-sample test gives the difference (config - none)
with its 95% interval. A lossless drafter's difference is noise. The check flags a config when either difference
is significant at the sweep's `lossless.alpha` (0.05), Bonferroni-corrected over every test the report makes, and
always flags a config whose serve command is lossy by design (the engine adapter names such settings: vLLM's
synthetic rejection sampling).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import replace
from typing import Any

from sparklab import engines
from sparklab.bench.stats import Difference, two_sample
from sparklab.report.document import Block, Bullets, Para, Section, Table
from sparklab.report.model import Group, Lossless, Report, Server, variant_label
from sparklab.report.verdict import Check

DASH = "-"


def _sampled(group: Group) -> bool:
    t = group.sampling.get("temperature")
    return isinstance(t, (int, float)) and t > 0


def _baseline(group: Group, groups: list[Group]) -> Group | None:
    same = [g for g in groups if g.is_baseline and g.server.engine == group.server.engine
            and g.workload == group.workload and g.concurrency == group.concurrency]
    return next((g for g in same if g.server.overrides == group.server.overrides), same[0] if same else None)


def _values(groups: list[Group], scores: dict[tuple[str, int], Any]) -> tuple[list[tuple[str, float, int]], list[str]]:
    """(task key, log-likelihood per token, tokens) of every scored answer; the reasons of the unscorable."""
    values, reasons = [], []
    for g in groups:
        for a in g.answers:
            if not a.get("ok"):
                continue
            score = scores.get((a["cell_id"], a["idx"]))
            if score is None:
                continue
            if score.status == "scored" and score.tokens:
                values.append((f"{g.workload_name}/{a.get('prompt_id')}", score.logprob_sum / score.tokens,
                               score.tokens))
            else:
                reasons.append(str(score.detail or score.status))
    return values, reasons


def _centred(first: list[tuple[str, float, int]], second: list[tuple[str, float, int]], i: int
             ) -> tuple[list[float], list[float]]:
    """Values minus their task's mean over both samples; tasks only one sample answered are left out."""
    pooled: dict[str, list[float]] = defaultdict(list)
    for key, *v in first + second:
        pooled[key].append(float(v[i - 1]))
    both = {k for k, _, _ in first} & {k for k, _, _ in second}
    mean = {k: sum(v) / len(v) for k, v in pooled.items()}
    return ([float(v[i - 1]) - mean[k] for k, *v in first if k in both],
            [float(v[i - 1]) - mean[k] for k, *v in second if k in both])


def _same_samples(first: list[tuple[str, float, int]], second: list[tuple[str, float, int]]) -> bool:
    """Each task's answers scored exactly alike in both samples (the same answers, as two servers sampling with the
    same seed give them)."""
    def per_task(values: list[tuple[str, float, int]]) -> dict[str, list[tuple[float, int]]]:
        out: dict[str, list[tuple[float, int]]] = defaultdict(list)
        for key, logprob, tokens in values:
            out[key].append((round(logprob, 6), tokens))
        return {k: sorted(v) for k, v in out.items()}

    return per_task(first) == per_task(second)


def results(report: Report) -> list[Lossless]:
    """Every drafting config's verdict per sampling, from the report's groups and scores: `build` calls it once and
    keeps them as Report.lossless, which the sections, the check and the exports read."""
    by_config: dict[tuple[str, str], list[Group]] = defaultdict(list)
    for g in report.groups:
        if not g.is_baseline and _sampled(g):
            sampling = {k: v for k, v in g.sampling.items() if v is not None}
            by_config[(g.server.id, json.dumps(sampling, sort_keys=True))].append(g)
    settings = report.sweep.get("lossless") or {}
    out = []
    for (_, sampling_key), groups in by_config.items():
        server = groups[0].server
        keys = tuple(g.key for g in groups)
        label = variant_label(json.loads(sampling_key), ["temperature", "top_p", "max_tokens"])
        bases = [b for g in groups if (b := _baseline(g, report.groups)) is not None]
        declared = tuple(server.lossy_settings)
        if not bases:
            out.append(Lossless(server, None, label, 0, 0, None, None, "no `none` config at this sampling in the "
                                "run", declared=declared, known=server.sampling_defects, groups=keys))
            continue
        mine, why = _values(groups, report.scores)
        theirs, why_base = _values(bases, report.scores)
        reason = ""
        if not mine or not theirs:
            reason = _why_not(server, settings, why + why_base, bool(mine))
        logprob = length = None
        same = False
        if not reason:
            first, second = _centred(theirs, mine, 1)
            logprob = two_sample(first, second)
            length = two_sample(*_centred(theirs, mine, 2))
            same = bool(first) and _same_samples(theirs, mine)
            if same:  # every answer scored as none's to the same task: the same samples (the engines' seeds agree)
                logprob = Difference(len(first), len(second), 0.0, 0.0, 0.0, 0.0, 0.0, 1.0)
                length = Difference(len(first), len(second), 0.0, 0.0, 0.0, 0.0, 0.0, 1.0)
            elif logprob is None or logprob.p_value is None:
                reason = "too few scored answers to the same tasks for a test (at least 2 each, with some spread)"
        out.append(Lossless(server, bases[0].server, label, len(mine), len(theirs), logprob, length, reason,
                            declared=declared, identical=same, known=server.sampling_defects, groups=keys))
    alpha = float(settings.get("alpha") or 0.05)
    tests = 2 * sum(1 for r in out if r.checked) or 1
    return [_judged(r, alpha / tests) for r in out]


def _why_not(server: Server, settings: dict[str, Any], reasons: list[str], mine: bool) -> str:
    adapter = engines.ENGINES.get(server.kind or "")
    if adapter is not None and adapter.scoring_unsupported:
        return f"not checkable: {adapter.scoring_unsupported}"
    if settings.get("enabled") is False:
        return "not checked: lossless.enabled is false in the sweep file"
    if reasons:
        common = max(set(reasons), key=reasons.count)
        return f"not checkable: {len(reasons)} answer(s) could not be scored ({common})"
    return ("not checked: the run has no scores for " + ("`none`'s" if mine else "this config's") + " sampled answers "
            "(the scoring server did not run: see the failures, then run the sweep again to score them)")


def _judged(r: Lossless, threshold: float) -> Lossless:
    if not r.checked:
        return r
    flagged = []
    for name, d in (("log-likelihood per token", r.logprob), ("answer length", r.length)):
        if d is not None and d.p_value is not None and d.p_value < threshold:
            flagged.append(f"{name} differs: {d.difference:+.3f} [{d.low:+.3f}, {d.high:+.3f}], p = {d.p_value:.2g} "
                           f"(< {threshold:.2g})")
    return replace(r, flagged=tuple(flagged))


def _diff(d: Difference | None, digits: int) -> str:
    if d is None:
        return DASH
    if d.low is None or d.high is None:
        return f"{d.difference:+.{digits}f}"
    return f"{d.difference:+.{digits}f} [{d.low:+.{digits}f}, {d.high:+.{digits}f}]"


def verdict(r: Lossless) -> str:
    if r.flagged:
        return "LOSSY: its answers are not the target's"
    if r.declared:
        return "lossy by design" + ("" if r.checked else f"; {r.reason}")
    if r.identical:
        return "consistent with lossless: the same samples as none, answer for answer (the same sampling seed)"
    return "consistent with lossless" if r.checked else r.reason


def sections(report: Report) -> list[Section]:
    found = report.lossless
    if not found:
        return []
    rows = tuple((r.server.label, r.sampling, f"{r.answers} / {r.baseline_answers}", _diff(r.logprob, 3),
                  DASH if not r.logprob or r.logprob.p_value is None else f"{r.logprob.p_value:.2g}",
                  _diff(r.length, 1), DASH if not r.length or r.length.p_value is None else f"{r.length.p_value:.2g}",
                  verdict(r)) for r in found)
    blocks: list[Block] = [
        Para("Sampled answers cannot be compared token by token. Every answer of each drafting config and of `none` "
             "was scored under the target model on a plain server of the same recipe, after the windows: its "
             "log-likelihood per token and its length. Both are centred on their task, then compared as two "
             "samples (Welch; the difference is config - none, with its 95% interval). A lossless drafter samples "
             "from the target's own distribution: its differences are noise."),
        Table(("config", "sampling", "answers (config / none)", "log-likelihood per token, diff [95%]", "p",
               "answer tokens, diff [95%]", "p", "verdict"), rows, (False, False, True, True, True, True, True, False))]
    notes = [f"{r.server.label}: {'; '.join(r.declared)}" for r in found if r.declared]
    if notes:
        blocks += [Para("Lossy by design (the serve command says so):"), Bullets(tuple(notes))]
    known = list(dict.fromkeys(f"{r.server.label}: {'; '.join(r.known)}" for r in found if r.known))
    if known:
        blocks += [Para("Known engine defects at temperature > 0 (the engine adapter named them from the server's "
                        "command and environment when the sweep was planned; a verdict above is theirs too):"),
                   Bullets(tuple(known))]
    return [Section("Lossless at temperature > 0: drafting's answers scored under the target", blocks=blocks)]


def check(report: Report) -> Check:
    found = report.lossless
    findings = []
    for r in found:
        where = f"{r.server.label} ({r.sampling})"
        cause = f"a known engine defect: {'; '.join(r.known)}"
        if r.flagged:
            findings.append(f"{where}: " + "; ".join(r.flagged) + " - a lossless config would not move these "
                            "beyond chance; its answers are not the target's" + (f" ({cause})" if r.known else ""))
        elif r.known:  # too few answers to see it is no proof that the defect did not act
            findings.append(f"{where}: not flagged at this sample size, but its server ran with {cause}")
        if r.declared:
            findings.append(f"{where}: lossy by design: " + "; ".join(r.declared))
        if not r.checked and not r.declared:
            findings.append(f"{where}: lossless at temperature > 0 {r.reason}")
    return Check("lossless at temperature > 0", "every drafting config's sampled answers are as likely under the "
                 "target, and as long, as `none`'s (Welch, Bonferroni over the tests), and no serve command is "
                 "lossy by design", tuple(findings),
                 None if found else "no drafting config ran at temperature > 0", report.lossy)
