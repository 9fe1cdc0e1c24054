"""`sparklab up` / ps / logs / down / gc against the stand-in engine, pulled from the local registry.

Every failure path ends with no sparklab container left (the autouse fixture checks after each test).
"""

from __future__ import annotations

import dataclasses
import re
import signal
import socket
import subprocess
import sys
import time

import openai
import pytest
import requests

from tests.dockerkit import (
    OUR_PROBES,
    Cli,
    Lines,
    field,
    free_port,
    listed,
    port_containers,
    pulled_copy,
    sparklab_containers,
)

pytestmark = pytest.mark.docker


def test_up_detached_pulls_from_the_registry_then_ps_logs_chat_down(cli: Cli, docker_client) -> None:
    with pulled_copy(cli.image, "up") as image:  # absent here, so `up` really pulls it from 127.0.0.1:5000
        _up_detached_then_ps_logs_chat_down(dataclasses.replace(cli, image=image), docker_client)


def _up_detached_then_ps_logs_chat_down(cli: Cli, docker_client) -> None:
    port = free_port()
    done = cli.run("up", "dspark", "--detach", *cli.launch_args(port, "-e", "MY_API_KEY=cli-secret-77"),
                   env=cli.env(HF_TOKEN="hf_topsecret42"))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    name = field(out, "container")
    try:
        assert re.search(r"ready in \d+\.\d s \(from container start until /v1/models answered 200", out)
        assert re.search(rf"image\s+{re.escape(cli.image)} \(sha256:[0-9a-f]{{64}}\)", out)
        assert "KV cache        93,184 tokens" in out
        assert "max concurrency 1.42x at 65,536 tokens per request" in out  # 93,184 / 65,536
        assert "advice: vLLM capped max_num_scheduled_tokens" in out  # the speculative budget warning
        key = field(out, "api key")
        assert "hf_topsecret42" not in out + done.stderr and "cli-secret-77" not in out + done.stderr
        _check_detached_server(cli, docker_client, name, key, port)
    finally:
        down = cli.run("down", name)
    assert down.returncode == 0, down.stderr
    assert name not in sparklab_containers(docker_client)


def _check_detached_server(cli: Cli, docker_client, name: str, key: str, port: int) -> None:
    container = docker_client.containers.get(name)
    labels = container.labels
    assert labels["sparklab.recipe"] == "gb10" and labels["sparklab.method"] == "dspark"
    assert labels["sparklab.mode"] == "up" and labels["sparklab.detached"] == "1"
    assert container.attrs["HostConfig"]["Init"] is True
    assert container.attrs["HostConfig"]["IpcMode"] == "host"
    assert {u["Name"] for u in container.attrs["HostConfig"]["Ulimits"]} == {"memlock", "stack"}
    env = dict(e.split("=", 1) for e in container.attrs["Config"]["Env"])
    assert env["HF_TOKEN"] == "hf_topsecret42" and env["VLLM_API_KEY"] == key
    assert env["MY_API_KEY"] == "cli-secret-77"

    ps = cli.run("ps")
    assert name in ps.stdout and "detached" in ps.stdout
    logs = cli.run("logs", name)
    assert "Application startup complete." in logs.stdout
    assert "--speculative_config.method" in logs.stdout and "dspark" in logs.stdout
    assert "hf_topsecret42" not in logs.stdout and key not in logs.stdout
    follow = cli.popen("logs", "-f", name)
    try:
        Lines(follow).wait_for("Application startup complete.", timeout=20)
        assert follow.poll() is None, "logs -f should keep following a running server"
    finally:
        follow.terminate()
        follow.wait(timeout=10)
    log_file = (cli.state / "logs" / f"{name}.log").read_text()
    assert "GPU KV cache size: 93,184 tokens" in log_file and "hf_topsecret42" not in log_file

    base = f"http://127.0.0.1:{port}/v1"
    assert requests.get(f"{base}/models", timeout=5).status_code == 401
    client = openai.OpenAI(base_url=base, api_key=key)
    model = client.models.list().data[0].id
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=8)
    assert reply.usage is not None and reply.usage.completion_tokens == 8
    stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=5, stream=True)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text.split() == ["tok0", "tok1", "tok2", "tok3", "tok4"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_foreground_up_stops_on_signal_within_15_s(cli: Cli, docker_client, sig: signal.Signals) -> None:
    port = free_port()
    proc = cli.popen("up", "mtp", *cli.launch_args(port))
    lines = Lines(proc)
    try:
        lines.wait_for("serving in the foreground", timeout=90)
        assert len(port_containers(docker_client, port)) == 1
        started = time.monotonic()
        proc.send_signal(sig)
        code = proc.wait(timeout=15)
        elapsed = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, proc.stderr.read() if proc.stderr else ""
    assert elapsed < 15
    assert port_containers(docker_client, port) == []


# A Ctrl-C that lands inside `up`'s own start calls: the container exists on the daemon but sparklab may not
# hold its handle yet. The hook sends the signal at that exact point, so the race is hit every time: in the server's
# own create or start (the image's parser check runs a throwaway container first: those calls are let through), or
# in the parser check's ("probe").
_INTERRUPT_AT = """
import os, signal, sys
import docker.models.containers as dm
import sparklab.runtimes.container_server as sc
where = sys.argv.pop(1)
def interrupt():
    os.kill(os.getpid(), signal.SIGINT)
def probe(name):
    return str(name).lstrip("/").startswith("sparklab-probe-")
if where in ("create", "probe"):  # the daemon has made the container; its answer is being read
    real_create = dm.ContainerCollection.create
    def create(self, *a, **k):
        made = real_create(self, *a, **k)
        if probe(k.get("name")) == (where == "probe"):
            interrupt()
        return made
    dm.ContainerCollection.create = create
elif where == "start":
    real_start = dm.Container.start
    def start(self, *a, **k):
        real_start(self, *a, **k)
        if not probe(self.name):
            interrupt()
    dm.Container.start = start
else:  # while the server's log follower is set up
    real_init = sc.Server.__init__
    def init(self, *a, **k):
        real_init(self, *a, **k)
        interrupt()
    sc.Server.__init__ = init
from sparklab.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("where", ["create", "start", "server", "probe"])
def test_ctrl_c_inside_the_start_call_leaves_no_container(cli: Cli, docker_client, where: str) -> None:
    port = free_port()
    probes = {c.id for c in listed(docker_client, OUR_PROBES)}
    proc = subprocess.run([sys.executable, "-c", _INTERRUPT_AT, where, "up", "none", *cli.launch_args(port)],
                          capture_output=True, text=True, timeout=60, env=cli.env())
    assert proc.returncode == 130, proc.stderr
    assert "interrupted" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert port_containers(docker_client, port) == []
    left = {c.id for c in listed(docker_client, OUR_PROBES)}
    assert left <= probes  # nor the parser check's throwaway container


def test_ctrl_c_during_startup_removes_the_container(cli: Cli, docker_client) -> None:
    port = free_port()
    proc = cli.popen("up", "none", *cli.launch_args(port, "-e", "STANDIN_START_DELAY=60"))
    try:
        deadline = time.monotonic() + 60
        while not port_containers(docker_client, port) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert port_containers(docker_client, port), "the container never appeared"
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 130
    assert "interrupted" in (proc.stderr.read() if proc.stderr else "")
    assert port_containers(docker_client, port) == []


def test_exit_at_start_fails_with_code_and_log_tail(cli: Cli) -> None:
    done = cli.run("up", "dspark", *cli.launch_args(free_port(), "-e", "STANDIN_EXIT_AT_START=3"))
    assert done.returncode == 4
    assert "the server container exited with code 3 before it was ready" in done.stderr
    assert "Last 50 log lines" in done.stderr and "Engine core initialization failed" in done.stderr
    assert "Traceback (most recent call last)" not in done.stderr.split("Last 50 log lines")[0]


def test_exit_137_is_reported_by_what_docker_says_killed_it(cli: Cli) -> None:
    """STANDIN_OOM SIGKILLs the engine from inside: exit 137 with Docker's OOMKilled false. Before, that was
    reported as "most likely out of memory"; now the message says it was not the kernel's OOM killer."""
    done = cli.run("up", "dspark", *cli.launch_args(free_port(), "-e", "STANDIN_OOM=1"))
    assert done.returncode == 4
    assert "exited with code 137 (SIGKILL from outside the container, not the kernel's OOM killer" in done.stderr


def test_hang_past_a_short_deadline(cli: Cli) -> None:
    started = time.monotonic()
    done = cli.run("up", "dspark", *cli.launch_args(free_port(), "-e", "STANDIN_NEVER_READY=1",
                                                    "--ready-timeout", "4"))
    assert done.returncode == 4
    assert "not ready after 4 s" in done.stderr and "Loading safetensors checkpoint shards" in done.stderr
    assert time.monotonic() - started < 40


def test_server_dying_while_serving_is_reported(cli: Cli, docker_client) -> None:
    port = free_port()
    done = cli.run("up", "none", *cli.launch_args(port, "-e", "STANDIN_DIE_AFTER=2"), timeout=90)
    assert done.returncode == 4
    assert "the server exited with code 1 while serving" in done.stderr


def test_port_already_taken_stops_before_any_container(cli: Cli, docker_client) -> None:
    before = sparklab_containers(docker_client)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        done = cli.run("up", "dspark", *cli.launch_args(port))
    assert done.returncode == 3
    assert f"port {port} is already in use" in done.stderr
    assert sparklab_containers(docker_client) == before


def test_pull_error_from_the_stream_is_reported(cli: Cli) -> None:
    done = cli.run("up", "dspark", *cli.launch_args(free_port()), "--image",
                   "127.0.0.1:5000/sparklab/no-such-image:1", "--pull", "always")
    assert done.returncode == 4
    assert "pull of 127.0.0.1:5000/sparklab/no-such-image:1 failed" in done.stderr


def test_missing_tag_falls_back_to_the_recipes_alternative(cli: Cli) -> None:
    # Like the SGLang image whose cookbook spelling differs: the first tag is absent, the alternative works.
    args = [a for a in cli.launch_args(free_port()) if a not in ("--image", cli.image)]
    done = cli.run("up", "none", "--detach", *args, "--set", "engines.vllm.image=127.0.0.1:5000/sparklab/standin:nope",
                   "--set", f"engines.vllm.image_alternatives=[{cli.image}]")
    assert done.returncode == 0, done.stderr
    assert "pull of 127.0.0.1:5000/sparklab/standin:nope failed" in done.stderr
    assert f"trying {cli.image}" in done.stderr
    assert f"image       {cli.image}" in done.stdout
    assert cli.run("down", field(done.stdout, "container")).returncode == 0


def test_sglang_engine_waits_on_health(cli: Cli) -> None:
    done = cli.run("up", "dspark", "--engine", "sglang", "--detach", *cli.launch_args(free_port(), "--set", "mem_fraction_static=0.01"))
    assert done.returncode == 0, done.stderr
    assert "until /health answered 200" in done.stdout
    assert "KV cache        93,184 tokens" in done.stdout
    name = field(done.stdout, "container")
    assert cli.run("down", name).returncode == 0


def _sigkilled_foreground_up(cli: Cli, docker_client, port: int):
    proc = cli.popen("up", "dspark", *cli.launch_args(port))
    try:
        Lines(proc).wait_for("serving in the foreground", timeout=90)
    finally:
        proc.kill()  # SIGKILL: no chance to clean up
        proc.wait(timeout=10)
    orphan = port_containers(docker_client, port)
    assert len(orphan) == 1 and orphan[0].status == "running"
    return orphan[0]


def test_sigkill_of_the_cli_leaves_an_orphan_that_gc_removes_but_not_a_detached_up(cli: Cli, docker_client) -> None:
    kept = cli.run("up", "none", "--detach", *cli.launch_args(free_port()))
    assert kept.returncode == 0, kept.stderr
    kept_name = field(kept.stdout, "container")
    try:
        port = free_port()
        orphan = _sigkilled_foreground_up(cli, docker_client, port)
        assert "gone (gc removes it)" in cli.run("ps").stdout
        gc = cli.run("gc")
        assert gc.returncode == 0
        assert orphan.name in gc.stdout and kept_name not in gc.stdout
        assert port_containers(docker_client, port) == []

        # The next start cleans up too, without an explicit gc.
        orphan = _sigkilled_foreground_up(cli, docker_client, port)
        again = cli.run("up", "none", "--detach", *cli.launch_args(free_port()))
        assert again.returncode == 0, again.stderr
        assert f"removed leftover container {orphan.name}" in again.stderr
        assert port_containers(docker_client, port) == []
        assert cli.run("down", field(again.stdout, "container")).returncode == 0
        assert docker_client.containers.get(kept_name).status == "running"
    finally:
        cli.run("down", kept_name)
