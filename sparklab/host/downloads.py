"""Model checkpoints from the Hugging Face Hub, fetched before any server's clock starts.

This is the only module that imports huggingface_hub. It works out which repositories a rendered plan needs
(the target and each draft its argv names), downloads them into the Hub cache that the containers mount, and
returns the commit each one resolved to, so a run can record exactly which weights it measured. Containers
then run with `offline_env()`, so a file missing there is an error at start instead of a silent download
under the readiness deadline.

`HF_TOKEN` is read from the environment and handed to huggingface_hub only; no message or log line here
contains it.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import threading
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from huggingface_hub import constants as hf_constants
from huggingface_hub import snapshot_download
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from sparklab.engines import engine
from sparklab.errors import SparklabError
from sparklab.host.disk import free_bytes
from sparklab.recipes.schema import Recipe
from sparklab.spec import LaunchSpec

log = logging.getLogger(__name__)

# `org/name`: what vLLM and SGLang resolve on the Hub. Paths, `ngram` and bare names are left alone.
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def offline_env() -> dict[str, str]:
    """Environment for server containers: the Hub cache is read-only truth, nothing is fetched at start."""
    return {"HF_HUB_OFFLINE": "1"}


def offline_for(spec: LaunchSpec) -> dict[str, str]:
    """offline_env() where the checkpoints were fetched into the cache the engine reads and it reads nothing else
    from the Hub: a container whose Hub cache is mounted, a host process whose adapter says where it reads
    (Engine.process_hub_cache); else nothing: a host process that fetches on its own must stay online."""
    if spec.runtime == "process":
        env = {**os.environ, **spec.env}
        return offline_env() if engine(spec.kind).process_hub_cache(spec, env) is not None else {}
    return offline_env() if host_hub_cache(spec) is not None else {}


def is_hub_id(ref: str) -> bool:
    return bool(_HUB_ID.match(ref)) and "--" not in ref and ".." not in ref and not Path(ref).expanduser().exists()


@dataclass(frozen=True)
class Checkpoint:
    """One repository a plan needs, the cache it goes to (host path), and where the recipe names it."""

    repo_id: str
    cache_dir: Path
    source: str  # the recipe file
    key: str  # the key in it: model.id or model.drafts.NAME.id
    revision: str = "main"

    @property
    def where(self) -> str:
        return f"{self.source}: {self.key}"


@dataclass(frozen=True)
class Progress:
    """Where one repository's download stands: files finished of all, bytes written of all to write."""

    repo_id: str
    files_done: int
    files_total: int | None
    bytes_done: int
    bytes_total: int | None


ProgressCallback = Callable[[Progress], None]


@dataclass(frozen=True)
class Fetched:
    checkpoint: Checkpoint
    commit: str  # the resolved revision, to record with the run
    path: Path  # the snapshot folder
    seconds: float
    bytes_received: int  # over the network in this call; 0 when the cache already had everything


# ---------------------------------------------------------------------------------------------------
# What a plan needs (pure)


def host_hub_cache(spec: LaunchSpec) -> Path | None:
    """The host directory the container reads as its Hub cache, or None when it sees no host cache.

    Inside the container the cache is $HF_HUB_CACHE, else $HF_HOME/hub, else <mount target>/hub (the recipe's
    hf_cache_target is where the engine's user keeps ~/.cache/huggingface). Mapped back through the mount.
    A host-process engine reads the host's own cache: the recipe's or this environment's variables, else
    huggingface_hub's default ~/.cache/huggingface/hub.
    """
    if spec.runtime == "process":
        env = {**os.environ, **spec.env}
        own = engine(spec.kind).process_hub_cache(spec, env)  # an engine that keeps its own (Edge-LLM)
        if own is not None:
            return own
        home = env.get("HF_HOME") or "~/.cache/huggingface"
        return Path(env.get("HF_HUB_CACHE") or f"{home}/hub").expanduser()
    mount = next((m for m in spec.mounts if spec.hf_cache and m.source == spec.hf_cache), None)
    if mount is None:
        return None
    home = spec.env.get("HF_HOME") or mount.target
    inside = PurePosixPath(spec.env.get("HF_HUB_CACHE") or f"{home}/hub")
    try:
        relative = inside.relative_to(PurePosixPath(mount.target))
    except ValueError:
        return None
    return Path(mount.source, *relative.parts)


def _mentions(argv: Iterable[str], repo_id: str) -> bool:
    pattern = re.compile(rf"(?<![\w./-]){re.escape(repo_id)}(?![\w./-])")
    return any(pattern.search(arg) for arg in argv)


def checkpoints(recipe: Recipe, spec: LaunchSpec) -> list[Checkpoint]:
    """The target and each draft the rendered argv references, when they are Hub ids and a cache is mounted."""
    cache = host_hub_cache(spec)
    if cache is None:
        return []
    model = recipe.model_of(spec.engine)
    key = "model" if model is recipe.model else f"engines.{spec.engine}.model"
    wanted = [(model.id, f"{key}.id")]
    wanted += [(draft.id, f"{key}.drafts.{name}.id") for name, draft in model.drafts.items()
               if _mentions(spec.argv, draft.id)]
    found: dict[str, Checkpoint] = {}
    for repo_id, key in wanted:
        if is_hub_id(repo_id) and repo_id not in found:
            found[repo_id] = Checkpoint(repo_id, cache, recipe.source, key)
    return list(found.values())


def plan_checkpoints(servers: Iterable[tuple[Recipe, LaunchSpec]]) -> list[Checkpoint]:
    """Every checkpoint of every server, each (repository, revision, cache) once, in first-needed order."""
    found: dict[tuple[str, str, Path], Checkpoint] = {}
    for recipe, spec in servers:
        for c in checkpoints(recipe, spec):
            found.setdefault((c.repo_id, c.revision, c.cache_dir), c)
    return list(found.values())


# ---------------------------------------------------------------------------------------------------
# Downloading


def endpoint() -> str:
    """The Hub to download from: $HF_ENDPOINT (a mirror) or huggingface_hub's default, read at call time."""
    return (os.environ.get("HF_ENDPOINT") or hf_constants.ENDPOINT).rstrip("/")


def download(checkpoint: Checkpoint, on_progress: ProgressCallback | None = None, *,
             endpoint: str | None = None, max_workers: int = 8) -> Fetched:
    """Snapshot-download one repository into its cache; files already there are not fetched again.

    A connection dropped mid-file is resumed with a Range request (huggingface_hub retries it); a pull stopped
    any other way keeps every finished file, so the next pull fetches only what is missing.
    """
    url = (endpoint or globals()["endpoint"]()).rstrip("/")
    token = os.environ.get("HF_TOKEN") or None
    if hf_constants.is_offline_mode():
        raise SparklabError(f"cannot download {checkpoint.repo_id}: HF_HUB_OFFLINE is set in this environment",
                            "Unset HF_HUB_OFFLINE for sparklab pull (containers get it anyway).")
    _quiet_library_handler()
    bars = _Bars(checkpoint.repo_id, on_progress)
    started = time.monotonic()
    checkpoint.cache_dir.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            path = snapshot_download(checkpoint.repo_id, revision=checkpoint.revision,
                                     cache_dir=str(checkpoint.cache_dir), endpoint=url, token=token,
                                     tqdm_class=bars.tqdm_class(), max_workers=max_workers)
        except Exception as exc:
            raise _explain(exc, checkpoint, url, token, bars) from None
    for warning in caught:
        log.warning("%s: %s", checkpoint.repo_id, _scrub(str(warning.message), token))
    snapshot = Path(path)
    return Fetched(checkpoint, snapshot.name, snapshot, time.monotonic() - started, bars.received)


def download_all(needed: Iterable[Checkpoint], on_progress: ProgressCallback | None = None, *,
                 endpoint: str | None = None) -> list[Fetched]:
    return [download(c, on_progress, endpoint=endpoint) for c in needed]


def _quiet_library_handler() -> None:
    """huggingface_hub adds a stderr handler of its own; its warnings (a resumed download, low disk space)
    already propagate to sparklab's logging, so that handler would only print them a second time."""
    library = logging.getLogger("huggingface_hub")
    for handler in list(library.handlers):
        if type(handler) is logging.StreamHandler:
            library.removeHandler(handler)


class _Bars:
    """Turns the progress bars huggingface_hub opens into Progress events (it draws nothing itself).

    snapshot_download opens a files bar (one tick per finished file), a bytes-written bar whose total grows
    as each file starts, and a bytes-received bar (network bytes). The class handed over mimics the part of
    tqdm's interface it calls.
    """

    def __init__(self, repo_id: str, on_progress: ProgressCallback | None) -> None:
        self.repo_id = repo_id
        self.on_progress = on_progress
        self.lock = threading.Lock()
        self.files: Any = None
        self.written: Any = None
        self.received_bar: Any = None

    @property
    def received(self) -> int:
        return int(self.received_bar.n) if self.received_bar is not None else 0

    def opened(self, bar: Any, unit: str, desc: str) -> None:
        if unit != "B":
            self.files = bar
        elif desc.startswith("Downloading"):
            self.received_bar = bar
        else:
            self.written = bar

    def changed(self, bar: Any) -> None:
        if self.on_progress is None or bar is self.received_bar:
            return
        files, written = self.files, self.written
        event = Progress(self.repo_id, int(files.n) if files else 0, files.total if files else None,
                         int(written.n) if written else 0, int(written.total) if written and written.total else None)
        self.on_progress(event)

    def tqdm_class(self) -> type:
        bars = self

        class Bar:
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                self.n = kwargs.get("initial") or 0
                self.total = kwargs.get("total")
                self.disable = True
                self.format_dict: dict[str, Any] = {"rate": None}
                bars.opened(self, str(kwargs.get("unit", "it")), str(kwargs.get("desc") or ""))

            def update(self, n: float | None = 1) -> None:
                with bars.lock:
                    self.n += n or 0
                bars.changed(self)

            def refresh(self, *args: Any, **kwargs: Any) -> None:
                bars.changed(self)

            def close(self) -> None:
                pass

            def clear(self, *args: Any, **kwargs: Any) -> None:
                pass

            def set_description(self, *args: Any, **kwargs: Any) -> None:
                pass

            set_description_str = set_postfix_str = set_postfix = set_description

            def __enter__(self) -> Bar:
                return self

            def __exit__(self, *exc: object) -> None:
                pass

        return Bar


# ---------------------------------------------------------------------------------------------------
# Errors a user can act on


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


_NETWORK_ERRORS = {"TransportError", "NetworkError", "TimeoutException", "ProxyError", "RemoteProtocolError"}


def _is_network_error(exc: BaseException) -> bool:
    """httpx2 (huggingface_hub 2.x) and httpx share these class names; matching them avoids a third import."""
    if isinstance(exc, OfflineModeIsEnabled):
        return False
    return isinstance(exc, ConnectionError) or any(
        cls.__name__ in _NETWORK_ERRORS and cls.__module__.startswith("httpx") for cls in type(exc).__mro__)


def _scrub(text: str, token: str | None) -> str:
    return text.replace(token, "<redacted>") if token else text


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _explain(exc: Exception, c: Checkpoint, url: str, token: str | None, bars: _Bars) -> BaseException:
    chain = _chain(exc)
    repo = c.repo_id
    full = next((e for e in chain if isinstance(e, OSError) and e.errno == errno.ENOSPC), None)
    if full is not None:
        free = free_bytes(c.cache_dir)
        need = bars.written.total if bars.written is not None and bars.written.total else None
        return SparklabError(
            f"no space left on the device holding {c.cache_dir} while downloading {repo}: "
            f"{_gib(free) + ' free' if free is not None else 'free space unknown'}"
            + (f", this download needs {_gib(need)}" if need else "") + ".",
            "Free space there, or give the cache another disk (--hf-cache DIR or HF_HOME); "
            "finished files are kept, so sparklab pull continues where it stopped.")
    gated = next((e for e in chain if isinstance(e, GatedRepoError)), None)
    if gated is not None:
        with_token = "the token in HF_TOKEN has no access to it" if token else "no HF_TOKEN is set"
        return SparklabError(
            f"{c.where}: {repo} is a gated repository and the Hub refused the download "
            f"({_status(gated)}; {with_token}). Set HF_TOKEN to a token of an account that has accepted the "
            f"model's terms on its Hub page, then pull again.")
    missing = next((e for e in chain if isinstance(e, RepositoryNotFoundError)), None)
    if missing is not None:
        status = _status(missing)
        if status == "401" and not token:
            return SparklabError(
                f"{c.where}: the Hub has no repository {repo} visible without a token (401): it does not exist, "
                f"or it is private or gated.",
                f"Check the model id at {c.key} in {c.source}; if it is right, set HF_TOKEN to a token with "
                f"access to it.")
        return SparklabError(f"{c.where}: repository {repo} not found on the Hub ({status}).",
                             f"Check the model id at {c.key} in {c.source} (an id looks like org/name).")
    revision = next((e for e in chain if isinstance(e, RevisionNotFoundError)), None)
    if revision is not None:
        return SparklabError(f"{c.where}: {repo} has no revision {c.revision!r}.",
                             "Check the revision (a branch, tag or commit sha).")
    network = next((e for e in chain if _is_network_error(e)), None)
    if network is not None:
        return SparklabError(
            f"cannot reach the Hub at {url} to download {repo}: "
            f"{type(network).__name__}: {_scrub(str(network), token) or 'connection failed'}",
            "Check the network and any proxy (HTTPS_PROXY); HF_ENDPOINT can point to a mirror of the Hub. "
            "Finished files are kept: sparklab pull continues where it stopped.")
    http = next((e for e in chain if isinstance(e, HfHubHTTPError)), None)
    if http is not None:
        first = _scrub(str(http), token).strip().splitlines()[0] if str(http).strip() else ""
        return SparklabError(f"the Hub at {url} answered {_status(http)} while downloading {repo}: {first}",
                             "Try again later; finished files are kept, so sparklab pull continues where it stopped.")
    return exc


def _status(exc: HfHubHTTPError) -> str:
    response = getattr(exc, "response", None)
    return str(getattr(response, "status_code", "?"))
