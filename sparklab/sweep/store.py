"""Results and sweep state of one sweep run in one SQLite file (`runs/<sweep-id>/results.sqlite`).

One writer (the sweep process). WAL mode and one transaction per state change, so killing sparklab loses at
most the cell in flight: `reset_interrupted` on resume puts it back to pending. JSON columns are TEXT.
Secrets: the caller redacts argv, startup facts and log tails before they get here; nothing is redacted here.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sparklab.errors import DiskFullError, SparklabError
from sparklab.host.disk import free_bytes
from sparklab.sweep.store_reads import StoreReader
from sparklab.sweep.store_rows import HOST_LOST, PlannedCell, Score, from_json, to_json, utc_now
from sparklab.sweep.store_schema import (
    SCHEMA_VERSION,
    UNUSABLE_HINT,
    check_integrity,
    connect,
    create_schema,
    migrate,
)


# Any: the store keeps JSON documents (sweep, configs, results, facts) and gives them back as such
class Store(StoreReader):
    """A sweep run's results file. Use `Store.create` for a new run, `Store.open` to resume or report; the
    queries that only read are StoreReader's (sparklab.sweep.store_reads)."""

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
            store = cls(connect(partial, mode="rwc"), partial)
            try:
                with store._transaction() as conn:
                    create_schema(conn)
                    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                    conn.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", [
                        ("sweep", to_json(sweep)), ("created_at", utc_now()), ("sparklab_version", sparklab_version)])
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
            conn = connect(path, mode="ro" if readonly else "rw")
        except sqlite3.DatabaseError as exc:
            raise SparklabError(f"{path}: not a readable SQLite results file ({exc}).", UNUSABLE_HINT) from None
        try:
            version = check_integrity(conn, path)
            if version < SCHEMA_VERSION and not readonly:
                migrate(conn, version)
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
        """One write transaction; BEGIN IMMEDIATE takes the write lock up front, so a commit is all or nothing.

        BEGIN is inside the rollback guard: a Ctrl-C is raised at whichever bytecode runs when it lands, and one that
        landed as BEGIN returned would otherwise leave the transaction open, so the next write (the Ctrl-C handler's
        own) failed with "cannot start a transaction within a transaction"."""
        try:
            self._conn.execute("BEGIN IMMEDIATE")
            yield self._conn
            self._conn.execute("COMMIT")
        except BaseException as exc:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.OperationalError) and _is_disk_full(exc, self.path):
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
                (id, engine, method, k, to_json(config), to_json(argv), image))

    # Any: JSON stored with the server config (sweep.provenance.launch_facts)
    def set_server_launch(self, id: str, launch: dict[str, Any]) -> None:
        """A server that measured nothing was started again with another launch (a fix): that launch is its setup."""
        with self._transaction() as conn:
            row = conn.execute("SELECT config_json FROM server_configs WHERE id = ?", (id,)).fetchone()
            if row is not None:
                conn.execute("UPDATE server_configs SET config_json = ? WHERE id = ?",
                             (to_json({**from_json(row[0]), "launch": launch}), id))

    def add_cells(self, cells: Iterable[PlannedCell]) -> int:
        """Idempotent: cells already stored keep their status and results. Returns how many were new."""
        added = 0
        with self._transaction() as conn:
            for cell in cells:
                added += conn.execute(
                    "INSERT OR IGNORE INTO cells (id, seq, server_config_id, concurrency, workload, repeat,"
                    " settings_json) VALUES (?, (SELECT COALESCE(MAX(seq), 0) + 1 FROM cells), ?, ?, ?, ?, ?)",
                    (cell.id, cell.server_config_id, cell.concurrency, cell.workload, cell.repeat,
                     to_json(cell.settings))).rowcount
        return added

    def set_meta(self, key: str, value: Any) -> None:
        """A JSON document about the run beside the sweep (e.g. `sparklab tune`'s state); "sweep" is fixed."""
        if key == "sweep":
            raise ValueError("the sweep document is written once, by Store.create")
        with self._transaction() as conn:
            conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, to_json(value)))

    def set_host_facts(self, facts: dict[str, Any]) -> None:
        with self._transaction() as conn:
            conn.executemany("INSERT OR REPLACE INTO host (key, value) VALUES (?, ?)",
                             [(key, to_json(value)) for key, value in facts.items()])

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
                (image_digest, engine_version, to_json(startup_facts) if startup_facts is not None else None,
                 utc_now(), ready_s, log_path, to_json(downloads) if downloads is not None else None,
                 server_config_id)), "server config", server_config_id)

    def record_image_check(self, server_config_id: str, check: dict[str, Any]) -> None:
        """The image's own parser on this server config's command, and the version it read (the latest check)."""
        with self._transaction() as conn:
            _require(conn.execute("UPDATE server_configs SET image_check_json = ? WHERE id = ?",
                                  (to_json(check), server_config_id)), "server config", server_config_id)

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
                (utc_now(), to_json(summary), to_json(result), image_digest, engine_version, served_version, cell_id)),
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
                         (status, utc_now(), to_json(summary), to_json(result), image_digest, engine_version,
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

    def add_scores(self, rows: Iterable[Score]) -> int:
        """Answers scored under the target (the lossless check), each its own row; a row already there is kept."""
        with self._transaction() as conn:
            return sum(conn.execute(
                "INSERT OR IGNORE INTO scores (cell_id, idx, scorer_id, status, tokens, logprob_sum, detail,"
                " scored_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (r.cell_id, r.idx, r.scorer_id, r.status, r.tokens, r.logprob_sum, r.detail, utc_now())).rowcount
                for r in rows)


def _keep_grades(conn: sqlite3.Connection, cell_id: str, grades: list[dict[str, Any]] | None) -> None:
    """This attempt's grades (sparklab.bench.grading.Grade.as_dict), replacing an earlier attempt's."""
    if grades is None:
        return
    conn.execute("DELETE FROM grades WHERE cell_id = ?", (cell_id,))
    conn.executemany(
        "INSERT INTO grades (cell_id, idx, prompt_id, kind, status, passed, grade_json, graded_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [(cell_id, int(g["index"]), str(g["prompt_id"]), str(g["kind"]), str(g["status"]),
          None if g.get("passed") is None else int(bool(g["passed"])), to_json(g), utc_now()) for g in grades])


def _keep_outputs(conn: sqlite3.Connection, cell_id: str, result: dict[str, Any]) -> dict[str, Any]:
    """The result's answers into the outputs table (this attempt's only); the result without them."""
    answers = result.get("outputs")
    if answers is None:
        return result
    conn.execute("DELETE FROM outputs WHERE cell_id = ?", (cell_id,))
    conn.executemany("INSERT INTO outputs (cell_id, idx, prompt_id, answer_json) VALUES (?, ?, ?, ?)",
                     [(cell_id, i, str(a.get("prompt_id", "")), to_json(a)) for i, a in enumerate(answers)])
    return {k: v for k, v in result.items() if k != "outputs"}


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
