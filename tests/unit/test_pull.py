"""`sparklab pull`: every image and checkpoint a recipe, method or sweep needs, each once, against fakes."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparklab.cli import pull as cli_pull
from sparklab.cli.main import build_parser
from sparklab.errors import ImageUnavailableError, SparklabError
from sparklab.runtimes import pull
from tests.fake_hub import FakeHub, FakeRepo

TARGET, DSPARK, DFLASH = "acme/target-30b", "acme/target-30b-dspark", "acme/target-30b-dflash"


def _repo(sha: str) -> FakeRepo:
    return FakeRepo({"config.json": b'{"hidden_size": 64}\n', "model.safetensors": b"\x00" * 300_000}, sha=sha)


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real_connect = socket.socket.connect

    def connect(self: socket.socket, address: Any) -> Any:
        if self.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in ("127.0.0.1", "::1"):
            raise AssertionError(f"connection to {address!r} attempted; tests may only reach 127.0.0.1")
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # a sweep mounts ~/.cache/huggingface: keep it here
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_HOME", raising=False)


@pytest.fixture
def fake_hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    repos = {TARGET: _repo("1" * 40), DSPARK: _repo("2" * 40)}  # no DFLASH: asking for it would fail
    with FakeHub(repos) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        yield hub


@pytest.fixture
def recipe_file(gb10_doc: dict[str, Any], tmp_path: Path) -> Path:
    gb10_doc["model"]["id"] = TARGET
    gb10_doc["model"]["drafts"] = {"dspark": {"id": DSPARK}, "dflash": {"id": DFLASH}}
    path = tmp_path / "target.yaml"
    path.write_text(yaml.safe_dump(gb10_doc, sort_keys=False))
    return path


@pytest.fixture
def sweep_file(recipe_file: Path, tmp_path: Path) -> Path:
    path = tmp_path / "pull-sweep.yaml"
    path.write_text(yaml.safe_dump({
        "name": "pull-sweep", "recipe": str(recipe_file), "engines": ["vllm", "sglang"],
        "methods": ["none", "dspark"], "num_speculative_tokens": [3, 5], "concurrency": [1]}))
    return path


def _args(*argv: str) -> cli_pull.PullArgs:
    return cli_pull.PullArgs.from_cli_args(build_parser().parse_args(["pull", *argv]))


class FakeImages:
    def __init__(self, unavailable: tuple[str, ...] = ()) -> None:
        self.asked: list[str] = []
        self.unavailable = unavailable

    def __call__(self, ref: str) -> Any:
        self.asked.append(ref)
        if ref in self.unavailable:
            raise ImageUnavailableError(f"pull of {ref} failed: manifest unknown")
        return type("Info", (), {"digest": "sha256:" + "f" * 64})()


def test_a_sweep_pulls_each_image_and_checkpoint_once(fake_hub: FakeHub, sweep_file: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    images = FakeImages()
    assert cli_pull.cmd_pull(_args(str(sweep_file)), pull_image=images) == 0
    # 6 servers (2 engines x none + dspark at K 3 and 5), 2 images, 2 checkpoints; the dflash draft is not used.
    assert images.asked == ["vllm/vllm-openai:v0.27.1-aarch64", "lmsysorg/sglang:dev-nemotron3-5-lightning"]
    gets = sorted({e.path.split("/resolve/")[0] for e in fake_hub.gets()})
    assert gets == [f"/{TARGET}", f"/{DSPARK}"]
    assert len(fake_hub.gets()) == 4  # two files each, once
    hub_cache = tmp_path / "home" / ".cache" / "huggingface" / "hub"
    assert (hub_cache / "models--acme--target-30b" / "snapshots" / ("1" * 40) / "config.json").is_file()
    out = capsys.readouterr().out
    assert f"{TARGET} {'1' * 40}" in out and f"{DSPARK} {'2' * 40}" in out


def test_a_method_pulls_its_draft_into_the_given_cache(fake_hub: FakeHub, recipe_file: Path, tmp_path: Path) -> None:
    cache = tmp_path / "hf"
    assert cli_pull.cmd_pull(_args(f"{recipe_file}:dspark", "--hf-cache", str(cache), "--no-images")) == 0
    assert sorted((cache / "hub").glob("models--*")) == [cache / "hub" / "models--acme--target-30b",
                                                        cache / "hub" / "models--acme--target-30b-dspark"]


def test_the_resolved_revisions_are_returned_for_the_run(fake_hub: FakeHub, recipe_file: Path,
                                                         tmp_path: Path) -> None:
    servers = pull.servers_for(f"{recipe_file}:dspark", hf_cache=tmp_path / "hf")
    said: list[str] = []
    pulled = pull.pull(servers, pull_image=FakeImages(), say=said.append)
    assert pulled.revisions() == {TARGET: "1" * 40, DSPARK: "2" * 40}
    assert pulled.images == {"vllm/vllm-openai:v0.27.1-aarch64": "sha256:" + "f" * 64}
    assert any(TARGET in line for line in said)


def test_an_unavailable_image_falls_back_to_its_alternative(fake_hub: FakeHub, recipe_file: Path,
                                                            tmp_path: Path) -> None:
    images = FakeImages(unavailable=("vllm/vllm-openai:v0.27.1-aarch64",))
    servers = pull.servers_for(f"{recipe_file}:none", hf_cache=tmp_path / "hf")
    pulled = pull.pull(servers, pull_image=images, models=False)
    assert images.asked == ["vllm/vllm-openai:v0.27.1-aarch64", "vllm/vllm-openai:v0.27.1"]
    assert list(pulled.images) == ["vllm/vllm-openai:v0.27.1"]
    assert not fake_hub.log


def test_every_method_of_a_recipe(fake_hub: FakeHub, recipe_file: Path, tmp_path: Path) -> None:
    servers = pull.servers_for(str(recipe_file), hf_cache=tmp_path / "hf", all_methods=True)
    assert {(spec.engine, spec.method) for _, spec in servers} == {
        ("vllm", m) for m in ("none", "mtp", "dflash", "dspark")} | {("sglang", m) for m in ("none", "dspark", "eagle")} | {
        (e, m) for e in ("edgellm", "edgellm-0.11.0") for m in ("none", "dspark")}
    with pytest.raises(SparklabError) as raised:  # the fake Hub has no dflash draft
        pull.pull(servers, pull_image=None)
    assert DFLASH in str(raised.value) and "model.drafts.dflash.id" in str(raised.value)


def test_a_sweep_is_named_by_file_or_by_name_and_a_recipe_is_not_a_sweep(recipe_file: Path,
                                                                         sweep_file: Path) -> None:
    assert pull.sweep_file(str(sweep_file)) == sweep_file
    assert pull.sweep_file("seed000") is not None and pull.sweep_file("seed000").name == "seed000.yaml"
    assert pull.sweep_file(str(recipe_file)) is None
    assert pull.sweep_file("dspark") is None and pull.sweep_file("gb10") is None
