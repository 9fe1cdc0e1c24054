"""What `sparklab tune` prints, as plain text: the dry run's plan (the space, the next round's serve commands, how the
search goes on, and its most loads and time next to the full grid's), and the answer (the pick per concurrency with
its interval, predictions against measurements, the SLO reach, and the `sparklab up` command of each winner or one
server with a measured K schedule). Pure: the tune's state in, lines out; no rich, printed by cli/sweep.py.
"""

from __future__ import annotations

import shlex
from typing import Any


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


def _slo(text: str) -> str:
    """The SLO as the report writes it, units said (a bound without one is in ms)."""
    from sparklab.bench import slo

    return slo.describe(slo.parse(text))


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
        bound += f", meeting the SLO {_slo(settings.slo)}"
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
        + ", one K-schedule server"
        + (", `none` once more to score the sampled answers (the lossless check)" if dry.scoring_loads else "")
        + "; retried failed starts not counted)",
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
        bound += f", meeting the SLO {_slo(state['slo'])}"
    lines = [f"best per concurrency ({state.get('objective')} tok/s{bound}; 95% intervals with within- and "
             "between-load noise):"]
    lines += [_pick_line(pick) for pick in state.get("picks", [])]
    if not state.get("picks"):
        lines.append("  none: no config finished at any concurrency (see the report's failures)"
                     + (", or none met the SLO" if state.get("slo") else ""))
    if state.get("changed_output"):
        lines.append("passed over, whatever their speed: answers that differ from none's at temperature 0 (not the "
                     "target model made faster): " + ", ".join(state["changed_output"]))
    if state.get("budget"):
        lines.append(f"budget for telling configs apart: {state['budget']}")
    if state.get("slo"):
        reach = state.get("slo_reach")
        lines.append(f"SLO {_slo(state['slo'])}: " + (
            f"met up to C={reach['concurrency']} (the highest concurrency of the space where a config meets it), "
            f"by {reach['label']} at {reach['mean']:.2f} tok/s" if reach else "no config meets it at any concurrency"))
        if state.get("slo_missed"):
            lines.append(f"  no config meets it at C={', '.join(map(str, state['slo_missed']))}")
    predicted = state.get("predictions", [])
    if predicted:
        lines.append("predicted vs measured (acceptance from the per-position rates pooled over the loaded K, step "
                     "cost interpolated between the measured K; a measured K's prediction was made without it):")
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
