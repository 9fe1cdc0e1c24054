"""The results file's format on disk: its tables, its schema version, and how an older file becomes current.

This module owns the SQLite DDL of `runs/<sweep-id>/results.sqlite` (`SCHEMA_VERSION`, the cell statuses its
CHECK constraint allows), opening a connection with the pragmas a sweep relies on (WAL, synchronous FULL, foreign
keys), the integrity and version check run on every open, and the step-by-step migrations from schema 1 to the
current one. `sweep.store` opens and writes files through it; nothing here knows a sweep's rows.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from sparklab.errors import SparklabError

SCHEMA_VERSION = 6
# partial: every attempt ended with failed requests; the last attempt's numbers are kept, and flagged.
STATUSES = ("pending", "running", "done", "failed", "skipped", "partial")
UNUSABLE_HINT = ("Keep the file for inspection and start a new run (`sparklab sweep FILE` with another run id); "
                 "sparklab cannot resume or report from it.")

SCHEMA_DDL = f"""
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


def connect(path: Path, mode: str) -> sqlite3.Connection:
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


def create_schema(conn: sqlite3.Connection) -> None:
    for statement in SCHEMA_DDL.split(";"):
        if statement.strip():
            conn.execute(statement)


def check_integrity(conn: sqlite3.Connection, path: Path) -> int:
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        # One row per problem, or one row holding many lines: flattened, so the message stays one paragraph.
        problems = [line for (text,) in conn.execute("PRAGMA quick_check(20)").fetchall()
                    for line in text.splitlines() if line and not line.startswith("***")]
    except sqlite3.DatabaseError as exc:
        raise SparklabError(f"{path}: not a readable SQLite results file ({exc}).", UNUSABLE_HINT) from None
    if problems != ["ok"]:
        more = f" (and {len(problems) - 2} more problems)" if len(problems) > 2 else ""
        raise SparklabError(f"{path}: the results file is corrupt: {'; '.join(problems[:2])}{more}.",
                            UNUSABLE_HINT)
    if version == 0:
        raise SparklabError(f"{path}: an SQLite file, but not a sparklab results file (no schema version).",
                            UNUSABLE_HINT)
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
    new = SCHEMA_DDL[SCHEMA_DDL.index("CREATE TABLE cells ("):SCHEMA_DDL.index("CREATE INDEX cells_status")]
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
    table = SCHEMA_DDL[SCHEMA_DDL.index("CREATE TABLE outputs ("):]
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
        table = SCHEMA_DDL[SCHEMA_DDL.index(f"CREATE TABLE {name} ("):]
        conn.execute(table[: table.index(";")].replace(f"CREATE TABLE {name}", f"CREATE TABLE IF NOT EXISTS {name}"))


# MIGRATIONS[v] takes a file from schema version v + 1 to v + 2 (simonw/llm's list-of-functions style).
MIGRATIONS = [_migrate_1_to_2, _migrate_2_to_3, _migrate_3_to_4, _migrate_4_to_5, _migrate_5_to_6]


def migrate(conn: sqlite3.Connection, version: int) -> None:
    conn.execute("PRAGMA foreign_keys = OFF")
    try:
        for step in range(version, SCHEMA_VERSION):
            conn.execute("BEGIN IMMEDIATE")
            try:
                MIGRATIONS[step - 1](conn)
                if conn.execute("PRAGMA foreign_key_check").fetchall():
                    raise SparklabError("a results file migration broke a foreign key", UNUSABLE_HINT)
                conn.execute(f"PRAGMA user_version = {step + 1}")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
    finally:
        conn.execute("PRAGMA foreign_keys = ON")
