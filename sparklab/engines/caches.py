"""Engine caches that survive between servers: one directory per image digest, mounted into every container.

torch.compile, Inductor, Triton and FlashInfer JIT redo minutes of work at every start unless their caches
outlive the container. sparklab keeps them under `$SPARKLAB_CACHE/engine-cache/<digest prefix>/` (default
`~/.cache/sparklab`), mounted at TARGET; which variables point into it is each engine adapter's
`cache_env`. A cache is keyed by the image, because compiled kernels belong to one engine build.

`render` mounts `<root>/<image-digest>` (resolved when the recipe pins a digest); `bind` resolves it once the
pull has told the digest. `scan`/`choose_trim`/`remove` are `sparklab gc --caches`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparklab.errors import SparklabError

if TYPE_CHECKING:
    from sparklab.spec import LaunchSpec

TARGET = "/sparklab/engine-cache"  # where the cache appears in every container
DIGEST_PLACEHOLDER = "<image-digest>"  # in a rendered mount whose image is not pulled yet
STAMP = ".sparklab-cache.json"  # {"image", "digest", "last_used"}, rewritten at every start
KEY_LENGTH = 16  # hex digits of the digest that name the directory


def default_root() -> Path:
    return Path(os.environ.get("SPARKLAB_CACHE") or "~/.cache/sparklab").expanduser() / "engine-cache"


def key_of(digest: str) -> str:
    """`sha256:0123…` → `0123456789abcdef`."""
    return digest.partition(":")[2][:KEY_LENGTH] or digest[:KEY_LENGTH]


def pinned_digest(image: str) -> str | None:
    """The digest of a `repo@sha256:…` reference, known before any pull."""
    return image.rsplit("@", 1)[1] if "@" in image else None


def source(root: Path, image: str) -> str:
    """The host directory to mount: resolved for a pinned image, else the placeholder `bind` resolves."""
    digest = pinned_digest(image)
    return str(root / (key_of(digest) if digest else DIGEST_PLACEHOLDER))


def bind(spec: LaunchSpec, image: str, digest: str | None, image_id: str | None = None) -> LaunchSpec:
    """The spec with its cache mount pointing at this image's directory, created and stamped as used now.

    Keyed by the registry digest; an image that never came from a registry has none, so its image id keys it."""
    if spec.engine_cache is None:
        return spec
    by = digest or image_id
    if not by:
        raise SparklabError(f"cannot key the engine cache: {image} has neither a digest nor an id")
    path = Path(spec.engine_cache) / key_of(by)
    try:
        path.mkdir(parents=True, exist_ok=True)
        _write_stamp(path, {"image": image, "digest": by, "last_used": time.time()})
    except OSError as exc:
        raise SparklabError(f"cannot prepare the engine cache {path}: {exc}",
                            "Free or fix that directory, set SPARKLAB_CACHE elsewhere, or give the recipe's engine "
                            "`engine_cache: false`.") from None
    mounts = tuple(dataclasses.replace(m, source=str(path)) if m.target == TARGET else m for m in spec.mounts)
    return dataclasses.replace(spec, mounts=mounts)


def _write_stamp(path: Path, stamp: dict[str, Any]) -> None:
    tmp = path / f"{STAMP}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(stamp))
    os.replace(tmp, path / STAMP)


# ---------------------------------------------------------------------------------------------------
# sparklab gc --caches


@dataclass(frozen=True)
class CacheEntry:
    key: str
    path: Path
    image: str
    digest: str
    size_bytes: int
    last_used: float
    in_use: bool


def _read_stamp(path: Path) -> dict[str, Any]:
    with contextlib.suppress(OSError, ValueError):
        stamp = json.loads((path / STAMP).read_text())
        if isinstance(stamp, dict):
            return stamp
    return {}


def _size(path: Path) -> int:
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
    return total


def scan(root: Path, mounted: Iterable[str]) -> list[CacheEntry]:
    """Every cache under root, newest use first; `mounted` are the host paths containers mount."""
    if not root.is_dir():
        return []
    in_use = {os.path.normpath(m) for m in mounted}
    entries = []
    for path in root.iterdir():
        if not path.is_dir() or path.is_symlink():
            continue
        stamp = _read_stamp(path)
        last_used = stamp.get("last_used")
        if not isinstance(last_used, int | float):
            last_used = path.stat().st_mtime
        entries.append(CacheEntry(
            key=path.name, path=path, image=str(stamp.get("image", "?")), digest=str(stamp.get("digest", "?")),
            size_bytes=_size(path), last_used=float(last_used), in_use=os.path.normpath(path) in in_use))
    return sorted(entries, key=lambda e: e.last_used, reverse=True)


def choose_trim(entries: list[CacheEntry], keep: int | None = None, max_gib: float | None = None) -> list[CacheEntry]:
    """What to remove (entries newest first): beyond the `keep` most recent, then the oldest until the rest
    fits in `max_gib`. A cache some container mounts is never chosen."""
    chosen: list[CacheEntry] = []
    if keep is not None:
        chosen = [e for e in entries[keep:] if not e.in_use]
    if max_gib is not None:
        budget = max_gib * (1 << 30)
        total = sum(e.size_bytes for e in entries if e not in chosen)
        for entry in reversed(entries):
            if total <= budget:
                break
            if entry in chosen or entry.in_use:
                continue
            chosen.append(entry)
            total -= entry.size_bytes
    return chosen


def remove(entries: list[CacheEntry]) -> list[CacheEntry]:
    removed = []
    for entry in entries:
        try:
            shutil.rmtree(entry.path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise SparklabError(
                f"could not remove the engine cache {entry.path}: {exc}",
                "Engines run as root in their containers, so their files may be root's: remove it as root.") from None
        removed.append(entry)
    return removed


def _gib(size: int) -> str:
    return f"{size / (1 << 30):.2f} GiB" if size >= 1 << 30 else f"{size / (1 << 20):.1f} MiB"


def _age(seconds: float) -> str:
    for unit, span in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= span:
            return f"{seconds / span:.0f} {unit} ago"
    return "just now"


def describe(entries: list[CacheEntry], removed: list[CacheEntry], now: float | None = None) -> list[str]:
    """One line per cache (digest, size, last use, image, state), then a total."""
    now = time.time() if now is None else now
    gone = {e.key for e in removed}
    lines = []
    for e in entries:
        state = "removed" if e.key in gone else "in use" if e.in_use else "kept"
        lines.append(f"{e.key}  {_gib(e.size_bytes):>10}  {_age(now - e.last_used):>12}  {state:7}  {e.image}")
    left = sum(e.size_bytes for e in entries if e.key not in gone)
    lines.append(f"{len(entries)} engine cache(s), {len(removed)} removed ({_gib(sum(e.size_bytes for e in removed))})"
                 f", {_gib(left)} left")
    return lines
