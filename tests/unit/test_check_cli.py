"""`sparklab check RECIPE|SWEEP` prints its table for every shipped recipe and sweep, and its exit code says whether a
command was refused (3) or could not be checked (6). A fake runtime stands in for Docker here (the unit tier starts
no container); the real parsers in their images: tests/e2e/test_image_parsers.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sparklab.cli.check import CheckArgs, cmd_check
from sparklab.cli.main import build_parser
from sparklab.engines.parsers import Probe, ProbeRun
from sparklab.errors import ContainerError
from sparklab.recipes.schema import list_recipes, recipes_dir
from sparklab.runtimes.containers import ImageInfo
from sparklab.runtimes.local import Runtime

SHIPPED = [p.stem for p in list_recipes()] + [p.stem for p in sorted((recipes_dir() / "sweeps").glob("*.yaml"))]


class FakeDocker:
    """Holds the CPU images (amd64, like this host); a vLLM parser that refuses `--speculative-confg`."""

    def host_arch(self) -> str:
        return "x86_64"

    def image_info(self, ref: str) -> ImageInfo | None:
        if "127.0.0.1:5000/sparklab/" not in ref:
            return None
        return ImageInfo(ref, "sha256:" + "1" * 64, "sha256:" + "2" * 64, "amd64")

    def image_labels(self, ref: str) -> dict[str, str]:
        return {}

    def registry_platforms(self, ref: str) -> list[str] | None:
        return None

    def ensure_image(self, ref: str, policy: str = "missing", on_event: Any = None, platform: Any = None
                     ) -> ImageInfo:
        found = self.image_info(ref)
        if found is None:
            raise ContainerError(f"pull of {ref} failed: no such host")
        return found

    def probe(self, image: str, probe: Probe, timeout_s: float) -> ProbeRun:
        if probe.args[3] == "vllm":
            cases = json.loads(probe.args[-1])["cases"]
            out = [{"id": c["id"], "ok": "--speculative-confg" not in c["argv"], "errors": [] if
                    "--speculative-confg" not in c["argv"] else [{"flag": None, "message":
                                                                  "unrecognized arguments: --speculative-confg 3"}]}
                   for c in cases]
            return ProbeRun(0, json.dumps({"vllm_version": "0.27.1+cpu", "cases": out}), "", 9.0)
        text = "@@version\nversion: 0.7.0 (build 11669, commit Debian)\n@@exit 0\n" + "".join(
            f"@@case {i}\n----- common params -----\n@@exit 0\n" for i in range(len(probe.args) // 4))
        return ProbeRun(0, text, "", 0.3)


def _check(*argv: str) -> int:
    return cmd_check(CheckArgs.from_cli_args(build_parser().parse_args(["check", *argv])),
                     Runtime(FakeDocker()))  # type: ignore[arg-type]


@pytest.mark.parametrize("name", SHIPPED)
def test_check_prints_the_table_for_every_shipped_recipe_and_sweep(name: str,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code = _check(name)
    out, err = capsys.readouterr()
    assert "server" in out and "engine version" in out and "parser" in out and "seconds" in out, out
    assert " server(s): " in out
    cpu = name.startswith(("cpu", "llamacpp-cpu"))
    assert code == (0 if cpu else 6), out + err  # the CPU images are here; the GB10 ones are not, and say why
    if cpu:
        assert "0.27.1+cpu" in out or "b11669" in out
    else:
        assert "warning:" in err and "own parser was not run" in err


def test_check_exits_3_with_the_parsers_words_when_a_command_is_refused(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    recipe = tmp_path / "cpu.yaml"
    recipe.write_text((recipes_dir() / "cpu.yaml").read_text().replace(
        "--speculative_config.method, ngram,", "--speculative-confg, ngram,"))
    code = _check(str(recipe), "--engine", "vllm-cpu")
    out = capsys.readouterr().out
    assert code == 3
    assert "unrecognized arguments: --speculative-confg 3" in out and f"from {recipe}:" in out
    # cpu.yaml's vLLM methods: none, ngram, draft_model and the lossless check's two controls (topk5, plain)
    assert "5 server(s): 4 accepted, 1 refused, 0 not checked" in out
