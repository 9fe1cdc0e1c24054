"""The sweep's results file: idempotent plans, cell state changes, crash safety and clear errors for bad files."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sparklab.errors import SparklabError
from sparklab.sweep.store import Store
from sparklab.sweep.store_rows import PlannedCell
from sparklab.sweep.store_schema import SCHEMA_VERSION
from tests.tmpfs import tmpfs

SWEEP = {"name": "seed000", "matrix": {"method": ["none", "dspark"], "concurrency": [1, 8]}}
RESULT = {
    "schema": "sparklab.bench/1",
    "summary": {"output_tps": 123.456789012345, "ttft_ms": {"p50": 41.0, "p99": 97.25}},
    "requests": [
        {"index": 0, "prompt_id": "p0", "chunk_times": [0.1, 0.13, 0.15], "chunk_tokens": [1, 3, None],
         "error": None, "text": "héllo \"world\"\n"},
        {"index": 1, "prompt_id": "p1", "chunk_times": [], "chunk_tokens": [], "error": "timeout", "text": ""},
    ],
}


def add_plan(store: Store, configs: tuple[str, ...] = ("sc-a", "sc-b"), concurrencies: tuple[int, ...] = (1, 8)
             ) -> None:
    """Server configs outer, loads inner — the order a sweep plans them in."""
    for sc in configs:
        store.add_server_config(sc, engine="vllm", method=sc, k=3, config={"method": sc},
                                argv=["vllm", "serve", "--api-key", "***"], image="vllm/vllm-openai:v0.27.1")
        store.add_cells(PlannedCell(f"{sc}-c{c}", sc, c, "speedbench-1k", 0, {"max_tokens": 128})
                        for c in concurrencies)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "runs" / "r1" / "results.sqlite"


@pytest.fixture
def store(path: Path):
    with Store.create(path, SWEEP, "0.1.0") as s:
        add_plan(s)
        yield s


def test_create_then_open_round_trips_sweep_meta_and_host_facts(path: Path) -> None:
    with Store.create(path, SWEEP, "0.1.0") as s:
        s.set_host_facts({"gpu": "GB10", "memory_gb": 128, "driver": {"version": "580.1"}})
    with Store.open(path) as s:
        assert s.sweep() == SWEEP
        meta = s.meta()
        assert meta["sparklab_version"] == "0.1.0"
        assert meta["created_at"].endswith("+00:00")
        assert s.host_facts() == {"gpu": "GB10", "memory_gb": 128, "driver": {"version": "580.1"}}


def test_wal_mode_foreign_keys_and_schema_version(path: Path) -> None:
    Store.create(path, SWEEP, "0.1.0").close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()
    with Store.open(path) as s:
        assert s._conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1


def test_create_refuses_an_existing_run(path: Path) -> None:
    Store.create(path, SWEEP, "0.1.0").close()
    with pytest.raises(SparklabError, match="already exists") as err:
        Store.create(path, SWEEP, "0.1.0")
    assert str(path) in err.value.message and "--resume" in (err.value.hint or "")


def test_adding_the_same_plan_again_duplicates_nothing_and_keeps_state(store: Store) -> None:
    store.start_cell("sc-a-c1")
    store.finish_cell("sc-a-c1", {"tps": 1.0}, RESULT)
    add_plan(store)
    assert len(store.server_configs()) == 2
    assert len(store.cells()) == 4
    assert store.cell("sc-a-c1").status == "done"
    assert store.counts() == {"pending": 3, "running": 0, "done": 1, "failed": 0, "skipped": 0,
                              "partial": 0}


def test_add_cells_reports_only_new_cells(store: Store) -> None:
    assert store.add_cells([PlannedCell("sc-a-c1", "sc-a", 1, "speedbench-1k", 0, {}),
                            PlannedCell("sc-a-c64", "sc-a", 64, "speedbench-1k", 0, {})]) == 1


def test_a_cell_must_belong_to_a_stored_server_config(store: Store) -> None:
    with pytest.raises(sqlite3.IntegrityError):
        store.add_cells([PlannedCell("x", "no-such-config", 1, "w", 0, {})])
    assert len(store.cells()) == 4  # the failed transaction left nothing behind


def test_start_then_finish(store: Store) -> None:
    store.start_cell("sc-a-c1")
    running = store.cell("sc-a-c1")
    assert (running.status, running.attempts, running.finished_at) == ("running", 1, None)
    assert running.started_at is not None
    store.finish_cell("sc-a-c1", {"tps": 1.0}, RESULT)
    done = store.cell("sc-a-c1")
    assert (done.status, done.attempts, done.summary) == ("done", 1, {"tps": 1.0})
    assert done.finished_at is not None and done.finished_at >= done.started_at


def test_finished_result_round_trips_exactly_after_reopen(store: Store, path: Path) -> None:
    store.start_cell("sc-b-c8")
    store.finish_cell("sc-b-c8", RESULT["summary"], RESULT)
    store.close()
    with Store.open(path) as s:
        cell = s.cell("sc-b-c8")
        assert cell.result == RESULT
        assert cell.summary == RESULT["summary"]
        assert cell.settings == {"max_tokens": 128}


def test_failing_cell_is_retried_until_max_attempts_then_marked_failed(store: Store) -> None:
    for attempt in (1, 2):
        store.start_cell("sc-a-c8")
        assert store.fail_cell("sc-a-c8", "bench_error", f"boom {attempt}", max_attempts=3) == "pending"
        assert store.cell("sc-a-c8").attempts == attempt
    store.start_cell("sc-a-c8")
    assert store.fail_cell("sc-a-c8", "bench_error", "boom 3", exit_code=1, log_tail="last\nlines",
                           max_attempts=3) == "failed"
    assert "sc-a-c8" not in [c.id for c in store.pending_cells()]
    failures = store.failures()
    assert [(f.cell_id, f.server_config_id, f.kind, f.message) for f in failures] == [
        ("sc-a-c8", "sc-a", "bench_error", f"boom {n}") for n in (1, 2, 3)]
    assert (failures[-1].exit_code, failures[-1].log_tail) == (1, "last\nlines")


def test_server_failure_fails_its_unfinished_cells_and_counts_attempts(store: Store) -> None:
    store.start_cell("sc-a-c1")
    store.finish_cell("sc-a-c1", {}, RESULT)
    for _ in range(2):
        store.fail_server_config("sc-b", "not_ready", "not ready after 1800 s", exit_code=137, log_tail="OOM",
                                 max_attempts=2)
    assert {c.id: (c.status, c.attempts) for c in store.cells()} == {
        "sc-a-c1": ("done", 1), "sc-a-c8": ("pending", 0), "sc-b-c1": ("failed", 2), "sc-b-c8": ("failed", 2)}
    rows = store.failures()
    assert [(f.cell_id, f.server_config_id, f.kind, f.exit_code) for f in rows] == [(None, "sc-b", "not_ready", 137)] * 2


def test_server_failure_does_not_count_the_running_cell_twice(store: Store) -> None:
    store.start_cell("sc-a-c1")
    store.fail_server_config("sc-a", "exited", "container exited with 139", exit_code=139, max_attempts=3)
    assert {c.id: c.attempts for c in store.cells() if c.server_config_id == "sc-a"} == {"sc-a-c1": 1, "sc-a-c8": 1}


def test_retry_failed_resets_attempts(store: Store) -> None:
    store.start_cell("sc-a-c1")
    store.fail_cell("sc-a-c1", "oom", "killed", max_attempts=1)
    assert store.counts()["failed"] == 1
    assert store.retry_failed() == 1
    cell = store.cell("sc-a-c1")
    assert (cell.status, cell.attempts) == ("pending", 0)


def test_pending_cells_keep_plan_order_with_server_configs_together(path: Path) -> None:
    with Store.create(path, SWEEP, "0.1.0") as s:
        add_plan(s, configs=("sc-z", "sc-a"), concurrencies=(8, 1))
        # A later, idempotent re-plan adds a cell for the first config: it still groups with that config.
        add_plan(s, configs=("sc-z", "sc-a"), concurrencies=(8, 1, 64))
        s.start_cell("sc-a-c8")
        s.fail_cell("sc-a-c8", "bench_error", "retry me")
        ids = [c.id for c in s.pending_cells()]
    assert ids == ["sc-z-c8", "sc-z-c1", "sc-z-c64", "sc-a-c8", "sc-a-c1", "sc-a-c64"]


def test_unknown_status_or_cell_is_a_programming_error(store: Store) -> None:
    with pytest.raises(ValueError, match="unknown cell status"):
        store.cells("finished")
    with pytest.raises(KeyError):
        store.start_cell("nope")
    with pytest.raises(KeyError):
        store.fail_cell("nope", "bench_error", "x")


def test_reset_interrupted_after_a_crash_without_finishing(store: Store, path: Path) -> None:
    store.start_cell("sc-a-c1")
    store.close()  # the process dies here: the cell is never finished
    with Store.open(path) as s:
        assert s.cell("sc-a-c1").status == "running"
        assert s.reset_interrupted() == ["sc-a-c1"]
        cell = s.cell("sc-a-c1")
        assert (cell.status, cell.attempts) == ("pending", 1)
        assert [(f.cell_id, f.kind) for f in s.failures()] == [("sc-a-c1", "interrupted")]
        assert s.reset_interrupted() == []


def test_a_cell_that_keeps_killing_sparklab_is_marked_failed(store: Store) -> None:
    for _ in range(3):
        store.start_cell("sc-a-c1")
        store.reset_interrupted(max_attempts=3)
    assert store.cell("sc-a-c1").status == "failed"


CRASHING_SWEEP = """
    import os, signal, sys
    from sparklab.sweep.store import Store
    from sparklab.sweep.store_rows import PlannedCell
    store = Store.create(sys.argv[1], {"name": "crash"}, "0.1.0")
    store.add_server_config("sc", engine="vllm", method="none", k=None, config={}, argv=["vllm"], image="img")
    store.add_cells([PlannedCell("c1", "sc", 1, "w", 0, {}), PlannedCell("c2", "sc", 8, "w", 0, {})])
    store.start_cell("c1")
    store.finish_cell("c1", {"tps": 9.5}, {"schema": "sparklab.bench/1", "requests": [{"index": 0}]})
    store.start_cell("c2")
    os.kill(os.getpid(), signal.SIGKILL)  # mid-second-cell: no close, no checkpoint, no atexit
"""


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_sigkill_loses_at_most_the_cell_in_flight(path: Path) -> None:
    path.parent.mkdir(parents=True)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(CRASHING_SWEEP), str(path)], capture_output=True,
                          timeout=60)
    assert proc.returncode == -9, proc.stderr.decode()
    assert Path(f"{path}-wal").exists()  # the commits live in the WAL, not yet checkpointed into the file
    with Store.open(path) as s:
        assert s.reset_interrupted() == ["c2"]
        first, second = s.cell("c1"), s.cell("c2")
        assert (first.status, first.summary, first.result["requests"]) == ("done", {"tps": 9.5}, [{"index": 0}])
        assert (second.status, second.attempts) == ("pending", 1)
        assert [c.id for c in s.pending_cells()] == ["c2"]


def expect_unusable(path: Path, *fragments: str) -> SparklabError:
    with pytest.raises(SparklabError) as err:
        Store.open(path)
    assert type(err.value) is SparklabError
    assert str(path) in err.value.message
    assert "\n" not in err.value.message  # one paragraph, however many problems SQLite lists
    for fragment in fragments:
        assert fragment in err.value.message
    assert err.value.hint
    assert err.value.__cause__ is None  # no sqlite3 traceback chained on
    assert err.value.__context__ is None or err.value.__suppress_context__
    return err.value


def test_missing_file_is_a_clear_error_and_is_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "runs" / "nope" / "results.sqlite"
    with pytest.raises(SparklabError, match="no results file") as err:
        Store.open(missing)
    assert str(missing) in err.value.message
    assert not missing.exists()


def test_a_text_file_named_sqlite_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "results.sqlite"
    path.write_text("model,tps\ndspark,512\n" * 100)
    expect_unusable(path, "not a readable SQLite results file")


def test_an_empty_or_foreign_sqlite_file_is_not_a_results_file(tmp_path: Path) -> None:
    path = tmp_path / "results.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    expect_unusable(path, "not a sparklab results file")


def test_a_truncated_results_file_is_a_clear_error(store: Store, path: Path) -> None:
    for i in range(200):
        store.start_cell("sc-a-c1")
        store.fail_cell("sc-a-c1", "bench_error", f"failure {i} " + "x" * 2000, max_attempts=10**6)
    store.close()  # the last connection checkpoints the WAL into the file
    assert not Path(f"{path}-wal").exists()
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    expect_unusable(path)


def test_a_corrupt_results_file_is_a_clear_error(store: Store, path: Path) -> None:
    for i in range(50):
        store.add_cells([PlannedCell(f"extra-{i}", "sc-a", i, "w" * 500, 0, {"i": i})])
    store.close()
    data = bytearray(path.read_bytes())
    data[4096:len(data)] = b"\xff" * (len(data) - 4096)  # every page after the first overwritten
    path.write_bytes(bytes(data))
    expect_unusable(path, "the results file is corrupt")


def test_another_schema_version_is_a_clear_error(path: Path) -> None:
    Store.create(path, SWEEP, "0.1.0").close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    err = expect_unusable(path, f"schema version {SCHEMA_VERSION + 1}", f"newer than this sparklab's {SCHEMA_VERSION}")
    assert "sparklab version that wrote it" in (err.hint or "")


# -- schema migrations, partial cells, a full disk ----------------------------------------------------------


def _as_version_1(path: Path) -> None:
    """Rewrite a fresh file the way sparklab 0.1 (schema 1) made it: cells without the 'partial' status (and
    no host columns, which came with schema 3)."""
    _as_version_2(path)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA foreign_keys = OFF")
    sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'cells'").fetchone()[0]
    conn.execute(sql.replace(", 'partial'", "").replace("CREATE TABLE cells", "CREATE TABLE cells_v1"))
    conn.execute("INSERT INTO cells_v1 SELECT * FROM cells")
    conn.execute("DROP TABLE cells")
    conn.execute("ALTER TABLE cells_v1 RENAME TO cells")
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()


def _as_version_5(path: Path) -> None:
    """Rewrite a fresh file the way schema 5 made it: no grades or scores tables, no downloads on server configs."""
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE grades")
    conn.execute("DROP TABLE scores")
    conn.execute("ALTER TABLE server_configs DROP COLUMN downloads_json")
    conn.execute("PRAGMA user_version = 5")
    conn.commit()
    conn.close()


def _as_version_4(path: Path) -> None:
    """Rewrite a fresh file the way schema 4 made it: no engine versions on cells, no image check on server configs."""
    _as_version_5(path)
    conn = sqlite3.connect(path)
    for table, column in (("cells", "engine_version"), ("cells", "served_version"),
                          ("server_configs", "image_check_json")):
        conn.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    conn.execute("PRAGMA user_version = 4")
    conn.commit()
    conn.close()


def _as_version_2(path: Path) -> None:
    """Rewrite a fresh file the way schema 2 made it: no host on cells and failures."""
    _as_version_4(path)
    conn = sqlite3.connect(path)
    conn.execute("DROP INDEX failures_cell")
    conn.execute("DROP INDEX failures_server_config")
    for table in ("cells", "failures"):
        conn.execute(f"ALTER TABLE {table} DROP COLUMN host")
    conn.execute("CREATE INDEX failures_cell ON failures(cell_id)")
    conn.execute("CREATE INDEX failures_server_config ON failures(server_config_id)")
    conn.execute("PRAGMA user_version = 2")
    conn.commit()
    conn.close()


def test_a_version_2_file_gains_the_host_columns_and_keeps_its_cells(path: Path) -> None:
    with Store.create(path, SWEEP, "0.1.0") as s:
        add_plan(s)
        s.start_cell("sc-a-c1")
        s.finish_cell("sc-a-c1", {"aggregate_tps": 1.0}, RESULT)
    _as_version_2(path)
    with Store.open(path, readonly=True) as s:  # read as it is: no host column yet
        assert s.cell("sc-a-c1").status == "done"
    with Store.open(path) as s:
        assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 6
        assert s.cell("sc-a-c1").host is None and s.cell("sc-a-c1").result == RESULT
        s.start_cell("sc-b-c1", host="spark-2")
        assert s.cell("sc-b-c1").host == "spark-2"


def test_a_version_4_file_is_read_as_it_is_and_gains_the_engine_versions(path: Path) -> None:
    """Old runs stay readable: read-only they are read as they are (no version: None); opened to resume they are
    migrated, and new cells keep the version their image stated and their server answered."""
    with Store.create(path, SWEEP, "0.1.0") as s:
        add_plan(s)
        s.start_cell("sc-a-c1")
        s.finish_cell("sc-a-c1", {"aggregate_tps": 1.0}, RESULT, image_digest="sha256:1")
    _as_version_4(path)
    with Store.open(path, readonly=True) as s:
        cell = s.cell("sc-a-c1")
        assert (cell.status, cell.image_digest, cell.engine_version, cell.served_version) == (
            "done", "sha256:1", None, None)
        assert s.server_configs()[0].image_check is None
    with Store.open(path) as s:
        assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 6
        s.start_cell("sc-b-c1")
        s.finish_cell("sc-b-c1", {"aggregate_tps": 2.0}, RESULT, image_digest="sha256:2", engine_version="0.32.0+cpu",
                      served_version="0.32.0+cpu")
        s.record_image_check("sc-b", {"verdict": {"status": "accepted", "version": "0.32.0+cpu"}, "seconds": 9.5})
        cell = s.cell("sc-b-c1")
        assert (cell.engine_version, cell.served_version) == ("0.32.0+cpu", "0.32.0+cpu")
        assert s.cell("sc-a-c1").engine_version is None and s.cell("sc-a-c1").result == RESULT
        assert [r.image_check for r in s.server_configs()][1]["seconds"] == 9.5


def test_a_version_5_file_is_read_as_it_is_and_gains_grades_scores_and_downloads(path: Path) -> None:
    """A run made at schema 5 (engine versions, no grades): read-only it has no grades, scores or downloads and keeps
    its engine versions; opened to resume it is migrated (5 -> 6) and stores all three."""
    from sparklab.sweep.store_rows import Score

    with Store.create(path, SWEEP, "0.1.0") as s:
        add_plan(s)
        s.start_cell("sc-a-c1")
        s.finish_cell("sc-a-c1", {"aggregate_tps": 1.0}, RESULT, image_digest="sha256:1", engine_version="0.27.1",
                      served_version="0.27.1+cpu")
        s.record_image_check("sc-a", {"verdict": {"status": "accepted"}})
    _as_version_5(path)
    with Store.open(path, readonly=True) as s:
        assert s.grades() == {} and s.scores() == {}
        assert [r.downloads for r in s.server_configs()] == [None, None]
        assert s.server_configs()[0].image_check == {"verdict": {"status": "accepted"}}
        assert (s.cell("sc-a-c1").engine_version, s.cell("sc-a-c1").served_version) == ("0.27.1", "0.27.1+cpu")
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == 5  # reading migrated nothing
    with Store.open(path) as s:
        assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 6
        assert s.cell("sc-a-c1").engine_version == "0.27.1" and s.cell("sc-a-c1").result == RESULT
        grade = {"index": 0, "prompt_id": "p", "kind": "instruction", "status": "graded", "passed": False}
        s.start_cell("sc-b-c1")
        s.finish_cell("sc-b-c1", {"aggregate_tps": 2.0}, RESULT, engine_version="0.27.1", grades=[grade])
        assert s.grades() == {"sc-b-c1": [grade]}
        assert s.add_scores([Score("sc-b-c1", 0, "sc-a", "scored", 3, -1.5)]) == 1
        s.record_server_start("sc-b", image_digest=None, startup_facts={}, ready_s=1.0, log_path=None,
                              downloads={"seconds": 0.0, "image_s": 0.1, "total_s": 0.1})
        assert [r.downloads for r in s.server_configs()][1] == {"seconds": 0.0, "image_s": 0.1, "total_s": 0.1}
        assert s.server_configs()[0].image_check == {"verdict": {"status": "accepted"}}


def test_a_lost_host_gives_its_running_cell_back_without_spending_an_attempt(store: Store) -> None:
    store.start_cell("sc-a-c1", host="spark-2")
    store.finish_cell("sc-a-c1", {"aggregate_tps": 1.0}, RESULT)
    store.start_cell("sc-a-c8", host="spark-2")
    assert store.host_lost("sc-a", "spark-2", "the Docker daemon stopped answering") == ["sc-a-c8"]
    cell = store.cell("sc-a-c8")
    assert (cell.status, cell.attempts, cell.host) == ("pending", 0, "spark-2")
    assert store.cell("sc-a-c1").status == "done"  # nothing finished is lost
    (failure,) = store.failures()
    assert (failure.kind, failure.host, failure.server_config_id) == ("host_lost", "spark-2", "sc-a")


def test_a_version_1_file_is_read_as_it_is_and_migrated_when_opened_for_writing(path: Path) -> None:
    with Store.create(path, SWEEP, "0.1.0") as s:
        add_plan(s)
        s.start_cell("sc-a-c1")
        s.finish_cell("sc-a-c1", {"aggregate_tps": 1.0}, RESULT)
        s.fail_cell("sc-b-c1", "bench_error", "boom")
    _as_version_1(path)
    with Store.open(path, readonly=True) as s:  # a report never writes
        assert s.cell("sc-a-c1").status == "done"
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == 1
    with Store.open(path) as s:
        assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert s.cell("sc-a-c1").result == RESULT and len(s.failures()) == 1
        s.start_cell("sc-b-c8")
        assert s.partial_cell("sc-b-c8", {"aggregate_tps": 2.0}, RESULT, "2 of 6 requests failed", 1) == "partial"
        assert s.failures()[-1].cell_id == "sc-b-c8"  # the failures' foreign key still points at cells


def test_partial_cells_run_again_then_stay_partial_with_their_numbers(store: Store) -> None:
    store.start_cell("sc-a-c1")
    assert store.partial_cell("sc-a-c1", {"aggregate_tps": 1.0}, RESULT, "4 of 6 requests failed", 2) == "pending"
    store.start_cell("sc-a-c1")
    assert store.partial_cell("sc-a-c1", {"aggregate_tps": 1.5}, RESULT, "1 of 6 requests failed", 2) == "partial"
    cell = store.cell("sc-a-c1")
    assert cell.status == "partial" and cell.summary == {"aggregate_tps": 1.5} and cell.attempts == 2
    assert [f.kind for f in store.failures()] == ["partial", "partial"]
    assert store.counts()["partial"] == 1
    assert store.retry_failed() == 1 and store.cell("sc-a-c1").status == "pending"


@pytest.fixture
def tiny_disk(tmp_path: Path):
    """A 1 MiB tmpfs (root only): the disk under a run directory filling up."""
    with tmpfs(tmp_path / "tiny", "1m") as mount:
        yield mount


def test_a_full_disk_is_a_disk_full_error_and_never_leaves_a_half_made_file(tiny_disk: Path) -> None:
    from sparklab.errors import DiskFullError

    (tiny_disk / "filler").write_bytes(b"\0" * (1024 * 1024 - 8192))  # all but 8 KiB
    path = tiny_disk / "run" / "results.sqlite"
    with pytest.raises(DiskFullError, match="is full"):
        Store.create(path, {"name": "big", "blob": "x" * 200_000}, "0.1.0")
    assert sorted(p.name for p in path.parent.iterdir()) == []


def test_a_disk_that_fills_during_a_run_is_a_disk_full_error_and_keeps_what_was_stored(tiny_disk: Path) -> None:
    from sparklab.errors import DiskFullError

    path = tiny_disk / "run" / "results.sqlite"
    with Store.create(path, SWEEP, "0.1.0") as s:
        add_plan(s)
        s.start_cell("sc-a-c1")
        s.finish_cell("sc-a-c1", {"aggregate_tps": 1.0}, RESULT)
        free = 1024 * 1024 - sum(p.stat().st_size for p in tiny_disk.rglob("*") if p.is_file())
        (tiny_disk / "filler").write_bytes(b"\0" * max(0, free - 96 * 1024))
        s.start_cell("sc-a-c8")
        with pytest.raises(DiskFullError, match="is full"):
            s.finish_cell("sc-a-c8", {"aggregate_tps": 2.0}, {**RESULT, "blob": "y" * 400_000})
    (tiny_disk / "filler").unlink()
    with Store.open(path) as s:
        assert s.cell("sc-a-c1").status == "done" and s.cell("sc-a-c1").result == RESULT
        assert s.cell("sc-a-c8").status == "running"  # resumable: the next run resets it


def test_a_version_2_file_gains_per_cell_digests_and_outputs_when_opened_for_writing(path: Path) -> None:
    with Store.create(path, SWEEP, "0.1.0") as s:
        add_plan(s)
        s.start_cell("sc-a-c1")
        s.finish_cell("sc-a-c1", {"aggregate_tps": 1.0}, RESULT)
    conn = sqlite3.connect(path)  # as sparklab made it before schema 3: no outputs table, no cell digest
    conn.execute("DROP TABLE outputs")
    conn.execute("ALTER TABLE cells DROP COLUMN image_digest")
    conn.execute("PRAGMA user_version = 2")
    conn.commit()
    conn.close()
    with Store.open(path, readonly=True) as s:
        assert s.cell("sc-a-c1").image_digest is None and s.outputs() == {}
    with Store.open(path) as s:
        assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 6
        s.start_cell("sc-b-c1")
        answers = [{"index": 0, "prompt_id": "seed-0", "token_ids": [1, 2]}]
        s.finish_cell("sc-b-c1", {"aggregate_tps": 2.0}, {**RESULT, "outputs": answers}, image_digest="sha256:abc")
        cell = s.cell("sc-b-c1")
        assert cell.image_digest == "sha256:abc" and "outputs" not in (cell.result or {})
        assert s.outputs() == {"sc-b-c1": answers}
        s.start_cell("sc-b-c1")  # a second attempt replaces the first one's answers
        s.finish_cell("sc-b-c1", {"aggregate_tps": 2.0}, {**RESULT, "outputs": answers[:0]})
        assert s.outputs() == {}


def test_a_version_4_run_reads_as_before_and_gains_grades_scores_and_downloads(tmp_path: Path) -> None:
    """A real run stored at schema 4 (the llama.cpp report fixture): read-only it has no grades, scores or
    downloads and reports as before; opened for writing it is migrated (4 -> 5 -> 6) and keeps every cell."""
    from sparklab.sweep.store_rows import Score
    from tests.reportkit import FIXTURES, load_dump

    path = load_dump(FIXTURES / "llamacpp-cpu-sweep.sql", tmp_path / "llamacpp-run")
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == 4
    with Store.open(path, readonly=True) as s:
        assert s.grades() == {} and s.scores() == {}
        assert all(row.downloads is None for row in s.server_configs())
        done = len(s.cells("done"))
    with Store.open(path) as s:
        assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 6
        assert len(s.cells("done")) == done
        assert all(c.engine_version is None for c in s.cells("done"))  # 4 -> 5 added the column, no value
        cell = s.cells("done")[0]
        grade = {"index": 1, "prompt_id": "p", "kind": "instruction", "status": "graded", "passed": True}
        s.finish_cell(cell.id, cell.summary, cell.result, grades=[grade])
        assert s.grades() == {cell.id: [grade]}
        assert s.add_scores([Score(cell.id, 1, "x", "scored", 4, -2.0)]) == 1
        assert s.add_scores([Score(cell.id, 1, "x", "scored", 9, -9.0)]) == 0  # a score is kept, never replaced
        assert s.scores()[(cell.id, 1)].tokens == 4
        server = s.server_configs()[0]
        s.record_server_start(server.id, image_digest=None, startup_facts={}, ready_s=1.0, log_path=None,
                              downloads={"seconds": 3.5, "image_s": 0.2, "total_s": 3.7})
        assert s.server_configs()[0].downloads == {"seconds": 3.5, "image_s": 0.2, "total_s": 3.7}


def test_grades_of_a_retried_cell_replace_the_first_attempts(store: Store) -> None:
    store.start_cell("sc-a-c1")
    first = [{"index": 0, "prompt_id": "p", "kind": "code", "status": "graded", "passed": False}]
    assert store.partial_cell("sc-a-c1", {"aggregate_tps": 1.0}, RESULT, "1 of 2 failed", grades=first) == "pending"
    assert store.grades()["sc-a-c1"] == first
    store.start_cell("sc-a-c1")
    second = [{**first[0], "passed": True}, {**first[0], "index": 1}]
    store.finish_cell("sc-a-c1", {"aggregate_tps": 1.0}, RESULT, grades=second)
    assert store.grades()["sc-a-c1"] == second


class _InterruptedAfterBegin:
    """The store's connection, but a Ctrl-C lands the moment its first BEGIN returns: before the transaction's own
    rollback guard is entered (a signal is raised at the next bytecode, whichever line that is)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.fired = False

    def execute(self, sql: str, *args: object) -> sqlite3.Cursor:
        cursor = self.conn.execute(sql, *args)
        if sql.startswith("BEGIN") and not self.fired:
            self.fired = True
            raise KeyboardInterrupt
        return cursor

    def __getattr__(self, name: str) -> object:
        return getattr(self.conn, name)


def test_a_ctrl_c_right_after_begin_leaves_no_transaction_open(store: Store) -> None:
    """Seen once in CI (2026-12-05): `tune` interrupted at the start of a round exited 1, not 130. Its Ctrl-C handler
    writes to the store (the cells in flight go back to pending, the tune state is saved); a transaction the signal
    had left open made that write fail with `cannot start a transaction within a transaction`, uncaught."""
    add_plan(store)
    conn = store._conn
    store._conn = _InterruptedAfterBegin(conn)  # type: ignore[assignment]  # a proxy of the connection
    with pytest.raises(KeyboardInterrupt):
        store.set_meta("tune", {"rounds": 1})
    store._conn = conn
    assert not conn.in_transaction
    store.set_meta("tune", {"rounds": 2})  # what the Ctrl-C handler does next
    store.reset_interrupted(3)
    assert json.loads(store.meta()["tune"]) == {"rounds": 2}
