"""The lossless check's scoring loop (sparklab.sweep.lossless.score_pending): several answers in flight at once,
rows stored in the answers' order, each workload read once, and a Ctrl-C that keeps what was scored and sends no
more. The engine adapter is a stand-in here (vLLM's own requests are tests/unit/test_lossless.py's)."""

from __future__ import annotations

import os
import signal
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from sparklab.bench import workloads
from sparklab.sweep import lossless
from sparklab.sweep.store_rows import Score

SUITE = workloads.load_workload("tasks-en")
PROMPTS = [p.id for p in SUITE.prompts]


class Adapter:
    """Scores an answer as minus its first token id after `delay_s`, counting the requests in flight."""

    scoring_unsupported = None

    def __init__(self, delay_s: float, interrupt_at: int | None = None) -> None:
        self.delay_s, self.interrupt_at = delay_s, interrupt_at
        self.lock = threading.Lock()
        self.in_flight = self.most = self.started = 0
        self.started_at: list[float] = []

    def score_answer(self, api: Any, model: str, messages: Any, extra: Any, chat_kwargs: Any, ids: list[int]) -> float:
        with self.lock:
            self.started += 1
            self.started_at.append(time.monotonic())
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            nth = self.started
        try:
            if nth == self.interrupt_at:  # Ctrl-C, as a terminal sends it, while the main thread waits on the pool
                os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0 if self.interrupt_at and nth <= 2 else self.delay_s)  # the first two are done by then
            return -float(ids[0])
        finally:
            with self.lock:
                self.in_flight -= 1


class Store:
    def __init__(self) -> None:
        self.rows: list[Score] = []

    def add_scores(self, rows: Any) -> None:
        self.rows.extend(rows)


def _cell(i: int) -> Any:
    return SimpleNamespace(id=f"cell{i}", workload="tasks-en", settings={"sampling": {"temperature": 1.0}},
                           result={"workload": {"content_hash": SUITE.content_hash}})


def _setup(monkeypatch: pytest.MonkeyPatch, adapter: Adapter, answers: int) -> tuple[Store, list[int]]:
    items = [(_cell(i // 3), i % 3, {"ok": True, "prompt_id": PROMPTS[i % len(PROMPTS)], "token_ids": [1000 + i, 5]})
             for i in range(answers)]
    loads: list[str] = []

    def load(spec: str) -> Any:
        loads.append(spec)
        return workloads.load_workload(spec)

    monkeypatch.setattr(lossless, "pending", lambda plan, store, name: iter(items))
    monkeypatch.setattr(lossless, "engine", lambda kind: adapter)
    monkeypatch.setattr(lossless, "load_workload", load)
    return Store(), loads


SERVER = SimpleNamespace(id="none-server", engine="vllm-cpu", label="vllm-cpu/none", spec=SimpleNamespace(kind="vllm"))
API = SimpleNamespace(first_model=lambda: "m")


def test_answers_are_scored_several_at_a_time_and_stored_in_their_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: one request at a time (48 answers took 66.8 s on the CPU engine's none server), the workload's suite
    read again for every answer."""
    adapter = Adapter(delay_s=0.15)
    store, loads = _setup(monkeypatch, adapter, answers=12)
    said: list[str] = []
    assert lossless.score_pending(None, store, SERVER, API, said.append) == 12  # type: ignore[arg-type]
    assert adapter.most > 1, "one request at a time"
    assert adapter.most == lossless.CONCURRENCY
    assert [(r.cell_id, r.idx, r.logprob_sum) for r in store.rows] == [
        (f"cell{i // 3}", i % 3, -float(1000 + i)) for i in range(12)]
    assert all(r.status == "scored" and r.tokens == 2 and r.scorer_id == "none-server" for r in store.rows)
    assert loads == ["tasks-en"]  # once, not once per answer
    assert said and said[-1].startswith("lossless check: scored 12 of 12 sampled answers under vllm-cpu/none in ")


def test_ctrl_c_while_scoring_keeps_what_was_scored_and_sends_no_more(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the rows scored since the last batch write were dropped, and (one at a time) nothing else was in
    flight to stop. The first two answers are scored at once, the others take 0.3 s: the interrupt comes as the
    seventh starts, with at least the first two done, whether or not the main thread has read them yet."""
    adapter = Adapter(delay_s=0.3, interrupt_at=7)
    store, _ = _setup(monkeypatch, adapter, answers=30)
    with pytest.raises(KeyboardInterrupt):
        lossless.score_pending(None, store, SERVER, API, lambda line: None)  # type: ignore[arg-type]
    interrupted = time.monotonic()
    time.sleep(0.8)  # the requests in flight end; none queued behind them may start
    kept = [(r.cell_id, r.idx) for r in store.rows]
    assert len(kept) >= 2, "the answers scored before Ctrl-C were dropped"
    assert kept == [(f"cell{i // 3}", i % 3) for i in range(len(kept))]  # a prefix, in order
    assert not [t for t in adapter.started_at if t > interrupted + 0.05]
    assert adapter.started <= 7 + lossless.CONCURRENCY, adapter.started
    assert len(kept) < 30 and all(r.status == "scored" for r in store.rows)
