"""`sparklab sweep` against the stand-in: resume after interruption at each stage, failing servers fail only
their cells, SIGKILL leaves nothing behind after the next start, bad results files are clear errors."""

from __future__ import annotations

import contextlib
import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparklab.recipes.plan import build_plan
from sparklab.sweep.store import Store
from tests.dockerkit import Cli, Lines, free_port, pulled_copy, run_containers, sparklab_containers, ulimit_args

pytestmark = pytest.mark.docker


def _sweep(tmp_path: Path, image: str, **changes: Any) -> Path:
    doc: dict[str, Any] = {
        "name": "standin", "recipe": "gb10", "methods": ["none", "dspark"], "num_speculative_tokens": [2, 3],
        "concurrency": [1, 2], "requests": {1: 3, 2: 4}, "warmup": 1,
        "sampling": {"max_tokens": 12, "temperature": 0, "top_p": None, "ignore_eos": True},
        "set": [f"engines.vllm.image={image}", "engines.vllm.gpus=none", "engines.vllm.mount_hf_cache=false",
                "engines.vllm.ulimits={stack: 67108864}", f"engines.vllm.port={free_port()}",
                "gpu_memory_utilization=0.01"],
    }
    doc.update(changes)
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _run(cli: Cli, path: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sparklab", "sweep", str(path), "--runs-dir",
                           str(path.parent / "runs"), *ulimit_flags(), *args], capture_output=True, text=True,
                          timeout=timeout, env=cli.env(), cwd=path.parent)


def ulimit_flags() -> list[str]:
    return ulimit_args()


def _store(path: Path) -> Store:
    (db,) = sorted((path.parent / "runs").glob("*/results.sqlite"))
    return Store.open(db)


def test_sweep_runs_every_cell_once_and_a_rerun_does_nothing(cli: Cli, tmp_path: Path, docker_client) -> None:
    path = _sweep(tmp_path, cli.image)
    done = _run(cli, path)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("server vllm/") == 2 * 3  # starting + ready, for none, dspark K=2, dspark K=3
    assert "vllm DSpark K=3" in done.stdout and "accept len" in done.stdout  # the report's labels
    with _store(path) as store:
        assert store.counts()["done"] == 6 and len(store.cells()) == 6
        assert {c.id for c in store.cells("done")} == {c.id for c in build_plan(path).cells}
        server = store.server_configs()[0]
        assert server.image_digest and server.startup_facts["kv_cache_tokens"] == 93184
        assert all(c.result["schema"] == "sparklab.bench/1" for c in store.cells("done"))
    again = _run(cli, path)
    assert again.returncode == 0 and "0 new cell(s)" in again.stderr and "starting" not in again.stderr


def test_sglang_sweep_keeps_the_accept_len_lines_and_reports_them(cli: Cli, tmp_path: Path) -> None:
    """SGLang has no acceptance counters: the sweep keeps its `accept len` log lines of each window, and the
    report (offline, from the results file alone) shows them, their source, and a speedup per repeat set."""
    sglang = [f"engines.sglang.image={cli.image}", "engines.sglang.gpus=none", "engines.sglang.mount_hf_cache=false",
              "engines.sglang.ulimits={stack: 67108864}", f"engines.sglang.port={free_port()}",
              "engines.sglang.env={STANDIN_TOKENS_PER_CHUNK: '1,3,2', STANDIN_TOKEN_DELAY: '0.002', "
              "STANDIN_LOG_LAG: '0.1'}", "unified_memory=false"]
    path = _sweep(tmp_path, cli.image, engines=["sglang"], num_speculative_tokens=[3], concurrency=[1],
                  requests={1: 4}, repeats=2, set=sglang)
    done = _run(cli, path)
    assert done.returncode == 0, done.stderr
    with _store(path) as store:
        assert store.counts()["done"] == 4
        logs = [c.result.get("speculative_log") for c in store.cells("done")]
        run_dir = store.path.parent
    assert sum(1 for log in logs if log) == 2  # the dspark cells; none prints no accept len lines
    assert all(log["samples"] == 4 and log["mean"] == pytest.approx(2.0) for log in logs if log)
    shown = subprocess.run([sys.executable, "-m", "sparklab", "report", str(run_dir), "-f", "json"],
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    dspark = next(g for g in doc["groups"] if g["method"] == "dspark")
    assert dspark["n"] == 2 and dspark["metrics"]["acceptance_length"]["mean"] == pytest.approx(2.0)
    assert dspark["acceptance_sources"] == [
        "SGLang decode log lines in the window (accept len, weighted by #running-req)"]
    assert dspark["metrics"]["acceptance_rate"]["mean"] == pytest.approx(1 / 3, abs=0.005)  # (2.0 - 1) / K, printed .2f
    assert dspark["speedup"] and dspark["speedup_ci95_low"] is not None
    assert doc["best"][0]["up_command"].startswith("sparklab up gb10:")
    # The sweep's closing table is drawn from the same model: it shows the acceptance the report found (it
    # used to show "-" for SGLang) and the report's speed-up.
    row = next(line for line in done.stdout.splitlines() if line.startswith("sglang DSpark K=3"))
    assert " 2.00 " in row and f"{100 * dspark['speedup']:.1f}%" in row


def test_a_failing_server_fails_only_its_cells(cli: Cli, tmp_path: Path) -> None:
    faults = [
        {"match": {"method": "dspark", "num_speculative_tokens": 2}, "set": ["engines.vllm.env={STANDIN_OOM: '1'}"]},
        {"match": {"method": "dspark", "num_speculative_tokens": 3},
         "set": ["engines.vllm.env={STANDIN_NEVER_READY: '1'}", "engines.vllm.ready_timeout_s=3"]},
        {"match": {"method": "mtp"}, "set": ["engines.vllm.env={STANDIN_EXIT_AT_START: '3'}"]},
    ]
    path = _sweep(tmp_path, cli.image, methods=["none", "mtp", "dspark"], max_attempts=1, overrides=faults,
                  num_speculative_tokens=[2, 3])
    done = _run(cli, path)
    assert done.returncode == 6, done.stderr
    with _store(path) as store:
        counts = store.counts()
        assert counts["done"] == 2 and counts["failed"] == 8  # none ok; mtp K=2/3, dspark K=2/3 failed
        kinds = sorted(f.kind for f in store.failures())
        # STANDIN_OOM SIGKILLs the engine from inside: exit 137, but Docker's OOMKilled is false, so it is
        # 'killed' (docker kill, earlyoom), not 'oom' (the kernel's OOM killer)
        assert kinds == ["exited", "exited", "killed", "not_ready"]
        killed = next(f for f in store.failures() if f.kind == "killed")
        assert killed.exit_code == 137 and killed.log_tail and "not the kernel's OOM killer" in killed.message


@pytest.mark.parametrize(("stage", "wait_for", "env"), [
    ("pull", "starting (", "STANDIN_START_DELAY: '1'"),  # the image was removed: the pull begins right then
    ("startup", "starting (", "STANDIN_START_DELAY: '4'"),
    ("load", "ready in", "STANDIN_TOKEN_DELAY: '0.08'"),  # the first cell takes ~4 s: SIGINT lands in it
    ("between cells", "seed #0:", "STANDIN_TOKEN_DELAY: '0.05'"),
])
def test_interrupt_at_each_stage_then_resume(cli: Cli, tmp_path: Path, docker_client, stage: str, wait_for: str,
                                             env: str) -> None:
    # the pull stage's image is absent here: a copy of its own to pull
    with pulled_copy(cli.image, "sweep") if stage == "pull" else contextlib.nullcontext(cli.image) as image:
        _interrupt_then_resume(cli, tmp_path, docker_client, image, stage, wait_for, env)


def _interrupt_then_resume(cli: Cli, tmp_path: Path, docker_client, image: str, stage: str, wait_for: str,
                           env: str) -> None:
    path = _sweep(tmp_path, image)
    doc = yaml.safe_load(path.read_text())
    # Only the first server (none) is slowed: the interrupt lands in it, and the resumed run's other servers run
    # at full speed.
    doc["overrides"] = [{"match": {"method": "none"}, "set": [f"engines.vllm.env={{{env}}}"]}]
    path.write_text(yaml.safe_dump(doc))
    before = sparklab_containers(docker_client)
    pull = ["--pull", "always"] if stage == "pull" else []
    proc = subprocess.Popen([sys.executable, "-m", "sparklab", "sweep", str(path), "--runs-dir",
                             str(tmp_path / "runs"), *ulimit_flags(), *pull], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=cli.env(), cwd=tmp_path)
    lines = Lines(proc)
    try:
        lines.wait_for(wait_for, timeout=120)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 130, "".join(lines.lines)
    assert sparklab_containers(docker_client) == before  # the server was torn down
    with _store(path) as store:
        assert store.counts()["running"] == 0 and store.counts()["done"] < 6
    resumed = _run(cli, path)
    assert resumed.returncode == 0, resumed.stderr
    with _store(path) as store:
        assert store.counts()["done"] == 6 and len(store.cells()) == 6  # nothing lost, nothing twice
        assert {c.id for c in store.cells("done")} == {c.id for c in build_plan(path).cells}


def test_sigkill_then_restart_removes_the_orphan_and_finishes(cli: Cli, tmp_path: Path, docker_client) -> None:
    path = _sweep(tmp_path, cli.image)
    doc = yaml.safe_load(path.read_text())
    # 12 tokens 0.08 s apart on the first server (none): its first cell (a warmup and 3 requests) takes ~4 s, so
    # it is in flight 1 s after ready; the resumed run's other servers run at full speed
    doc["overrides"] = [{"match": {"method": "none"}, "set": ["engines.vllm.env={STANDIN_TOKEN_DELAY: '0.08'}"]}]
    path.write_text(yaml.safe_dump(doc))
    proc = subprocess.Popen([sys.executable, "-m", "sparklab", "sweep", str(path), "--runs-dir",
                             str(tmp_path / "runs"), *ulimit_flags()], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=cli.env(), cwd=tmp_path)
    try:
        Lines(proc).wait_for("ready in", timeout=120)
        time.sleep(1)
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert [c.status for c in run_containers(docker_client, tmp_path / "runs")] == ["running"]  # the orphan
    resumed = _run(cli, path)
    assert resumed.returncode == 0, resumed.stderr
    assert "removed leftover container" in resumed.stderr and "was in flight" in resumed.stderr
    with _store(path) as store:
        assert store.counts()["done"] == 6 and len(store.cells()) == 6
        assert [f.kind for f in store.failures()] == ["interrupted"]


def test_missing_or_corrupt_results_are_clear_errors(cli: Cli, tmp_path: Path) -> None:
    path = _sweep(tmp_path, cli.image)
    missing = _run(cli, path, "--resume", "nope")
    assert missing.returncode == 1 and "no run 'nope'" in missing.stderr and "Traceback" not in missing.stderr
    bad = tmp_path / "runs" / "standin-broken"
    bad.mkdir(parents=True)
    (bad / "results.sqlite").write_bytes(b"SQLite format 3\x00" + b"\xff" * 5000)
    corrupt = _run(cli, path, "--resume", "standin-broken")
    assert corrupt.returncode == 1 and "Traceback" not in corrupt.stderr
    assert str(bad / "results.sqlite") in corrupt.stderr.replace("\n", "")
    with pytest.raises(sqlite3.DatabaseError):
        sqlite3.connect(bad / "results.sqlite").execute("select * from cells").fetchall()


def test_a_drafting_server_that_changes_the_output_is_caught(cli: Cli, tmp_path: Path) -> None:
    """STANDIN_ALTER_OUTPUT=4: the drafting server's answers differ from token 4 on; the report's equality
    column and its warning name that config, and the baseline is the reference."""
    path = _sweep(tmp_path, cli.image, num_speculative_tokens=[3], concurrency=[1], requests={1: 3})
    doc = yaml.safe_load(path.read_text())
    doc["set"].append("engines.vllm.env={STANDIN_ALTER_OUTPUT: '4', STANDIN_TOKENS_PER_CHUNK: '2'}")
    path.write_text(yaml.safe_dump(doc))
    done = _run(cli, path)
    assert done.returncode == 0, done.stderr
    with _store(path) as store:
        run_dir = store.path.parent
        answers = store.outputs()
    assert sum(len(a) for a in answers.values()) == 2 * (3 + 1)  # measured and warmup, both servers
    shown = subprocess.run([sys.executable, "-m", "sparklab", "report", str(run_dir), "-f", "md"],
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "0% (0/3), first diff at token 4" in shown.stdout
    assert "identical to none: 1 warning(s)" in shown.stdout
    assert "- vllm DSpark K=3 C=1 seed: 0% (0/3), first diff at token 4 identical to `none`" in shown.stdout


def test_the_tool_call_probe_flags_a_runaway(cli: Cli, tmp_path: Path) -> None:
    """STANDIN_TOOL_RUNAWAY=40: with tool_choice "required" the stand-in repeats one call 40 times until the
    length limit (seed 002's loop), with "auto" it calls once; the report flags the first only."""
    path = _sweep(tmp_path, cli.image, methods=["none"], concurrency=[1], requests={1: 4},
                  workloads=["toolcall-probe"])
    doc = yaml.safe_load(path.read_text())
    doc["set"].append("engines.vllm.env={STANDIN_TOOL_RUNAWAY: '40'}")
    path.write_text(yaml.safe_dump(doc))
    done = _run(cli, path)
    assert done.returncode == 0, done.stderr
    with _store(path) as store:
        run_dir = store.path.parent
    shown = subprocess.run([sys.executable, "-m", "sparklab", "report", str(run_dir), "-f", "md"],
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "tool-call runaways: 1 warning(s)" in shown.stdout
    assert ("- vllm none C=1 toolcall-probe tools-required: 2 of 2 answers ran away (up to 40 tool calls, the same "
            "call up to 40 times; finish: length 2)") in shown.stdout
    assert "| toolcall-probe | 1 | vllm none | tools-auto | 2 | 1.0 | 1 | 1 | tool_calls 2 | 0 |" in shown.stdout
