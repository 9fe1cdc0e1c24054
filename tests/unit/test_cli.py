"""The CLI boundary: commands print what they should, errors are one clear paragraph, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sparklab.cli.main import main


def test_render_prints_docker_run_and_serve_command(capsys) -> None:
    assert main(["render", "dspark"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("# recipes/gb10.yaml: engine vllm, method dspark\n")
    assert "docker run --rm --init --name sparklab-gb10-vllm-dspark" in printed
    assert "--speculative_config.method dspark" in printed
    assert "vllm serve --model nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4" in printed


def test_render_overrides(capsys) -> None:
    assert main(["render", "dspark", "-k", "8", "--image", "my/img:1", "--port", "9000",
                 "--set", "max_model_len=32768", "--serve-arg=--max-num-seqs=8"]) == 0
    printed = capsys.readouterr().out
    assert "--speculative_config.num_speculative_tokens 8" in printed
    assert "--entrypoint vllm my/img:1" in printed
    assert "--max-model-len 32768" in printed
    assert "--max-num-seqs=8 --host 127.0.0.1 --port 9000" in printed


def test_secrets_never_printed(capsys, monkeypatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secretvalue123")
    assert main(["render", "gb10:dspark", "--engine", "sglang", "-e", "MY_API_KEY=abc987", "-e", "PLAIN=1"]) == 0
    printed = capsys.readouterr().out
    assert "hf_secretvalue123" not in printed and "abc987" not in printed
    assert "-e HF_TOKEN " in printed and "-e MY_API_KEY " in printed and "-e PLAIN=1" in printed
    assert '--api-key "$SPARKLAB_API_KEY"' in printed


def test_recipe_error_is_one_paragraph_with_exit_code_2(capsys) -> None:
    assert main(["render", "dspark", "--set", "engines.vllm.prot=1"]) == 2
    err = capsys.readouterr().err
    assert "error: recipes/gb10.yaml: engines.vllm.prot: unknown key" in err.replace("\n", " ")
    assert "Traceback" not in err


def test_preflight_error_exit_code_3(capsys) -> None:
    assert main(["render", "dspark", "--set", "model.drafts.dspark.block_size=4"]) == 3
    err = capsys.readouterr().err
    assert "preflight:" in err and "block size 4" in err


def test_unknown_method_lists_the_available_ones(capsys) -> None:
    assert main(["render", "medusa"]) == 2
    assert "Methods of vllm in this recipe: none, mtp, dflash, dspark." in capsys.readouterr().err


def test_up_dry_run_shares_the_path_up_to_the_first_side_effect(capsys, tmp_path) -> None:
    code = main(["up", "dspark", "--dry-run", "--hf-cache", str(tmp_path), "--set", "gpu_memory_utilization=0.01",
                 "--port", "18999"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "dry run: preflight passed, nothing started." in captured.out


def test_up_dry_run_runs_host_checks(capsys, tmp_path) -> None:
    assert main(["up", "dspark", "--dry-run", "--hf-cache", str(tmp_path / "missing"),
                 "--set", "gpu_memory_utilization=0.01"]) == 3
    assert "Hugging Face cache directory" in capsys.readouterr().err


def test_recipes_lists_engines_and_methods(capsys) -> None:
    assert main(["recipes"]) == 0
    printed = capsys.readouterr().out
    assert "gb10-modelcard" in printed and "lmsysorg/sglang:dev-nemotron3-5-lightning" in printed


# The console script is the one installed beside this interpreter (the test venv's), not whatever `sparklab`
# happens to be on PATH: the suite must pass on a machine where nothing else installed sparklab.
@pytest.mark.parametrize("entry", [[str(Path(sys.executable).parent / "sparklab")], [sys.executable, "-m", "sparklab"]])
def test_entry_points(entry: list[str]) -> None:
    done = subprocess.run([*entry, "--version"], capture_output=True, text=True, check=True)
    assert done.stdout.startswith("sparklab ")
