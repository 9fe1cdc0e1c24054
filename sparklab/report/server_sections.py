"""The report's sections on the servers and the machine (pure): measured facts per server config (startup
log, readiness wait, downloads), the platform line, memory and clocks as sampled (`report.host_samples`), the
roofline with its assumptions, and where each cell ran in a sweep over several Docker hosts.
"""

from __future__ import annotations

from typing import Any

from sparklab.report.document import Block, Bullets, Para, Section, Table
from sparklab.report.formats import DASH
from sparklab.report.host_samples import CLOCK_DROP_FLAG, clock_drops, memory_rows
from sparklab.report.model import Report, Server
from sparklab.report.roofline import assumptions, model_inputs
from sparklab.sweep.store_rows import HOST_LOST


def facts_section(report: Report) -> Section:
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


def memory_section(report: Report) -> Section | None:
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


def roofline_section(report: Report) -> Section:
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


def hosts_section(report: Report) -> Section | None:
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
