"""Rich renderables for results. Pure: a result dict in, something printable out."""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Mapping
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from sparklab import engines
from sparklab.engines.logwatch import headline


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def bench_result(result: Mapping[str, Any]) -> Group:
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
    if spec and spec.get("verify_steps"):
        parts.append(Text(f"speculative ({spec['source']}): acceptance length {_num(spec['acceptance_length'])}"
                          f" over {int(spec['verify_steps']):,} verify steps"))
    from_log = result.get("speculative_log")
    if from_log:
        rate = "" if from_log.get("rate") is None else f", rate {_num(100 * from_log['rate'], 1)}%"
        parts.append(Text(f"speculative ({from_log['source']}): median {_num(from_log['median'])}, "
                          f"mean {_num(from_log['mean'])}{rate} over {from_log['samples']} lines"))
    lifelong = engines.cumulative_acceptance(result.get("server", {}).get("after") or {})
    if lifelong is not None:
        parts.append(Text(f"speculative ({lifelong[1]}): {_num(lifelong[0])}"))
    return Group(*parts)


def plan_table(plan: Any, eta_s: float, model: Any, hosts: list[Any] | None = None) -> Group:
    """`sparklab sweep --dry-run`: every server with its command and cells, the Docker hosts, and the ETA."""
    from sparklab.recipes.render import serve_command

    parts: list[Any] = [Text(f"sweep {plan.sweep.name} ({plan.source}): {len(plan.servers)} servers, "
                             f"{len(plan.cells)} cells", style="bold")]
    if hosts:
        parts.append(Text("hosts (one server each at a time; ports: the recipe's plus the offset): " + ", ".join(
            f"{h.name} = {h.docker}" + (f" +{h.port_offset}" if h.port_offset else "") for h in hosts)))
    for server in plan.servers:
        varying = plan.sweep.sampling.varying()  # a sampling axis (temperature, max_tokens) names its value
        loads = ", ".join(f"c={c.concurrency} {c.workload}"
                          + "".join(f" {k}={c.sampling.get(k)}" for k in varying)
                          + f"#{c.repeat} n={c.requests}" for c in server.cells)
        parts.append(Text(f"\n{server.label}  [{server.id}]  {server.spec.image}\n  {serve_command(server.spec)}\n"
                          f"  cells: {loads}"))
    hours, rest = divmod(int(eta_s), 3600)
    auto = plan.sweep.auto_repeats if plan.sweep.repeats == "auto" else None
    if auto is not None:
        parts.append(Text(f"\nrepeats: auto - each load runs {auto.min} to {auto.max} times, stopping once its 95% "
                          f"interval's half-width is under {100 * auto.target:g}% of its mean; the cells above and the "
                          f"ETA count all {auto.max} runs"))
    at_most, one_host = "at most " if auto or model.builds else "", " on one host" if hosts else ""
    parts.append(Text(f"\nETA {at_most}{hours} h {rest // 60:02d} min{one_host}: "
                      f"{model.startup_text()}, "
                      f"{model.tokens_per_s:.1f} tok/s at c=1 scaled by c^{model.batching} (refined from earlier "
                      f"runs of this recipe when there are any)"))
    return Group(*parts)


def sweep_table(report: Any) -> Group:
    """The closing table of a sweep, drawn from the report's model (sparklab.report.model.Report), so the two
    can never disagree: per server config and load, the mean over repeats of each figure, acceptance from
    whichever source the engine reported, and the headline speed-up over the same engine's `none`."""
    table = Table("server", "c", "workload", "n", "aggregate tok/s", "per-request tok/s", "TTFT p50 ms",
                  "accept len", "vs none", "= none", box=None, pad_edge=False)
    for group in report.groups:
        m = group.metrics
        table.add_row(group.server.label, str(group.concurrency), group.workload, str(group.n),
                      _mean(m["aggregate_tps"]), _mean(m["per_request_tps"]), _mean(m["ttft_p50_ms"], 1),
                      _mean(m["acceptance_length"]), _speedup(group), _identical(group))
    first = report.failures[0] if report.failures else None
    notes = [Text(f"{len(report.failures)} failure(s) recorded over all attempts; first: {first.kind}: "
                  f"{headline(first.message, first.log_tail)}")] if first else []
    if getattr(report, "slo", None):
        notes.append(Text(slo_lines(report)))
    return Group(Text("sweep results (mean over repeats; aggregate = tokens / window, warmup excluded; vs none = "
                      "per-request tok/s at c=1, aggregate above, as in the report; = none: answers identical to "
                      "none's at temperature 0)", style="bold"), table, *notes)


def slo_lines(report: Any) -> str:
    """The sweep's latency objective: the best config meeting it per concurrency, and how far it reaches."""
    from sparklab.bench import slo as slos
    from sparklab.report.latency import best_under

    terms = slos.parse(report.slo)
    best, reach = best_under(report, terms)
    parts = [f"{w} C={c}: {g.server.label}" if g else f"{w} C={c}: none meets it" for (w, c), g in best.items()]
    parts += [f"{w}: met up to C={hit[0]} ({hit[1].server.label})" if hit else f"{w}: met at no concurrency"
              for w, hit in reach.items()]
    return f"SLO {slos.describe(terms)} (95% intervals of each term at or under its bound): " + "; ".join(parts)


def _identical(group: Any) -> str:
    """The share of answers identical to the baseline's (the report's "identical to none", in short)."""
    e = group.equality
    if group.is_baseline or e is None:
        return "-"
    if e.status == "sampling":
        return "n/a (T>0)"
    return f"{100 * e.share:.0f}%" if e.share is not None else "-"


def _mean(estimate: Any, digits: int = 2) -> str:
    return "-" if estimate is None else _num(estimate.mean, digits)


def _speedup(group: Any) -> str:
    if group.speedup is None:
        return "-"
    mark = " (n.s.)" if group.speedup.significant is False else ""
    mark += " (identical repeats)" if group.speedup.identical else ""
    mark += " (partial)" if group.rests_on_partial else ""
    return f"{100 * group.speedup.value:.1f}%{mark}"


def ready_summary(ready: Any, key_given: bool = False) -> Group:
    """`sparklab up`: where the ready server is, how long it took, and what its startup log said.
    A key the user gave is never echoed (terminal logs, screen shares); a generated one is shown once."""
    spec = ready.server.spec
    facts = ready.facts
    lines = [f"ready in {ready.seconds_to_ready:.1f} s "
             f"(from container start until {spec.ready_path} answered 200; sparklab's monotonic clock)",
             f"  container   {ready.server.name}",
             f"  image       {ready.image.ref}" + (f" ({ready.image.digest})" if ready.image.digest else ""),
             f"  endpoint    {spec.endpoint}/v1"]
    check = getattr(ready, "check", None)
    if check is not None:
        verdict = check.verdict
        took = f"cached, {check.first_seconds:.1f} s when first run" if check.cached and check.first_seconds else \
            f"{check.seconds:.1f} s"
        lines.append(f"  engine      {verdict.version or 'version not read'} (the image's package metadata)"
                     + (f"; its server answers {ready.served_version}" if getattr(ready, "served_version", None)
                        else ""))
        lines.append(f"  parser      {verdict.status} by the image's own parser before the start ({took})")
    if ready.api_key and key_given:
        lines.append("  api key     the one you gave (--api-key or SPARKLAB_API_KEY)")
    elif ready.api_key:
        kept = ("not stored or logged" if getattr(spec, "runtime", "container") == "container"
                else "not logged; kept for `sparklab bench` in the server's private run file")
        lines.append(f"  api key     {ready.api_key}   (shown once; {kept})")
    lines.append(f"  log file    {ready.server.log_path}")
    found = []
    if facts.kv_cache_tokens is not None:
        found.append(f"  KV cache        {facts.kv_cache_tokens:,} tokens")
    if facts.max_concurrency is not None:
        per = (f" at {facts.concurrency_tokens_per_request:,} tokens per request"
               if facts.concurrency_tokens_per_request else "")
        found.append(f"  max concurrency {facts.max_concurrency:.2f}x{per}")
    if facts.kv_cache_memory_gib is not None:
        found.append(f"  KV cache memory {facts.kv_cache_memory_gib:.2f} GiB")
    if facts.model_load_seconds is not None:
        mem = f"{facts.model_load_gib:.2f} GiB in " if facts.model_load_gib is not None else ""
        found.append(f"  model load      {mem}{facts.model_load_seconds:.1f} s")
    if facts.engine_init_seconds is not None:
        found.append(f"  engine init     {facts.engine_init_seconds:.1f} s (profile, KV cache, warmup)")
    if found:
        lines += [f"from the {facts.source}:", *found]
    parts: list[Any] = [Text(line) for line in lines]
    parts += [Text.assemble(("advice:", "yellow"), " " + advice) for advice in facts.advice]
    return Group(*parts)


def ps_table(containers: list[Any], hosts: list[str] | None = None) -> Table:
    """`sparklab ps`: every sparklab container with its labels, age and whether its owner still runs;
    hosts: the Docker host of each (a HOST column), when there is more than one."""
    from sparklab.runtimes.owners import created_age, owner_alive

    table = Table("NAME", "STATUS", "RECIPE", "ENGINE", "METHOD", "MODE", "ENDPOINT", "AGE", "OWNER")
    if hosts is not None:
        table.add_column("HOST")
    for i, c in enumerate(containers):
        status = c.status + (f" ({c.exit_code})" if c.exit_code is not None else "")
        owner = "detached" if c.detached else (
            "running" if owner_alive(c.labels.get("sparklab.owner", "")) else "gone (gc removes it)")
        table.add_row(c.name, status, c.labels.get("sparklab.recipe", ""), c.labels.get("sparklab.engine", ""),
                      c.labels.get("sparklab.method", ""), c.labels.get("sparklab.mode", ""),
                      c.labels.get("sparklab.endpoint", ""), created_age(c.created), owner,
                      *([hosts[i]] if hosts is not None else []))
    return table


def recipes_table() -> Table:
    """`sparklab recipes`: every recipe's engines, methods and images."""
    from sparklab.recipes.schema import list_recipes, load_recipe

    table = Table("RECIPE", "ENGINE", "METHODS", "IMAGE")
    for column in table.columns:
        column.overflow = "fold"
    for path in list_recipes():
        recipe = load_recipe(path)
        for name, engine in recipe.engines.items():
            where = engine.image or f"host process: {' '.join(engine.entrypoint)}" + (
                f" from {engine.venv}" if engine.venv else "")
            table.add_row(recipe.name, name, ", ".join(engine.methods), where)
    return table


def timestamped(console: Any) -> Callable[[str], None]:
    """A plain line per event, with the time: for logs and overnight runs."""
    def say(message: str) -> None:
        console.print(f"{time.strftime('%H:%M:%S')} {message}", markup=False, highlight=False)
    return say


def _interval(low: float | None, high: float | None, n: int) -> str:
    """A tune pick's 95% interval; low = high over several repeats is identical repeats, not a measured one."""
    if low is None or high is None:
        return " (one run: no interval)"
    if low == high and n >= 2:
        return " (identical repeats: the interval is not measured)"
    return f" [{low:.2f}, {high:.2f}]"


def _duration(seconds: float) -> str:
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours} h {rest // 60:02d} min"


def tune_plan(dry: Any) -> str:
    """`sparklab tune --dry-run` (dry: sparklab.tuning.DryRun): the space, the next round with its serve commands,
    how the search goes on, and the most loads and time it can take next to the full grid's. Nothing started."""
    from sparklab.recipes.render import serve_command
    from sparklab.tune.search import Done, label

    space, settings = dry.space, dry.settings
    contiguous = list(space.ks) == list(range(min(space.ks), max(space.ks) + 1))
    ks = (f"K {min(space.ks)}-{max(space.ks)}" if len(space.ks) > 1 and contiguous
          else f"K {', '.join(map(str, space.ks))}")
    bound = f", median TTFT <= {settings.ttft_max_ms:g} ms" if settings.ttft_max_ms else ""
    if settings.slo:
        bound += f", meeting the SLO {settings.slo}"
    cs = ", ".join(map(str, space.concurrencies))
    explore = "; the full grid first" if settings.explore == "grid" else ""
    lines = [f"tune {dry.plan.sweep.name}: {', '.join(space.methods)}; {ks}; C {cs}; maximise {dry.objective} "
             f"tok/s{bound}{explore}; {settings.repeats} repeat(s) per measured config, up to {settings.max_repeats} "
             f"over its loads where the verdict needs them; budget: {settings.budget()}",
             f"run: {dry.run_dir} ({'continues: the next step from its stored results' if dry.exists else 'new'})"]
    if dry.hosts:
        from sparklab.recipes.hosts import redact_url

        lines.append("hosts: " + ", ".join(f"{h.name} = {redact_url(h.docker)}" for h in dry.hosts))
    lines += [f"note: {note}" for note in dry.notes]
    step = dry.next_step
    if isinstance(step, Done):
        lines.append("next: nothing to load; the stored results already answer (run it to print the picks)")
    else:
        lines.append(f"next round: {step.why} ({settings.repeats} run(s) per load):")
        servers = {(s.method, s.num_speculative_tokens): s for s in dry.plan.servers}
        for config in step.configs:
            server = servers[config]
            lines.append(f"  {label(config)}: {serve_command(server.spec)}")
        lines += [f"  note: {note}" for note in step.notes]
    lines += [
        "then, from what those measure: the smallest K of each drafter that could match the best; the K whose "
        "predicted tok/s beats the best by more than the run-to-run noise or its own prediction error; drafters "
        "whose acceptance misses its prediction in measured mode (halving the K interval); reloads in ABBA order "
        "of the best and its runner-up per concurrency, and of a contender not told apart from the best until it "
        "is or the budget runs out (then a tie-break, said as one); a K schedule measured before it is recommended",
        f"at most {dry.max_loads} model loads (each of the {dry.grid_loads} configs once"
        + (f", reloads up to {settings.max_repeats} runs per concurrency" if settings.max_loads > 1 else "")
        + ", one K-schedule server; retried failed starts not counted)",
        f"ETA at most {_duration(dry.eta_upper_s)} (those loads, every cell up to {settings.max_repeats} repeat(s)); "
        f"the full grid: {dry.grid_loads} loads, ETA {_duration(dry.grid_eta_s)}. Timing model: "
        f"{dry.model.startup_text()}, {dry.model.tokens_per_s:.1f} tok/s at c=1 scaled by "
        f"c^{dry.model.batching} (refined from earlier runs of this recipe when there are any)",
        "dry run: nothing started",
    ]
    return "\n".join(lines)


def _pick_line(pick: dict[str, Any]) -> str:
    loads = f" over {pick['loads']} load(s)" if pick.get("loads") else ""
    fake = " (SYNTHETIC acceptance)" if pick.get("synthetic") else ""
    return (f"  C={pick['concurrency']}: {pick['label']}{fake}: {pick['mean']:.2f} tok/s"
            f"{_interval(pick['low'], pick['high'], pick['n'])} (n={pick['n']}{loads}); {pick['note']}")


def _schedule_lines(schedule: dict[str, Any], servers: dict[Any, Any]) -> list[str]:
    ranges = ", ".join(f"{a}-{b}: K={k}" for a, b, k in schedule["ranges"])
    verdict = schedule["verdict"]
    lines = [f"K schedule ({schedule['method']}, K per batch size {ranges}), measured on one server against each "
             "concurrency's winner (95% intervals, within- and between-load noise):"]
    for row in verdict["rows"]:
        versus = row["versus"] or {}
        ratio = (f"{100 * versus['value']:.1f}% [{100 * versus['low']:.1f}, {100 * versus['high']:.1f}]"
                 if versus.get("low") is not None else "-")
        schedule_speed = (f"{row['schedule_mean']:.2f}"
                          f"{_interval(row['schedule_low'], row['schedule_high'], row.get('schedule_n', 0))}"
                          if row["schedule_mean"] is not None else "not measured")
        winner = f"{row['winner_mean']:.2f}{_interval(row['winner_low'], row['winner_high'], row.get('winner_n', 0))}"
        lines.append(f"  C={row['concurrency']} (K={row['k']}): schedule {schedule_speed} vs {row['winner']} "
                     f"{winner}: {ratio}"
                     + (" LOSES" if row["loses"] else ""))
    lines.append(f"  {verdict['summary']}")
    if verdict.get("k0"):
        lines.append("  K=0 is in it only because the schedule server was measured at that batch size: "
                     + verdict["k0"])
    server = servers.get((schedule["method"], schedule["k"]))
    if schedule.get("synthetic"):
        lines.append("  (synthetic acceptance: a measurement of the engine, not a schedule to run)")
    elif verdict["recommended"] and server is not None:
        lines.append(f"one server for every concurrency (a range's K is capped at the server's K={schedule['k']}):")
        extra = "".join(" " + shlex.quote(f"--serve-arg={a}") for a in schedule["serve_args"])
        lines.append(f"  {server.up_command}{extra}")
        flag, _, value = schedule["serve_args"][0].partition("=")
        where = f"engines.{schedule.get('engine', server.engine)}.methods.{schedule['method']}.args"
        lines.append(f"  or in the recipe, added to {where}: [{flag}, '{value}']")
    return lines


def tune_summary(report: Any, state: dict[str, Any]) -> str:
    """`sparklab tune`'s answer: the pick per concurrency and how sure (tie-breaks and one-load verdicts said),
    predictions against measurements, the loads it took, the SLO reach, and the `sparklab up` command of each
    winner, or one server with a K schedule when that was measured and lost nowhere."""
    settings = state.get("settings", {})
    bound = f", median TTFT <= {settings['ttft_max_ms']:g} ms" if settings.get("ttft_max_ms") else ""
    if state.get("slo"):
        bound += f", meeting the SLO {state['slo']}"
    lines = [f"best per concurrency ({state.get('objective')} tok/s{bound}; 95% intervals with within- and "
             "between-load noise):"]
    lines += [_pick_line(pick) for pick in state.get("picks", [])]
    if not state.get("picks"):
        lines.append("  none: no config finished at any concurrency (see the report's failures)"
                     + (", or none met the SLO" if state.get("slo") else ""))
    if state.get("budget"):
        lines.append(f"budget for telling configs apart: {state['budget']}")
    if state.get("slo"):
        reach = state.get("slo_reach")
        lines.append(f"SLO {state['slo']}: " + (
            f"met up to C={reach['concurrency']} (the highest concurrency of the space where a config meets it), "
            f"by {reach['label']} at {reach['mean']:.2f} tok/s" if reach else "no config meets it at any concurrency"))
        if state.get("slo_missed"):
            lines.append(f"  no config meets it at C={', '.join(map(str, state['slo_missed']))}")
    predicted = state.get("predictions", [])
    if predicted:
        lines.append("predicted vs measured (acceptance from the largest K's per-position rates, step cost "
                     "interpolated between the measured K; a measured K's prediction was made without it):")
        for row in predicted:
            measured = row["measured"]
            after = (f"measured {measured:.2f} ({row['predicted'] / measured - 1:+.1%})" if measured
                     else "not loaded")
            lines.append(f"  {row['method']} K={row['k']} C={row['concurrency']}: predicted {row['predicted']:.2f}, "
                         f"{after}")
    lines.append(f"model loads: {state.get('loads', 0)} in {len(state.get('rounds', []))} round(s); "
                 f"wall time {state.get('wall_s', 0.0):.0f} s")
    lines += [f"note: {note}" for note in state.get("notes", [])]
    servers = {(s.method, s.k): s for s in report.servers if not _is_schedule(s)}
    schedule = state.get("schedule")
    recommended = bool(schedule and (schedule.get("verdict") or {}).get("recommended"))
    lines.append("run the winner:" if not recommended else "the per-concurrency winners (the schedule below "
                 "replaces them):")
    for pick in state.get("picks", []):
        server = servers.get((pick["method"], pick["k"]))
        if pick.get("synthetic"):
            lines.append(f"  C={pick['concurrency']}: not a config to run: synthetic acceptance benchmarks the "
                         "engine's step cost at a chosen acceptance profile, its answers are not the target's")
        elif server is not None:
            lines.append(f"  C={pick['concurrency']}: {server.up_command}")
    if schedule and schedule.get("verdict"):
        lines += _schedule_lines(schedule, servers)
    elif schedule and schedule.get("serve_args"):
        lines.append(f"a K schedule ({schedule['method']}) would serve every concurrency, but it was not measured "
                     "(the tune stopped before it): not recommended; run the same command to measure it")
    elif schedule:
        why = schedule.get("why_not") or (f"engine version {schedule.get('engine_version')} has no per-batch-size K "
                                          "setting sparklab knows")
        lines.append(f"no K schedule printed: {schedule['method']} wins with different K per concurrency, but {why}")
    return "\n".join(lines)


def _is_schedule(server: Any) -> bool:
    return any("num_speculative_tokens_per_batch_size" in a for a in getattr(server, "serve_args", ()))


def check_table(checks: list[Any]) -> Table:
    """`sparklab check`: per server, its image and digest, the engine version the image states, the parser's
    verdict and how long the check took (a cached verdict: the lookup, and its own run's time)."""
    table = Table("server", "image", "digest", "engine version", "parser", "seconds", box=None, pad_edge=False)
    for c in checks:
        spec, verdict = c.spec, c.verdict
        k = spec.speculative.num_speculative_tokens if spec.speculative else None
        server = f"{spec.recipe}:{spec.engine}/{spec.method}" + (f" K={k}" if k is not None else "")
        digest = (c.digest or "-")[:19]
        style = {"accepted": "green", "rejected": "bold red"}.get(verdict.status, "yellow")
        seconds = (f"{c.seconds:.2f} (cached; {c.first_seconds:.1f} first)" if c.cached and c.first_seconds is not None
                   else f"{c.seconds:.1f}")
        table.add_row(server, c.image, digest, verdict.version or "-", Text(verdict.status, style=style), seconds)
    return table
