"""The report's content: a `Report` → a `Document` of sections and tables (pure; rendered by document.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sparklab import engines
from sparklab.bench.metrics import CONFIDENCE, IDENTICAL, IDENTICAL_SHORT, SPREAD_WARN, Ratio
from sparklab.report import latency, losses, provenance, verdicts
from sparklab.report.checks import run_checks
from sparklab.report.document import Block, Bullets, Code, Document, Image, Para, Section, Table
from sparklab.report.formats import DASH, fmt
from sparklab.report.generation import generation_sections
from sparklab.report.lossless import sections as lossless_sections
from sparklab.report.model import (
    BEST_TIE,
    CLOCK_DROP_FLAG,
    DECODE_LEAD,
    Group,
    Report,
    Server,
    clock_drops,
    headline_name,
    memory_rows,
)
from sparklab.report.quality import sections as graded_sections
from sparklab.report.roofline import assumptions, model_inputs
from sparklab.report.thinking import sections as thinking_sections
from sparklab.sweep.store import HOST_LOST


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


def _k(server: Server) -> str:
    return DASH if server.k is None else str(server.k)


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


def _seed_tables(report: Report) -> list[Section]:
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
                rows.append((server.method_name, _k(server),
                             *(fmt(by_c[c].headline) if c in by_c else DASH for c in concs),
                             *((fmt(by_c[c].metrics["ttft_p50_ms"], 1) if c in by_c else DASH for c in concs)
                               if ttft else ()),
                             *(fmt_ratio(by_c[c]) if c in by_c else DASH for c in concs)))
            numeric = (False, False, *([True] * (3 if ttft else 2) * len(concs)))
            sections.append(Section(f"Throughput vs baseline: {engine}, workload {workload}", blocks=[
                Table(header, tuple(rows), numeric)]))
    return sections


def _detail_tables(report: Report) -> list[Section]:
    sections = []
    header = ("config", "K", "n", "aggregate tok/s", "per-request tok/s", "decode tok/s", "TTFT p50 ms",
              "accept len", "accept rate %", "vs baseline", "identical to none", "% of roofline")
    numeric = (False, False, True, True, True, True, True, True, True, True, False, True)
    for workload in report.workloads:
        for c in report.concurrencies(workload):
            rows = []
            for g in (g for g in report.groups if g.workload == workload and g.concurrency == c):
                m = g.metrics
                rows.append((f"{g.server.engine} {g.server.method_name}", _k(g.server), _n(g),
                             fmt(m["aggregate_tps"]), fmt(m["per_request_tps"]), fmt(m["decode_tps"]),
                             fmt(m["ttft_p50_ms"], 1), fmt(m["acceptance_length"]) + provenance.mark(g),
                             fmt(m["acceptance_rate"], 1, 100), fmt_ratio(g), _identical(g),
                             f"{g.roofline.percent:.1f}%" if g.roofline else DASH))
            sections.append(Section(f"All metrics: workload {workload}, C={c}", level=3,
                                    blocks=[Table(header, tuple(rows), numeric)]))
    return [Section("All metrics per concurrency"), *sections]


def _k_pivot(report: Report) -> list[Section]:
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


def _acceptance(report: Report) -> Section | None:
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


def _best(report: Report) -> Section:
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
        rows.append((best.workload, str(best.concurrency), f"{g.server.engine} {g.server.method_name}",
                     _k(g.server), f"{best.score:,.2f}{single}", fmt_ratio(g), why))
        commands.append(f"# {best.workload}, C={best.concurrency}\n{g.server.up_command}")
    return Section("Best configuration per concurrency", blocks=[
        Para("Score: the median of the headline tok/s over repeats minus their standard deviation (a "
             f"configuration that is fast only sometimes scores lower); within {100 * BEST_TIE:.0f}% of the top "
             "score the smallest K wins (no drafting counts as K=0). Configs with synthetic acceptance are "
             "benchmarks of the engine's step cost, not drafters, and are never named. "
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


def _facts(report: Report) -> Section:
    rows = []
    warnings: dict[str, list[str]] = {}
    advice: dict[str, list[str]] = {}
    downloads = any(s.downloads for s in report.servers)
    for s in report.servers:
        f = s.startup
        conc = DASH
        if f.get("max_concurrency") is not None:
            conc = f"{f['max_concurrency']:g}x at {f.get('concurrency_tokens_per_request') or '?'} tokens"
        rows.append((s.label, DASH if s.ready_s is None else f"{s.ready_s:.1f}",
                     DASH if f.get("kv_cache_tokens") is None else f"{f['kv_cache_tokens']:,}", conc,
                     _opt(f.get("kv_cache_memory_gib"), "{:g}"), _opt(f.get("model_load_seconds"), "{:g}"),
                     _opt(f.get("model_load_gib"), "{:g}"), _opt(f.get("engine_init_seconds"), "{:g}"),
                     *(_download_cells(s) if downloads else ())))
        for text in f.get("warnings") or []:
            warnings.setdefault(text, []).append(s.label)
        for text in f.get("advice") or []:
            advice.setdefault(text, []).append(s.label)
    header = ("server", "ready s", "KV cache tokens", "max concurrency", "KV cache GiB", "weights load s",
              "model GiB", "engine init s", *(("download s", "download + start s") if downloads else ()))
    blocks: list[Block] = [
        Para("From each server's startup log (the latest start of that config) and sparklab's readiness wait."
             + (" Download: the model checkpoints the sweep fetched for it before its first server (a checkpoint "
                "counts for the first server that needs it; 0 when the cache had it) plus making sure of its image "
                "(a pull, or a look-up); download + start adds the time to ready (seed 002 measured 371 s for one "
                "model)." if downloads else "")),
        Table(header, tuple(rows), (False, *([True] * (len(header) - 1)))),
    ]
    if advice:
        blocks.append(Para("Advice from these logs:"))
        blocks.append(Bullets(tuple(f"{text} ({_who(who, report)})" for text, who in advice.items())))
    if warnings:
        blocks.append(Para("Startup warnings:"))
        blocks.append(Bullets(tuple(f"{text} ({_who(who, report)})" for text, who in warnings.items())))
    return Section("Measured facts per server config", blocks=blocks)


def _download_cells(s: Server) -> tuple[str, str]:
    d = s.downloads or {}
    total = d.get("total_s")
    if total is None:
        return DASH, DASH
    gib = f", {d['bytes'] / 2**30:.2f} GiB" if d.get("bytes") else ""
    return (f"{total:,.1f}{gib}", DASH if s.ready_s is None else f"{total + s.ready_s:,.1f}")


def platform_line(p: dict[str, Any]) -> str:
    """OS release, kernel, GPU driver and CUDA where nvidia-smi answered (sparklab.host.platform)."""
    parts = [str(p.get("os_release") or "OS release unknown"), f"kernel {p.get('kernel', '?')}"]
    gpus = p.get("gpus") or []
    if gpus:
        parts.append(", ".join(sorted({f"{g.get('name')} (driver {g.get('driver')})" for g in gpus})))
        parts.append(f"CUDA {p['cuda']}" if p.get("cuda") else "CUDA version not reported")
    else:
        parts.append(f"no NVIDIA GPU driver ({p.get('nvidia_smi') or 'nvidia-smi did not answer'})")
    if p.get("docker"):
        parts.append(f"Docker {p['docker']}")
    return ", ".join(parts)


def _memory(report: Report) -> Section | None:
    rows = memory_rows(report)
    drops = clock_drops(report)
    if not rows and not drops:
        return None
    blocks: list[Block] = []
    if rows:
        blocks.append(Para("Sampled at most 1 s apart while each server started and while its cells ran: host "
                           "memory from /proc/meminfo (used = MemTotal - MemAvailable), the container's own from "
                           "its cgroup, the GPU's from nvidia-smi where it answers (not on GB10's unified "
                           "memory). Headroom is the lowest MemAvailable seen."))
        blocks.append(Table(
            ("server", "peak used at start GiB", "peak used in cells GiB", "headroom GiB", "lowest MemFree GiB",
             "container peak GiB", "GPU peak MiB", "host total GiB"),
            tuple((r.server.label, _opt(r.start_peak_used_gib, "{:.2f}"), _opt(r.cells_peak_used_gib, "{:.2f}"),
                   _opt(r.headroom_gib, "{:.2f}"), _opt(r.min_free_gib, "{:.2f}"),
                   _opt(r.peak_container_gib, "{:.2f}"), _opt(r.peak_gpu_used_mib, "{:.0f}"),
                   _opt(r.total_gib, "{:.1f}")) for r in rows),
            (False, *([True] * 7))))
    if drops:
        blocks.append(Para(f"Cells whose SM clock fell by more than {100 * CLOCK_DROP_FLAG:.0f}% (nvidia-smi, read "
                           "through the window: from its highest reading under load to its lowest; runs before that "
                           "read it at the cell's start and end; throttling makes their numbers lower than the "
                           "config's; the check \"clocks under load\" names the reasons):"))
        blocks.append(Bullets(tuple(
            f"{d.group.server.label} C={d.group.concurrency} {d.group.workload} #{d.cell.repeat}: SM clock "
            f"{100 * d.drop:.0f}% lower ({_opt(d.start.get('sm_clock_mhz'), '{:.0f}')} → "
            f"{_opt(d.end.get('sm_clock_mhz'), '{:.0f}')} MHz), temperature "
            f"{_opt(d.start.get('temperature_c'), '{:.0f}')} → {_opt(d.end.get('temperature_c'), '{:.0f}')} °C, "
            f"power {_opt(d.start.get('power_w'), '{:.1f}')} → {_opt(d.end.get('power_w'), '{:.1f}')} W"
            for d in drops)))
    return Section("Memory and clocks", blocks=blocks)


def _opt(value: float | None, pattern: str) -> str:
    return DASH if value is None else pattern.format(value)


def _who(labels: list[str], report: Report) -> str:
    return "every server" if len(labels) == len(report.servers) > 1 else ", ".join(labels)


def _roofline(report: Report) -> Section:
    blocks: list[Block] = []
    seen: list[list[str]] = []
    for s in report.servers:
        if s.device is None:
            continue
        inputs, _ = model_inputs(s.model.get("facts") or {}, s.device)
        if inputs is not None and (lines := assumptions(inputs)) not in seen:
            seen.append(lines)
    for lines in seen:
        blocks.append(Para(f"Assumptions ({len(seen)} model/device set{'s' if len(seen) > 1 else ''}; override "
                           "with --bandwidth-gbps, --hardware or --fact KEY=VALUE):" if lines is seen[0] else
                           "Another model/device set:"))
        blocks.append(Bullets(tuple(lines)))
    rows = []
    for g in report.groups:
        r = g.roofline
        if r is None:
            continue
        rows.append((g.workload, str(g.concurrency), g.server.label, f"{r.acceptance_length:.2f}",
                     DASH if r.verify_tokens is None else f"{r.verify_tokens:g}",
                     DASH if r.experts_per_layer is None else f"{r.experts_per_layer:.1f}",
                     DASH if r.context_tokens is None else f"{r.context_tokens:,.0f}", f"{r.bytes_per_step / 1e6:,.1f}",
                     f"{r.bound_tps:,.1f}", DASH if r.nominal_bound_tps is None else f"{r.nominal_bound_tps:,.1f}",
                     f"{r.measured_tps:,.2f}", r.measured_source, f"{r.percent:.1f}%", f"{r.effective_gbps:,.1f}"))
    if rows:
        blocks.append(Table(("workload", "C", "config", "tokens/step/seq", "tokens through the target",
                             "experts read per MoE layer", "context tokens", "MB/step", "bound tok/s",
                             "bound at nominal BW", "measured tok/s", "measured as", "% of bound", "effective GB/s"),
                            tuple(rows), (False, True, False, *([True] * 8), False, True, True)))
    if report.roofline_notes:
        blocks.append(Bullets(tuple(report.roofline_notes)))
    return Section("Roofline: measured decode speed against the memory-bandwidth bound", blocks=blocks)


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


def _checks(report: Report) -> Section:
    blocks: list[Block] = [Para(
        "Each check reads the stored run; a warning means a number above should not be acted on as it stands "
        "(README: \"Checks on the verdict\").")]
    for check in run_checks(report):
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


def _hosts(report: Report) -> Section | None:
    """Where each cell ran, for a sweep over Docker hosts (sparklab.fleet); nothing for a one-machine run."""
    cells = [(g, c) for g in report.groups for c in g.cells]
    if not any(c.host for _, c in cells):
        return None
    hosts = report.host.get("docker_hosts") or {}
    facts = tuple(f"{name}: {h.get('docker')} ({h.get('architecture')}, {h.get('mem_total_gib')} GiB, "
                  f"Docker {h.get('docker_version')}, servers on ports +{h.get('port_offset')})"
                  for name, h in hosts.items())
    lost = tuple(f"{f.at[:19]} {f.host}: lost ({f.message.splitlines()[0][:120]}); its cell in flight ran again"
                 for f in report.failures if f.kind == HOST_LOST)
    note = ("The bench client ran on the controller and reached each server over the network: one clock and "
            "one client for every host; the round trip adds to TTFT only.")
    rows = tuple((g.server.label, str(c.concurrency), c.workload, str(c.repeat), c.host or DASH)
                 for g, c in cells)
    return Section("Where each cell ran", blocks=[Bullets((note, *facts, *lost)),
                                                  Table(("server", "C", "workload", "repeat", "host"), rows)])


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
    sections = [_overview(report), *lead, _method(report), *_seed_tables(report), *tuned, *_k_pivot(report),
                _best(report), *synthetic, *quality, verdicts.load_noise_section(report), _checks(report),
                _reliability(report), *_detail_tables(report)]
    if acceptance := _acceptance(report):
        sections.append(acceptance)
    if tools := _tool_calls(report):
        sections.append(tools)
    sections += [_roofline(report), _facts(report), provenance.section(report)]
    if memory := _memory(report):
        sections.append(memory)
    if hosts := _hosts(report):
        sections.append(hosts)
    if failures := _failures(report):
        sections.append(failures)
    if plots:
        sections.append(Section("Plots", blocks=[Image(title, path) for title, path in plots]))
    return Document(f"sparklab report: {report.sweep.get('name', report.run_id)}", sections)
