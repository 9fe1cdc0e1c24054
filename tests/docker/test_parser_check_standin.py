"""A parser that cannot run in the image is a warning naming why, never a silent pass: the stand-in image has a
`vllm` command and a Python, but no vLLM for the parser probe to import, so `sparklab check` says so for each
command, exits 6 (not checked), and leaves no container."""

from __future__ import annotations

import pytest

from tests.dockerkit import OUR_PROBES, Cli, listed

pytestmark = pytest.mark.docker


def test_check_says_why_the_parser_could_not_run_in_the_standin(cli: Cli, docker_client) -> None:
    probes = {c.id for c in listed(docker_client, OUR_PROBES)}
    done = cli.run("check", "gb10", "--engine", "vllm", "--set", f"engines.vllm.image={cli.image}",
                   "--set", "engines.vllm.platform=null", "--pull", "never", timeout=300)
    assert done.returncode == 6, done.stdout + done.stderr
    assert "4 server(s): 0 accepted, 0 refused, 4 not checked" in done.stdout
    assert "vLLM's own parser was not run on 4 command(s)" in done.stderr
    assert "no Python in this image can import vllm (tried:" in done.stderr, done.stderr
    assert {c.id for c in listed(docker_client, OUR_PROBES)} <= probes
