"""The only module that talks HTTP to an engine outside the chat stream: readiness probes, /v1/models,
/metrics, /server_info, /version, prefix-cache resets. Engine adapters say which paths mean what; this
module only sends them (tests/unit/test_architecture.py pins `requests` here and in the Docker runtime).

A snapshot of the server's counters asks each path once for every adapter that reads it (`fetch`), and all the
snapshots of one bench cell share one `Budget`, so an engine that stopped answering costs the cell seconds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import requests
from urllib3.exceptions import HTTPError as TransportError

from sparklab.errors import EngineUnreachable as Unreachable
from sparklab.errors import SparklabError

TIMEOUT_S = 10.0
# What one bench cell may spend asking for server counters, its snapshots before and after the window together. A
# healthy engine answers /metrics and /server_info in milliseconds; an engine that hangs used to cost 10 s per GET
# (4 GETs a snapshot, 81 s for a cell with a 0.5 s window, tests/unit/test_bench.py), now this in all.
COUNTERS_BUDGET_S = 10.0
_PIECE = 65536  # bytes read at most at a time, so a trickling answer still meets its deadline

@dataclass(frozen=True)
class Answer:
    status: int
    text: str

    # Any: the engine's JSON reply, whatever shape it sent
    def json(self) -> Any:
        import json

        return json.loads(self.text)


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


@dataclass(frozen=True)
class EngineAPI:
    """One engine's HTTP root (http://host:port, without /v1) and the key it wants."""

    root: str
    api_key: str | None = None

    def get(self, path: str, timeout_s: float = TIMEOUT_S, with_key: bool = True) -> Answer:
        """GET root+path; raises Unreachable when nothing answers, or not all of it within about timeout_s.

        Each socket wait is bounded by timeout_s, and the body is read as it arrives and given up once the whole
        GET has taken longer: an engine that trickles its answer cannot hold the caller either."""
        url = self.root + path
        ends = time.monotonic() + timeout_s
        try:
            with requests.get(url, headers=_headers(self.api_key if with_key else None), timeout=timeout_s,
                              stream=True) as response:
                body = bytearray()
                while piece := response.raw.read1(_PIECE, decode_content=True):
                    body += piece
                    if time.monotonic() > ends:
                        raise Unreachable(f"{url}: no whole answer within {timeout_s:g} s")
                text = body.decode(response.encoding or "utf-8", errors="replace")
        except requests.RequestException as exc:
            raise Unreachable(str(exc)) from None
        except (TransportError, OSError) as exc:  # read1 is urllib3's: requests does not wrap what it raises
            raise Unreachable(f"{url}: {exc}") from None
        return Answer(response.status_code, text)

    def post(self, path: str, timeout_s: float = 30.0) -> Answer:
        try:
            response = requests.post(self.root + path, headers=_headers(self.api_key), timeout=timeout_s)
        except requests.RequestException as exc:
            raise Unreachable(str(exc)) from None
        return Answer(response.status_code, response.text)

    # Any: a JSON request body, whatever the engine's endpoint takes
    def post_json(self, path: str, body: Any, timeout_s: float = 120.0) -> Answer:
        """POST a JSON body (the lossless check's scoring requests); raises Unreachable when nothing answers."""
        try:
            response = requests.post(self.root + path, json=body, headers=_headers(self.api_key), timeout=timeout_s)
        except requests.RequestException as exc:
            raise Unreachable(str(exc)) from None
        return Answer(response.status_code, response.text)

    # Any: the engine's JSON reply, whatever shape it sent
    def get_json(self, path: str, timeout_s: float = TIMEOUT_S) -> Any:
        """GET JSON for a user-facing command: every failure is a SparklabError that says what to do."""
        url = self.root + path
        try:
            answer = self.get(path, timeout_s)
        except Unreachable as exc:
            raise SparklabError(f"cannot reach {url}: {exc}", "Is the server up? Check --url (sparklab ps).") from None
        if answer.status in (401, 403):
            raise SparklabError(f"{url} answered {answer.status}: wrong or missing API key",
                                "Pass --api-key (sparklab up printed it) or use --container NAME.")
        if answer.status != 200:
            raise SparklabError(f"{url} answered HTTP {answer.status}")
        try:
            return answer.json()
        except ValueError:
            raise SparklabError(f"{url} answered 200 but not with JSON") from None

    def alive(self, timeout_s: float = 5.0) -> bool:
        """GET /health (vLLM and SGLang serve it): alive unless nothing answers or it answers 5xx. A server
        without /health (404) is not presumed dead. The client's stall detector asks this."""
        try:
            return self.get("/health", timeout_s).status < 500
        except Unreachable:
            return False

    def first_model(self) -> str:
        """The first model the server lists (GET /v1/models)."""
        models = self.get_json("/v1/models")
        data = models.get("data") if isinstance(models, dict) else None
        if not data or not isinstance(data, list) or not isinstance(data[0], dict) or "id" not in data[0]:
            raise SparklabError(f"{self.root}/v1/models lists no model", "Name one with --model.")
        return str(data[0]["id"])


class Budget:
    """Seconds that several requests may take in all (a bench cell's counter snapshots), spent only while they
    run: the window between the snapshots costs nothing."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self.left = seconds
        self.clock = clock


class Replies:
    """One snapshot's answers: each path asked once, read by every adapter that wants it."""

    def __init__(self, answers: dict[str, Answer | Unreachable]) -> None:
        self.answers = answers

    def get(self, path: str) -> Answer:
        """The answer to GET path; raises Unreachable as the GET did (nothing answered, or no time was left)."""
        found = self.answers[path]  # a KeyError: the adapter reads a path it does not list in `counter_paths`
        if isinstance(found, Unreachable):
            raise Unreachable(str(found))
        return found


def fetch(api: EngineAPI, paths: Iterable[str], budget: Budget | None = None) -> Replies:
    """GET each path once, in order, each within TIMEOUT_S and together within what is left of `budget`; a path
    left without time is answered with Unreachable, as if the engine had not answered it."""
    budget = budget or Budget(math.inf)
    answers: dict[str, Answer | Unreachable] = {}
    for path in dict.fromkeys(paths):
        if budget.left <= 0:
            answers[path] = Unreachable(f"not asked: this cell's {budget.seconds:g} s for server counters were spent")
            continue
        started = budget.clock()
        try:
            answers[path] = api.get(path, min(TIMEOUT_S, budget.left))
        except Unreachable as exc:
            answers[path] = exc
        finally:
            budget.left -= budget.clock() - started
    return Replies(answers)


def probe(url: str, headers: dict[str, str] | None, timeout_s: float = 5.0) -> int:
    """One readiness try: the HTTP status of GET url; raises Unreachable when nothing answers."""
    try:
        return requests.get(url, headers=headers, timeout=timeout_s).status_code
    except requests.RequestException as exc:
        raise Unreachable(str(exc)) from None
