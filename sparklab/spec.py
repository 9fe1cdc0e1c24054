"""What one server launch is, once rendered: the pivot type of the pipeline (pure, imports nothing of sparklab).

A recipe renders to a `LaunchSpec` (sparklab.recipes.render); a runtime starts it (sparklab.runtimes); engine adapters
read it (sparklab.engines). It holds no secret value: the API key is `API_KEY_PLACEHOLDER` until a runtime starts the
server, and secret environment variables are named, never valued (`secret_env`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

API_KEY_PLACEHOLDER = "<redacted:api-key>"
# HF_TOKEN, GITHUB_TOKEN, VLLM_API_KEY, AWS_SECRET_ACCESS_KEY, DB_PASSWORD…, but not STANDIN_REASONING_TOKENS.
_SECRET_NAME = re.compile(r"(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|KEY|CREDENTIALS?)$", re.IGNORECASE)
PASSTHROUGH_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
SESSION_ENV = "SPARKLAB_SESSION"  # a name for everything one session of sparklab commands starts
SESSION_LABEL = "sparklab.session"


def session() -> str | None:
    """The session named by SPARKLAB_SESSION (None: unset): every container and host process this sparklab
    starts carries it as a label, and its cleanup of orphans (gc, and the one at the start of up and sweep)
    touches that session's only. The test suite sets one, so it never removes what a night started."""
    return os.environ.get(SESSION_ENV) or None


def session_labels() -> dict[str, str]:
    """The session's label for what this sparklab starts (servers, probes, helpers): none without a session."""
    current = session()
    return {SESSION_LABEL: current} if current else {}


def in_session(labels: dict[str, str]) -> bool:
    """Whether a server with these labels is this session's to clean up (every server, without a session)."""
    current = session()
    return current is None or labels.get(SESSION_LABEL) == current


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name))


@dataclass(frozen=True)
class Speculative:
    """The speculative-decoding settings an argv asks for, in engine-neutral terms."""

    method: str | None
    num_speculative_tokens: int | None
    draft_model: str | None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    mode: str = "rw"


@dataclass(frozen=True)
class LaunchSpec:
    """Everything needed to start one server container. Holds no secret values."""

    recipe: str
    recipe_path: str
    engine: str
    kind: str
    method: str
    image: str
    image_alternatives: tuple[str, ...]  # tried in order when the registry has no `image`
    platform: str | None
    entrypoint: tuple[str, ...]
    argv: tuple[str, ...]
    env: dict[str, str]
    secret_env: tuple[str, ...]  # names whose values are supplied at launch, never printed or stored
    host: str
    port: int
    network: str
    ipc: str
    shm_size: str | None
    ulimits: dict[str, tuple[int, int]]
    gpus: bool
    mounts: tuple[Mount, ...]
    labels: dict[str, str]
    name: str
    ready_path: str
    ready_timeout_s: float
    speculative: Speculative | None
    recipe_argv_len: int  # argv[:recipe_argv_len] came from the recipe; the rest sparklab added
    needs_api_key: bool = False
    api_key_env: str | None = None  # the env var that carries the API key to the engine, if any
    public: bool = False
    hf_cache: str | None = None
    engine_cache: str | None = None  # the engine caches' root on the host (None: the recipe opted out)
    # Secret values given as --env NAME=VALUE: only containers.launch reads them; never printed or stored.
    secret_values: dict[str, str] = field(default_factory=dict, repr=False)
    runtime: str = "container"  # or "process": entrypoint[0] is a program on this host (sparklab/processes.py)
    address: str | None = None  # the Docker host's address as the controller reaches it (None: this machine)

    @property
    def endpoint(self) -> str:
        return endpoint_url(self.host, self.port, self.address)


def endpoint_url(host: str, port: int, address: str | None) -> str:
    if address:
        return f"http://{address}:{port}"
    return f"http://{'127.0.0.1' if host in ('0.0.0.0', '127.0.0.1') else host}:{port}"
