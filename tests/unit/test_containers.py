"""containers.py against a fake docker-py client: pull stream handling and cleanup on a failed start."""

from __future__ import annotations

import dataclasses
import io
from types import SimpleNamespace
from typing import Any

import docker.errors
import pytest
from rich.console import Console

from sparklab.cli.progress import PullProgress
from sparklab.errors import ContainerError
from sparklab.recipes.render import LaunchOptions, render
from sparklab.recipes.schema import load_recipe, recipes_dir
from sparklab.runtimes.containers import Docker
from sparklab.runtimes.docker_images import _split_ref
from sparklab.runtimes.owners import owner_alive, owner_token

DIGEST = "sha256:" + "ab" * 32
PORT_TAKEN = "driver failed programming external connectivity: Bind for 127.0.0.1:8000 failed: port is already allocated"
# dockerd 20.10.24's answer to a start on its default bridge once the interface docker0 is gone (seen on this machine,
# 2026-12-05, after a second dockerd started with --bridge=none had deleted it)
BRIDGE_GONE = ("failed to create endpoint stoic_feistel on network bridge: adding interface veth34fde77 to bridge "
               "docker0 failed: could not find bridge docker0: route ip+net: no such network interface")


class FakeImages:
    def __init__(self, present: bool) -> None:
        self.present = present

    def get(self, ref: str) -> Any:
        if not self.present:
            raise docker.errors.ImageNotFound("no such image")
        return SimpleNamespace(id="sha256:img", attrs={"RepoDigests": [f"{ref.rsplit(':', 1)[0]}@{DIGEST}"],
                                                      "Architecture": "amd64"})


class FakeClient:
    def __init__(self, events: list[dict[str, Any]], present_after_pull: bool = True,
                 start_error: str = PORT_TAKEN) -> None:
        self.events = events
        self.start_error = start_error
        self.pulled: list[tuple[str, str | None]] = []
        self.images = FakeImages(present=False)
        self._present_after = present_after_pull
        self.api = SimpleNamespace(pull=self._pull)
        self.created: list[FakeContainer] = []
        self.containers = SimpleNamespace(create=self._create, get=self._get)

    def _pull(self, repo: str, tag: str | None = None, **kwargs: Any):
        self.pulled.append((repo, tag))
        yield from self.events
        self.images.present = self._present_after

    def _create(self, image: str, **kwargs: Any) -> FakeContainer:
        container = FakeContainer(kwargs["name"], self.start_error)
        self.created.append(container)
        return container

    def _get(self, name: str) -> Any:
        raise docker.errors.NotFound("none")


class FakeContainer:
    def __init__(self, name: str, explanation: str = PORT_TAKEN) -> None:
        self.name = name
        self.removed = False
        self.explanation = explanation

    def start(self) -> None:
        response = SimpleNamespace(status_code=500, reason="err")
        raise docker.errors.APIError("500", response=response,  # type: ignore[arg-type]
                                     explanation=self.explanation)

    def remove(self, force: bool = False) -> None:
        self.removed = True


LAYER_EVENTS = [
    {"status": "Pulling from sparklab/standin", "id": "1"},
    {"status": "Waiting", "id": "aaaa"},
    {"status": "Downloading", "progressDetail": {"current": 10, "total": 100}, "id": "aaaa"},
    {"status": "Extracting", "progressDetail": {"current": 3, "units": "s"}, "id": "aaaa"},  # no total
    {"status": "Pull complete", "progressDetail": {}, "id": "aaaa"},
    {"status": f"Digest: {DIGEST}"},
    {"status": "Status: Downloaded newer image for x:1"},
]


def test_pull_reports_layers_tolerates_missing_totals_and_records_the_digest() -> None:
    client = FakeClient(LAYER_EVENTS)
    seen: list[tuple[str, str, int | None, int | None]] = []
    info = Docker(client).pull("127.0.0.1:5000/sparklab/standin:1",  # type: ignore[arg-type]
                               lambda *e: seen.append(e))
    assert client.pulled == [("127.0.0.1:5000/sparklab/standin", "1")]
    assert ("aaaa", "Downloading", 10, 100) in seen
    assert ("aaaa", "Extracting", 3, None) in seen
    assert info.digest == DIGEST


def test_progress_bar_accepts_every_event_shape() -> None:
    with PullProgress(Console(file=io.StringIO())) as bar:
        for event in LAYER_EVENTS:
            detail = event.get("progressDetail") or {}
            bar.update(str(event.get("id", "")), event["status"], detail.get("current"), detail.get("total"))
    assert set(bar.tasks) == {"aaaa"}  # one bar per layer, none for the "Pulling from" line


def test_error_detail_in_the_stream_is_an_error() -> None:
    events = [{"status": "Pulling fs layer", "id": "bbbb"},
              {"errorDetail": {"message": "manifest unknown"}, "error": "manifest unknown"}]
    with pytest.raises(ContainerError, match="pull of x/y:1 failed: manifest unknown"):
        Docker(FakeClient(events)).pull("x/y:1")  # type: ignore[arg-type]


def test_policies() -> None:
    client = FakeClient(LAYER_EVENTS)
    with pytest.raises(ContainerError, match="not present locally and --pull never"):
        Docker(client).ensure_image("x/y:1", "never")  # type: ignore[arg-type]
    Docker(client).ensure_image("x/y:1", "missing")  # type: ignore[arg-type]
    Docker(client).ensure_image("x/y:1", "missing")  # type: ignore[arg-type]
    assert len(client.pulled) == 1  # present after the first pull
    Docker(client).ensure_image("x/y:1", "always")  # type: ignore[arg-type]
    assert len(client.pulled) == 2


def test_failed_start_removes_the_created_container_and_names_the_port() -> None:
    client = FakeClient([])
    spec = render(load_recipe(recipes_dir() / "gb10.yaml"), "vllm", "none", LaunchOptions(run_id="t"))
    with pytest.raises(ContainerError) as exc:
        Docker(client).launch(spec, {})  # type: ignore[arg-type]
    assert client.created[0].removed
    assert "Port 8000 is taken" in str(exc.value)


@pytest.mark.parametrize(("ref", "split"), [
    ("vllm/vllm-openai:v0.27.1-aarch64", ("vllm/vllm-openai", "v0.27.1-aarch64")),
    ("127.0.0.1:5000/sparklab/standin", ("127.0.0.1:5000/sparklab/standin", "latest")),
    (f"repo/img@{DIGEST}", (f"repo/img@{DIGEST}", None)),
])
def test_split_ref(ref: str, split: tuple[str, str | None]) -> None:
    assert _split_ref(ref) == split


def test_owner_token_tracks_this_process_and_a_dead_one() -> None:
    assert owner_alive(owner_token())
    host, boot, pid, started = owner_token().split("/")
    assert not owner_alive(f"{host}/{boot}/{pid}/{int(started) + 1}")  # same pid, other start: reused
    assert not owner_alive(f"{host}/otherboot/{pid}/{started}")
    assert owner_alive(f"some-other-host/{boot}/{pid}/{started}")  # cannot judge: leave it
    assert not owner_alive("garbage")


def test_logs_are_redacted_of_every_secret_the_container_was_given() -> None:
    from sparklab.redaction import redacted_lines
    from sparklab.runtimes.container_server import container_secrets

    container = SimpleNamespace(attrs={"Config": {
        "Env": ["HF_TOKEN=hf_abcdef123", "VLLM_API_KEY=key-987654", "PATH=/usr/bin", "EMPTY_TOKEN="],
        "Cmd": ["-m", "sglang.launch_server", "--api-key", "sgl-key-555", "--port", "30000"]}})
    secrets = container_secrets(container)  # type: ignore[arg-type]
    assert sorted(secrets) == [b"hf_abcdef123", b"key-987654", b"sgl-key-555"]
    # A secret split across stream chunks is still caught: lines are reassembled first.
    chunks = [b"server_args=ServerArgs(api_key='sgl-k", b"ey-555', port=30000)\nHF_TOKEN=hf_abcdef123\ntail"]
    out = b"".join(redacted_lines(iter(chunks), secrets))
    assert out == b"server_args=ServerArgs(api_key='***', port=30000)\nHF_TOKEN=***\ntail"


def test_a_start_on_a_default_bridge_whose_interface_is_gone_says_how_to_make_it_again() -> None:
    client = FakeClient([], start_error=BRIDGE_GONE)
    spec = dataclasses.replace(render(load_recipe(recipes_dir() / "gb10.yaml"), "vllm", "none",
                                      LaunchOptions(run_id="t")), network="bridge")  # a recipe's network: bridge
    with pytest.raises(ContainerError) as exc:
        Docker(client).launch(spec, {})  # type: ignore[arg-type]
    assert client.created[0].removed
    assert "could not find bridge docker0" in exc.value.message  # Docker's own words, then what to do
    assert exc.value.hint is not None and "restart the Docker daemon" in exc.value.hint, exc.value.hint
