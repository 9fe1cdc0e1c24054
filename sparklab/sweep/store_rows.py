"""The rows a sweep run's results file gives back, and how values are stored in it.

This module owns the plain records of `sweep.store` (a planned cell, a cell with its state, a server config, a
failure, an answer's score), the failure kind of a lost Docker host, and the two encodings every table uses:
UTC timestamps as ISO text and JSON documents as compact TEXT. It holds no SQL, so readers of stored results
(`report/`) can name these types without the store's write side.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

HOST_LOST = "host_lost"  # the failure kind of a Docker host that went away under its server (sparklab.fleet)

@dataclass(frozen=True)
class PlannedCell:
    """One load point of the plan, as the sweep adds it (id: a stable hash of what defines the cell)."""

    id: str
    server_config_id: str
    concurrency: int
    workload: str
    repeat: int
    settings: dict[str, Any]


@dataclass(frozen=True)
class ServerConfigRow:
    id: str
    engine: str
    method: str
    k: int | None
    config: dict[str, Any]
    argv: list[str]
    image: str
    image_digest: str | None
    engine_version: str | None
    startup_facts: dict[str, Any] | None
    started_at: str | None
    ready_s: float | None
    log_path: str | None
    image_check: dict[str, Any] | None = None  # its image's parser verdict and version (sparklab.imagecheck)
    downloads: dict[str, Any] | None = None  # model downloads and the image pull before its latest start (schema 6)


@dataclass(frozen=True)
class CellRow(PlannedCell):
    """A planned cell with its state in this run."""

    status: str
    attempts: int
    started_at: str | None
    finished_at: str | None
    summary: dict[str, Any] | None
    result: dict[str, Any] | None
    image_digest: str | None = None  # the image this cell ran on (a resumed run may have pulled another)
    host: str | None = None  # the Docker host its last attempt ran on (None: before schema 4, or never started)
    # The engine version its image's package metadata states, and the one its server's version endpoint answered
    # (None: before schema 5, or not read)
    engine_version: str | None = None
    served_version: str | None = None


@dataclass(frozen=True)
class Score:
    """One answer scored under the target model (sparklab.sweep.lossless): its tokens' summed log-probability, or
    why it could not be scored (status "unscorable", detail)."""

    cell_id: str
    idx: int
    scorer_id: str  # the server config that scored it (a plain server of the same recipe)
    status: str  # "scored" | "unscorable"
    tokens: int | None
    logprob_sum: float | None
    detail: str | None = None


@dataclass(frozen=True)
class FailureRow:
    id: int
    cell_id: str | None
    server_config_id: str | None
    at: str
    kind: str
    message: str
    exit_code: int | None
    log_tail: str | None
    host: str | None = None


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


# Any: a JSON document (sweep, config, result, facts) goes in as the caller built it
def to_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


# Any: a JSON document comes back as whatever it was stored as
def from_json(text: str | None) -> Any:
    return None if text is None else json.loads(text)
