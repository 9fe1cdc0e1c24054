"""The lossless check at temperature > 0: every sampled answer scored under the target model, after the window.

Token equality says nothing when answers are sampled. A lossless drafter samples from the target's own
distribution, so its answers are as likely under the target as the baseline's own samples; a lossy one (vLLM's
synthetic rejection sampling, FLy in newer vLLM) is not. So each sampled (temperature > 0) answer of `none` and of
every drafting config is scored on a plain server of the same recipe (the run's own `none` server config): the
summed log-probability of its token ids after its chat-templated prompt (the engine adapter's `score_answer`;
vLLM: /tokenize and prompt_logprobs). The report compares the two samples (sparklab.report.lossless).

When it runs: right after a `none` server's cells, while that server is up (whatever answers exist by then), and
once more at the end of the sweep for what is left, on that `none` config started again, with no cells. An
engine that cannot score gets a row per answer saying why, so the report can say "not checkable" and why.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from sparklab.bench.workloads import Workload, load_workload
from sparklab.engines import engine
from sparklab.engines.api import EngineAPI
from sparklab.engines.base import ScoringError
from sparklab.recipes.plan import Plan, ServerConfig
from sparklab.sweep.store_rows import CellRow, Score

# Any: a cell's settings and answers are JSON as stored; `store` is a run's Store or one host's view of it
# (sweep.hoststore.HostStore), read through the same methods (tune asks whether answers wait to be scored)

BASELINE = "none"
BATCH = 20  # scores written per transaction
# Answers scored at a time. Scoring is one prefill per answer (no decode), which an engine batches: sent one by one on
# the CPU engine, vLLM's API server and its engine core took turns; on a GPU one prefill leaves it mostly idle.
CONCURRENCY = 4


def sampled(settings: dict[str, Any] | None) -> bool:
    temperature = ((settings or {}).get("sampling") or {}).get("temperature")
    return isinstance(temperature, (int, float)) and temperature > 0


def baseline_of(plan: Plan, engine_name: str) -> ServerConfig | None:
    return next((s for s in plan.servers if s.engine == engine_name and s.method == BASELINE), None)


def pending(plan: Plan, store: Any, engine_name: str) -> Iterator[tuple[CellRow, int, dict[str, Any]]]:
    """The sampled answers of this engine's configs not scored yet, when there is something to compare: a
    drafting config's sampled cell and a `none` config in the plan."""
    ids = {s.id: s for s in plan.servers if s.engine == engine_name}
    cells = [c for c in [*store.cells("done"), *store.cells("partial")]
             if c.server_config_id in ids and sampled(c.settings)]
    if baseline_of(plan, engine_name) is None or not any(ids[c.server_config_id].method != BASELINE for c in cells):
        return
    scored = store.scores()
    outputs = store.outputs()
    for cell in cells:
        for idx, answer in enumerate(outputs.get(cell.id, [])):
            if answer.get("ok") and not answer.get("warmup") and (cell.id, idx) not in scored:
                yield cell, idx, answer


def will_score(plan: Plan) -> bool:
    """Whether the plan's answers will need scoring (what `pending` finds once they exist): the check on, and an
    engine with a `none` config, a drafting config and sampled cells."""
    return plan.sweep.lossless.enabled and any(
        baseline_of(plan, s.engine) is not None and s.method != BASELINE and any(sampled({"sampling": c.sampling})
                                                                                  for c in s.cells)
        for s in plan.servers)


def settle_without_server(plan: Plan, store: Any, say: Callable[[str], None]) -> int:
    """Rows for the pending answers no server could score, written now so that no `none` is loaded for them (on a
    Spark a load of minutes). Returns how many rows were written."""
    written = 0
    for name in dict.fromkeys(s.engine for s in plan.servers):
        plain = baseline_of(plan, name)
        if plain is None:
            continue
        rows = _unscorable(plain, list(pending(plan, store, name)))
        if rows:
            store.add_scores(rows)
            written += len(rows)
            common = Counter(r.detail for r in rows).most_common(1)[0][0]
            say(f"lossless check: {len(rows)} sampled answer(s) on {name} cannot be scored ({common}); no server is "
                "started for them")
    return written


def _unscorable(scorer: ServerConfig, items: Sequence[tuple[CellRow, int, dict[str, Any]]]) -> list[Score]:
    """The rows of these answers that no server could score: every one on an engine that cannot score, else those
    without their token ids or whose workload or prompt changed (`_job`)."""
    reason = engine(scorer.spec.kind).scoring_unsupported
    if reason:
        return [Score(c.id, i, scorer.id, "unscorable", None, None, reason) for c, i, _ in items]
    workloads: dict[str, Workload] = {}
    return [job for c, i, a in items if isinstance(job := _job(workloads, scorer.id, c, i, a), Score)]


def engines_with_pending(plan: Plan, store: Any) -> list[str]:
    return [name for name in dict.fromkeys(s.engine for s in plan.servers)
            if next(pending(plan, store, name), None) is not None]


def score_pending(plan: Plan, store: Any, server: ServerConfig, api: EngineAPI, say: Callable[[str], None],
                  concurrency: int = CONCURRENCY) -> int:
    """Score what is pending for this (plain) server's engine on it; returns how many answers got a row.

    `concurrency` answers are scored at a time (the engine batches them; sent one by one, each waits for the one
    before it), and the rows are written in the order of the answers. Interrupted, the rows scored so far are
    written, nothing more is sent, and the interrupt goes on (the rest stays pending for the next run)."""
    items = list(pending(plan, store, server.engine))
    if not items:
        return 0
    adapter = engine(server.spec.kind)
    started = time.monotonic()
    if adapter.scoring_unsupported:
        store.add_scores(_unscorable(server, items))
        say(f"lossless check: {server.label} cannot score answers ({adapter.scoring_unsupported})")
        return len(items)
    model = api.first_model()
    workloads: dict[str, Workload] = {}  # each workload read once, not once per answer
    jobs = [_job(workloads, server.id, cell, idx, answer) for cell, idx, answer in items]

    def run(job: Score | _Job) -> Score:
        return job if isinstance(job, Score) else job.score(adapter, api, model)

    scored = written = 0
    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="sparklab-score")
    futures = [pool.submit(run, job) for job in jobs]
    try:
        while written < len(futures):
            rows = [future.result() for future in futures[written:written + BATCH]]
            store.add_scores(rows)
            scored += sum(row.status == "scored" for row in rows)
            written += len(rows)
    except BaseException as exc:
        pool.shutdown(wait=False, cancel_futures=True)  # the queued ones are never sent
        if isinstance(exc, KeyboardInterrupt):  # every answer scored before it, in order, read here or not
            finished = itertools.takewhile(lambda f: f.done() and not f.cancelled() and f.exception() is None,
                                           futures[written:])
            store.add_scores(future.result() for future in finished)  # a row already there is kept
        raise
    pool.shutdown()
    say(f"lossless check: scored {scored} of {len(items)} sampled answers under {server.label} in "
        f"{time.monotonic() - started:.1f} s")
    return len(items)


@dataclass(frozen=True)
class _Job:
    """One answer to score: what the engine is sent (read in the main thread; only the HTTP runs in the pool)."""

    cell: str
    idx: int
    scorer: str
    messages: Sequence[dict[str, Any]]
    extra: dict[str, Any] | None
    chat_kwargs: dict[str, Any] | None
    ids: list[int]

    # Any: the engine adapter (sparklab.engines.base.Engine), whose score_answer this calls
    def score(self, adapter: Any, api: EngineAPI, model: str) -> Score:
        try:
            total = adapter.score_answer(api, model, self.messages, self.extra, self.chat_kwargs, self.ids)
        except ScoringError as exc:
            return Score(self.cell, self.idx, self.scorer, "unscorable", None, None, str(exc)[:300])
        return Score(self.cell, self.idx, self.scorer, "scored", len(self.ids), total)


def _job(workloads: dict[str, Workload], scorer: str, cell: CellRow, idx: int, answer: dict[str, Any]) -> Score | _Job:
    """The answer's scoring request, or its row already when it cannot be scored."""
    ids = answer.get("token_ids")
    if not ids:
        return Score(cell.id, idx, scorer, "unscorable", None, None, "the answer has no token ids (the engine sent "
                                                                     "none, or it was not streamed)")
    if answer.get("ids_len") is not None and answer["ids_len"] != len(ids):
        return Score(cell.id, idx, scorer, "unscorable", None, None,
                     f"only the first {len(ids)} of {answer['ids_len']} token ids were kept")
    if cell.workload not in workloads:
        workloads[cell.workload] = load_workload(cell.workload)
    workload = workloads[cell.workload]
    stored = ((cell.result or {}).get("workload") or {}).get("content_hash")
    if stored and stored != workload.content_hash:
        return Score(cell.id, idx, scorer, "unscorable", None, None, f"the workload {cell.workload} changed since the "
                                                                     "cell ran (its content hash differs)")
    prompt = workload.by_id(str(answer.get("prompt_id")))
    if prompt is None:
        return Score(cell.id, idx, scorer, "unscorable", None, None, "its prompt is no longer in the workload")
    thinking = ((cell.settings or {}).get("sampling") or {}).get("enable_thinking")
    chat_kwargs = {"enable_thinking": thinking} if thinking is not None else None
    return _Job(cell.id, idx, scorer, prompt.messages, prompt.extra, chat_kwargs, list(ids))


def score_safely(plan: Plan, store: Any, server: ServerConfig, api: EngineAPI, say: Callable[[str], None]) -> None:
    """score_pending on a plain server after its cells: a fault here costs the check, not the run (it goes to
    the run's log with its traceback)."""
    from sparklab.errors import DiskFullError
    from sparklab.sweep import rundir

    try:
        score_pending(plan, store, server, api, say)
    except (KeyboardInterrupt, DiskFullError):
        raise
    except Exception as exc:
        reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:300]
        rundir.faults.error("lossless check on %s: %s", server.label, reason, exc_info=exc)
        say(f"lossless check on {server.label}: stopped by {reason}; what was scored is kept")
