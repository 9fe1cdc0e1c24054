"""Reading a sweep run's results file: the read-side queries of `sweep.store.Store`.

This module owns every query that only reads a results file (pending and stored cells, server configs, failures,
kept answers, grades and scores, counts, host facts and the sweep document), including how a file of an older
schema opened read-only (never migrated) answers: a column it lacks reads as NULL, a table it lacks as empty.
`Store` adds opening, creating and every write on top of it.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from sparklab.sweep.store_rows import CellRow, FailureRow, Score, ServerConfigRow, from_json
from sparklab.sweep.store_schema import STATUSES


# Any: the store keeps JSON documents (sweep, configs, results, facts) and gives them back as such
class StoreReader:
    """The queries over one open results file (connection `_conn`, file `path`); `sweep.store.Store` is the class
    to use."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self._conn = conn
        self.path = path

    def pending_cells(self) -> list[CellRow]:
        """Pending cells in plan order, those of one server config together (one server start serves them)."""
        return self._cells("WHERE c.status = 'pending'")

    def cells(self, status: str | None = None) -> list[CellRow]:
        if status is None:
            return self._cells("")
        if status not in STATUSES:
            raise ValueError(f"unknown cell status {status!r}; expected one of {', '.join(STATUSES)}")
        return self._cells("WHERE c.status = ?", (status,))

    def cell(self, cell_id: str) -> CellRow:
        rows = self._cells("WHERE c.id = ?", (cell_id,))
        if not rows:
            raise KeyError(f"no cell {cell_id!r} in {self.path}")
        return rows[0]

    def _cells(self, where: str, params: tuple[Any, ...] = ()) -> list[CellRow]:
        rows = self._conn.execute(
            "SELECT c.id, c.server_config_id, c.concurrency, c.workload, c.repeat, c.settings_json, c.status,"
            " c.attempts, c.started_at, c.finished_at, c.summary_json, c.result_json,"
            f" {self._column('cells', 'image_digest', 'c.')}, {self._column('cells', 'host', 'c.')},"
            f" {self._column('cells', 'engine_version', 'c.')}, {self._column('cells', 'served_version', 'c.')}"
            f" FROM cells c JOIN server_configs s ON s.id = c.server_config_id {where} ORDER BY s.seq, c.seq",
            params).fetchall()
        return [CellRow(r[0], r[1], r[2], r[3], r[4], from_json(r[5]), r[6], r[7], r[8], r[9], from_json(r[10]),
                        from_json(r[11]), r[12], r[13], r[14], r[15]) for r in rows]

    def kept_summaries(self, server_config_id: str) -> list[tuple[str, int, dict[str, Any] | None, str | None]]:
        """(workload, concurrency, summary, image digest) of a server config's done and partial cells, without
        their full results (cheap enough to ask before every cell)."""
        rows = self._conn.execute(
            f"SELECT c.workload, c.concurrency, c.summary_json, {self._column('cells', 'image_digest', 'c.')}"
            " FROM cells c"
            " WHERE c.server_config_id = ? AND c.status IN ('done', 'partial') ORDER BY c.seq",
            (server_config_id,)).fetchall()
        return [(r[0], r[1], from_json(r[2]), r[3]) for r in rows]

    def _version(self) -> int:
        return int(self._conn.execute("PRAGMA user_version").fetchone()[0])

    def outputs(self) -> dict[str, list[dict[str, Any]]]:
        """Each cell's stored answers (sparklab.outputs.kept), by cell id; empty for runs stored before them."""
        if self._version() < 3:
            return {}
        out: dict[str, list[dict[str, Any]]] = {}
        for cell_id, text in self._conn.execute("SELECT cell_id, answer_json FROM outputs ORDER BY cell_id, idx"):
            out.setdefault(cell_id, []).append(json.loads(text))
        return out

    def grades(self) -> dict[str, list[dict[str, Any]]]:
        """Each cell's grades (sparklab.bench.grading.Grade.as_dict), by cell id; empty before schema 6."""
        if not self._has_table("grades"):
            return {}
        out: dict[str, list[dict[str, Any]]] = {}
        for cell_id, text in self._conn.execute("SELECT cell_id, grade_json FROM grades ORDER BY cell_id, idx"):
            out.setdefault(cell_id, []).append(json.loads(text))
        return out


    def scores(self) -> dict[tuple[str, int], Score]:
        """Every stored score by (cell id, answer index); empty before schema 6."""
        if not self._has_table("scores"):
            return {}
        rows = self._conn.execute("SELECT cell_id, idx, scorer_id, status, tokens, logprob_sum, detail FROM scores")
        return {(r[0], r[1]): Score(*r) for r in rows}

    def _has_table(self, name: str) -> bool:
        return self._conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                                  (name,)).fetchone() is not None

    def server_configs(self) -> list[ServerConfigRow]:
        rows = self._conn.execute(
            "SELECT id, engine, method, k, config_json, argv_json, image, image_digest, engine_version,"
            " startup_facts_json, started_at, ready_s, log_path,"
            f" {self._column('server_configs', 'image_check_json')},"
            f" {self._column('server_configs', 'downloads_json')} FROM server_configs ORDER BY seq").fetchall()
        return [ServerConfigRow(r[0], r[1], r[2], r[3], from_json(r[4]), from_json(r[5]), r[6], r[7], r[8],
                                from_json(r[9]), r[10], r[11], r[12], from_json(r[13]), from_json(r[14])) for r in rows]

    def failures(self) -> list[FailureRow]:
        rows = self._conn.execute("SELECT id, cell_id, server_config_id, at, kind, message, exit_code, log_tail,"
                                  f" {self._column('failures', 'host')} FROM failures ORDER BY id").fetchall()
        return [FailureRow(*r) for r in rows]

    def _column(self, table: str, column: str, prefix: str = "") -> str:
        """The column, or NULL in an older file opened read-only (never migrated): image_digest came with schema
        3, host with 4, the engine versions and image checks with 5, downloads with 6."""
        columns = {r[1] for r in self._conn.execute(f"PRAGMA table_info({table})")}
        return f"{prefix}{column}" if column in columns else "NULL"

    def counts(self) -> dict[str, int]:
        """Cells per status, every status present (0 when none)."""
        counts = dict.fromkeys(STATUSES, 0)
        counts.update(self._conn.execute("SELECT status, COUNT(*) FROM cells GROUP BY status").fetchall())
        return counts

    def measured_per_server(self) -> dict[str, int]:
        """Done and partial cells per server config id, without reading their results."""
        return dict(self._conn.execute("SELECT server_config_id, COUNT(*) FROM cells"
                                       " WHERE status IN ('done', 'partial') GROUP BY server_config_id").fetchall())

    def attempted(self) -> bool:
        """Whether any cell was ever started."""
        return self._conn.execute("SELECT 1 FROM cells WHERE attempts > 0 LIMIT 1").fetchone() is not None

    def host_facts(self) -> dict[str, Any]:
        return {key: json.loads(value) for key, value in self._conn.execute("SELECT key, value FROM host")}

    def meta(self) -> dict[str, str]:
        return dict(self._conn.execute("SELECT key, value FROM meta").fetchall())

    def sweep(self) -> dict[str, Any]:
        """The resolved sweep document the run was created from."""
        return json.loads(self.meta()["sweep"])

