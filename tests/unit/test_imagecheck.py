"""The image's own parser at preflight (sparklab.runtimes.imagecheck), with a fake runtime standing in for Docker: what
each adapter asks the image to run, how its answer becomes a verdict, the cache per (image digest, command), the
refusal naming the recipe line, and the warning when a parser cannot run. The real parsers in real images:
tests/e2e/test_image_parsers.py."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sparklab.engines.parsers import NOT_CHECKED, Probe, ProbeRun
from sparklab.errors import PreflightError
from sparklab.recipes.render import LaunchOptions, render
from sparklab.recipes.schema import load_recipe, recipes_dir
from sparklab.runtimes import imagecheck
from sparklab.runtimes.containers import ImageInfo
from sparklab.spec import LaunchSpec

IMAGE = ImageInfo("127.0.0.1:5000/sparklab/vllm-cpu:0.27.1", "sha256:" + "a" * 64, "sha256:" + "b" * 64, "amd64")


def _vllm(method: str = "ngram", *extra: str, recipe: Path | None = None) -> LaunchSpec:
    return render(load_recipe(recipe or recipes_dir() / "cpu.yaml"), "vllm-cpu", method,
                  LaunchOptions(extra_args=extra))


class FakeParser:
    """Answers probes as the image's parser would: a JSON document per run, refusing any argv holding `refuse`."""

    def __init__(self, refuse: str = "--speculative-confg", version: str = "0.27.1+cpu", answer: str | None = None,
                 error: str | None = None) -> None:
        self.refuse, self.version, self.answer, self.error = refuse, version, answer, error
        self.runs: list[tuple[str, Probe]] = []

    def for_spec(self, spec: LaunchSpec) -> FakeParser:
        return self

    def probe(self, image: str, probe: Probe, timeout_s: float) -> ProbeRun:
        self.runs.append((image, probe))
        if self.error:
            return ProbeRun(None, "", "", 0.2, error=self.error)
        if self.answer is not None:
            return ProbeRun(127, "", self.answer, 0.2)
        cases = json.loads(probe.args[-1])["cases"]
        out = [{"id": c["id"], "ok": self.refuse not in c["argv"],
                "errors": [] if self.refuse not in c["argv"] else [
                    {"flag": None, "message": f"unrecognized arguments: {self.refuse} 3"}]} for c in cases]
        return ProbeRun(0 if all(c["ok"] for c in out) else 1,
                        json.dumps({"vllm_version": self.version, "version_source": "metadata", "cases": out}), "",
                        11.5)


def test_the_vllm_probe_runs_vllm_serves_own_parser_with_the_images_python_on_the_exact_command(tmp_path: Path
                                                                                                ) -> None:
    spec = _vllm()
    runtime = FakeParser()
    (checked,) = imagecheck.check([spec], runtime, IMAGE, cache=imagecheck.Cache(tmp_path))
    ((image, probe),) = runtime.runs
    assert image == IMAGE.ref and probe.program == "sh"
    # sh -c FIND_PYTHON sparklab-probe MODULE PROGRAM SCRIPT PAYLOAD: the Python `vllm`'s own #! line names
    assert probe.args[3:5] == ("vllm", "vllm") and "FlexibleArgumentParser" in probe.args[5]
    (case,) = json.loads(probe.args[6])["cases"]
    assert case["argv"] == list(spec.argv) and spec.argv[0] == "serve"  # the whole command, --host/--port too
    assert probe.env["VLLM_CPU_KVCACHE_SPACE"] == "2"  # the server's environment, for parsers that read it
    assert checked.verdict.status == "accepted" and checked.version == "0.27.1+cpu" and checked.warnings == []


def test_a_misspelt_flag_is_refused_with_the_parsers_words_and_the_recipe_line(tmp_path: Path) -> None:
    recipe = tmp_path / "cpu.yaml"
    recipe.write_text((recipes_dir() / "cpu.yaml").read_text().replace(
        "--speculative_config.method, ngram,", "--speculative-confg, ngram,"))
    spec = _vllm(recipe=recipe)
    with pytest.raises(PreflightError) as refused:
        imagecheck.preflight_one(spec, FakeParser(refuse="--speculative-confg"), IMAGE,
                                 cache=imagecheck.Cache(tmp_path / "cache"))
    message = refused.value.message
    assert "vLLM 0.27.1+cpu's own parser" in message and "unrecognized arguments: --speculative-confg 3" in message
    line = next(i for i, text in enumerate(recipe.read_text().splitlines(), 1) if "--speculative-confg" in text)
    assert f"from {recipe}:{line}: --speculative-confg, ngram," in message


def test_a_flag_given_on_the_command_line_says_so(tmp_path: Path) -> None:
    spec = _vllm("none", "--speculative-confg", "3")
    with pytest.raises(PreflightError, match=r"from --serve-arg --speculative-confg \(or a sweep file's overrides"):
        imagecheck.preflight_one(spec, FakeParser(), IMAGE, cache=imagecheck.Cache(tmp_path))


def test_a_verdict_is_kept_per_image_digest_and_command_so_a_sweep_pays_once(tmp_path: Path) -> None:
    cache = imagecheck.Cache(tmp_path)
    runtime = FakeParser()
    first = imagecheck.check([_vllm("ngram"), _vllm("none")], runtime, IMAGE, cache=cache)
    assert len(runtime.runs) == 1 and [c.cached for c in first] == [False, False]  # one run for both servers
    again = imagecheck.check([_vllm("ngram"), _vllm("none"), _vllm("draft_model")], runtime, IMAGE, cache=cache)
    assert [c.cached for c in again] == [True, True, False] and len(runtime.runs) == 2
    assert len(json.loads(runtime.runs[1][1].args[-1])["cases"]) == 1  # only the command it had not seen
    assert again[0].first_seconds == 11.5 and again[0].seconds < 1.0
    other = replace(IMAGE, digest="sha256:" + "c" * 64)  # another build under the same tag: asked again
    assert not imagecheck.check([_vllm("ngram")], runtime, other, cache=cache)[0].cached


def test_a_parser_that_cannot_run_is_a_warning_naming_why_never_a_pass(tmp_path: Path) -> None:
    no_python = FakeParser(answer="sparklab probe: no Python in this image can import vllm (tried: python3 (absent))")
    (checked,) = imagecheck.check([_vllm()], no_python, IMAGE, cache=imagecheck.Cache(tmp_path))
    assert checked.verdict.status == NOT_CHECKED
    (warning,) = checked.warnings
    assert "vLLM's own parser was not run on this command" in warning and "no Python in this image" in warning
    assert imagecheck.Cache(tmp_path).get(IMAGE.digest, _vllm()) is None  # asked again next time
    refused_entry = FakeParser(error="exec: \"sh\": executable file not found in $PATH")
    (checked,) = imagecheck.check([_vllm()], refused_entry, IMAGE, cache=imagecheck.Cache(tmp_path))
    assert checked.verdict.status == NOT_CHECKED and "executable file not found" in checked.warnings[0]


def test_an_image_outside_the_versions_the_adapter_was_read_from_gets_one_warning(tmp_path: Path) -> None:
    (checked,) = imagecheck.check([_vllm()], FakeParser(version="0.33.0"), IMAGE, cache=imagecheck.Cache(tmp_path))
    (warning,) = checked.warnings
    assert "vLLM 0.33.0 is outside the versions sparklab's vLLM knowledge was read from (0.27.1, 0.32.0)" in warning
    for area in ("readiness path", "startup lines", "fatal lines", "acceptance counters", "cache variables"):
        assert area in warning
    (inside,) = imagecheck.check([_vllm()], FakeParser(version="0.32.0+cpu"), IMAGE,
                                 cache=imagecheck.Cache(tmp_path / "b"))
    assert inside.warnings == []


def test_each_adapter_says_how_its_parser_runs() -> None:
    gb10 = load_recipe(recipes_dir() / "gb10.yaml")
    sglang = render(gb10, "sglang", "dspark", LaunchOptions())
    probe: Any = __import__("sparklab.engines", fromlist=["engine"]).engine("sglang").parser_probe([sglang])
    assert probe.args[3:5] == ("sglang", "python3") and "prepare_server_args" in probe.args[5]
    (case,) = json.loads(probe.args[6])["cases"]
    assert case["argv"][:2] == ["--model-path", "nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4"]
    assert "sparklab-check-key" in case["argv"]  # the key placeholder, never a key
    llama = render(load_recipe(recipes_dir() / "llamacpp-gb10.yaml"), "llamacpp", "draft", LaunchOptions())
    from sparklab.engines import engine

    probe = engine("llamacpp").parser_probe([llama])
    assert probe.program == "sh" and probe.args[2:4] == ("sparklab-probe", "/app/llama-server")
    assert int(probe.args[4]) == len(llama.argv) + len(llama.entrypoint) - 1
    edge = render(gb10, "edgellm", "dspark", LaunchOptions())
    probe = engine("trtedge").parser_probe([edge])
    assert probe.args[3] == "experimental" and probe.args[4].endswith("/.venvs/edgellm/bin/python")
    (case,) = json.loads(probe.args[6])["cases"]
    assert case["argv"][0] == "nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4"  # `trtedge serve`'s own flags
