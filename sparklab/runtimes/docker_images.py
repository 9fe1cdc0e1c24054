"""A Docker host's images: what it has (id, digest, architecture, labels), what its registry offers (platforms,
whether a ref can be pulled there), and a pull with per-layer progress under a pull policy. Part of the Docker
runtime: `containers.Docker` delegates its image methods here (no other module of the package imports this one).
"""

from __future__ import annotations

import docker
import docker.errors
import requests

from sparklab.errors import ContainerError, ImageUnavailableError
from sparklab.runtimes.base import ImageInfo, PullCallback


def _split_ref(image: str) -> tuple[str, str | None]:
    """`repo:tag` → (repo, tag); `repo@sha256:…` → (repo@sha256:…, None)."""
    if "@" in image:
        return image, None
    last = image.rsplit("/", 1)[-1]
    if ":" in last:
        repo, tag = image.rsplit(":", 1)
        return repo, tag
    return image, "latest"


_UNAVAILABLE = ("not found", "manifest unknown", "does not exist", "pull access denied", "name unknown")


def _pull_error(ref: str, message: str) -> ContainerError:
    if any(text in message.lower() for text in _UNAVAILABLE):
        return ImageUnavailableError(f"pull of {ref} failed: {message}",
                                     "Check the image name and tag, and that you may pull it (docker login).")
    return ContainerError(f"pull of {ref} failed: {message}",
                          "Check registry access, the network and free disk space.")


def image_info(client: docker.DockerClient, ref: str) -> ImageInfo | None:
    try:
        image = client.images.get(ref)
    except docker.errors.ImageNotFound:
        return None
    except docker.errors.APIError as exc:
        raise ContainerError(f"cannot inspect image {ref}: {exc.explanation}") from None
    digests = image.attrs.get("RepoDigests") or []
    repo = _split_ref(ref)[0].split("@")[0]
    digest = next((d.split("@", 1)[1] for d in digests if d.split("@")[0] == repo), None)
    if digest is None and digests:
        digest = digests[0].split("@", 1)[1]
    return ImageInfo(ref=ref, id=str(image.id), digest=digest, architecture=str(image.attrs.get("Architecture")))


def image_problem(client: docker.DockerClient, ref: str, policy: str = "missing") -> str | None:
    """Why this host cannot have the image (None: it has it, or its registry has it to pull)."""
    if image_info(client, ref) is not None:
        return None
    if policy == "never":
        return f"{ref} is not on this host and --pull never was given"
    try:
        client.images.get_registry_data(ref)
    except docker.errors.APIError as exc:
        return f"{ref} cannot be pulled there: {str(exc.explanation or exc).splitlines()[0][:200]}"
    except (docker.errors.DockerException, requests.RequestException) as exc:
        return f"{ref} cannot be checked there: {exc}"
    return None


def pull(client: docker.DockerClient, ref: str, on_event: PullCallback | None = None,
         platform: str | None = None) -> ImageInfo:
    """Pull with per-layer progress; any errorDetail in the stream is an error."""
    repo, tag = _split_ref(ref)
    stream_digest: str | None = None
    try:
        for event in client.api.pull(repo, tag=tag, stream=True, decode=True, platform=platform):
            if "errorDetail" in event or "error" in event:
                detail = event.get("errorDetail") or {}
                message = detail.get("message") or event.get("error") or str(event)
                raise _pull_error(ref, str(message))
            status = str(event.get("status", ""))
            if status.startswith("Digest: "):
                stream_digest = status.split("Digest: ", 1)[1].strip()
            if on_event is not None:
                progress = event.get("progressDetail") or {}
                on_event(str(event.get("id", "")), status, progress.get("current"), progress.get("total"))
    except docker.errors.APIError as exc:
        raise _pull_error(ref, str(exc.explanation or exc)) from None
    except requests.RequestException as exc:
        raise ContainerError(f"pull of {ref} failed: {exc}") from None
    info = image_info(client, ref)
    if info is None:
        raise ContainerError(f"pull of {ref} finished but the image is not there")
    if stream_digest and info.digest != stream_digest:
        info = ImageInfo(info.ref, info.id, stream_digest, info.architecture)
    return info


def ensure_image(client: docker.DockerClient, ref: str, policy: str = "missing", on_event: PullCallback | None = None,
                 platform: str | None = None) -> ImageInfo:
    if policy not in ("missing", "always", "never"):
        raise ContainerError(f"unknown pull policy {policy!r}", "Use --pull missing|always|never.")
    local = image_info(client, ref)
    if policy == "never" or (policy == "missing" and local is not None):
        if local is None:
            raise ContainerError(f"image {ref} is not present locally and --pull never was given",
                                 "Pull it first (sparklab pull / docker pull) or drop --pull never.")
        return local
    info = pull(client, ref, on_event, platform)
    if "@" in ref and info.digest and not ref.endswith(info.digest):
        raise ContainerError(f"image {ref} resolved to digest {info.digest}, not the pinned one")
    return info


def image_labels(client: docker.DockerClient, ref: str) -> dict[str, str]:
    """The labels of a local image ({} when it is not here): what an image says of itself (its CUDA targets)."""
    try:
        return dict(client.images.get(ref).attrs.get("Config", {}).get("Labels") or {})
    except (docker.errors.DockerException, requests.RequestException):
        return {}


def registry_platforms(client: docker.DockerClient, ref: str) -> list[str] | None:
    """The platforms the registry's manifest lists for a ref (`linux/arm64`, …); None when it cannot be asked."""
    try:
        data = client.images.get_registry_data(ref)
    except (docker.errors.DockerException, requests.RequestException):
        return None
    return [f"{p.get('os', '?')}/{p.get('architecture', '?')}" + (f"/{p['variant']}" if p.get("variant") else "")
            for p in data.attrs.get("Platforms") or []]
