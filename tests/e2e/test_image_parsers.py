"""The image's own parser at preflight, for real: `sparklab check` on the CPU recipe runs vLLM 0.27.1's serve parser
and llama.cpp b11669's in their images, and a misspelt flag (`--speculative-confg`) is refused with the parser's own
message, in under 30 s and before any model loads, by `up`, `up --dry-run`, `sweep --dry-run` and `sweep` (where only
that server config fails; the rest of the sweep goes on)."""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import pytest
import yaml

from sparklab.recipes.schema import recipes_dir
from sparklab.sweep.store import Store
from tests.dockerkit import Cli, free_port, make_cli, sparklab_containers, ulimit_args

pytestmark = pytest.mark.engine

MISSPELT = "--speculative-confg"
REFUSAL = f"unrecognized arguments: {MISSPELT} 3"
LIMIT_S = 30.0  # the bound from the command to the refusal


def _launch(cli: Cli, port: int) -> list[str]:
    """The CPU recipe's launch flags (cli.launch_args sets a GB10 variable the CPU recipe does not have)."""
    return ["--image", cli.image, "--no-gpus", "--hf-cache", str(cli.hf_cache), "--no-download", "--port", str(port),
            *ulimit_args()]


def _images(vllm: str, llama: str) -> list[str]:
    return ["--set", f"engines.vllm-cpu.image={vllm}", "--set", f"engines.llamacpp-cpu.image={llama}"]


def test_check_parses_the_cpu_recipe_in_both_images_for_real_and_caches_the_verdicts(
        vllm_cpu_image: str, llamacpp_cpu_image: str, tmp_path: Path, measured) -> None:
    cli = make_cli(vllm_cpu_image, tmp_path)
    started = time.monotonic()
    cold = cli.run("check", "cpu", *_images(vllm_cpu_image, llamacpp_cpu_image), "--pull", "never", timeout=600)
    cold_s = time.monotonic() - started
    assert cold.returncode == 0, cold.stdout + cold.stderr
    rows = {line.split()[0]: line for line in cold.stdout.splitlines() if line.startswith("cpu:")}
    # cpu.yaml's every engine and method: issue 26's lossless controls (topk5, plain) and issue 25's synthetic
    # acceptance engine (its own image, docker/vllm-cpu-synthetic, with both controls: cpu-quality runs there) beside the demo's servers
    assert set(rows) == {"cpu:vllm-cpu/none", "cpu:vllm-cpu/ngram", "cpu:vllm-cpu/draft_model", "cpu:vllm-cpu/topk5",
                         "cpu:vllm-cpu/plain", "cpu:vllm-cpu-synthetic/none", "cpu:vllm-cpu-synthetic/ngram",
                         "cpu:vllm-cpu-synthetic/draft_model", "cpu:vllm-cpu-synthetic/topk5",
                         "cpu:vllm-cpu-synthetic/plain", "cpu:vllm-cpu-synthetic/synthetic",
                         "cpu:llamacpp-cpu/none", "cpu:llamacpp-cpu/draft_model"}, cold.stdout
    for name, row in rows.items():
        assert " accepted " in row, row
        # the image's package metadata: the distribution vllm-cpu says 0.27.1 (its server adds +cpu, the shim's)
        assert (" 0.27.1 " if "vllm" in name else " b11669 ") in row
        assert re.search(r"sha256:[0-9a-f]{12}", row), row
    assert "13 server(s): 13 accepted, 0 refused, 0 not checked" in cold.stdout
    started = time.monotonic()
    warm = cli.run("check", "cpu", *_images(vllm_cpu_image, llamacpp_cpu_image), "--pull", "never", timeout=600)
    warm_s = time.monotonic() - started
    assert warm.returncode == 0 and warm.stdout.count("(cached;") == 13, warm.stdout
    measured["check cpu (13 servers, 3 images): cold s / cached s (whole command)"] = f"{cold_s:.1f} / {warm_s:.1f}"


def test_up_refuses_a_misspelt_flag_at_preflight_before_any_model_loads(
        docker_client, vllm_cpu_image: str, tmp_path: Path, measured) -> None:
    cli = make_cli(vllm_cpu_image, tmp_path)
    port = free_port()
    started = time.monotonic()
    done = cli.run("up", "cpu:ngram", "--engine", "vllm-cpu", *_launch(cli, port),
                   f"--serve-arg={MISSPELT}", "--serve-arg=3", timeout=300)
    took = time.monotonic() - started
    assert done.returncode == 3, done.stdout + done.stderr
    assert REFUSAL in done.stderr and "vLLM 0.27.1's own parser" in done.stderr, done.stderr
    assert f"from --serve-arg {MISSPELT} (or a sweep file's overrides: serve_args)" in done.stderr
    assert took < LIMIT_S, f"refused after {took:.1f} s"
    # no server container was ever created (so no model load); the probe container is gone too
    assert not [n for n in sparklab_containers(docker_client) if "cpu-vllm-cpu-ngram" in n]
    logs = cli.state / "logs"
    assert not logs.exists() or not any(logs.iterdir())  # no server log was ever opened
    measured["up: misspelt flag refused (s, cold parser)"] = round(took, 1)


def test_up_dry_run_refuses_it_and_llamacpp_refuses_its_own(vllm_cpu_image: str, llamacpp_cpu_image: str,
                                                            tmp_path: Path, measured) -> None:
    cli = make_cli(vllm_cpu_image, tmp_path)
    started = time.monotonic()
    done = cli.run("up", "cpu:ngram", "--engine", "vllm-cpu", *_launch(cli, free_port()), "--dry-run",
                   f"--serve-arg={MISSPELT}", "--serve-arg=3", timeout=300)
    took = time.monotonic() - started
    assert done.returncode == 3 and REFUSAL in done.stderr, done.stdout + done.stderr
    assert "dry run: preflight passed" not in done.stdout and took < LIMIT_S
    measured["up --dry-run: misspelt flag refused (s)"] = round(took, 1)
    (tmp_path / "llama").mkdir()
    llama = make_cli(llamacpp_cpu_image, tmp_path / "llama")
    done = llama.run("up", "cpu:draft_model", "--engine", "llamacpp-cpu", *_launch(llama, free_port()),
                     "--dry-run", "--serve-arg=--spec-draft-n-maxx", "--serve-arg=3", timeout=300)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "llama.cpp b11669's own parser" in done.stderr and "--spec-draft-n-maxx" in done.stderr, done.stderr
    ok = llama.run("up", "cpu:draft_model", "--engine", "llamacpp-cpu", *_launch(llama, free_port()),
                   "--dry-run", timeout=300)
    assert ok.returncode == 0 and "accepted" in ok.stdout and "b11669" in ok.stdout, ok.stdout + ok.stderr


def _sweep(tmp_path: Path, image: str) -> Path:
    path = tmp_path / "misspelt.yaml"
    path.write_text(yaml.safe_dump({
        "name": "misspelt", "recipe": str(recipes_dir() / "cpu.yaml"), "engines": ["vllm-cpu"],
        "methods": ["none", "ngram"], "num_speculative_tokens": [3], "concurrency": [1], "requests": 2,
        "warmup": 0, "max_attempts": 3, "set": [f"engines.vllm-cpu.image={image}"],
        "sampling": {"max_tokens": 16, "temperature": 0, "top_p": None, "ignore_eos": True},
        "overrides": [{"match": {"method": "ngram"}, "serve_args": [MISSPELT, "3"]}]}))
    return path


def test_a_sweep_refuses_the_misspelt_server_before_its_first_start_and_runs_the_rest(
        vllm_cpu_image: str, tmp_path: Path, measured) -> None:
    cli = make_cli(vllm_cpu_image, tmp_path)
    sweep = _sweep(tmp_path, vllm_cpu_image)
    runs = tmp_path / "runs"
    dry = cli.run("sweep", str(sweep), "--dry-run", "--runs-dir", str(runs), timeout=300)
    assert dry.returncode == 3 and REFUSAL in dry.stderr, dry.stdout + dry.stderr
    assert re.search(rf"from {re.escape(str(sweep))}:\d+: .*{MISSPELT}", dry.stderr), dry.stderr  # the sweep's line
    shutil.rmtree(cli.state / "parser-checks")  # the dry run's verdicts: the sweep is timed with a cold parser
    started = time.monotonic()
    proc = cli.popen("sweep", str(sweep), "--runs-dir", str(runs), *ulimit_args())
    refused_at: float | None = None
    assert proc.stderr is not None
    for line in proc.stderr:
        if refused_at is None and "refused by its image's own parser before any start" in line:
            refused_at = time.monotonic() - started
    proc.wait(timeout=900)
    assert refused_at is not None and refused_at < LIMIT_S, refused_at
    measured["sweep: misspelt server refused after (s, from the command)"] = round(refused_at, 1)
    (db,) = runs.glob("misspelt-*/results.sqlite")
    with Store.open(db, readonly=True) as store:
        configs = {s.method: s for s in store.server_configs()}
        cells = {configs_id: [c.status for c in store.cells() if c.server_config_id == configs_id]
                 for configs_id in (configs["none"].id, configs["ngram"].id)}
        (failure,) = [f for f in store.failures() if f.kind == "preflight"]
    assert cells[configs["ngram"].id] == ["failed"] and configs["ngram"].started_at is None  # never started
    assert cells[configs["none"].id] == ["done"]  # the rest of the sweep went on
    assert REFUSAL in failure.message and failure.server_config_id == configs["ngram"].id
    assert configs["none"].image_check["verdict"]["status"] == "accepted"
    assert proc.returncode == 6  # incomplete: one server config failed
