"""`sparklab up` / ps / logs / bench / down / gc with a host-process engine: the stand-in's Edge-LLM surface
(docker/standin/bin/trtedge) run straight from the source tree, through every path the Docker tier covers.

After each test no stand-in process and no run file may be left (the `host` fixture checks)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from sparklab.runtimes.runfiles import group_members
from tests.dockerkit import SESSION, Lines, field, free_port
from tests.process.conftest import RECIPE, STANDIN, HostCli, processes_of


def _ours(port: int) -> list[int]:
    """The stand-in engine serving on `port` (not the sparklab CLI, whose command line names the port too)."""
    return processes_of(str(STANDIN / "bin"), f"--port {port}")


def _run_files(host: HostCli) -> list[Path]:
    return sorted((host.state / "processes").glob("*.json"))


def test_up_detached_then_ps_logs_bench_down(host: HostCli) -> None:
    port = free_port()
    done = host.run("up", f"{RECIPE}:dspark", "--detach",
                    *host.launch_args(port, "-e", "MY_API_KEY=cli-secret-77", "-e", "STANDIN_REASONING_TOKENS=4"),
                    env=host.env(HF_TOKEN="hf_topsecret42"))
    assert done.returncode == 0, done.stderr
    name = field(done.stdout, "container")
    try:
        assert re.search(r"ready in \d+\.\d s \(from container start until /health/ready answered 200", done.stdout)
        assert "speculative decoding True" in done.stdout  # the startup fact from Edge-LLM's "Loaded model" line
        assert "reads its API key only from its command line" in done.stderr
        key = field(done.stdout, "api key")
        (run_file,) = _run_files(host)
        assert run_file.stat().st_mode & 0o077 == 0  # the key is kept for `bench`, private to its user
        record = json.loads(run_file.read_text())
        (engine,) = _ours(port)
        assert sorted(group_members(record["pid"])) == sorted([record["pid"], engine])  # keeper leads, engine in
        assert os.getsid(engine) == record["pid"]  # a session of its own: no terminal signal reaches it

        ps = host.run("ps")
        assert name in ps.stdout and "running" in ps.stdout and "detached" in ps.stdout

        bench = host.run("bench", "--container", name, "--requests", "3", "--max-tokens", "16", "--warmup", "0")
        assert bench.returncode == 0, bench.stderr
        assert "3 ok" in bench.stdout or "ok 3" in bench.stdout or re.search(r"\b3\b.*ok", bench.stdout)

        logs = host.run("logs", name)
        assert "Loaded model=standin/nemotron-lightning" in logs.stdout
        assert '"POST /v1/chat/completions HTTP/1.1" 200' in logs.stdout
        log_file = Path(field(done.stdout, "log file")).read_text()
        for secret in (key, "cli-secret-77", "hf_topsecret42"):
            assert secret not in log_file + logs.stdout + done.stdout.replace(key, "") + done.stderr
    finally:
        down = host.run("down", name)
    assert down.returncode == 0, down.stderr
    assert _ours(port) == [] and _run_files(host) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_foreground_up_stops_on_signal(host: HostCli, sig: signal.Signals) -> None:
    port = free_port()
    proc = host.popen("up", f"{RECIPE}:none", *host.launch_args(port))
    try:
        Lines(proc).wait_for("serving in the foreground", timeout=30)
        assert len(_ours(port)) == 1
        started = time.monotonic()
        proc.send_signal(sig)
        code = proc.wait(timeout=15)
        elapsed = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, proc.stderr.read() if proc.stderr else ""
    assert elapsed < 15
    assert _ours(port) == []


def test_an_up_started_ignoring_ctrl_c_keeps_serving_through_it_and_stops_on_sigterm(host: HostCli) -> None:
    """A script's background job (`nohup sparklab up … &`) starts with SIGINT ignored: the terminal's Ctrl-C is
    not for it, and SIGTERM is how it is stopped, tearing the engine down."""
    port = free_port()
    proc = host.popen("up", f"{RECIPE}:none", *host.launch_args(port), ignoring_ctrl_c=True)
    try:
        Lines(proc).wait_for("serving in the foreground", timeout=30)
        proc.send_signal(signal.SIGINT)
        time.sleep(1)
        assert proc.poll() is None and len(_ours(port)) == 1
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, proc.stderr.read() if proc.stderr else ""
    assert _ours(port) == []


def test_ctrl_c_during_startup_ends_the_group(host: HostCli) -> None:
    port = free_port()
    proc = host.popen("up", f"{RECIPE}:none", *host.launch_args(port, "-e", "STANDIN_START_DELAY=60"))
    try:
        deadline = time.monotonic() + 30
        while not _ours(port) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _ours(port), "the engine never started"
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 130
    assert "interrupted" in (proc.stderr.read() if proc.stderr else "")
    assert _ours(port) == []


def test_exit_at_start_fails_with_code_and_log_tail(host: HostCli) -> None:
    port = free_port()
    done = host.run("up", f"{RECIPE}:dspark", *host.launch_args(port, "-e", "STANDIN_EXIT_AT_START=3"))
    assert done.returncode == 4
    assert "the server process exited with code 3 before it was ready" in done.stderr
    assert "Last 50 log lines" in done.stderr and "TensorRT prerequisite error" in done.stderr
    assert "Likely cause: TensorRT or CUDA is missing" in done.stderr  # the adapter's known failure
    assert _ours(port) == []


def test_never_ready_fails_at_the_deadline(host: HostCli) -> None:
    port = free_port()
    started = time.monotonic()
    done = host.run("up", f"{RECIPE}:none",
                    *host.launch_args(port, "-e", "STANDIN_NEVER_READY=1", "--ready-timeout", "3"))
    assert done.returncode == 4
    assert "not ready after 3 s" in done.stderr and "Loading safetensors checkpoint shards" in done.stderr
    assert time.monotonic() - started < 30
    assert _ours(port) == []


def test_port_already_taken_starts_nothing(host: HostCli) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        done = host.run("up", f"{RECIPE}:none", *host.launch_args(port))
    assert done.returncode != 0
    assert f"port {port}" in done.stderr and "in use" in done.stderr
    assert _ours(port) == [] and _run_files(host) == []


def test_a_missing_program_is_a_clear_error(host: HostCli, tmp_path: Path) -> None:
    done = host.run("up", f"{RECIPE}:none", *host.launch_args(free_port()), "--set", f"standin_dir={tmp_path}")
    assert done.returncode == 4, done.stderr
    assert f"{tmp_path}/bin/trtedge is not an executable program on this host" in done.stderr
    assert "Traceback" not in done.stderr


def _sigkilled_foreground_up(host: HostCli, port: int) -> str:
    proc = host.popen("up", f"{RECIPE}:dspark", *host.launch_args(port))
    try:
        lines = Lines(proc)
        name = lines.wait_for("  container ", timeout=30).split()[-1]
        lines.wait_for("serving in the foreground", timeout=30)
    finally:
        proc.kill()  # SIGKILL: no chance to clean up
        proc.wait(timeout=10)
    assert len(_ours(port)) == 1  # the server runs on, unowned
    return name


def test_sigkill_of_the_cli_leaves_an_orphan_that_gc_removes_but_not_a_detached_up(host: HostCli) -> None:
    kept_port = free_port()
    kept = host.run("up", f"{RECIPE}:none", "--detach", *host.launch_args(kept_port))
    assert kept.returncode == 0, kept.stderr
    kept_name = field(kept.stdout, "container")
    try:
        port = free_port()
        orphan = _sigkilled_foreground_up(host, port)
        ps = host.run("ps").stdout
        assert orphan in ps and "gone (gc removes it)" in ps
        gc = host.run("gc")
        assert gc.returncode == 0, gc.stderr
        assert orphan in gc.stdout and kept_name not in gc.stdout
        assert _ours(port) == [] and len(_ours(kept_port)) == 1

        # The next start cleans up too, without an explicit gc.
        orphan = _sigkilled_foreground_up(host, port)
        again = host.run("up", f"{RECIPE}:none", "--detach", *host.launch_args(free_port()))
        assert again.returncode == 0, again.stderr
        assert f"removed leftover host process {orphan}" in again.stderr
        assert _ours(port) == []
        assert host.run("down", field(again.stdout, "container")).returncode == 0
        assert len(_ours(kept_port)) == 1
    finally:
        host.run("down", kept_name)


def test_a_recycled_pid_is_never_signalled(host: HostCli) -> None:
    """A run file whose pid now names another process (its start time differs) is forgotten, not killed."""
    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        runs = host.state / "processes"
        runs.mkdir(parents=True)
        record = {"name": "sparklab-stale", "pid": bystander.pid, "start_time": "1", "argv": ["x"],
                  "labels": {"sparklab": "1", "sparklab.owner": f"{socket.gethostname()}/oldboot/1/1", "sparklab.detached": "0",
                             "sparklab.mode": "up", "sparklab.uid": str(os.getuid()), "sparklab.session": SESSION},
                  "log_path": str(runs / "x.log"), "log_offset": 0, "created": "2026-01-01T00:00:00Z"}
        (runs / "sparklab-stale.json").write_text(json.dumps(record))
        ps = host.run("ps").stdout
        assert "sparklab-stale" in ps and "exited" in ps  # its pid is someone else's: not running
        gc = host.run("gc")
        assert gc.returncode == 0 and "sparklab-stale" in gc.stdout
        assert bystander.poll() is None  # alive: never signalled
        assert _run_files(host) == []
    finally:
        bystander.kill()
        bystander.wait()


def test_render_prints_the_command_line_paste_ready(host: HostCli) -> None:
    done = host.run("render", f"{RECIPE}:dspark", "--set", f"standin_dir={STANDIN}", "--port", "18999")
    assert done.returncode == 0, done.stderr
    assert f"{STANDIN}/bin/trtedge \\\n    serve standin/nemotron-lightning" in done.stdout
    assert "--speculative-config '{\"method\": \"dspark\", \"num_speculative_tokens\": 3" in done.stdout
    assert '--api-key "$SPARKLAB_API_KEY"' in done.stdout and "docker run" not in done.stdout
    # paste it: a shell runs exactly this argv
    command = done.stdout.split("\n", 1)[1].strip()
    env = host.env(SPARKLAB_API_KEY="k-123", STANDIN_EXIT_AT_START="0")
    pasted = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env, timeout=30)
    assert '"--api-key", "***"' in pasted.stdout and '"--port", "18999"' in pasted.stdout


def test_an_engine_dying_while_serving_is_reported(host: HostCli) -> None:
    port = free_port()
    done = host.run("up", f"{RECIPE}:none", *host.launch_args(port, "-e", "STANDIN_DIE_AFTER=1"))
    assert done.returncode == 4
    assert "the server exited with code 1 while serving" in done.stderr
    assert _ours(port) == []


def test_a_foreground_up_stops_its_engine_at_the_memory_floor(host: HostCli) -> None:
    """Issue 27, item 6: `up` in the foreground samples memory as a sweep does and stops the engine under the floor
    (here a floor above any machine's memory, so the first sample trips it). Before: `up` had no floor."""
    port = free_port()
    done = host.run("up", f"{RECIPE}:none", *host.launch_args(port, "--memory-floor-gib", "100000"), timeout=60)
    assert done.returncode == 4, done.stdout + done.stderr
    assert "under the floor of 100000.0 GiB: sparklab stopped the server" in done.stderr
    assert "memory samples" in done.stderr and "MemAvailable" in done.stderr
    assert "Traceback" not in done.stderr
    assert _ours(port) == []


def test_a_foreground_up_stops_an_engine_that_stops_answering_after_ready(host: HostCli) -> None:
    """Issue 27, item 6: the engine hangs while serving (its process group stopped: no log, no health answer). A
    sweep's stall check would fail its cells; before, `up` in the foreground served on for ever. Now it ends
    after the stall timeout with what it saw, and the engine is gone."""
    port = free_port()
    proc = host.popen("up", f"{RECIPE}:none", *host.launch_args(port, "--stall-timeout", "3"))
    lines = Lines(proc)
    try:
        lines.wait_for("serving in the foreground", timeout=30)
        (engine,) = _ours(port)
        began = time.monotonic()
        os.killpg(os.getpgid(engine), signal.SIGSTOP)
        code = proc.wait(timeout=60)
        seconds = time.monotonic() - began
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read() if proc.stderr else ""
    assert code == 4, err
    assert "stopped answering" in err and "3 s" in err
    assert seconds < 20
    assert _ours(port) == []
