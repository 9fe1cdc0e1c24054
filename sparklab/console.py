"""Rich renderables for results. Pure: a result dict in, something printable out."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def bench_result(result: dict[str, Any]) -> Group:
    s = result["summary"]
    load = result["load"]
    req = s["requests"]
    amount = f"{load['requests']} requests" if load["requests"] else f"{load['duration_s']:g} s"
    mode = "streaming" if load["stream"] else "non-streaming"
    rate = f", Poisson {load['rate']:g} req/s" if load["rate"] else ""
    head = Text.assemble(
        ("sparklab bench", "bold"), f"  {result['workload']['name']} · {result['model']} · "
        f"concurrency {load['concurrency']}{rate} · {amount} · {mode}\n",
        f"window {s['wall_s']:.2f} s (first measured request start → last end); "
        f"{req['warmup']} warmup request(s) excluded; tokens from "
        f"{', '.join(s['token_sources']) or '-'}\n",
        f"requests {req['ok']} ok, {req['failed']} failed · output tokens {s['output_tokens']:,}"
        f" ({_num(s['tokens_per_request'], 1)} per request)\n",
        (f"aggregate {_num(s['aggregate_tps'])} tok/s", "bold"), " (Σ tokens / window) · ",
        (f"per request {_num((s['per_request_tps'] or {}).get('mean'))} tok/s", "bold"),
        " (mean of tokens / E2E latency)",
    )
    parts: list[Any] = [head]
    if req["first_errors"]:
        parts.append(Text("errors: " + "; ".join(req["first_errors"]), style="red"))
    table = Table("metric", "mean", "p50", "p90", "p99", "n", "definition", box=None, pad_edge=False)
    rows = [
        ("TTFT ms", "ttft_ms", "first token (reasoning or answer) - start"),
        ("TTFA ms", "ttfa_ms", "first answer (non-reasoning) token - start"),
        ("TPOT ms", "tpot_ms", "(end - first token) / (tokens - 1)"),
        ("ITL ms/token", "itl_ms", "chunk gap / tokens in the chunk, per token"),
        ("chunk gap ms", "chunk_gap_ms", "raw gap between chunks"),
        ("decode tok/s", "decode_tps", "tokens after the first chunk / time after it"),
        ("per-request tok/s", "per_request_tps", "tokens / E2E latency"),
        ("E2E ms", "e2e_ms", "end - start"),
    ]
    for label, key, definition in rows:
        stat = s.get(key)
        if stat:
            table.add_row(label, _num(stat["mean"]), _num(stat["p50"]), _num(stat["p90"]), _num(stat["p99"]),
                          str(stat["n"]), definition)
    if table.rows:
        parts.append(table)
    if s.get("tokens_per_chunk") is not None:
        parts.append(Text(f"tokens per chunk {s['tokens_per_chunk']:.2f} (client side; with speculative "
                          f"decoding it approaches the acceptance length)"))
    server = result.get("server_latency")
    if server:
        parts.append(Text(f"engine's own view (vLLM histograms over the window): TTFT {_num(server['ttft_ms'])} ms, "
                          f"TPOT {_num(server['tpot_ms'])} ms, E2E {_num(server['e2e_ms'])} ms"))
    spec = result.get("speculative")
    if spec and spec.get("drafts"):
        per_pos = " ".join(_num(p) for p in spec["per_position_acceptance"])
        parts.append(Text(
            f"speculative (server counters over the window): acceptance length {_num(spec['acceptance_length'])}"
            f" · acceptance rate {_num(100 * (spec['acceptance_rate'] or 0), 1)}% · per position {per_pos}"
            f" · {int(spec['drafts']):,} drafts"))
    from_log = result.get("speculative_log")
    if from_log:
        parts.append(Text(f"speculative ({from_log['source']}): median {_num(from_log['median'])}, "
                          f"mean {_num(from_log['mean'])} over {from_log['samples']} lines"))
    sglang = (result.get("server", {}).get("after") or {}).get("sglang_avg_spec_accept_length")
    if sglang is not None:
        parts.append(Text(f"speculative (SGLang /server_info avg_spec_accept_length): {_num(sglang)}"))
    return Group(*parts)


def plan_table(plan: Any, eta_s: float, model: Any) -> Group:
    """`sparklab sweep --dry-run`: every server with its command and cells, and the ETA."""
    from sparklab.render import serve_command

    parts: list[Any] = [Text(f"sweep {plan.sweep.name} ({plan.source}): {len(plan.servers)} servers, "
                             f"{len(plan.cells)} cells", style="bold")]
    for server in plan.servers:
        loads = ", ".join(f"c={c.concurrency} {c.workload}#{c.repeat} n={c.requests}" for c in server.cells)
        parts.append(Text(f"\n{server.label}  [{server.id}]  {server.spec.image}\n  {serve_command(server.spec)}\n"
                          f"  cells: {loads}"))
    hours, rest = divmod(int(eta_s), 3600)
    parts.append(Text(f"\nETA {hours} h {rest // 60:02d} min: {model.startup_s:.0f} s per server start, "
                      f"{model.tokens_per_s:.1f} tok/s at c=1 scaled by c^{model.batching} (refined from earlier "
                      f"runs of this recipe when there are any)"))
    return Group(*parts)


def sweep_table(store: Any) -> Group:
    """Done cells: throughput, latency, acceptance, and speed-up over the baseline (method none)."""
    labels = {s.id: s.config.get("label", f"{s.engine}/{s.method}") for s in store.server_configs()}
    methods = {s.id: (s.engine, s.method) for s in store.server_configs()}
    rows: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for cell in store.cells("done"):
        rows.setdefault((cell.server_config_id, cell.concurrency, cell.workload), []).append(cell.result or {})
    baseline = {(methods[sid][0], c, w): _mean(r, "aggregate_tps") for (sid, c, w), r in rows.items()
                if methods[sid][1] == "none"}
    table = Table("server", "c", "workload", "n", "aggregate tok/s", "per-request tok/s", "TTFT p50 ms",
                  "accept len", "vs none", box=None, pad_edge=False)
    for (sid, c, w), results in rows.items():
        agg = _mean(results, "aggregate_tps")
        base = baseline.get((methods[sid][0], c, w))
        per_request = [r["summary"]["per_request_tps"]["mean"] for r in results if r["summary"].get("per_request_tps")]
        ttft = [r["summary"]["ttft_ms"]["p50"] for r in results if r["summary"].get("ttft_ms")]
        accept = [r["speculative"]["acceptance_length"] for r in results
                  if r.get("speculative") and r["speculative"].get("acceptance_length")]
        table.add_row(labels[sid], str(c), w, str(len(results)), _num(agg),
                      _num(sum(per_request) / len(per_request)) if per_request else "-",
                      _num(sum(ttft) / len(ttft), 1) if ttft else "-",
                      _num(sum(accept) / len(accept)) if accept else "-",
                      f"{100 * agg / base:.1f}%" if base and agg is not None else "-")
    failures = store.failures()
    notes = [Text(f"{len(failures)} failure(s) recorded over all attempts; first: {failures[0].kind}: "
                  f"{failures[0].message.splitlines()[0]}")] if failures else []
    return Group(Text("sweep results (mean over repeats; aggregate = tokens / window, warmup excluded; "
                      "acceptance from the server's counters)", style="bold"), table, *notes)


def _mean(results: list[dict[str, Any]], key: str) -> float | None:
    values = [r["summary"][key] for r in results if r.get("summary") and r["summary"].get(key) is not None]
    return sum(values) / len(values) if values else None
