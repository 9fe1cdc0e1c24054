"""Checks before any container starts. Spec checks are pure; host checks take their probes as arguments."""

from __future__ import annotations

import errno
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sparklab.engines import sglang, vllm
from sparklab.engines.base import flag_value
from sparklab.errors import PreflightError
from sparklab.recipes import Recipe
from sparklab.render import LaunchSpec


@dataclass(frozen=True)
class Finding:
    level: str  # "error" | "warning"
    message: str
    hint: str = ""


def _where(spec: LaunchSpec) -> str:
    return f"{spec.recipe_path}: engines.{spec.engine}.methods.{spec.method}"


def check_spec(spec: LaunchSpec, recipe: Recipe) -> list[Finding]:
    """What would make the engine refuse or die after loading, judged from the rendered argv."""
    if spec.kind == "vllm":
        return _check_vllm(spec, recipe)
    return _check_sglang(spec, recipe)


def _draft_block_size(recipe: Recipe, draft: str | None) -> tuple[str, int] | None:
    for name, entry in recipe.model.drafts.items():
        if entry.id == draft and entry.block_size:
            return name, entry.block_size
    return None


def _check_k(spec: LaunchSpec, recipe: Recipe, k: int | None, flag: str) -> list[Finding]:
    sp = spec.speculative
    if sp is None:
        return []
    if k is None or k < 1:
        return [Finding("error", f"{_where(spec)}: {flag} must be a positive integer, got {k!r}",
                        "Give --num-speculative-tokens N (N >= 1).")]
    known = _draft_block_size(recipe, sp.draft_model)
    if known and k < known[1]:
        name, size = known
        return [Finding(
            "error",
            f"{_where(spec)}: {flag} is {k}, below the {name} draft's block size {size} "
            f"(model.drafts.{name}.block_size); the engine refuses to start below it",
            f"Use --num-speculative-tokens {size} or more.")]
    return []


def _check_vllm(spec: LaunchSpec, recipe: Recipe) -> list[Finding]:
    sp = spec.speculative
    if sp is None:
        return []
    where = _where(spec)
    found: list[Finding] = []
    if sp.method not in vllm.METHODS:
        found.append(Finding(
            "error", f"{where}: vLLM 0.27.1 has no speculative method {sp.method!r}",
            f"Known methods: {', '.join(sorted(vllm.METHODS))}."))
    if sp.method in ("dspark", "dflash") and not sp.draft_model:
        found.append(Finding(
            "error",
            f"{where}: speculative method {sp.method} has no draft model (--speculative_config.model). "
            f"vLLM would load the target, fall back to its built-in MTP head and die after loading with: "
            f"{vllm.PARALLEL_DRAFTING_ERROR}",
            f"Name the draft: --speculative_config.model <the {sp.method} checkpoint> "
            f"(in the recipe: {{{{ drafts.{sp.method} }}}}).",
        ))
    moe = sp.options.get("moe_backend")
    target_moe = flag_value(spec.argv, "--moe-backend")
    if sp.method == "mtp" and target_moe == "marlin" and moe is None:
        found.append(Finding(
            "error",
            f"{where}: MTP with --moe-backend marlin needs a speculative moe_backend: the MTP drafter "
            f"inherits the target's marlin, which it does not support, and vLLM fails at start-up",
            "Add --speculative_config.moe_backend triton (seed 000's MTP line has it)."))
    if moe is not None and moe not in vllm.SPEC_MOE_BACKENDS:
        found.append(Finding(
            "error", f"{where}: --speculative_config.moe_backend {moe!r} is not one vLLM accepts",
            f"Use one of: {', '.join(vllm.SPEC_MOE_BACKENDS)}."))
    if sp.method != "ngram" or sp.num_speculative_tokens is not None:
        found += _check_k(spec, recipe, sp.num_speculative_tokens, "num_speculative_tokens")
    return found


def _check_sglang(spec: LaunchSpec, recipe: Recipe) -> list[Finding]:
    sp = spec.speculative
    if sp is None:
        return []
    where = _where(spec)
    found: list[Finding] = []
    if sp.method not in sglang.METHODS:
        found.append(Finding(
            "error", f"{where}: SGLang has no speculative algorithm {sp.method!r}",
            f"Known algorithms: {', '.join(sorted(sglang.METHODS))}."))
    if sp.method in sglang.NEEDS_DRAFT and not sp.draft_model:
        found.append(Finding(
            "error", f"{where}: --speculative-algorithm {sp.method} needs --speculative-draft-model-path",
            "Add --speculative-draft-model-path <draft checkpoint>."))
    flag = "--speculative-dspark-block-size" if sp.method == "DSPARK" else "--speculative-num-steps"
    if sp.method in ("DSPARK", "EAGLE", "EAGLE3", "NEXTN") and sp.num_speculative_tokens is not None:
        found += _check_k(spec, recipe, sp.num_speculative_tokens, flag)
    return found


# ---------------------------------------------------------------------------------------------------
# Host checks


def port_in_use(host: str, port: int) -> bool:
    """True when something already listens on host:port (a bind attempt, like the server's own).

    SO_REUSEADDR, as uvicorn and SGLang set it: connections of a server just stopped, lingering in TIME_WAIT,
    do not keep the next server from binding, so they must not fail this check either.
    """
    bind_host = "0.0.0.0" if host == "0.0.0.0" else "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((bind_host, port))
        except OSError as exc:
            return exc.errno in (errno.EADDRINUSE, errno.EACCES)
    return False


def mem_available_gib(meminfo: Path = Path("/proc/meminfo")) -> tuple[float, float]:
    """(MemAvailable, MemTotal) in GiB. GB10 memory is unified and NVML cannot report it, so read this."""
    values: dict[str, float] = {}
    for line in meminfo.read_text().splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            values[key] = float(parts[0]) / (1024 * 1024)  # kB → GiB
    return values.get("MemAvailable", 0.0), values.get("MemTotal", 0.0)


def _arch(name: str) -> str:
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
    host = _arch(host_arch)
    if named and named != host and not allow_foreign:
        return [Finding(
            "warning",
            f"image {spec.image} is built for {named} but this Docker host is {host}: it will not run here "
            f"(exec format error) unless the host emulates {named}",
            "Use a multi-arch or native tag with --image, or pass --allow-foreign-platform to try anyway.")]
    return []


def check_image_platform(image: str, image_arch: str, host_arch: str, allow_foreign: bool) -> list[Finding]:
    if _arch(image_arch) != _arch(host_arch) and not allow_foreign:
        return [Finding(
            "error",
            f"image {image} is linux/{_arch(image_arch)} but this Docker host is linux/{_arch(host_arch)}",
            "Pick an image for this host with --image, or pass --allow-foreign-platform if it emulates it.")]
    return []


def check_host(spec: LaunchSpec, recipe: Recipe, *, port_busy: Callable[[str, int], bool] = port_in_use,
               meminfo: Path = Path("/proc/meminfo")) -> list[Finding]:
    found: list[Finding] = []
    if port_busy(spec.host, spec.port):
        found.append(Finding(
            "error", f"port {spec.port} is already in use on this host",
            f"Stop what listens there (`sparklab ps`, `ss -ltnp 'sport = :{spec.port}'`) or use --port N."))
    if spec.hf_cache and not Path(spec.hf_cache).is_dir():
        found.append(Finding(
            "error", f"the Hugging Face cache directory {spec.hf_cache} does not exist",
            f"Create it (mkdir -p {spec.hf_cache}) or point to yours with --hf-cache DIR or HF_HOME."))
    available, total = mem_available_gib(meminfo)
    required = _required_gib(spec, recipe, total)
    if required is not None and available < required[0]:
        found.append(Finding(
            "error",
            f"only {available:.1f} GiB of memory is available (MemAvailable) but this launch needs "
            f"{required[0]:.1f} GiB ({required[1]})",
            "Stop other servers (`sparklab ps`), drop the page cache "
            "(sync; echo 3 > /proc/sys/vm/drop_caches), or lower the memory settings with --set."))
    return found


def _required_gib(spec: LaunchSpec, recipe: Recipe, total: float) -> tuple[float, str] | None:
    needs: list[tuple[float, str]] = []
    if recipe.min_available_gib:
        needs.append((recipe.min_available_gib, "the recipe's min_available_gib"))
    util = flag_value(spec.argv, "--gpu-memory-utilization")
    if recipe.unified_memory and util is not None:
        try:
            fraction = float(util)
        except ValueError:
            fraction = 0.0
        needs.append((fraction * total, f"--gpu-memory-utilization {util} of {total:.1f} GiB unified memory"))
    return max(needs) if needs else None


def raise_errors(findings: list[Finding]) -> list[Finding]:
    """Raise one PreflightError listing every error; return the warnings."""
    errors = [f for f in findings if f.level == "error"]
    if errors:
        message = "\n".join(f"preflight: {f.message}" for f in errors)
        hint = "\n".join(f"  fix: {f.hint}" for f in errors if f.hint)
        raise PreflightError(message, hint or None)
    return [f for f in findings if f.level != "error"]
