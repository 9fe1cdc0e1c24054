"""Host checks before any container starts (each takes its probes as arguments); the engine's own checks of
a rendered launch are its adapter's `check_spec`. `Finding` is re-exported for callers."""

from __future__ import annotations

import errno
import socket
from collections.abc import Callable
from pathlib import Path

from sparklab.engines.base import Finding
from sparklab.errors import PreflightError
from sparklab.host.facts import HostFacts, ThisMachine
from sparklab.host.headroom import MIN_FLOOR_GIB, headroom, max_fraction_text, refusal
from sparklab.host.memory import HostMemory, engine_need, read_meminfo, unified_need
from sparklab.recipes.schema import Recipe
from sparklab.spec import LaunchSpec

# ---------------------------------------------------------------------------------------------------
# Host checks


def port_in_use(host: str, port: int) -> bool:
    """True when something already listens on host:port: a bind attempt on the address the server will bind
    (an IPv6 one on IPv6), like the server's own; the one port probe of preflight, sweeps and host processes.

    SO_REUSEADDR, as uvicorn and SGLang set it: connections of a server just stopped, lingering in TIME_WAIT,
    do not keep the next server from binding, so they must not fail this check either. An address this host does
    not have is not "in use": the server's own bind says what is wrong with it.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc.errno in (errno.EADDRINUSE, errno.EACCES)
    return False


def free_port(host: str = "127.0.0.1") -> int:
    """A port on host that nothing listens on now (the kernel's pick of an ephemeral one): for a caller that starts
    a server on it next (the benchmark scripts, the tests). Another process may take it first; the server's own
    bind, or port_in_use, says so."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_answers(address: str, port: int, timeout_s: float = 2.0) -> bool:
    """True when something on another machine accepts connections on address:port (its port is taken)."""
    try:
        with socket.create_connection((address, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def mem_available_gib(meminfo: Path = Path("/proc/meminfo")) -> tuple[float, float]:
    """(MemAvailable, MemTotal) in GiB. GB10 memory is unified and NVML cannot report it, so read this."""
    host = read_meminfo(meminfo)
    return host.available_gib, host.total_gib


def arch_name(name: str) -> str:
    """Docker's and the kernel's names for one architecture, as one (x86_64 → amd64, aarch64 → arm64)."""
    name = name.lower()
    return {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(name, name)


def tag_platform(image: str) -> str | None:
    """The platform an image tag names (`…-aarch64`, `…-arm64`, `…-amd64`), if any."""
    tag = image.split("@")[0].rsplit(":", 1)[-1].lower() if ":" in image.split("/")[-1] else ""
    if "aarch64" in tag or "arm64" in tag:
        return "arm64"
    if "amd64" in tag or "x86_64" in tag:
        return "amd64"
    return None


def check_platform_tag(spec: LaunchSpec, host_arch: str, allow_foreign: bool) -> list[Finding]:
    named = tag_platform(spec.image)
    host = arch_name(host_arch)
    if named and named != host and not allow_foreign:
        return [Finding(
            "warning",
            f"image {spec.image} is built for {named} but this Docker host is {host}: it will not run here "
            f"(exec format error) unless the host emulates {named}",
            "Use a multi-arch or native tag with --image, or pass --allow-foreign-platform to try anyway.")]
    return []


def check_image_platform(image: str, image_arch: str, host_arch: str, allow_foreign: bool) -> list[Finding]:
    if arch_name(image_arch) != arch_name(host_arch) and not allow_foreign:
        return [Finding(
            "error",
            f"image {image} is linux/{arch_name(image_arch)} but this Docker host is linux/{arch_name(host_arch)}",
            "Pick an image for this host with --image, or pass --allow-foreign-platform if it emulates it.")]
    return []


def check_host(spec: LaunchSpec, recipe: Recipe, *, port_busy: Callable[[str, int], bool] = port_in_use,
               meminfo: Path = Path("/proc/meminfo"), floor_gib: float | None = None,
               facts: HostFacts | None = None) -> list[Finding]:
    """floor_gib: the memory floor configured for this server (None: the default; 0: off), see check_memory.
    facts: the host the server runs on (default this machine, its memory read from `meminfo`)."""
    facts = facts if facts is not None else ThisMachine(meminfo=meminfo, gpu=False)
    found: list[Finding] = []
    if port_busy(spec.host, spec.port):
        found.append(Finding(
            "error", f"port {spec.port} is already in use on this host",
            f"Stop what listens there (`sparklab ps`, `ss -ltnp 'sport = :{spec.port}'`) or use --port N."))
    if spec.hf_cache and not facts.is_dir(Path(spec.hf_cache)):
        found.append(Finding(
            "error", f"the Hugging Face cache directory {spec.hf_cache} does not exist",
            f"Create it (mkdir -p {spec.hf_cache}) or point to yours with --hf-cache DIR or HF_HOME."))
    found += check_memory(spec, recipe, facts.meminfo(), floor_gib)
    return found


def check_memory(spec: LaunchSpec, recipe: Recipe, host: HostMemory, floor_gib: float | None = None) -> list[Finding]:
    """MemAvailable against the recipe's floor and the engine's share; on unified memory, the room its fraction
    leaves against the memory floor (host/headroom.py: under the least floor, an error; under a floor the user
    configured, a warning; 0: none), and MemFree, since that is what the engine's own startup check reads there
    (see sparklab.memory)."""
    required = _required_gib(spec, recipe, host.total_gib)
    room = headroom(spec, recipe, host)
    if required is not None and host.available_gib < required[0]:
        floor = floor_gib if floor_gib else MIN_FLOOR_GIB
        leaves = (f" On this host, {room.flag} {max_fraction_text(room, floor)} or less also leaves the memory floor "
                  f"({floor:.1f} GiB) under load." if room is not None else "")
        return [Finding(
            "error",
            f"only {host.available_gib:.1f} GiB of memory is available (MemAvailable) but this launch needs "
            f"{required[0]:.1f} GiB ({required[1]})",
            "Stop other servers (`sparklab ps`), drop the page cache "
            "(sync; echo 3 > /proc/sys/vm/drop_caches), or lower the memory settings with --set." + leaves)]
    refused = refusal(room, floor_gib) if room is not None else None
    if refused is not None:  # a floor the user set is theirs to keep: said, not refused
        return [Finding("error" if floor_gib is None else "warning", refused[0], refused[1])]
    need = unified_need(spec, recipe, host)
    if need is not None and host.free_gib < need.gib:
        return [Finding(
            "warning",
            f"only {host.free_gib:.1f} GiB free (MemFree) for {need.flag} {need.fraction:g} "
            f"({need.gib:.1f} GiB): on unified memory the engine counts the page cache "
            f"({host.cached_gib:.1f} GiB cached) as used and may refuse to start",
            "A sweep drops the model files' page cache before each server (posix_fadvise) unless "
            "--no-drop-caches; else: sync; echo 3 > /proc/sys/vm/drop_caches (root).")]
    return []


def _required_gib(spec: LaunchSpec, recipe: Recipe, total: float) -> tuple[float, str] | None:
    needs: list[tuple[float, str]] = []
    if recipe.min_available_gib:
        needs.append((recipe.min_available_gib, "the recipe's min_available_gib"))
    need = engine_need(spec, total) if recipe.unified_memory else None
    if need is not None:
        needs.append((need.gib, f"{need.flag} {need.fraction:g} of {total:.1f} GiB unified memory"))
    return max(needs) if needs else None


def raise_errors(findings: list[Finding]) -> list[Finding]:
    """Raise one PreflightError listing every error; return the warnings."""
    errors = [f for f in findings if f.level == "error"]
    if errors:
        message = "\n".join(f"preflight: {f.message}" for f in errors)
        hint = "\n".join(f"  fix: {f.hint}" for f in errors if f.hint)
        raise PreflightError(message, hint or None)
    return [f for f in findings if f.level != "error"]


__all__ = ["Finding", "check_host", "check_image_platform", "check_platform_tag", "mem_available_gib",
           "port_answers", "port_in_use", "raise_errors", "tag_platform"]
