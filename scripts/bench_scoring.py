#!/usr/bin/env python3
"""How long the lossless check's scoring takes, one answer at a time against several at once (sparklab.sweep.lossless).

Against a running plain vLLM server (127.0.0.1 only), e.g. the CPU recipe's:

    sparklab up cpu:none --detach --image 127.0.0.1:5000/sparklab/vllm-cpu:0.27.1-synthetic
    python scripts/bench_scoring.py --url http://127.0.0.1:PORT --api-key KEY --rounds 3

It samples real answers first (temperature 1.0, the tasks-en and code suites, their token ids as the server returns
them), then scores all of them with `score_pending` at concurrency 1 and at the default, in alternating rounds (1, N,
N, 1, ...) so drift of a shared host falls on both arms alike, and prints each round's seconds, the medians and their
ratio. Every score of the two arms is compared too: batching may move a log-probability in its last digits, never more.
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace
from typing import Any

from sparklab.bench.workloads import load_workload
from sparklab.engines.api import EngineAPI
from sparklab.sweep import lossless
from sparklab.sweep.store_rows import Score


class Memory:
    """The reads of a run's store that score_pending makes, over answers held in memory."""

    def __init__(self, cells: list[Any], outputs: dict[str, list[dict[str, Any]]]) -> None:
        self._cells, self._outputs = cells, outputs
        self.rows: list[Score] = []

    def cells(self, status: str) -> list[Any]:
        return self._cells if status == "done" else []

    def scores(self) -> dict[Any, Any]:
        return {}

    def outputs(self) -> dict[str, list[dict[str, Any]]]:
        return self._outputs

    def add_scores(self, rows: Any) -> None:
        self.rows.extend(rows)


def sample(api: EngineAPI, model: str, suites: list[str], max_tokens: int) -> tuple[list[Any], dict[str, Any]]:
    """One sampled answer per prompt of each suite, as a sweep's cell stores it (token ids included)."""
    cells, outputs = [], {}
    for suite in suites:
        workload = load_workload(suite)
        cell_id = f"drafting-{suite}"
        answers = []
        for prompt in workload.prompts:
            body = {"model": model, "messages": list(prompt.messages), "max_tokens": max_tokens, "temperature": 1.0,
                    "return_token_ids": True}
            reply = api.post_json("/v1/chat/completions", body, timeout_s=300).json()
            ids = reply["choices"][0].get("token_ids")
            if not ids:
                raise SystemExit(f"{api.root} returned no token ids (vLLM's return_token_ids): cannot score")
            answers.append({"ok": True, "warmup": False, "prompt_id": prompt.id, "token_ids": ids})
        outputs[cell_id] = answers
        cells.append(SimpleNamespace(id=cell_id, server_config_id="drafting", workload=suite,
                                     settings={"sampling": {"temperature": 1.0}},
                                     result={"workload": {"content_hash": workload.content_hash}}))
    return cells, outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="the plain server, http://127.0.0.1:PORT")
    parser.add_argument("--api-key", default="")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each arm, alternating")
    parser.add_argument("--copies", type=int, default=4, help="each sampled answer scored this many times per round")
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args()
    api = EngineAPI(args.url, args.api_key or None)
    model = api.first_model()
    started = time.monotonic()
    cells, outputs = sample(api, model, ["tasks-en", "code"], args.max_tokens)
    answers = sum(len(a) for a in outputs.values())
    print(f"sampled {answers} answers in {time.monotonic() - started:.1f} s")
    # copies: the same answers again under other cell ids, so a round scores a sweep's worth (the CPU engine tier's
    # quality sweep scores 48)
    cells = [SimpleNamespace(**{**vars(c), "id": f"{c.id}#{i}"}) for i in range(args.copies) for c in cells]
    outputs = {f"{k}#{i}": v for i in range(args.copies) for k, v in outputs.items()}
    servers = [SimpleNamespace(id="drafting", engine="vllm", method="ngram"),
               SimpleNamespace(id="none", engine="vllm", method="none", label="vllm/none",
                               spec=SimpleNamespace(kind="vllm"))]
    plan = SimpleNamespace(servers=servers)
    arms = [1, lossless.CONCURRENCY]
    seconds: dict[int, list[float]] = {n: [] for n in arms}
    values: dict[int, list[float | None]] = {}
    for r in range(args.rounds):
        for n in (arms if r % 2 == 0 else arms[::-1]):
            store = Memory(cells, outputs)
            t = time.monotonic()
            lossless.score_pending(plan, store, servers[1], api, lambda line: None, concurrency=n)  # type: ignore[arg-type]
            seconds[n].append(time.monotonic() - t)
            assert len(store.rows) == sum(len(a) for a in outputs.values()), len(store.rows)
            assert all(row.status == "scored" for row in store.rows), [r.detail for r in store.rows][:3]
            values.setdefault(n, [row.logprob_sum for row in store.rows])
            print(f"round {r + 1}, concurrency {n}: {len(store.rows)} answers in {seconds[n][-1]:.2f} s")
    one, many = (statistics.median(seconds[n]) for n in arms)
    drift = max(abs(a - b) / max(1e-9, abs(a)) for a, b in zip(values[1], values[arms[1]], strict=True)
                if a is not None and b is not None)
    print(f"median: concurrency 1 {one:.2f} s, concurrency {arms[1]} {many:.2f} s; ratio {many / one:.2f} "
          f"({one / many:.2f}x faster); largest relative difference of one answer's score between the arms {drift:.2e}")


if __name__ == "__main__":
    main()
