"""A dead engine in a live container (issue 12, part 1), against the stand-in: it prints a real vLLM fatal line
and hangs, before ready or after (its API answering /v1/models, chat requests hanging). `up` fails within
seconds with the cause; a sweep fails that server as "fatal" and runs the next; nothing is left running.

The stand-in's traceback ends with the fatal line's epoch time, so each test measures the seconds from the
line to sparklab's error; they are kept in ~/.cache/sparklab/measurements/dead-engine.json."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from tests.docker.test_sweep_standin import _run, _store, _sweep
from tests.dockerkit import Cli, free_port

pytestmark = pytest.mark.docker

PROMISE_S = 5.0  # from the fatal line to sparklab's error


def _seconds_since_fatal_line(text: str, ended_at: float) -> float:
    match = re.search(r"fatal line at ([\d.]+) \(epoch s\)", text)
    assert match, f"no fatal line time in:\n{text[-3000:]}"
    return ended_at - float(match.group(1))


def _keep(name: str, seconds: float) -> None:
    out = Path(os.environ.get("SPARKLAB_CACHE", Path.home() / ".cache" / "sparklab")) / "measurements"
    out.mkdir(parents=True, exist_ok=True)
    path = out / "dead-engine.json"
    found = json.loads(path.read_text()) if path.exists() else {}
    found[name] = round(seconds, 2)
    path.write_text(json.dumps(found, indent=2))


def test_up_fails_within_seconds_when_the_engine_dies_before_ready(cli: Cli) -> None:
    """Before: `up` waited the whole --ready-timeout (1800 s; here the test's 90 s timeout ran out) and then
    advised raising it."""
    done = cli.run("up", "dspark", *cli.launch_args(free_port(), "-e", "STANDIN_FATAL_BEFORE_READY=1"), timeout=90)
    ended = time.time()
    assert done.returncode == 4, done.stderr
    first = done.stderr.split("Last 50 log lines")[0]
    assert "the engine logged a fatal error" in first and "before it was ready" in first
    assert re.search(r"\(EngineCore pid=\d+\) ERROR \d\d-\d\d [\d:]{8} \[core\.py:1349\] EngineCore failed to start\.",
                     first)
    assert "What died: vLLM's engine core failed to start; its error: RuntimeError: standin fault" in done.stderr
    assert "--ready-timeout" not in done.stderr and "Traceback (most recent call last)" not in first
    seconds = _seconds_since_fatal_line(done.stderr, ended)
    _keep("stand-in, before ready: fatal line to `up`'s error (s)", seconds)
    assert seconds < PROMISE_S


def test_foreground_up_stops_when_the_engine_dies_while_serving(cli: Cli) -> None:
    """Before: the API server kept answering, so `up` served on with a dead engine and never said so."""
    done = cli.run("up", "none", *cli.launch_args(free_port(), "-e", "STANDIN_FATAL_AFTER=2"), timeout=90)
    ended = time.time()
    assert done.returncode == 4, done.stderr
    assert "the engine logged a fatal error while serving" in done.stderr
    assert "[core.py:1351] EngineCore encountered a fatal error." in done.stderr
    assert "AsyncLLM output_handler failed." in done.stderr  # the tail
    seconds = _seconds_since_fatal_line(done.stderr, ended)
    _keep("stand-in, while serving (foreground up): fatal line to the error (s)", seconds)
    assert seconds < PROMISE_S


def test_a_silent_load_fails_as_stalled_when_asked(cli: Cli) -> None:
    """Before: a hung load waited the whole --ready-timeout; there was no stall detector."""
    started = time.monotonic()
    done = cli.run("up", "dspark", *cli.launch_args(free_port(), "-e", "STANDIN_NEVER_READY=quiet",
                                                    "--stall-timeout", "3"), timeout=90)
    assert done.returncode == 4, done.stderr
    assert "the engine printed nothing for 3 s" in done.stderr and "--stall-timeout" in done.stderr
    assert "Loading safetensors checkpoint shards" in done.stderr
    assert time.monotonic() - started < 40


def test_a_sweep_fails_a_dead_server_as_fatal_and_runs_the_next(cli: Cli, tmp_path: Path) -> None:
    """none: the engine dies 3 s after ready while its first cell streams (chat requests then hang for ever; the
    request timeout is 30 min). dspark K=2: it dies while loading. dspark K=3 is healthy. Before: the first
    cell hung until the request timeout and K=2 waited for the 1800 s ready deadline. Now both fail as "fatal"
    within seconds with their lines, their cells go back to the queue, and K=3 runs."""
    faults = [
        {"match": {"method": "none"},
         "set": ["engines.vllm.env={STANDIN_FATAL_AFTER: '3', STANDIN_TOKEN_DELAY: '0.3'}"]},
        {"match": {"method": "dspark", "num_speculative_tokens": 2},
         "set": ["engines.vllm.env={STANDIN_FATAL_BEFORE_READY: '1'}"]},
    ]
    path = _sweep(tmp_path, cli.image, overrides=faults, warmup=1, requests={1: 2, 2: 2})
    started = time.monotonic()
    done = _run(cli, path, timeout=240)
    took = time.monotonic() - started
    assert done.returncode == 6, done.stderr
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout
    with _store(path) as store:
        failures = store.failures()
        by_label = {s.id: s.config["label"] for s in store.server_configs()}
        cells = store.cells()
        counts = store.counts()
    assert sorted((by_label[f.server_config_id], f.kind) for f in failures) == [
        ("vllm/dspark K=2", "fatal"), ("vllm/none", "fatal")]
    after_ready = next(f for f in failures if by_label[f.server_config_id] == "vllm/none")
    assert "while cells ran" in after_ready.message
    assert "[core.py:1351] EngineCore encountered a fatal error." in after_ready.message
    assert after_ready.log_tail and "AsyncLLM output_handler failed." in after_ready.log_tail
    before_ready = next(f for f in failures if by_label[f.server_config_id] == "vllm/dspark K=2")
    assert "[core.py:1349] EngineCore failed to start." in before_ready.message
    status = {(by_label[c.server_config_id], c.concurrency): c.status for c in cells}
    assert status[("vllm/none", 1)] == status[("vllm/none", 2)] == "pending"  # back to the queue
    assert status[("vllm/dspark K=3", 1)] == status[("vllm/dspark K=3", 2)] == "done"
    assert counts["running"] == 0
    assert "failed (fatal)" in done.stderr
    assert took < 150, f"the sweep took {took:.0f} s"


def test_bench_on_a_server_whose_engine_died_ends_within_seconds_with_the_fatal_line(cli: Cli) -> None:
    """Issue 27, item 6. The engine prints its fatal line 4 s after ready while /v1/models keeps answering (its
    chat requests then hang, /health says 503). Before: `bench --container` ran past 100 s (each request waited
    for the 60 s stall detector). Now bench watches the server's log as a sweep does and ends within seconds with
    the line; a second bench on the dead server ends at once. The server is the user's: bench leaves it running."""
    port = free_port()
    up = cli.run("up", "none", "--detach", *cli.launch_args(port, "-e", "STANDIN_FATAL_AFTER=4", "-e",
                                                            "STANDIN_TOKEN_DELAY=0.05"), timeout=90)
    assert up.returncode == 0, up.stderr
    name = re.search(r"^  container\s+(\S+)", up.stdout, re.MULTILINE)
    assert name, up.stdout
    try:
        started = time.monotonic()
        done = cli.run("bench", "--container", name.group(1), "--requests", "400", "--max-tokens", "64", "--warmup",
                       "0", timeout=150)
        ended = time.time()
        took = time.monotonic() - started
        assert done.returncode == 4, done.stdout + done.stderr
        assert "the engine logged a fatal error while bench ran" in done.stderr
        assert "[core.py:1351] EngineCore encountered a fatal error." in done.stderr
        assert "What died: vLLM's engine core" in done.stderr and "Traceback (most recent call last)" in done.stderr
        seconds = _seconds_since_fatal_line(done.stderr, ended)
        _keep("stand-in, bench --container: fatal line to bench's error (s)", seconds)
        assert seconds < PROMISE_S and took < 60
        again = time.monotonic()
        second = cli.run("bench", "--container", name.group(1), "--requests", "3", "--warmup", "0", timeout=60)
        assert second.returncode == 4 and "the engine logged a fatal error" in second.stderr, second.stderr
        _keep("stand-in, bench --container on an engine dead already: to the error (s)", time.monotonic() - again)
        assert time.monotonic() - again < 15
        assert cli.run("ps").stdout.count(name.group(1)) == 1  # bench does not stop a server it did not start
    finally:
        cli.run("down", name.group(1))
