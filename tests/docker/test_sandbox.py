"""The code suite's sandbox for real (sparklab.runtimes.sandbox): graded code runs in a throwaway container with no
network, a read-only root, as nobody, with memory, processes and time capped, and the container is gone after.

Each hostile answer is graded the way a sweep grades it (sparklab.bench.grading.grade) and must fail while the
host notices nothing: no connection reaches the test's own server, a loop is killed at the cap, memory and
process bombs end inside the container. The autouse fixture checks that no sparklab container is left behind.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
import yaml

from sparklab.bench.grading import grade
from sparklab.bench.workloads import load_workload
from sparklab.runtimes.containers import Docker
from sparklab.runtimes.sandbox import DEFAULT_IMAGE, DockerSandbox, Limits
from tests.dockerkit import _missing

pytestmark = pytest.mark.docker
REFERENCE = yaml.safe_load((Path(__file__).resolve().parents[1] / "fixtures" / "grading" /
                            "reference_answers.yaml").read_text())
TESTS = ("import unittest\nfrom solution import f\n"
         "class T(unittest.TestCase):\n"
         "    def test_one(self):\n        self.assertEqual(f(), 1)\n"
         "    def test_two(self):\n        self.assertEqual(f(), 1)\n")
TASK = {"kind": "code", "entry": "solution.py", "tests": TESTS}


@pytest.fixture(scope="module")
def sandbox(docker_client) -> DockerSandbox:
    docker = Docker(docker_client)
    if docker.image_info(DEFAULT_IMAGE) is None:
        _missing(f"the sandbox image {DEFAULT_IMAGE} is not on this Docker engine (bash docker/base/build.sh)")
    return DockerSandbox(docker, Limits(timeout_s=15.0, per_test_s=3.0, memory_mib=64, pids=32))


def _answer(code: str) -> dict[str, object]:
    return {"ok": True, "prompt_id": "t", "content": f"```python\n{code}\n```"}


class Listener:
    """A server on the host's loopback that counts every connection: the sandbox must never reach it."""

    def __init__(self) -> None:
        self.hits = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.hits += 1
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = HTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_right_answers_pass_every_test_in_the_container(sandbox: DockerSandbox) -> None:
    for prompt in load_workload("code").prompts:
        result = grade(0, prompt.task, {"ok": True, "prompt_id": prompt.id, "content": REFERENCE[prompt.id]}, sandbox)
        assert result.passed and set(result.tests.values()) == {"pass"}, (prompt.id, result.tests, result.note)


def test_an_answer_that_tries_the_network_fails_and_reaches_nothing(sandbox: DockerSandbox) -> None:
    listener = Listener()
    try:
        code = ("import socket, urllib.request\n"
                "def f():\n"
                "    errors = []\n"
                f"    for url in ('http://127.0.0.1:{listener.port}/', 'http://172.17.0.1:{listener.port}/',\n"
                "                'http://example.com/'):\n"
                "        try:\n"
                "            urllib.request.urlopen(url, timeout=2).read()\n"
                "            return 1\n"
                "        except OSError as exc:\n"
                "            errors.append(str(exc))\n"
                "    raise RuntimeError('; '.join(errors))\n")
        result = grade(0, TASK, _answer(code), sandbox)
    finally:
        listener.close()
    assert result.status == "graded" and not result.passed
    assert set(result.tests.values()) == {"error"}
    assert listener.hits == 0  # the host's loopback is not the sandbox's: nothing came through


def test_an_answer_that_loops_forever_is_killed_at_the_cap(sandbox: DockerSandbox) -> None:
    """It ignores the per-test alarm: only the container's time cap ends it."""
    code = ("import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
            "def f():\n    while True:\n        pass\n")
    started = time.monotonic()
    result = grade(0, TASK, _answer(code), sandbox)
    took = time.monotonic() - started
    assert not result.passed and set(result.tests.values()) == {"timeout"}
    assert "killed at the sandbox's time cap" in result.note
    assert 15.0 <= took < 45.0


def test_a_looping_test_fails_alone(sandbox: DockerSandbox) -> None:
    code = "calls = []\ndef f():\n    calls.append(1)\n    while len(calls) > 1:\n        pass\n    return 1\n"
    result = grade(0, TASK, _answer(code), sandbox)
    assert result.tests == {"test_solution.T.test_one": "pass", "test_solution.T.test_two": "timeout"}


def test_memory_and_process_bombs_end_inside_the_container(sandbox: DockerSandbox) -> None:
    hog = grade(0, TASK, _answer("def f():\n    block = bytearray(1 << 30)\n    return len(block)\n"), sandbox)
    assert not hog.passed and set(hog.tests.values()) <= {"error", "timeout"}
    fork = ("import os\n"
            "def f():\n"
            "    made = 0\n"
            "    try:\n"
            "        for _ in range(1000):\n"
            "            if os.fork() == 0:\n"
            "                import time; time.sleep(30); os._exit(0)\n"
            "            made += 1\n"
            "    except OSError:\n"
            "        return made\n"
            "    return made\n")
    bomb = grade(0, {**TASK, "tests": TESTS.replace("self.assertEqual(f(), 1)", "self.assertLess(f(), 32)")},
                 _answer(fork), sandbox)
    assert bomb.tests and set(bomb.tests.values()) <= {"pass", "error", "timeout"}
    assert bomb.tests["test_solution.T.test_one"] == "pass"  # fork failed before 32 processes: the pids cap


def test_the_root_is_read_only_and_the_user_is_nobody(sandbox: DockerSandbox) -> None:
    code = ("import os\n"
            "def f():\n"
            "    open('/tmp/scratch', 'w').write('ok')\n"
            "    try:\n"
            "        open('/etc/sparklab-was-here', 'w').write('x')\n"
            "        return 0\n"
            "    except OSError:\n"
            "        pass\n"
            "    try:\n"
            "        open('/task/solution.py', 'a').write('x')\n"
            "        return 0\n"
            "    except OSError:\n"
            "        return 1 if os.getuid() == 65534 else 0\n")
    result = grade(0, TASK, _answer(code), sandbox)
    assert result.passed, (result.tests, result.note)


def test_a_missing_image_is_a_preflight_error_before_any_server(docker_client) -> None:
    from sparklab.errors import PreflightError

    missing = DockerSandbox(Docker(docker_client), Limits(image="sparklab/no-such-image:0"))
    with pytest.raises(PreflightError, match="sandbox image sparklab/no-such-image:0") as caught:
        missing.check("sweep.yaml: grading.sandbox_image")
    assert "docker/base/build.sh" in (caught.value.hint or "")
    ran = missing.run({"a.py": ""}, ["python3", "a.py"])
    assert ran.error and "no image" in ran.error
