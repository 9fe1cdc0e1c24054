"""Report fixtures: a stored real CPU-engine run (an SQL dump), and a run built from seed 000's published table."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import yaml

from sparklab.recipes.plan import build_plan
from sparklab.recipes.schema import recipes_dir
from sparklab.sweep import runner
from sparklab.sweep.store import Store
from sparklab.sweep.store_schema import SCHEMA_VERSION

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "report"
GOLDEN = Path(__file__).resolve().parent / "golden" / "report"
CPU_RUN_ID = "cpu-report-fixture-20261129-161930-13a461"


def dump(results: Path, out: Path) -> None:
    """Write a results file as SQL text (how the CPU fixture was made from its run)."""
    conn = sqlite3.connect(results)
    try:
        text = "\n".join(conn.iterdump())
    finally:
        conn.close()
    out.write_text(f"PRAGMA user_version = {SCHEMA_VERSION};\n{text}\n", encoding="utf-8")


def load_dump(sql: Path, run_dir: Path) -> Path:
    """The results file of a dumped run, recreated under run_dir (its name is the run id)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "results.sqlite"
    conn = sqlite3.connect(path)
    try:
        conn.executescript(sql.read_text(encoding="utf-8"))
    finally:
        conn.close()
    return path


def cpu_run(tmp_path: Path) -> Path:
    return load_dump(FIXTURES / "cpu-sweep.sql", tmp_path / CPU_RUN_ID)


def single_run_sweep(name: str, tmp_path: Path) -> Path:
    """A bundled seed sweep file with one run per load instead of its `repeats: auto` (report fixtures that
    stand for one published number per cell)."""
    doc = yaml.safe_load((recipes_dir() / "sweeps" / f"{name}.yaml").read_text())
    doc["repeats"] = 1
    doc.pop("auto_repeats", None)
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def seed000_run(tmp_path: Path) -> Path:
    """recipes/sweeps/seed000.yaml planned and registered as a real sweep would, each cell finished with the
    number seed 000 published for it (one run each; C=1 per-request tok/s, C=8 aggregate tok/s)."""
    published: dict[str, Any] = yaml.safe_load((FIXTURES / "seed000.yaml").read_text())
    plan = build_plan(single_run_sweep("seed000", tmp_path), run_id="seed000-published")
    path = tmp_path / "seed000-published" / "results.sqlite"
    with Store.create(path, plan.sweep.model_dump(), "test") as store:
        runner.register(plan, store)
        methods = {s.id: s.method for s in store.server_configs()}
        for cell in store.cells():
            row = published["results"][methods[cell.server_config_id]]
            summary: dict[str, Any] = {"requests": {"measured": cell.settings["requests"],
                                                    "ok": cell.settings["requests"], "failed": 0}}
            if cell.concurrency == 1:
                summary["per_request_tps"] = {"n": cell.settings["requests"], "mean": row[1]}
            else:
                summary["aggregate_tps"] = row[cell.concurrency]
            store.finish_cell(cell.id, summary, {"summary": summary})
    return path


def seed004_run(tmp_path: Path) -> Path:
    """recipes/sweeps/seed004.yaml planned and registered as a real sweep would, each cell finished with the
    numbers seed 004 published for it: generation speed excluding TTFT (decode tok/s) and TTFT median."""
    published: dict[str, Any] = yaml.safe_load((FIXTURES / "seed004.yaml").read_text())
    plan = build_plan(recipes_dir() / "sweeps" / "seed004.yaml", run_id="seed004-published")
    path = tmp_path / "seed004-published" / "results.sqlite"
    with Store.create(path, plan.sweep.model_dump(), "test") as store:
        runner.register(plan, store)
        methods = {s.id: s.method for s in store.server_configs()}
        for cell in store.cells():
            row = published["results"][cell.workload]
            method = methods[cell.server_config_id]
            n = cell.settings["requests"]
            summary: dict[str, Any] = {
                "requests": {"measured": n, "ok": n, "failed": 0},
                "decode_tps": {"n": n, "mean": row[method]},
                "ttft_ms": {"n": n, "p50": row[f"ttft_{method}"]},
                "prompt_tokens": {"n": n, "mean": row["prompt"]},
            }
            store.finish_cell(cell.id, summary, {"summary": summary})
    return path
