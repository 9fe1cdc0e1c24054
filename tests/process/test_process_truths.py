"""Issue 27 item 11 with a real host-process engine: its run file stores no secret (HF_TOKEN, a secret -e value,
the API key), as the README says; `bench --container` still finds the key, from the running engine itself."""

from __future__ import annotations

from pathlib import Path

from tests.dockerkit import field, free_port
from tests.process.conftest import RECIPE, HostCli


def _run_files(host: HostCli) -> list[Path]:
    return sorted((host.state / "processes").glob("*.json"))


def test_the_run_file_stores_no_secret_and_bench_still_finds_the_key(host: HostCli) -> None:
    port = free_port()
    done = host.run("up", f"{RECIPE}:none", "--detach", *host.launch_args(port, "-e", "MY_API_KEY=cli-secret-77"),
                    env=host.env(HF_TOKEN="hf_topsecret42"))
    assert done.returncode == 0, done.stderr
    name = field(done.stdout, "container")
    try:
        key = field(done.stdout, "api key")
        (run_file,) = _run_files(host)
        stored = run_file.read_text()
        for secret in (key, "cli-secret-77", "hf_topsecret42"):
            assert secret not in stored, f"the run file stores {secret[:6]}…"
        bench = host.run("bench", "--container", name, "--requests", "2", "--max-tokens", "8", "--warmup", "0")
        assert bench.returncode == 0, bench.stderr  # the key, read from the engine's own command line
        logs = host.run("logs", name)
        assert "Loaded model=standin/nemotron-lightning" in logs.stdout
        assert key not in logs.stdout and "hf_topsecret42" not in logs.stdout
    finally:
        down = host.run("down", name)
    assert down.returncode == 0, down.stderr
    assert _run_files(host) == []
