"""The run's store as one host's worker sees it (sparklab.sweep.fleet): one lock around every call, the host's name
on what it records, and Ctrl-C on the controller turned into an interrupt at the worker's next write."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sparklab.sweep.store import CellRow, Score, ServerConfigRow, Store


class HostStore:
    """The run's store as one host's worker sees it: every call under one lock (one SQLite connection for all
    threads), and what it records carries the host's name (none: this machine alone).

    After Ctrl-C on the controller (`stop`), this worker's next write unwinds it as an interrupt (its server comes
    down on the way); what it was doing stays 'running' for reset_interrupted. Reads still answer."""

    def __init__(self, store: Store, lock: threading.RLock | None = None, host: str | None = None,
                 stop: threading.Event | None = None) -> None:
        self._store = store
        self._lock = lock or threading.RLock()
        self.host = host
        self._stop = stop or threading.Event()

    @property
    def path(self) -> Path:
        return self._store.path

    @contextmanager
    def _writing(self) -> Iterator[Store]:
        with self._lock:
            if self._stop.is_set():
                raise KeyboardInterrupt
            yield self._store

    # -- reads (they answer after Ctrl-C too) ---------------------------------------------------------------------

    def pending_cells(self) -> list[CellRow]:
        with self._lock:
            return self._store.pending_cells()

    def cells(self, status: str | None = None) -> list[CellRow]:
        with self._lock:
            return self._store.cells(status)

    def cell(self, cell_id: str) -> CellRow:
        with self._lock:
            return self._store.cell(cell_id)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return self._store.counts()

    def server_configs(self) -> list[ServerConfigRow]:
        with self._lock:
            return self._store.server_configs()

    def meta(self) -> dict[str, str]:
        with self._lock:
            return self._store.meta()

    def outputs(self) -> dict[str, list[dict[str, Any]]]:
        with self._lock:
            return self._store.outputs()

    def scores(self) -> dict[tuple[str, int], Score]:
        with self._lock:
            return self._store.scores()

    # -- what a server's work records ------------------------------------------------------------------------------

    def kept_summaries(self, server_config_id: str) -> list[tuple[str, int, dict[str, Any] | None, str | None]]:
        with self._writing() as store:  # asked before each cell: after Ctrl-C the worker unwinds here too
            return store.kept_summaries(server_config_id)

    def record_server_start(self, server_config_id: str, *, image_digest: str | None,
                            startup_facts: dict[str, Any] | None, ready_s: float | None,
                            log_path: str | None, engine_version: str | None = None,
                            downloads: dict[str, Any] | None = None) -> None:
        with self._writing() as store:
            store.record_server_start(server_config_id, image_digest=image_digest, startup_facts=startup_facts,
                                      ready_s=ready_s, log_path=log_path, engine_version=engine_version,
                                      downloads=downloads)

    def record_image_check(self, server_config_id: str, check: dict[str, Any]) -> None:
        with self._writing() as store:
            store.record_image_check(server_config_id, check)

    def start_cell(self, cell_id: str) -> None:
        with self._writing() as store:
            store.start_cell(cell_id, host=self.host)

    def finish_cell(self, cell_id: str, summary: dict[str, Any], result: dict[str, Any],
                    image_digest: str | None = None, engine_version: str | None = None,
                    served_version: str | None = None, grades: list[dict[str, Any]] | None = None) -> None:
        with self._writing() as store:
            store.finish_cell(cell_id, summary, result, image_digest=image_digest, engine_version=engine_version,
                              served_version=served_version, grades=grades)

    def skip_cell(self, cell_id: str) -> None:
        with self._writing() as store:
            store.skip_cell(cell_id)

    def fail_cell(self, cell_id: str, kind: str, message: str, exit_code: int | None = None,
                  log_tail: str | None = None, max_attempts: int = 3) -> str:
        with self._writing() as store:
            return store.fail_cell(cell_id, kind, message, exit_code, log_tail, max_attempts, host=self.host)

    def partial_cell(self, cell_id: str, summary: dict[str, Any], result: dict[str, Any], message: str,
                     max_attempts: int = 3, image_digest: str | None = None, engine_version: str | None = None,
                     served_version: str | None = None, grades: list[dict[str, Any]] | None = None) -> str:
        with self._writing() as store:
            return store.partial_cell(cell_id, summary, result, message, max_attempts, image_digest, host=self.host,
                                      engine_version=engine_version, served_version=served_version, grades=grades)

    def fail_server_config(self, server_config_id: str, kind: str, message: str, exit_code: int | None = None,
                           log_tail: str | None = None, max_attempts: int = 3,
                           cell_ids: Iterable[str] | None = None) -> None:
        with self._writing() as store:
            store.fail_server_config(server_config_id, kind, message, exit_code, log_tail, max_attempts, cell_ids,
                                     host=self.host)

    def add_scores(self, rows: Iterable[Score]) -> int:
        with self._writing() as store:
            return store.add_scores(rows)

    def record_failure(self, kind: str, message: str) -> None:
        with self._writing() as store:
            store.record_failure(kind, message)

    def host_lost(self, server_config_id: str, host: str, message: str) -> list[str]:
        with self._writing() as store:
            return store.host_lost(server_config_id, host, message)
