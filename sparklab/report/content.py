"""The report's content: a `Report` → a `Document` of sections and tables (pure; rendered by document.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sparklab import engines
from sparklab.bench.metrics import CONFIDENCE, IDENTICAL, IDENTICAL_SHORT, SPREAD_WARN
from sparklab.report import latency, losses, provenance, verdicts
from sparklab.report.checks import flagged_by, run_checks
from sparklab.report.document import Block, Bullets, Code, Document, Image, Para, Section, Table
from sparklab.report.formats import DASH
from sparklab.report.generation import generation_sections
from sparklab.report.lossless import sections as lossless_sections
from sparklab.report.model import BEST_TIE, DECODE_LEAD, Report, Server
from sparklab.report.quality import sections as graded_sections
from sparklab.report.server_sections import (
    facts_section,
    hosts_section,
    memory_section,
    platform_line,
    roofline_section,
)
from sparklab.report.thinking import sections as thinking_sections
from sparklab.report.throughput_tables import acceptance_section, detail_tables, fmt_ratio, k_cell, k_pivot, seed_tables
from sparklab.report.verdict import Check

# -- sections ----------------------------------------------------------------------------------------------------


def _overview(report: Report) -> Section:
    sweep, meta, host, counts = report.sweep, report.meta, report.host, report.counts
    engines = sorted({f"{s.engine} {s.engine_version}" for s in report.servers if s.engine_version})

    def identity(s: Server) -> str:
        started = s.ready_s is not None or bool(s.startup)
        return f"`{s.image}` " + (s.image_digest or ("(no digest recorded)" if started else "(never started)"))

    images = sorted({identity(s) for s in report.servers if not s.is_process})
    programs = sorted({identity(s) for s in report.servers if s.is_process})
    items = [
        f"run `{report.run_id}` of sweep `{sweep.get('name', '?')}` (recipe `{sweep.get('recipe', '?')}`), "
        f"created {meta.get('created_at', '?')} by sparklab {meta.get('sparklab_version', '?')}",
        f"cells: {counts.get('done', 0)} done, {counts.get('failed', 0)} failed, "
        + (f"{counts['partial']} partial (kept with failed requests), " if counts.get("partial") else "")
        + f"{counts.get('pending', 0) + counts.get('running', 0)} not run; {len(report.servers)} server configs",
        f"host: {host.get('hostname', '?')} ({host.get('machine', '?')}, {host.get('mem_total_gib', '?')} GiB)",
    ]
    platform = host.get("platform") or {}
    if platform:
        items.append("platform: " + platform_line(platform))
    if engines:
        items.append("engine versions (GET /version): " + ", ".join(engines))
    if images:
        items.append("images: " + "; ".join(images))
    if programs:
        items.append("programs (host processes; the digest is the program file's sha256): " + "; ".join(programs))
    blocks: list[Block] = []
    if sweep.get("description"):
        blocks.append(Para(str(sweep["description"])))
    blocks.append(Bullets(tuple(items)))
    return Section("Run", blocks=blocks)


def _method(report: Report) -> Section:
    sweep = report.sweep
    sampling = sweep.get("sampling") or {}
    sources = sorted({s for g in report.groups for s in g.token_sources})
    accept = sorted({s for g in report.groups for s in g.acceptance_sources})
    pct = f"{100 * CONFIDENCE:.0f}%"
    return Section("How these numbers were measured", blocks=[Bullets((
        "C=1 per-request tok/s: completion tokens / E2E latency of each request, mean over the cell's requests "
        "(seed 000's per-request TPS). C>1 aggregate tok/s: all completion tokens / the window, from the first "
        "measured request's start to the last one's end (seed 000's aggregate TPS).",
        f"each cell: {sweep.get('warmup', '?')} warmup request(s) excluded, "
        f"{'streamed' if sweep.get('stream', True) else 'non-streamed'}, max_tokens "
        f"{sampling.get('max_tokens', '?')}, temperature {sampling.get('temperature')}; tokens counted from "
        f"{', '.join(sources) or 'unknown'}.",
        "decode tok/s: tokens after the first chunk / the time after it, mean over requests. TTFT p50: the "
        "median request's first token - start, averaged over repeats.",
        "acceptance length (1 + accepted / drafts) and rate (accepted / draft tokens): the server's own figures "
        "over each window, not client guesses; here from " + ("; ".join(accept) if accept else (
            _no_acceptance(report) if any(not g.is_baseline for g in report.groups) else "no drafting")) + ".",
        f"repeats: `a ± b` is the mean over repeats and the half-width of its {pct} Student-t interval; a "
        f"single run has no interval; `({IDENTICAL_SHORT})` marks repeats that all gave one value (the interval "
        f"is not measured: a spread of zero is not certainty). `(spread)` marks a coefficient of variation over "
        f"{100 * SPREAD_WARN:.0f}%.",
        f"vs baseline: the mean over the same engine's `none` at the same concurrency and workload; `[low, high]` "
        f"is its {pct} interval (delta method on the log ratio, Welch degrees of freedom); `n.s.` = the "
        "interval includes 100%, not a significant difference.",
    ))])


def _no_acceptance(report: Report) -> str:
    """Which engines drafted and reported no acceptance, and why when its adapter knows."""
    reasons = []
    silent = {g.server.id: g.server for g in report.groups if not g.is_baseline and not g.acceptance_sources}
    for server in silent.values():
        adapter = engines.ENGINES.get(server.kind or "")
        reason = adapter.no_acceptance_reason if adapter is not None else ""
        reasons.append(f"{server.engine}: {reason or 'it reported none in this run'}")
    return f"nowhere: no engine of this run reports it ({'; '.join(dict.fromkeys(reasons))})"


def _versus_runner_up(best: Any) -> str:
    """Whether the pick is significantly ahead of the next best config, or a coin toss between the two."""
    second, r = best.runner_up, best.versus_runner_up
    if second is None or r is None:
        return ""
    name = f"{second.server.engine} {second.server.method_name}" + (
        f" K={second.server.k}" if second.server.k is not None else "")
    if r.identical:
        return f"; {100 * r.value:.1f}% of runner-up {name} ({IDENTICAL})"
    if r.low is None or r.high is None:
        return f"; {100 * r.value:.1f}% of runner-up {name}, single runs: cannot tell them apart"
    if not r.significant:
        return (f"; NOT significantly different from runner-up {name} ({100 * r.value:.1f}% "
                f"[{100 * r.low:.1f}, {100 * r.high:.1f}]): either will do")
    return f"; {100 * r.value:.1f}% of runner-up {name} [{100 * r.low:.1f}, {100 * r.high:.1f}]"


def _best(report: Report, checks: list[Check]) -> Section:
    if not report.best:
        return Section("Best configuration per concurrency", blocks=[Para("No finished cells.")])
    rows, commands = [], []
    for best in report.best:
        g = best.group
        why = f"best of {best.candidates}"
        if best.best_score_group is not g:
            why = (f"within {100 * BEST_TIE:.0f}% of {best.best_score_group.server.label} and a smaller K "
                   f"(best of {best.candidates})")
        single = (" (single run: no spread known)" if g.n < 2
                  else f" ({IDENTICAL})" if g.headline is not None and g.headline.identical else "")
        why += _versus_runner_up(best)
        if g.speedup and g.speedup.significant is False:
            why += "; not significantly faster than the baseline"
        if best.one_load:
            why += "; rests on one load (a config it is compared with ran on one server start only)"
        if best.synthetic_skipped:
            why += ("; scored above it but synthetic acceptance, not a drafter, so never named best: "
                    + ", ".join(s.server.label for s in best.synthetic_skipped))
        if best.changed_output:
            why += ("; scored above it but its answers differ from `none`'s at temperature 0, so never named best: "
                    + ", ".join(s.server.label for s in best.changed_output))
        if best.lossy:
            why += ("; scored above it but its sampled answers are not the target's (lossless check), so never "
                    "named best: " + ", ".join(s.server.label for s in best.lossy))
        if flags := flagged_by(best, report, checks):
            why += f"; rests on a number a check flagged ({', '.join(flags)}): see Checks on the verdict"
        rows.append((best.workload, str(best.concurrency), f"{g.server.engine} {g.server.method_name}",
                     k_cell(g.server), f"{best.score:,.2f}{single}", fmt_ratio(g), why))
        commands.append(f"# {best.workload}, C={best.concurrency}\n{g.server.up_command}")
    return Section("Best configuration per concurrency", blocks=[
        Para("Score: the median of the headline tok/s over repeats minus their standard deviation (a "
             f"configuration that is fast only sometimes scores lower); within {100 * BEST_TIE:.0f}% of the top "
             "score the smallest K wins (no drafting counts as K=0). Configs with synthetic acceptance are "
             "benchmarks of the engine's step cost, not drafters, and are never named; nor are configs whose answers "
             "are not the target's (they differ from `none`'s at temperature 0, or the lossless check flagged "
             "them). A pick whose number, or its baseline's, a check flagged says so. "
             + ("The comparison with the runner-up includes between-load noise (some config was reloaded)."
                if any(g.load_noise for g in report.groups) else
                "No config was reloaded: every comparison sees within-load noise only, so every verdict rests on "
                "one load per config.")),
        Table(("workload", "C", "config", "K", "score tok/s", "vs baseline", "why"), tuple(rows),
              (False, True, False, False, True, True, False)),
        Para("To run it:"),
        Code("\n".join(commands)),
    ])


def _pick_interval(pick: dict[str, Any]) -> str:
    """A stored tune pick's interval: low = high over several repeats is identical repeats, not a measured one."""
    if pick["low"] is None or pick["high"] is None:
        return DASH
    if pick["low"] == pick["high"] and pick["n"] >= 2:
        return IDENTICAL
    return f"[{pick['low']:,.2f}, {pick['high']:,.2f}]"


def _tune(report: Report) -> Section | None:
    """`sparklab tune`'s picks, its predictions against what it measured, and what the search cost."""
    import json

    if "tune" not in report.meta:
        return None
    state = json.loads(report.meta["tune"])
    picks = tuple((str(p["concurrency"]), p["label"], f"{p['mean']:,.2f}", _pick_interval(p), str(p["n"]), p["note"])
                  for p in state.get("picks", []))
    rows = tuple((f"{r['method']} K={r['k']}", str(r["concurrency"]), f"{r['predicted']:,.2f}",
                  f"{r['measured']:,.2f}" if r["measured"] else "not loaded",
                  f"{r['predicted'] / r['measured'] - 1:+.1%}" if r["measured"] else DASH, r["basis"])
                 for r in state.get("predictions", []))
    rounds = "; ".join(f"{r['why']}: {', '.join(r['loads']) or 'nothing new'}" for r in state.get("rounds", []))
    blocks: list[Block] = [
        Para(f"This run is a `sparklab tune` search (objective: {state.get('objective')} tok/s): "
             f"{state.get('loads', 0)} model loads in {len(state.get('rounds', []))} rounds, "
             f"{state.get('wall_s', 0.0):,.0f} s of wall time. Rounds: {rounds or 'none'}."),
        Table(("C", "pick", "mean tok/s", "95% interval", "n", "how sure"), picks,
              (True, False, True, False, True, False)),
    ]
    if rows:
        blocks += [Para("Predicted vs measured: acceptance length at K from the largest K's per-position rates, "
                        "step time interpolated between the measured K (piecewise linear); a measured K's "
                        "prediction was made without its own numbers."),
                   Table(("config", "C", "predicted tok/s", "measured tok/s", "error", "step cost"),
                         rows, (False, True, True, True, True, False))]
    if state.get("budget"):
        blocks.append(Para(f"Budget for telling the best from a contender: {state['budget']}; picks marked "
                           "TIE-BREAK spent it without telling them apart."))
    verdict = (state.get("schedule") or {}).get("verdict")
    if verdict:
        rows_s = tuple((str(r["concurrency"]), str(r["k"]), r["winner"], f"{r['winner_mean']:,.2f}",
                        DASH if r["schedule_mean"] is None else f"{r['schedule_mean']:,.2f}",
                        DASH if not (r["versus"] or {}).get("low") else
                        f"{100 * r['versus']['value']:.1f}% [{100 * r['versus']['low']:.1f}, "
                        f"{100 * r['versus']['high']:.1f}]", "LOSES" if r["loses"] else "")
                       for r in verdict["rows"])
        blocks += [Para(f"The K schedule, measured on one server at every concurrency: {verdict['summary']}."
                        + (f" {verdict['k0']}." if verdict.get("k0") else "")),
                   Table(("C", "K there", "winner", "winner tok/s", "schedule tok/s", "schedule / winner", ""),
                         rows_s, (True, True, False, True, True, True, False))]
    blocks += [Para(note) for note in state.get("notes", [])]
    return Section("sparklab tune: the best method and K per concurrency", blocks=blocks)


def _reliability(report: Report) -> Section:
    items = []
    single = [g for g in report.groups if g.n < 2]
    if single:
        items.append(f"{len(single)} of {len(report.groups)} measurements come from a single run: they have no "
                     "confidence interval and their speedups cannot be called significant. Set `repeats: 3` (or "
                     "`repeats: auto`) in the sweep file and resume the run.")
    spread = [g for g in report.groups if g.headline and g.headline.spread_is_large]
    for g in spread:
        values = ", ".join(f"{v:.2f}" for v in g.headline.values) if g.headline else ""
        items.append(f"{g.server.label} at C={g.concurrency} ({g.workload}): spread "
                     f"{100 * (g.headline.cv or 0) if g.headline else 0:.0f}% over {g.n} runs ({values}).")
    for g in (g for g in report.groups if g.partial):
        measured = sum(int(((c.summary or {}).get("requests") or {}).get("measured") or 0) for c in g.cells)
        items.append(f"{g.server.label} at C={g.concurrency} ({g.workload}): {g.failed_requests} of {measured} "
                     "measured requests failed; its numbers, and every speedup marked (partial), rest on "
                     "incomplete cells. Rerun them: `sparklab sweep FILE --retry-failed`.")
    same = [f"{g.server.label} C={g.concurrency} {g.workload}" for g in report.groups
            if g.headline is not None and g.headline.identical]
    if same:
        items.append(f"{IDENTICAL}: every repeat of {'; '.join(same)} gave the same headline value, so no spread was "
                     "measured and its speedups claim no significance. Identical tok/s over repeats is unusual on a "
                     "real engine: check that the runs measured what they say.")
    ns = [g for g in report.groups if not g.is_baseline and g.speedup and g.speedup.significant is False]
    if ns:
        items.append("not significantly different from the baseline (interval includes 100%): " +
                      "; ".join(f"{g.server.label} C={g.concurrency} {g.workload}" for g in ns) + ".")
    if not items:
        n = min((g.n for g in report.groups), default=0)
        items.append(f"every measurement has at least {n} runs, none with a spread over "
                     f"{100 * SPREAD_WARN:.0f}%, and every speedup's interval excludes 100%.")
    return Section("How far to trust this", blocks=[Bullets(tuple(items))])


def _checks(checks: list[Check]) -> Section:
    blocks: list[Block] = [Para(
        "Each check reads the stored run; a warning means a number above should not be acted on as it stands "
        "(README: \"Checks on the verdict\").")]
    for check in checks:
        if not check.findings and check.not_checked:
            blocks.append(Para(f"{check.name}: not checked ({check.not_checked})."))
            continue
        if not check.findings:
            blocks.append(Para(f"{check.name}: passed ({check.looked_at})."))
            continue
        blocks.append(Para(f"{check.name}: {len(check.findings)} warning(s) (checked: {check.looked_at}):"))
        blocks.append(Bullets(check.findings))
    return Section("Checks on the verdict", blocks=blocks)


def _tool_calls(report: Report) -> Section | None:
    rows = tuple((g.workload, str(g.concurrency), g.server.label, t.prompt_id, str(t.answers), f"{t.mean_calls:.1f}",
                  str(t.max_calls), str(t.max_identical), ", ".join(f"{r} {n}" for r, n in t.finish_reasons),
                  str(t.runaways))
                 for g in report.groups for t in g.tool_calls)
    if not rows:
        return None
    return Section("Tool-call probe", blocks=[
        Para("Per answer to a prompt offering tools: the tool calls it made (streamed deltas joined by index), the "
             "most often one identical call (name and arguments) was repeated, and how it finished. A runaway "
             "repeats one call or never stops calling (seed 002: 159 identical calls until the length limit)."),
        Table(("workload", "C", "config", "prompt", "answers", "calls/answer", "max calls", "max identical",
               "finish", "runaways"), rows, (False, True, False, False, True, True, True, True, False, True))])


def _failures(report: Report) -> Section | None:
    if not report.failures:
        return None
    labels = {s.id: s.label for s in report.servers}
    rows = tuple((f.at[:19], labels.get(f.server_config_id or "", "?"), f.kind,
                  DASH if f.exit_code is None else str(f.exit_code), f.message.splitlines()[0][:160])
                 for f in report.failures)
    return Section("Failures (every attempt)", blocks=[Table(("at (UTC)", "server", "kind", "exit", "message"), rows)])


def document(report: Report, plots: list[tuple[str, Path]] | None = None) -> Document:
    lead = generation_sections(report) if report.lead == DECODE_LEAD else []  # seed 004's columns first
    tuned = [t] if (t := _tune(report)) else []  # sparklab tune's picks and predicted vs measured
    synthetic = [s] if (s := verdicts.synthetic_section(report)) else []
    synthetic += [s] if (s := latency.section(report, report.slo)) else []
    synthetic += [s] if (s := losses.section(report)) else []
    quality = [*graded_sections(report), *lossless_sections(report), *thinking_sections(report)]
    checks = run_checks(report)
    sections = [_overview(report), *lead, _method(report), *seed_tables(report), *tuned, *k_pivot(report),
                _best(report, checks), *synthetic, *quality, verdicts.load_noise_section(report), _checks(checks),
                _reliability(report), *detail_tables(report)]
    if acceptance := acceptance_section(report):
        sections.append(acceptance)
    if tools := _tool_calls(report):
        sections.append(tools)
    sections += [roofline_section(report), facts_section(report), provenance.section(report)]
    if memory := memory_section(report):
        sections.append(memory)
    if hosts := hosts_section(report):
        sections.append(hosts)
    if failures := _failures(report):
        sections.append(failures)
    if plots:
        sections.append(Section("Plots", blocks=[Image(title, path) for title, path in plots]))
    return Document(f"sparklab report: {report.sweep.get('name', report.run_id)}", sections)
