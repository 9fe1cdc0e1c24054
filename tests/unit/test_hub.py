"""Model downloads before the clock starts: snapshot downloads against a fake Hub on 127.0.0.1."""

from __future__ import annotations

import contextlib
import logging
import random
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sparklab.errors import SparklabError
from sparklab.host import downloads
from sparklab.recipes.plan import build_plan
from sparklab.recipes.render import LaunchOptions, render
from sparklab.recipes.schema import load_recipe, recipes_dir
from tests.fake_hub import FakeHub, FakeRepo, Fault

SECRET = "hf_sparklabTestSecret0123456789abcdef"
WEIGHTS_SIZE = 4 * 1024 * 1024 + 123


def _weights(size: int = WEIGHTS_SIZE) -> bytes:
    return random.Random(7).randbytes(size)


def small_repo() -> FakeRepo:
    return FakeRepo({
        "config.json": b'{"architectures": ["FakeForCausalLM"], "hidden_size": 64}\n',
        "model.safetensors": _weights(),
        "tokenizer.json": b'{"version": "1.0", "model": {"type": "BPE", "vocab": {}}}\n',
    })


@pytest.fixture(autouse=True)
def only_loopback(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Every connection any test here makes goes to 127.0.0.1; anything else fails the test at once."""
    seen: list[Any] = []
    real_connect = socket.socket.connect

    def connect(self: socket.socket, address: Any) -> Any:
        seen.append(address)
        if self.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in ("127.0.0.1", "::1"):
            raise AssertionError(f"connection to {address!r} attempted; tests may only reach 127.0.0.1")
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    yield seen
    assert all(a[0] == "127.0.0.1" for a in seen if isinstance(a, tuple))


def _checkpoint(tmp_path: Path, repo_id: str = "acme/tiny-model", key: str = "model.id") -> downloads.Checkpoint:
    return downloads.Checkpoint(repo_id=repo_id, cache_dir=tmp_path / "hf" / "hub", source="recipes/custom.yaml", key=key)


# ---------------------------------------------------------------------------------------------------
# Downloads


def test_a_small_repo_lands_in_the_cache_the_container_reads(tmp_path: Path, only_loopback: list[Any]) -> None:
    repo = small_repo()
    events: list[downloads.Progress] = []
    with FakeHub({"acme/tiny-model": repo}) as fake:
        fetched = downloads.download(_checkpoint(tmp_path), events.append, endpoint=fake.endpoint)
    assert fetched.commit == repo.sha
    storage = tmp_path / "hf" / "hub" / "models--acme--tiny-model"
    assert fetched.path == storage / "snapshots" / repo.sha
    for name, data in repo.files.items():
        assert (fetched.path / name).read_bytes() == data
    assert (storage / "refs" / "main").read_text() == repo.sha  # how an offline engine resolves "main"
    # Exactly one whole GET per file; per-file progress ends at 3 of 3 files and every byte.
    assert sorted(e.path.rsplit("/", 1)[1] for e in fake.gets()) == sorted(repo.files)
    assert all("range" not in e.headers for e in fake.gets())
    total = sum(len(d) for d in repo.files.values())
    assert sum(e.body_bytes for e in fake.gets()) == total
    assert events and (events[-1].files_done, events[-1].files_total) == (3, 3)
    assert events[-1].bytes_done == events[-1].bytes_total == total
    assert fetched.bytes_received == total
    assert only_loopback  # the guard saw the connections


def test_a_second_pull_downloads_nothing(tmp_path: Path) -> None:
    with FakeHub({"acme/tiny-model": small_repo()}) as fake:
        downloads.download(_checkpoint(tmp_path), endpoint=fake.endpoint)
        before = len(fake.gets())
        again = downloads.download(_checkpoint(tmp_path), endpoint=fake.endpoint)
    assert len(fake.gets()) == before
    assert again.bytes_received == 0


def test_a_complete_cache_is_enough_when_the_hub_is_unreachable(tmp_path: Path) -> None:
    with FakeHub({"acme/tiny-model": small_repo()}) as fake:
        first = downloads.download(_checkpoint(tmp_path), endpoint=fake.endpoint)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    again = downloads.download(_checkpoint(tmp_path), endpoint=closed)
    assert (again.commit, again.path, again.bytes_received) == (first.commit, first.path, 0)


def test_a_dropped_connection_resumes_with_a_range_request(tmp_path: Path) -> None:
    # huggingface_hub writes in 10 MiB chunks and resumes from the last whole chunk, so the file is larger.
    size, chunk = 12 * 1024 * 1024 + 5, 10 * 1024 * 1024
    repo = small_repo()
    repo.files["model.safetensors"] = _weights(size)
    cut = chunk + 512 * 1024
    with FakeHub({"acme/tiny-model": repo}) as fake:
        fake.faults[("acme/tiny-model", "model.safetensors")] = Fault(drop_after=cut)
        fetched = downloads.download(_checkpoint(tmp_path), endpoint=fake.endpoint)
    first, second = fake.gets("model.safetensors")
    assert "range" not in first.headers and first.body_bytes == cut
    assert second.headers["range"] == f"bytes={chunk}-" and second.status == 206
    assert second.body_bytes == size - chunk  # only the remainder crossed the wire again
    assert (fetched.path / "model.safetensors").read_bytes() == repo.files["model.safetensors"]
    small = sum(len(d) for name, d in repo.files.items() if name != "model.safetensors")
    assert fetched.bytes_received == size + small


def test_an_interrupted_pull_fetches_only_what_is_missing_next_time(tmp_path: Path) -> None:
    repo = small_repo()
    with FakeHub({"acme/tiny-model": repo}) as fake:
        fake.faults[("acme/tiny-model", "model.safetensors")] = Fault(status=500)
        with pytest.raises(SparklabError) as failed:
            downloads.download(_checkpoint(tmp_path), endpoint=fake.endpoint)
        assert "acme/tiny-model" in failed.value.message and "500" in failed.value.message
        done = len(fake.gets())
        # huggingface_hub may cancel downloads not yet started when one fails (a race under load): what is
        # in the snapshot after the failure is what the next pull must not fetch again
        kept = {p.name for p in tmp_path.glob("hf/hub/models--acme--tiny-model/snapshots/*/*")}
        fetched = downloads.download(_checkpoint(tmp_path), endpoint=fake.endpoint)
    assert "model.safetensors" not in kept
    missing = set(repo.files) - kept
    assert sorted(e.path.rsplit("/", 1)[1] for e in fake.gets()[done:]) == sorted(missing)
    # the weights, and any small file the failed pull had not yet linked (measured under load: a 58-byte one)
    assert fetched.bytes_received == sum(len(repo.files[name]) for name in missing) >= WEIGHTS_SIZE
    assert (fetched.path / "model.safetensors").read_bytes() == repo.files["model.safetensors"]


# ---------------------------------------------------------------------------------------------------
# Errors the user can act on


def test_a_gated_repo_without_a_token_says_to_set_hf_token(tmp_path: Path) -> None:
    repo = small_repo()
    repo.gated = True
    with FakeHub({"acme/gated-model": repo}, token=SECRET) as fake, pytest.raises(SparklabError) as raised:
        downloads.download(_checkpoint(tmp_path, "acme/gated-model"), endpoint=fake.endpoint)
    text = str(raised.value)
    assert "acme/gated-model" in raised.value.message and "gated" in raised.value.message
    assert "HF_TOKEN" in text and "\n\n" not in raised.value.message
    assert not fake.gets()  # refused at the HEAD, nothing downloaded


def test_a_gated_repo_downloads_with_the_token_from_the_environment(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    repo = small_repo()
    repo.gated = True
    monkeypatch.setenv("HF_TOKEN", SECRET)
    with FakeHub({"acme/gated-model": repo}, token=SECRET) as fake:
        fetched = downloads.download(_checkpoint(tmp_path, "acme/gated-model"), endpoint=fake.endpoint)
    assert fetched.commit == repo.sha
    assert all(e.headers.get("authorization") == f"Bearer {SECRET}" for e in fake.log)


@pytest.mark.parametrize(("token", "status"), [(None, 401), (SECRET, 404)])
def test_a_missing_repo_names_the_recipe_file_and_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      token: str | None, status: int) -> None:
    if token:
        monkeypatch.setenv("HF_TOKEN", token)
    checkpoint = _checkpoint(tmp_path, "acme/no-such-draft", key="model.drafts.dspark.id")
    with FakeHub({}) as fake, pytest.raises(SparklabError) as raised:
        downloads.download(checkpoint, endpoint=fake.endpoint)
    text = str(raised.value)
    assert fake.log[0].status == status
    assert "acme/no-such-draft" in text and "recipes/custom.yaml" in text and "model.drafts.dspark.id" in text
    assert ("HF_TOKEN" in text) == (status == 401)  # anonymous: it may exist but be private or gated


def test_an_unreachable_hub_names_the_endpoint_and_hf_endpoint(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(SparklabError) as raised:
        downloads.download(_checkpoint(tmp_path), endpoint=f"http://127.0.0.1:{port}")
    text = str(raised.value)
    assert f"127.0.0.1:{port}" in raised.value.message and "acme/tiny-model" in raised.value.message
    assert "HF_ENDPOINT" in text


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str = "2m") -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                              capture_output=True, text=True, timeout=30)
    except (FileNotFoundError, PermissionError) as exc:
        pytest.skip(f"cannot mount a tmpfs here ({exc}): the disk-full case needs root and mount(8)")
    if done.returncode != 0:
        pytest.skip(f"mount -t tmpfs was refused ({done.stderr.strip() or done.returncode}): the disk-full case "
                    "needs root and a kernel that lets this container mount")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


@pytest.mark.tmpfs
def test_a_full_disk_names_the_path_and_the_free_space(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "small") as small, FakeHub({"acme/tiny-model": small_repo()}) as fake:
        checkpoint = downloads.Checkpoint("acme/tiny-model", small / "hub", "recipes/custom.yaml", "model.id")
        with pytest.raises(SparklabError) as raised:
            downloads.download(checkpoint, endpoint=fake.endpoint)
        message = raised.value.message
        assert "no space left" in message.lower() and str(small / "hub") in message
        assert "free" in message and "acme/tiny-model" in message
        assert not list((small / "hub").rglob("*.incomplete"))  # no half file left taking the space


def test_hf_token_never_appears_in_output_logs_or_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str],
                                                         caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("HF_TOKEN", SECRET)
    gated = small_repo()
    gated.gated = True
    texts: list[str] = []
    with FakeHub({"acme/gated-model": gated, "acme/tiny-model": small_repo()}, token="hf_anotherToken") as fake:
        fake.faults[("acme/tiny-model", "model.safetensors")] = Fault(drop_after=1000)  # a retry is logged
        downloads.download(_checkpoint(tmp_path), endpoint=fake.endpoint)
        for repo_id in ("acme/gated-model", "acme/absent"):
            with pytest.raises(SparklabError) as raised:
                downloads.download(_checkpoint(tmp_path, repo_id), endpoint=fake.endpoint)
            error: BaseException | None = raised.value
            while error is not None:  # the whole chain, in case a traceback is shown with --debug
                texts += [str(error), repr(error), str(getattr(error, "hint", ""))]
                error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    captured = capsys.readouterr()
    texts += [captured.out, captured.err, caplog.text, *(r.getMessage() for r in caplog.records)]
    assert any(e.headers.get("authorization") == f"Bearer {SECRET}" for e in fake.log)  # it was used
    assert caplog.records  # the logs were really captured
    assert not [t for t in texts if SECRET in t]


# ---------------------------------------------------------------------------------------------------
# What a plan needs (pure)


def _gb10_spec(method: str, engine: str = "vllm", hf_cache: Path = Path("/data/hf")) -> tuple[Any, Any]:
    recipe = load_recipe(recipes_dir() / "gb10.yaml")
    return recipe, render(recipe, engine, method, LaunchOptions(hf_cache=hf_cache))


@pytest.mark.parametrize(("engine", "method", "drafts"), [
    ("vllm", "none", []),
    ("vllm", "mtp", []),
    ("vllm", "dspark", ["nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4-DSpark"]),
    ("vllm", "dflash", ["nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4-DFlash"]),
    ("sglang", "eagle", []),  # its draft path is the target itself
])
def test_the_target_and_only_the_drafts_the_argv_references(engine: str, method: str, drafts: list[str]) -> None:
    recipe, spec = _gb10_spec(method, engine)
    found = downloads.checkpoints(recipe, spec)
    assert [c.repo_id for c in found] == [recipe.model.id, *drafts]
    assert {c.cache_dir for c in found} == {Path("/data/hf/hub")}
    assert found[0].key == "model.id" and found[0].source.endswith("gb10.yaml")
    assert [c.key for c in found[1:]] == [f"model.drafts.{method}.id" for _ in drafts]


def test_local_paths_are_not_downloaded() -> None:
    recipe = load_recipe(recipes_dir() / "cpu.yaml")
    for method in ("none", "ngram", "draft_model"):
        assert downloads.checkpoints(recipe, render(recipe, None, method)) == []


def test_the_cache_is_where_the_container_looks() -> None:
    _, spec = _gb10_spec("none")
    assert downloads.host_hub_cache(spec) == Path("/data/hf/hub")
    moved = replace(spec, env={**spec.env, "HF_HOME": "/root/.cache/huggingface/elsewhere"})
    assert downloads.host_hub_cache(moved) == Path("/data/hf/elsewhere/hub")
    pinned = replace(spec, env={**spec.env, "HF_HUB_CACHE": "/root/.cache/huggingface/h"})
    assert downloads.host_hub_cache(pinned) == Path("/data/hf/h")
    outside = replace(spec, env={**spec.env, "HF_HOME": "/opt/hf"})
    assert downloads.host_hub_cache(outside) is None  # not on the mount: a pull could not help this container
    assert downloads.host_hub_cache(replace(spec, mounts=(), hf_cache=None)) is None


def test_a_sweep_needs_each_checkpoint_once() -> None:
    plan = build_plan(recipes_dir() / "sweeps" / "seed000.yaml")
    found = downloads.plan_checkpoints((s.recipe, s.spec) for s in plan.servers)
    assert [c.repo_id for c in found] == [
        "nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4",
        "nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4-DFlash",
        "nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4-DSpark",
    ]


@pytest.mark.parametrize(("ref", "expected"), [
    ("nvidia/Some-Model_v2.1", True), ("/models/SmolLM2", False), ("./local/dir", False), ("~/m/x", False),
    ("ngram", False), ("gpt2", False), ("a/b/c", False), ("org/..", False), ("org--x/y", False), ("", False),
])
def test_what_counts_as_a_hub_id(ref: str, expected: bool) -> None:
    assert downloads.is_hub_id(ref) is expected


def test_containers_get_offline_mode() -> None:
    assert downloads.offline_env() == {"HF_HUB_OFFLINE": "1"}
