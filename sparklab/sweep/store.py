"""Results and sweep state of one sweep run in one SQLite file (`runs/<sweep-id>/results.sqlite`).

One writer (the sweep process). WAL mode and one transaction per state change, so killing sparklab loses at
most the cell in flight: `reset_interrupted` on resume puts it back to pending. JSON columns are TEXT.
Secrets: the caller redacts argv, startup facts and log tails before they get here; nothing is redacted here.
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sparklab.errors import DiskFullError, SparklabError
from sparklab.host.disk import free_bytes

SCHEMA_VERSION = 6
# partial: every attempt ended with failed requests; the last attempt's numbers are kept, and flagged.
STATUSES = ("pending", "running", "done", "failed", "skipped", "partial")
HOST_LOST = "host_lost"  # the failure kind of a Docker host that went away under its server (sparklab.fleet)
_UNUSABLE_HINT = ("Keep the file for inspection and start a new run (`sparklab sweep FILE` with another run id); "
                  "sparklab cannot resume or report from it.")

_SCHEMA = f"""
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE host (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE server_configs (
    id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    engine TEXT NOT NULL,
    method TEXT NOT NULL,
    k INTEGER,
    config_json TEXT NOT NULL,
    argv_json TEXT NOT NULL,
    image TEXT NOT NULL,
    image_digest TEXT,
    engine_version TEXT,
    startup_facts_json TEXT,
    started_at TEXT,
    ready_s REAL,
    log_path TEXT,
    image_check_json TEXT,
    downloads_json TEXT
);
CREATE TABLE cells (
    id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    server_config_id TEXT NOT NULL REFERENCES server_configs(id),
    concurrency INTEGER NOT NULL,
    workload TEXT NOT NULL,
    repeat INTEGER NOT NULL,
    settings_json TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'pending' CHECK (status IN ({", ".join(f"'{s}'" for s in STATUSES)})),
    attempts INTEGER NOT NULL DEFAULT 0,
    started_at TEXT,
    finished_at TEXT,
    summary_json TEXT,
    result_json TEXT,
    image_digest TEXT,
    host TEXT,
    engine_version TEXT,
    served_version TEXT
);
CREATE INDEX cells_status ON cells(status, seq);
CREATE INDEX cells_server_config ON cells(server_config_id);
CREATE TABLE failures (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    cell_id TEXT REFERENCES cells(id),
    server_config_id TEXT REFERENCES server_configs(id),
    at TEXT NOT NULL,
    kind TEXT NOT NULL,
    message TEXT NOT NULL,
    exit_code INTEGER,
    log_tail TEXT,
    host TEXT
);
CREATE INDEX failures_cell ON failures(cell_id);
CREATE INDEX failures_server_config ON failures(server_config_id);
CREATE TABLE outputs (
    cell_id TEXT NOT NULL REFERENCES cells(id),
    idx INTEGER NOT NULL,
    prompt_id TEXT NOT NULL,
    answer_json TEXT NOT NULL,
    PRIMARY KEY (cell_id, idx)
);
CREATE TABLE grades (
    cell_id TEXT NOT NULL REFERENCES cells(id),
    idx INTEGER NOT NULL,
    prompt_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    status TEXT NOT NULL,
    passed INTEGER,
    grade_json TEXT NOT NULL,
    graded_at TEXT NOT NULL,
    PRIMARY KEY (cell_id, idx)
);
CREATE TABLE scores (
    cell_id TEXT NOT NULL REFERENCES cells(id),
    idx INTEGER NOT NULL,
    scorer_id TEXT NOT NULL,
    status TEXT NOT NULL,
    tokens INTEGER,
    logprob_sum REAL,
    detail TEXT,
    scored_at TEXT NOT NULL,
    PRIMARY KEY (cell_id, idx)
);
"""
_CELL_COLUMNS_V1 = ("id, seq, server_config_id, concurrency, workload, repeat, settings_json, status, attempts,"
                    " started_at, finished_at, summary_json, result_json")


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


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


# Any: the store keeps JSON documents (sweep, configs, results, facts) and gives them back as such
class Store:
    """A sweep run's results file. Use `Store.create` for a new run, `Store.open` to resume or report."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self._conn = conn
        self.path = path

    # -- opening ----------------------------------------------------------------------------------------------

    @classmethod
    def create(cls, path: str | Path, sweep: dict[str, Any], sparklab_version: str) -> Store:
        path = Path(path)
        if path.exists():
            raise SparklabError(f"{path}: a results file already exists here.",
                                "Resume that run with `sparklab sweep --resume`, or choose another run id.")
        path.parent.mkdir(parents=True, exist_ok=True)
        # Built beside its final name and renamed when whole: a full disk never leaves a half-made results file.
        partial = path.with_name(f".{path.name}.creating-{os.getpid()}")
        try:
            store = cls(_connect(partial, mode="rwc"), partial)
            try:
                with store._transaction() as conn:
                    _create_schema(conn)
                    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                    conn.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", [
                        ("sweep", _dumps(sweep)), ("created_at", utc_now()), ("sparklab_version", sparklab_version)])
            finally:
                store.close()
            os.replace(partial, path)
        except (sqlite3.OperationalError, OSError, DiskFullError) as exc:
            for leftover in partial.parent.glob(partial.name + "*"):
                leftover.unlink(missing_ok=True)
            if isinstance(exc, DiskFullError) or _is_disk_full(exc, partial):
                raise _disk_full(path) from None
            raise
        return cls.open(path)

    @classmethod
    def open(cls, path: str | Path, readonly: bool = False) -> Store:
        """readonly: for reports; the file is never written (it may sit on read-only media)."""
        path = Path(path)
        if not path.is_file():
            raise SparklabError(f"{path}: no results file (missing or not a file).",
                                "Check the run id: each run keeps runs/<sweep-id>/results.sqlite.")
        try:
            conn = _connect(path, mode="ro" if readonly else "rw")
        except sqlite3.DatabaseError as exc:
            raise SparklabError(f"{path}: not a readable SQLite results file ({exc}).", _UNUSABLE_HINT) from None
        try:
            version = _check_integrity(conn, path)
            if version < SCHEMA_VERSION and not readonly:
                _migrate(conn, version)
        except BaseException:
            conn.close()
            raise
        return cls(conn, path)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; BEGIN IMMEDIATE takes the write lock up front, so a commit is all or nothing."""
        try:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            if _is_disk_full(exc, self.path):
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise _disk_full(self.path) from None
            raise

    # -- the plan ---------------------------------------------------------------------------------------------

    def add_server_config(self, id: str, *, engine: str, method: str, k: int | None, config: dict[str, Any],
                          argv: list[str], image: str) -> None:
        """Idempotent: a server config already stored under this id is left as it is. argv must be redacted."""
        with self._transaction() as conn:
            conn.execute(
                "INSERT OR IGNORE INTO server_configs (id, seq, engine, method, k, config_json, argv_json, image)"
                " VALUES (?, (SELECT COALESCE(MAX(seq), 0) + 1 FROM server_configs), ?, ?, ?, ?, ?, ?)",
                (id, engine, method, k, _dumps(config), _dumps(argv), image))

    def add_cells(self, cells: Iterable[PlannedCell]) -> int:
        """Idempotent: cells already stored keep their status and results. Returns how many were new."""
        added = 0
        with self._transaction() as conn:
            for cell in cells:
                added += conn.execute(
                    "INSERT OR IGNORE INTO cells (id, seq, server_config_id, concurrency, workload, repeat,"
                    " settings_json) VALUES (?, (SELECT COALESCE(MAX(seq), 0) + 1 FROM cells), ?, ?, ?, ?, ?)",
                    (cell.id, cell.server_config_id, cell.concurrency, cell.workload, cell.repeat,
                     _dumps(cell.settings))).rowcount
        return added

    def set_meta(self, key: str, value: Any) -> None:
        """A JSON document about the run beside the sweep (e.g. `sparklab tune`'s state); "sweep" is fixed."""
        if key == "sweep":
            raise ValueError("the sweep document is written once, by Store.create")
        with self._transaction() as conn:
            conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, _dumps(value)))

    def set_host_facts(self, facts: dict[str, Any]) -> None:
        with self._transaction() as conn:
            conn.executemany("INSERT OR REPLACE INTO host (key, value) VALUES (?, ?)",
                             [(key, _dumps(value)) for key, value in facts.items()])

    # -- state changes, each its own transaction -------------------------------------------------------------

    def record_server_start(self, server_config_id: str, *, image_digest: str | None,
                            startup_facts: dict[str, Any] | None, ready_s: float | None,
                            log_path: str | None, engine_version: str | None = None,
                            downloads: dict[str, Any] | None = None) -> None:
        """The latest start of this server config (a resumed run overwrites the previous one's facts). downloads:
        what was fetched for it first (model checkpoints, the image pull) and how long it took."""
        with self._transaction() as conn:
            _require(conn.execute(
                "UPDATE server_configs SET image_digest = ?, engine_version = ?, startup_facts_json = ?,"
                " started_at = ?, ready_s = ?, log_path = ?, downloads_json = ? WHERE id = ?",
                (image_digest, engine_version, _dumps(startup_facts) if startup_facts is not None else None,
                 utc_now(), ready_s, log_path, _dumps(downloads) if downloads is not None else None,
                 server_config_id)), "server config", server_config_id)

    def record_image_check(self, server_config_id: str, check: dict[str, Any]) -> None:
        """The image's own parser on this server config's command, and the version it read (the latest check)."""
        with self._transaction() as conn:
            _require(conn.execute("UPDATE server_configs SET image_check_json = ? WHERE id = ?",
                                  (_dumps(check), server_config_id)), "server config", server_config_id)

    def start_cell(self, cell_id: str, host: str | None = None) -> None:
        """host: the Docker host the cell runs on (sparklab.hosts names it), kept with the cell."""
        with self._transaction() as conn:
            _require(conn.execute(
                "UPDATE cells SET status = 'running', attempts = attempts + 1, started_at = ?, finished_at = NULL,"
                " host = COALESCE(?, host) WHERE id = ?", (utc_now(), host, cell_id)), "cell", cell_id)

    def finish_cell(self, cell_id: str, summary: dict[str, Any], result: dict[str, Any],
                    image_digest: str | None = None, engine_version: str | None = None,
                    served_version: str | None = None, grades: list[dict[str, Any]] | None = None) -> None:
        """The cell is done exactly when its summary and full result (per-request records too) are stored.
        The result's `outputs` (each request's bounded answer) go to the outputs table, the rest to the cell;
        grades (a graded suite's, made after the window) to the grades table, one per answer.
        engine_version: what the image's package metadata states; served_version: what the server answered."""
        with self._transaction() as conn:
            result = _keep_outputs(conn, cell_id, result)
            _keep_grades(conn, cell_id, grades)
            _require(conn.execute(
                "UPDATE cells SET status = 'done', finished_at = ?, summary_json = ?, result_json = ?,"
                " image_digest = ?, engine_version = ?, served_version = ? WHERE id = ?",
                (utc_now(), _dumps(summary), _dumps(result), image_digest, engine_version, served_version, cell_id)),
                "cell", cell_id)

    def fail_cell(self, cell_id: str, kind: str, message: str, exit_code: int | None = None,
                  log_tail: str | None = None, max_attempts: int = 3, host: str | None = None) -> str:
        """A failure row, and the cell back to pending, or failed after max_attempts. Returns the new status."""
        with self._transaction() as conn:
            row = conn.execute("SELECT server_config_id, attempts FROM cells WHERE id = ?", (cell_id,)).fetchone()
            if row is None:
                raise KeyError(f"no cell {cell_id!r} in {self.path}")
            server_config_id, attempts = row
            _insert_failure(conn, cell_id, server_config_id, kind, message, exit_code, log_tail, host)
            status = "failed" if attempts >= max_attempts else "pending"
            conn.execute("UPDATE cells SET status = ?, finished_at = ? WHERE id = ?", (status, utc_now(), cell_id))
        return status

    def skip_cell(self, cell_id: str) -> None:
        """A planned cell that need not run (`repeats: auto` has measured its load precisely enough)."""
        with self._transaction() as conn:
            _require(conn.execute("UPDATE cells SET status = 'skipped', finished_at = ? WHERE id = ?",
                                  (utc_now(), cell_id)), "cell", cell_id)

    def record_failure(self, kind: str, message: str) -> None:
        """A run-level failure row (no cell, no server), e.g. why the sweep stopped."""
        with self._transaction() as conn:
            _insert_failure(conn, None, None, kind, message, None, None)

    def partial_cell(self, cell_id: str, summary: dict[str, Any], result: dict[str, Any], message: str,
                     max_attempts: int = 3, image_digest: str | None = None, host: str | None = None,
                     engine_version: str | None = None, served_version: str | None = None,
                     grades: list[dict[str, Any]] | None = None) -> str:
        """Some requests failed: a 'partial' failure row; the cell runs again (pending), or after max_attempts
        stays 'partial' with this attempt's numbers, which reports show flagged. Returns the new status."""
        with self._transaction() as conn:
            row = conn.execute("SELECT server_config_id, attempts FROM cells WHERE id = ?", (cell_id,)).fetchone()
            if row is None:
                raise KeyError(f"no cell {cell_id!r} in {self.path}")
            server_config_id, attempts = row
            _insert_failure(conn, cell_id, server_config_id, "partial", message, None, None, host)
            status = "partial" if attempts >= max_attempts else "pending"
            result = _keep_outputs(conn, cell_id, result)
            _keep_grades(conn, cell_id, grades)
            conn.execute("UPDATE cells SET status = ?, finished_at = ?, summary_json = ?, result_json = ?,"
                         " image_digest = ?, engine_version = ?, served_version = ? WHERE id = ?",
                         (status, utc_now(), _dumps(summary), _dumps(result), image_digest, engine_version,
                          served_version, cell_id))
        return status

    def fail_server_config(self, server_config_id: str, kind: str, message: str, exit_code: int | None = None,
                           log_tail: str | None = None, max_attempts: int = 3,
                           cell_ids: Iterable[str] | None = None, host: str | None = None) -> None:
        """The server failed (not ready, exited, OOM): one failure row, and an attempt on each unfinished cell.

        A running cell already counted its attempt in `start_cell`; pending ones count one here, so a server
        that never starts marks its cells failed after max_attempts runs instead of retrying them forever.
        cell_ids: only these pending cells count the attempt (those this server start never reached; a cell it
        ran and sent back to pending has counted its attempt already). None: every pending cell of the server.
        """
        with self._transaction() as conn:
            _insert_failure(conn, None, server_config_id, kind, message, exit_code, log_tail, host)
            if cell_ids is None:
                targets = [r[0] for r in conn.execute(
                    "SELECT id FROM cells WHERE server_config_id = ? AND status IN ('pending', 'running')",
                    (server_config_id,))]
            else:
                wanted = set(cell_ids)
                targets = [r[0] for r in conn.execute(
                    "SELECT id, status FROM cells WHERE server_config_id = ? AND status IN ('pending', 'running')",
                    (server_config_id,)) if r[1] == "running" or r[0] in wanted]
            for cell_id in targets:
                conn.execute("UPDATE cells SET attempts = attempts + (status = 'pending') WHERE id = ?", (cell_id,))
                conn.execute("UPDATE cells SET status = CASE WHEN attempts >= ? THEN 'failed' ELSE 'pending' END,"
                             " finished_at = ? WHERE id = ?", (max_attempts, utc_now(), cell_id))

    def reset_interrupted(self, max_attempts: int = 3) -> list[str]:
        """Cells left running by a crash or kill go back to pending (failed after max_attempts), each with an
        'interrupted' failure row. Call it when a run is resumed. Returns their ids."""
        with self._transaction() as conn:
            rows = conn.execute("SELECT id, server_config_id FROM cells WHERE status = 'running' ORDER BY seq"
                                ).fetchall()
            for cell_id, server_config_id in rows:
                _insert_failure(conn, cell_id, server_config_id, "interrupted",
                                "sparklab stopped while this cell was running (killed, crashed or power lost)",
                                None, None)
            conn.execute("UPDATE cells SET status = CASE WHEN attempts >= ? THEN 'failed' ELSE 'pending' END"
                         " WHERE status = 'running'", (max_attempts,))
        return [cell_id for cell_id, _ in rows]

    def host_lost(self, server_config_id: str, host: str, message: str) -> list[str]:
        """The Docker host running this server config was lost: one 'host_lost' failure row, and its running
        cell back to pending with its attempt given back (the host failed, not the cell). Returns those ids."""
        with self._transaction() as conn:
            _insert_failure(conn, None, server_config_id, HOST_LOST, message, None, None, host)
            rows = [r[0] for r in conn.execute(
                "SELECT id FROM cells WHERE server_config_id = ? AND status = 'running'", (server_config_id,))]
            conn.execute("UPDATE cells SET status = 'pending', attempts = MAX(attempts - 1, 0), finished_at = ?"
                         " WHERE server_config_id = ? AND status = 'running'", (utc_now(), server_config_id))
        return rows

    def retry_failed(self) -> int:
        """Failed cells back to pending with their attempts reset (`--retry-failed`). Returns how many."""
        with self._transaction() as conn:
            return conn.execute(
                "UPDATE cells SET status = 'pending', attempts = 0 WHERE status IN ('failed', 'partial')").rowcount

    # -- reading ----------------------------------------------------------------------------------------------

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
        return [CellRow(r[0], r[1], r[2], r[3], r[4], _loads(r[5]), r[6], r[7], r[8], r[9], _loads(r[10]),
                        _loads(r[11]), r[12], r[13], r[14], r[15]) for r in rows]

    def kept_summaries(self, server_config_id: str) -> list[tuple[str, int, dict[str, Any] | None, str | None]]:
        """(workload, concurrency, summary, image digest) of a server config's done and partial cells, without
        their full results (cheap enough to ask before every cell)."""
        rows = self._conn.execute(
            f"SELECT c.workload, c.concurrency, c.summary_json, {self._column('cells', 'image_digest', 'c.')}"
            " FROM cells c"
            " WHERE c.server_config_id = ? AND c.status IN ('done', 'partial') ORDER BY c.seq",
            (server_config_id,)).fetchall()
        return [(r[0], r[1], _loads(r[2]), r[3]) for r in rows]

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

    def add_scores(self, rows: Iterable[Score]) -> int:
        """Answers scored under the target (the lossless check), each its own row; a row already there is kept."""
        with self._transaction() as conn:
            return sum(conn.execute(
                "INSERT OR IGNORE INTO scores (cell_id, idx, scorer_id, status, tokens, logprob_sum, detail,"
                " scored_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (r.cell_id, r.idx, r.scorer_id, r.status, r.tokens, r.logprob_sum, r.detail, utc_now())).rowcount
                for r in rows)

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
        return [ServerConfigRow(r[0], r[1], r[2], r[3], _loads(r[4]), _loads(r[5]), r[6], r[7], r[8], _loads(r[9]),
                                r[10], r[11], r[12], _loads(r[13]), _loads(r[14])) for r in rows]

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

    def host_facts(self) -> dict[str, Any]:
        return {key: json.loads(value) for key, value in self._conn.execute("SELECT key, value FROM host")}

    def meta(self) -> dict[str, str]:
        return dict(self._conn.execute("SELECT key, value FROM meta").fetchall())

    def sweep(self) -> dict[str, Any]:
        """The resolved sweep document the run was created from."""
        return json.loads(self.meta()["sweep"])


def _connect(path: Path, mode: str) -> sqlite3.Connection:
    # mode=rw: opening never creates a file, so a mistyped run id is an error, not a new empty database.
    # check_same_thread off: a sweep over several hosts writes from one thread per host, one call at a time
    # (sparklab.hosts.HostStore holds a lock around every call).
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode={mode}", uri=True, isolation_level=None,
                           check_same_thread=False)
    try:
        conn.execute("PRAGMA foreign_keys = ON")
        if mode == "rwc":
            conn.execute("PRAGMA journal_mode = WAL")
        # FULL: a committed cell survives power loss too, not only a killed process; writes are a few per cell.
        conn.execute("PRAGMA synchronous = FULL")
    except sqlite3.DatabaseError:
        conn.close()
        raise
    return conn


def _create_schema(conn: sqlite3.Connection) -> None:
    for statement in _SCHEMA.split(";"):
        if statement.strip():
            conn.execute(statement)


def _check_integrity(conn: sqlite3.Connection, path: Path) -> int:
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        # One row per problem, or one row holding many lines: flattened, so the message stays one paragraph.
        problems = [line for (text,) in conn.execute("PRAGMA quick_check(20)").fetchall()
                    for line in text.splitlines() if line and not line.startswith("***")]
    except sqlite3.DatabaseError as exc:
        raise SparklabError(f"{path}: not a readable SQLite results file ({exc}).", _UNUSABLE_HINT) from None
    if problems != ["ok"]:
        more = f" (and {len(problems) - 2} more problems)" if len(problems) > 2 else ""
        raise SparklabError(f"{path}: the results file is corrupt: {'; '.join(problems[:2])}{more}.",
                            _UNUSABLE_HINT)
    if version == 0:
        raise SparklabError(f"{path}: an SQLite file, but not a sparklab results file (no schema version).",
                            _UNUSABLE_HINT)
    if version > SCHEMA_VERSION:
        raise SparklabError(
            f"{path}: results schema version {version}, newer than this sparklab's {SCHEMA_VERSION}.",
            "Open it with the sparklab version that wrote it (its version is in the file's meta table), "
            "or start a new run.")
    # An older file is read as it is (each version's tables are a subset of the next one's) and migrated
    # when opened for writing.
    return int(version)


def _migrate_1_to_2(conn: sqlite3.Connection) -> None:
    """Cells may be 'partial': SQLite cannot alter a CHECK constraint, so the table is rebuilt (the documented
    create-copy-drop-rename procedure, foreign keys off meanwhile)."""
    new = _SCHEMA[_SCHEMA.index("CREATE TABLE cells ("):_SCHEMA.index("CREATE INDEX cells_status")]
    # version 2's table: host comes with version 4, the engine versions with 5
    new = new.replace(",\n    host TEXT,\n    engine_version TEXT,\n    served_version TEXT\n", "\n")
    conn.execute(new.replace("CREATE TABLE cells (", "CREATE TABLE cells_v2 (").rstrip().rstrip(";"))
    conn.execute(f"INSERT INTO cells_v2 ({_CELL_COLUMNS_V1}) SELECT {_CELL_COLUMNS_V1} FROM cells")
    conn.execute("DROP TABLE cells")
    conn.execute("ALTER TABLE cells_v2 RENAME TO cells")
    conn.execute("CREATE INDEX cells_status ON cells(status, seq)")
    conn.execute("CREATE INDEX cells_server_config ON cells(server_config_id)")


def _migrate_2_to_3(conn: sqlite3.Connection) -> None:
    """Each cell keeps the image digest it ran on, and each request's bounded answer (the equality check)."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(cells)")}
    if "image_digest" not in columns:
        conn.execute("ALTER TABLE cells ADD COLUMN image_digest TEXT")
    table = _SCHEMA[_SCHEMA.index("CREATE TABLE outputs ("):]
    conn.execute(table[: table.index(";")].replace("CREATE TABLE outputs", "CREATE TABLE IF NOT EXISTS outputs"))


def _migrate_3_to_4(conn: sqlite3.Connection) -> None:
    """Cells and failures say which Docker host they ran on (NULL for the runs before: the local engine)."""
    for table in ("cells", "failures"):
        if "host" not in {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN host TEXT")


def _migrate_4_to_5(conn: sqlite3.Connection) -> None:
    """Each cell keeps the engine version its image states and its server answered; each server config the verdict of
    its image's own parser (NULL for the runs before)."""
    for table, column in (("cells", "engine_version"), ("cells", "served_version"),
                          ("server_configs", "image_check_json")):
        if column not in {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} TEXT")


def _migrate_5_to_6(conn: sqlite3.Connection) -> None:
    """Grades of graded suites and the lossless check's scores, one row per answer; what each server downloaded
    before it started. Older runs have none of them, and report as before."""
    if "downloads_json" not in {row[1] for row in conn.execute("PRAGMA table_info(server_configs)")}:
        conn.execute("ALTER TABLE server_configs ADD COLUMN downloads_json TEXT")
    for name in ("grades", "scores"):
        table = _SCHEMA[_SCHEMA.index(f"CREATE TABLE {name} ("):]
        conn.execute(table[: table.index(";")].replace(f"CREATE TABLE {name}", f"CREATE TABLE IF NOT EXISTS {name}"))


# MIGRATIONS[v] takes a file from schema version v + 1 to v + 2 (simonw/llm's list-of-functions style).
MIGRATIONS = [_migrate_1_to_2, _migrate_2_to_3, _migrate_3_to_4, _migrate_4_to_5, _migrate_5_to_6]


def _keep_grades(conn: sqlite3.Connection, cell_id: str, grades: list[dict[str, Any]] | None) -> None:
    """This attempt's grades (sparklab.bench.grading.Grade.as_dict), replacing an earlier attempt's."""
    if grades is None:
        return
    conn.execute("DELETE FROM grades WHERE cell_id = ?", (cell_id,))
    conn.executemany(
        "INSERT INTO grades (cell_id, idx, prompt_id, kind, status, passed, grade_json, graded_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [(cell_id, int(g["index"]), str(g["prompt_id"]), str(g["kind"]), str(g["status"]),
          None if g.get("passed") is None else int(bool(g["passed"])), _dumps(g), utc_now()) for g in grades])


def _keep_outputs(conn: sqlite3.Connection, cell_id: str, result: dict[str, Any]) -> dict[str, Any]:
    """The result's answers into the outputs table (this attempt's only); the result without them."""
    answers = result.get("outputs")
    if answers is None:
        return result
    conn.execute("DELETE FROM outputs WHERE cell_id = ?", (cell_id,))
    conn.executemany("INSERT INTO outputs (cell_id, idx, prompt_id, answer_json) VALUES (?, ?, ?, ?)",
                     [(cell_id, i, str(a.get("prompt_id", "")), _dumps(a)) for i, a in enumerate(answers)])
    return {k: v for k, v in result.items() if k != "outputs"}


def _migrate(conn: sqlite3.Connection, version: int) -> None:
    conn.execute("PRAGMA foreign_keys = OFF")
    try:
        for step in range(version, SCHEMA_VERSION):
            conn.execute("BEGIN IMMEDIATE")
            try:
                MIGRATIONS[step - 1](conn)
                if conn.execute("PRAGMA foreign_key_check").fetchall():
                    raise SparklabError("a results file migration broke a foreign key", _UNUSABLE_HINT)
                conn.execute(f"PRAGMA user_version = {step + 1}")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
    finally:
        conn.execute("PRAGMA foreign_keys = ON")


def _is_disk_full(exc: BaseException, path: Path | None = None) -> bool:
    """ENOSPC, SQLite's "database or disk is full", or its "disk I/O error" on a filesystem with (almost) no
    space left (what SQLite says when it cannot even create its WAL file)."""
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return True
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    text = str(exc).lower()
    return "full" in text or ("i/o error" in text and path is not None and (free_bytes(path) or 0) < 1024 * 1024)


def _disk_full(path: Path) -> DiskFullError:
    return DiskFullError(f"the disk holding {path} is full: sparklab stopped the sweep (finished cells are kept)",
                         f"Free space there (df -h {path.parent}), then run the same sweep again to continue.")


def _require(cursor: sqlite3.Cursor, what: str, key: str) -> None:
    # A KeyError is a programming error in the caller (ids come from the plan it just stored), not a user error.
    if cursor.rowcount == 0:
        raise KeyError(f"no {what} {key!r}")


def _insert_failure(conn: sqlite3.Connection, cell_id: str | None, server_config_id: str | None, kind: str,
                    message: str, exit_code: int | None, log_tail: str | None, host: str | None = None) -> None:
    conn.execute("INSERT INTO failures (cell_id, server_config_id, at, kind, message, exit_code, log_tail, host)"
                 " VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (cell_id, server_config_id, utc_now(), kind, message, exit_code,
                                                      log_tail, host))
