"""Issue 27 item 4: `sparklab report` never tracebacks. A crafted results file (a corpus of variants made here from
a real stored run) gives either a whole report or one paragraph naming the file, never a traceback; on an error
nothing is written, and the results file is never changed (its bytes and mtime). RUN is a run id, a sweep name
(matched exactly, never as a pattern), a run directory or a results file; `-o` must be a directory."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from sparklab.cli.main import main
from sparklab.sweep.store import Store
from tests.reportkit import CPU_RUN_ID, cpu_run

Mutation = Callable[[Path], None]


def _sql(*statements: str) -> Mutation:
    def mutate(path: Path) -> None:
        conn = sqlite3.connect(path)
        try:
            conn.execute("PRAGMA foreign_keys = OFF")
            for statement in statements:
                conn.execute(statement)
            conn.commit()
        finally:
            conn.close()
    return mutate


def _bytes(change: Callable[[bytes], bytes]) -> Mutation:
    def mutate(path: Path) -> None:
        path.write_bytes(change(path.read_bytes()))
    return mutate


def _first(table: str, column: str = "id") -> str:
    return f"(SELECT {column} FROM {table} ORDER BY seq LIMIT 1)"


DRAFTING = "(SELECT id FROM server_configs WHERE method != 'none' ORDER BY seq LIMIT 1)"
LONG = "m" * 5000

# Each variant: how the base run's file is changed. The base is a real CPU-engine run (tests/fixtures/report),
# migrated to the current schema, with one stored answer in `outputs`.
CORPUS: dict[str, Mutation] = {
    "meta sweep bad JSON": _sql("UPDATE meta SET value = '{not json' WHERE key = 'sweep'"),
    "meta sweep missing": _sql("DELETE FROM meta WHERE key = 'sweep'"),
    "meta sweep a list": _sql("UPDATE meta SET value = '[1, 2]' WHERE key = 'sweep'"),
    "meta sweep null": _sql("UPDATE meta SET value = 'null' WHERE key = 'sweep'"),
    "meta headline a number": _sql("UPDATE meta SET value = json_set(value, '$.headline', 7) WHERE key = 'sweep'"),
    "meta tune bad JSON": _sql("INSERT INTO meta (key, value) VALUES ('tune', '{oops')"),
    "meta tune wrong shape": _sql("INSERT INTO meta (key, value) VALUES ('tune', '[\"rounds\"]')"),
    "host fact bad JSON": _sql("UPDATE host SET value = '{' WHERE key = 'hostname'"),
    "settings bad JSON": _sql(f"UPDATE cells SET settings_json = 'x' WHERE id = {_first('cells')}"),
    "summary bad JSON": _sql(f"UPDATE cells SET summary_json = '{{' WHERE id = {_first('cells')}"),
    "summary a list": _sql(f"UPDATE cells SET summary_json = '[]' WHERE id = {_first('cells')}"),
    "summary numbers as text": _sql("UPDATE cells SET summary_json = json_set(summary_json, '$.aggregate_tps', "
                                    "'fast')"),
    "summary NaN and Infinity": _sql("UPDATE cells SET summary_json = replace(summary_json, "
                                     "'\"aggregate_tps\":', '\"aggregate_tps\":NaN, \"x\":')"),
    "result bad JSON": _sql(f"UPDATE cells SET result_json = '[[' WHERE id = {_first('cells')}"),
    "result requests not a list": _sql("UPDATE cells SET result_json = json_set(result_json, '$.requests', 5)"),
    "config bad JSON": _sql(f"UPDATE server_configs SET config_json = '{{{{' WHERE id = {_first('server_configs')}"),
    "config a string": _sql(f"UPDATE server_configs SET config_json = '\"x\"' WHERE id = {_first('server_configs')}"),
    "argv bad JSON": _sql(f"UPDATE server_configs SET argv_json = '' WHERE id = {_first('server_configs')}"),
    "startup facts bad JSON": _sql(f"UPDATE server_configs SET startup_facts_json = 'nope' "
                                   f"WHERE id = {_first('server_configs')}"),
    "startup facts a list": _sql("UPDATE server_configs SET startup_facts_json = '[1]'"),
    "outputs bad JSON": _sql("UPDATE outputs SET answer_json = '{'"),
    "k as text": _sql(f"UPDATE server_configs SET k = 'three' WHERE id = {DRAFTING}"),
    "concurrency as text": _sql(f"UPDATE cells SET concurrency = 'many' WHERE id = {_first('cells')}"),
    "orphan cell": _sql(f"UPDATE cells SET server_config_id = 'gone' WHERE id = {_first('cells')}"),
    "cells table missing": _sql("DROP TABLE cells"),
    "server_configs table missing": _sql("DROP TABLE server_configs"),
    "meta table missing": _sql("DROP TABLE meta"),
    "failures table missing": _sql("DROP TABLE failures"),
    "host table missing": _sql("DROP TABLE host"),
    "v4 without outputs": _sql("DROP TABLE outputs"),
    "cells without summary column": _sql("ALTER TABLE cells DROP COLUMN summary_json"),
    # schema 5 (issue 24): the image's own parser verdict per server
    "image check bad JSON": _sql(f"UPDATE server_configs SET image_check_json = '{{bad' "
                                 f"WHERE id = {_first('server_configs')}"),
    "image check a number": _sql("UPDATE server_configs SET image_check_json = '5'"),
    "image check wrong shape": _sql("UPDATE server_configs SET image_check_json = "
                                    "'{\"verdict\": 5, \"engine_version\": {\"x\": 1}, \"messages\": 7}'"),
    "5000-character method": _sql(f"UPDATE server_configs SET method = '{LONG}' WHERE id = {DRAFTING}"),
    "5000-character engine": _sql(f"UPDATE server_configs SET engine = '{'e' * 5000}'"),
    "5000-character workload": _sql(f"UPDATE cells SET workload = '{'w' * 5000}'"),
    "path-like workload": _sql("UPDATE cells SET workload = '../../../../../tmp/x'"),
    "schema version 99": _sql("PRAGMA user_version = 99"),
    "schema version 0": _sql("PRAGMA user_version = 0"),
    "not SQLite": _bytes(lambda data: b"this is not a database\n" * 100),
    "empty file": _bytes(lambda data: b""),
    "truncated file": _bytes(lambda data: data[: len(data) // 2]),
    "corrupt page": _bytes(lambda data: data[:4096] + b"\xff" * 4096 + data[8192:]),
}


def _base(tmp_path: Path) -> Path:
    path = cpu_run(tmp_path / "runs")
    Store.open(path).close()  # migrated to the current schema (outputs, digests, hosts, image checks), as on resume
    conn = sqlite3.connect(path)
    try:
        cell = conn.execute("SELECT id FROM cells ORDER BY seq LIMIT 1").fetchone()[0]
        answer = {"index": 0, "prompt_id": "p0", "warmup": False, "ok": True, "finish_reason": "length",
                  "text": "def f():", "text_len": 8}
        conn.execute("INSERT INTO outputs (cell_id, idx, prompt_id, answer_json) VALUES (?, 0, 'p0', ?)",
                     (cell, json.dumps(answer)))
        conn.commit()
    finally:
        conn.close()
    return path


def _state(path: Path) -> tuple[str, int]:
    return hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns


def _report(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["report", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _refused_or_whole(code: int, out: str, err: str, path: Path) -> None:
    assert "Traceback" not in err
    if code != 0:
        assert str(path) in err, err
        message = err.split("error: ", 1)[1]
        assert message.count("\n") <= 2, err  # the message and its hint


@pytest.mark.parametrize("variant", list(CORPUS), ids=list(CORPUS))
def test_a_crafted_results_file_reports_or_is_refused_in_one_paragraph(tmp_path: Path, capsys, variant: str) -> None:
    path = _base(tmp_path)
    CORPUS[variant](path)
    before = _state(path)
    out_dir = tmp_path / "out"
    code, out, err = _report(capsys, str(path), "-o", str(out_dir))
    _refused_or_whole(code, out, err, path)
    if code != 0:
        assert not out_dir.exists(), f"written despite the error: {sorted(out_dir.rglob('*'))}"
        assert not list(tmp_path.glob(".out*")), "a partial directory left behind"
    else:
        assert {p.name for p in out_dir.iterdir()} >= {"report.md", "report.csv", "report.json", "report.html"}
        assert all(out_dir.resolve() in p.resolve().parents for p in out_dir.rglob("*"))
    for fmt in ("md", "csv", "json"):
        _refused_or_whole(*_report(capsys, str(path), "-f", fmt), path)
    assert _state(path) == before, "the results file changed"


def test_the_corpus_is_large_enough_and_each_variant_changes_the_file(tmp_path: Path) -> None:
    assert len(CORPUS) >= 27
    base = _state(_base(tmp_path / "base"))[0]
    for i, mutate in enumerate(CORPUS.values()):
        path = _base(tmp_path / str(i))
        mutate(path)
        assert _state(path)[0] != base


# -- where the report goes ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("target", ["existing file", "/dev/null"])
def test_report_refuses_an_out_that_is_not_a_directory(tmp_path: Path, capsys, target: str) -> None:
    path = _base(tmp_path)
    out = Path("/dev/null") if target == "/dev/null" else tmp_path / "notes.txt"
    if target != "/dev/null":
        out.write_text("my notes\n")
    before = out.stat()
    code, _, err = _report(capsys, str(path), "-o", str(out))
    assert code != 0 and str(out) in err and "not a directory" in err and "Traceback" not in err, err
    after = out.stat()
    assert (after.st_mode, after.st_size, after.st_mtime_ns) == (before.st_mode, before.st_size, before.st_mtime_ns)
    if target != "/dev/null":
        assert out.read_text() == "my notes\n"


def test_report_into_an_existing_directory_replaces_its_report(tmp_path: Path, capsys) -> None:
    path = _base(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.md").write_text("old")
    (out / "mine.txt").write_text("kept")
    code, _, err = _report(capsys, str(path), "-o", str(out))
    assert code == 0, err
    assert (out / "report.md").read_text() != "old" and (out / "mine.txt").read_text() == "kept"
    assert "](plots/" in (out / "report.md").read_text()  # plots linked where they now are


# -- which run RUN names ----------------------------------------------------------------------------------------------

def _runs(tmp_path: Path, *names: str) -> Path:
    runs = tmp_path / "runs"
    for name in names:
        cpu_run(tmp_path / "made")
        (runs / name).mkdir(parents=True)
        os.replace(tmp_path / "made" / CPU_RUN_ID / "results.sqlite", runs / name / "results.sqlite")
    return runs


@pytest.mark.parametrize("pattern", ["*", "**", "pq*", "p?", "[p]q", "*/results.sqlite"])
def test_a_pattern_is_never_expanded(tmp_path: Path, capsys, pattern: str) -> None:
    """`report '*'` picked the newest run of whichever sweep sorted last; `report '**'` was a NotImplementedError."""
    runs = _runs(tmp_path, "other-20261130-100000-aaaaaa", "pq-20261129-100000-bbbbbb")
    code, out, err = _report(capsys, pattern, "--runs-dir", str(runs))
    assert code != 0 and "no results for run" in err and "Traceback" not in err, err
    assert out == ""


def test_an_absolute_directory_without_results_is_an_error(tmp_path: Path, capsys) -> None:
    empty = tmp_path / "empty-run"
    empty.mkdir()
    code, _, err = _report(capsys, str(empty), "--runs-dir", str(tmp_path))
    assert code != 0 and str(empty) in err and "results.sqlite" in err and "Traceback" not in err, err


def test_a_sweep_name_matches_its_own_runs_only(tmp_path: Path, capsys) -> None:
    runs = _runs(tmp_path, "pq-long-20261130-100000-aaaaaa")
    code, _, err = _report(capsys, "pq", "--runs-dir", str(runs))
    assert code != 0 and "no results for run 'pq'" in err, err  # pq-long's run is not pq's
    runs = _runs(tmp_path / "two", "pq-20261129-100000-bbbbbb", "pq-long-20261130-100000-aaaaaa")
    code, _, err = _report(capsys, "pq", "--runs-dir", str(runs), "-f", "csv")
    assert code == 0 and "newest run of sweep pq: pq-20261129-100000-bbbbbb" in err, err
