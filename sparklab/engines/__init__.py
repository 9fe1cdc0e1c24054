"""engines: everything sparklab knows about each engine, one adapter module per kind, and the doors to a running one.

`base` is the adapter protocol (launch flags, preflight, startup log, readiness, counters, known deaths, the
engine's own parser: `parsers`, `probes/`); `vllm`, `sglang`, `llamacpp` and `trtedge` each cite the engine
version and source line a fact was read from, in their `KNOWLEDGE` tables (`knowledge`). `api` is
the only module that talks HTTP to an engine outside the chat stream; `logwatch` follows a log for fatal lines;
`caches` mounts the engines' compile caches per image digest; `scrape` and `counters` parse what engines print
and export. It may import only `spec`, `records`, `outputs`, `inputs` and `errors`: adapters are the lowest
domain layer, so everything above can ask them. See docs/architecture.md.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from sparklab.engines import llamacpp, sglang, trtedge, vllm
from sparklab.engines.base import Acceptance, Engine
from sparklab.errors import SparklabError

if TYPE_CHECKING:
    from sparklab.engines.api import Budget, EngineAPI

# Any: snapshots, windows and cell results are JSON as stored; each adapter defines its own keys
ENGINES: dict[str, Engine] = {e.kind: e for e in (vllm.ENGINE, sglang.ENGINE, trtedge.ENGINE, llamacpp.ENGINE)}


def engine(kind: str) -> Engine:
    try:
        return ENGINES[kind]
    except KeyError:
        raise SparklabError(f"no engine adapter for kind {kind!r}", f"Known kinds: {', '.join(ENGINES)}.") from None


def candidates(kind: str | None) -> list[Engine]:
    """The adapter of `kind`, or every adapter when the kind is unknown (`sparklab bench --url`)."""
    return [engine(kind)] if kind else list(ENGINES.values())


def snapshot(api: EngineAPI, kind: str | None, budget: Budget | None = None) -> dict[str, Any]:
    """Server-side counters at one instant, read by the adapter (or every adapter) of the engine from one GET of
    each path they list, within what is left of `budget` (a bench cell's, shared by its snapshots)."""
    from sparklab.engines.api import fetch  # requests only where counters are asked for: the report never is

    adapters = candidates(kind)
    snap: dict[str, Any] = {"at": time.time()}
    replies = fetch(api, (path for adapter in adapters for path in adapter.counter_paths), budget)
    for adapter in adapters:
        snap.update(adapter.read_counters(replies))
    return snap


def window(before: dict[str, Any], after: dict[str, Any], kind: str | None) -> dict[str, Any]:
    """`speculative`, `server_latency` and `prefix_cache` over the window (None where no adapter can say)."""
    out: dict[str, Any] = {"speculative": None, "server_latency": None, "prefix_cache": None}
    for adapter in candidates(kind):
        for key, value in adapter.window(before, after).items():
            if out.get(key) is None:
                out[key] = value
    return out


def cumulative_acceptance(snapshot: dict[str, Any]) -> Acceptance | None:
    """The acceptance length an engine states over its whole life in one snapshot, and its source (None: none)."""
    for adapter in ENGINES.values():
        found = adapter.cumulative_acceptance(snapshot)
        if found is not None:
            return found
    return None


def acceptance(result: dict[str, Any]) -> Acceptance | tuple[None, None]:
    """Acceptance length of a stored bench result and its source, from whichever engine reported it."""
    for adapter in ENGINES.values():
        found = adapter.acceptance(result)
        if found is not None:
            return found
    return None, None


def acceptance_rate(result: dict[str, Any]) -> float | None:
    """The window's acceptance rate (accepted ÷ proposed draft tokens), from whichever engine reported it."""
    for adapter in ENGINES.values():
        found = adapter.acceptance_rate(result)
        if found is not None:
            return found
    return None
