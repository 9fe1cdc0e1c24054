"""Before any server starts: the image's own parser on the exact command, the engine's version, and whether the
image fits this host.

The engine adapter says how its parser runs (sparklab.engines.parsers); this module runs it through the runtime
(a throwaway container of the image, or the engine's own Python for a host-process engine), caches each verdict
under the image's digest and a hash of the command (so a sweep pays once per server config), and turns verdicts
into preflight findings: a refused command fails its server with the parser's own words and the recipe line that
wrote the flag; a parser that could not run, and an engine version outside what the adapter's knowledge was read
from, are warnings that say why.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from sparklab.engines import engine, parsers
from sparklab.engines.parsers import ACCEPTED, NOT_CHECKED, REJECTED, Probe, ProbeRun, Verdict
from sparklab.errors import PreflightError, SparklabError
from sparklab.host import memory, preflight
from sparklab.recipes.origin import flag_origin, named_flag
from sparklab.runtimes import local
from sparklab.runtimes.base import ImageInfo, PullCallback, Runtime
from sparklab.runtimes.containers import Docker
from sparklab.runtimes.state import state_dir
from sparklab.spec import LaunchSpec, is_secret_name

log = logging.getLogger(__name__)

# vLLM's imports alone take ~11 s on a quiet 2-core machine (docker/vllm-cpu/README.md); a loaded one, several times
# that. A check still running after this is killed and reported as not checked.
TIMEOUT_S = 180.0
# The label an image states its CUDA architectures in (docker/llamacpp-gb10/Dockerfile sets it): `121`, `90;120;121`.
CUDA_LABEL = "org.sparklab.cuda-architectures"
CACHE_FORMAT = 1


class ProbeRuntime(Protocol):
    """What runs a probe (every `base.Runtime` does): the runtime a server's recipe names (`for_spec`: Docker runs it
    in a container of `image`, Processes on this host) and its `probe`."""

    def for_spec(self, spec: LaunchSpec) -> ProbeRuntime: ...

    def probe(self, image: str, probe: Probe, timeout_s: float) -> ProbeRun: ...


@dataclass
class Checked:
    """One server's check: the verdict, how long it took, whether it came from the cache, and what to warn of."""

    spec: LaunchSpec
    image: str
    digest: str | None  # what the verdict is kept under: the image digest, else its id (None: a host program)
    verdict: Verdict
    seconds: float  # this check's time (a cache lookup when cached)
    cached: bool = False
    first_seconds: float | None = None  # a cached verdict's own run
    warnings: list[str] = field(default_factory=list)

    @property
    def version(self) -> str | None:
        return self.verdict.version

    # Any: JSON, cached and stored with the run
    def as_dict(self) -> dict[str, Any]:
        """What a run stores with the server config."""
        return {"image": self.image, "digest": self.digest, "verdict": self.verdict.as_dict(),
                "seconds": round(self.seconds, 3), "cached": self.cached,
                "first_seconds": None if self.first_seconds is None else round(self.first_seconds, 3),
                "warnings": list(self.warnings)}


def probe_env(spec: LaunchSpec) -> dict[str, str]:
    """The server's environment as its parser may read it (llama.cpp takes LLAMA_ARG_* as flags); no secret."""
    return {k: v for k, v in spec.env.items() if not is_secret_name(k)}


def command_hash(spec: LaunchSpec) -> str:
    """What a verdict depends on besides the image: the program, its arguments (key placeholder kept) and env."""
    data = {"entrypoint": list(spec.entrypoint), "argv": parsers.key_free(spec.argv),
            "env": sorted(probe_env(spec).items()), "format": CACHE_FORMAT}
    return hashlib.sha256(json.dumps(data).encode()).hexdigest()[:32]


class Cache:
    """Verdicts on disk: `<state>/parser-checks/<image digest>/<command hash>.json`. Only a parser's own verdict is
    kept (accepted or rejected); a parser that could not run is asked again next time."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or state_dir() / "parser-checks"

    def _path(self, digest: str, spec: LaunchSpec) -> Path:
        return self.root / digest.replace(":", "-").replace("/", "-") / f"{command_hash(spec)}.json"

    def get(self, digest: str | None, spec: LaunchSpec) -> tuple[Verdict, float] | None:
        if digest is None:
            return None
        try:
            data = json.loads(self._path(digest, spec).read_text())
            return Verdict.from_dict(data["verdict"]), float(data["seconds"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put(self, digest: str | None, spec: LaunchSpec, verdict: Verdict, seconds: float) -> None:
        if digest is None or verdict.status == NOT_CHECKED:
            return
        path = self._path(digest, spec)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{time.monotonic_ns()}.tmp")
            tmp.write_text(json.dumps({"verdict": verdict.as_dict(), "seconds": seconds,
                                       "argv": parsers.key_free(spec.argv), "checked_at": time.time()}))
            tmp.replace(path)
        except OSError as exc:  # a read-only state dir costs a second run, not the check
            log.debug("parser verdict not cached at %s: %s", path, exc)


def image_key(image: ImageInfo | None) -> str | None:
    return None if image is None else (image.digest or image.id or None)


def check(specs: Sequence[LaunchSpec], runtime: ProbeRuntime, image: ImageInfo | None, *,
          cache: Cache | None = None, timeout_s: float = TIMEOUT_S) -> list[Checked]:
    """Each server's command through its engine's own parser, in one run for those the cache does not know.
    All specs run one image (or program) and one environment (`check_all` groups them so)."""
    if not specs:
        return []
    cache = cache if cache is not None else Cache()
    digest = image_key(image)
    ref = image.ref if image is not None else specs[0].image
    out: list[Checked | None] = [None] * len(specs)
    todo: list[int] = []
    for i, spec in enumerate(specs):
        started = time.monotonic()
        hit = cache.get(digest, spec)
        if hit is None:
            todo.append(i)
        else:
            out[i] = Checked(spec, ref, digest, hit[0], time.monotonic() - started, True, hit[1])
    if todo:
        batch = [specs[i] for i in todo]
        adapter = engine(batch[0].kind)
        probe = adapter.parser_probe(batch)
        if isinstance(probe, str):
            verdicts, seconds = [parsers.not_checked(probe)] * len(batch), 0.0
        else:
            runner = runtime.for_spec(batch[0])
            run = runner.probe(ref, replace(probe, env={**probe_env(batch[0]), **probe.env}), timeout_s)
            verdicts, seconds = adapter.parser_verdicts(batch, run), run.seconds
        for i, verdict in zip(todo, verdicts, strict=True):
            cache.put(digest, specs[i], verdict, seconds)
            out[i] = Checked(specs[i], ref, digest, verdict, seconds)
    done = [c for c in out if c is not None]
    for checked in done:
        checked.warnings += warnings_of(checked)
    return done


def check_all(pairs: Sequence[tuple[LaunchSpec, ImageInfo | None]], runtime: ProbeRuntime, *,
              cache: Cache | None = None, timeout_s: float = TIMEOUT_S) -> list[Checked]:
    """Every server, one parser run per image and environment, in the order given."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, (spec, image) in enumerate(pairs):
        key = (spec.kind, image_key(image) or spec.image, spec.entrypoint[0], tuple(sorted(probe_env(spec).items())))
        groups.setdefault(key, []).append(i)
    out: list[Checked | None] = [None] * len(pairs)
    for members in groups.values():
        image = pairs[members[0]][1]
        for i, checked in zip(members, check([pairs[i][0] for i in members], runtime, image, cache=cache,
                                             timeout_s=timeout_s), strict=True):
            out[i] = checked
    return [c for c in out if c is not None]


NOT_RUN = "own parser was not run on this command"


def summarize(checks: Sequence[Checked]) -> list[str]:
    """The checks' warnings for a list of servers: one line per engine, image and reason a parser did not run
    (naming its servers), then every other warning once."""
    unrun: dict[tuple[str, str, str], list[str]] = {}
    others: list[str] = []
    for c in checks:
        if c.verdict.status == NOT_CHECKED:
            name = engine(c.spec.kind).name or c.spec.kind
            unrun.setdefault((name, c.image, c.verdict.why_not), []).append(
                f"{c.spec.recipe}/{c.spec.engine}/{c.spec.method}")
        others += [w for w in c.warnings if NOT_RUN not in w]
    lines = [f"{name}'s own parser was not run on {len(servers)} command(s) of {image} ({', '.join(servers)}): {why}"
             for (name, image, why), servers in unrun.items()]
    return lines + list(dict.fromkeys(others))


def where(spec: LaunchSpec) -> str:
    return f"{spec.recipe}/{spec.engine}/{spec.method} ({spec.image})"


def warnings_of(checked: Checked) -> list[str]:
    """The parser that did not run, and a version outside what the adapter's knowledge was read from."""
    verdict, spec = checked.verdict, checked.spec
    adapter = engine(spec.kind)
    found: list[str] = []
    if verdict.status == NOT_CHECKED:
        found.append(f"{where(spec)}: {adapter.name or spec.kind}'s {NOT_RUN}: {verdict.why_not}")
        return found
    why_unknown = "" if verdict.version else (verdict.version_source or "the image states no version")
    warning = adapter.version_warning(verdict.version, where(spec), why_unknown)
    if warning:
        found.append(warning)
    return found


def refusal(checked: Checked, sources: Sequence[Path] = ()) -> PreflightError:
    """The parser's own words, each with the recipe line that wrote the flag, as one preflight error."""
    spec, verdict = checked.spec, checked.verdict
    adapter = engine(spec.kind)
    version = f" {verdict.version}" if verdict.version else ""
    lines = [f"preflight: {adapter.name or spec.kind}{version}'s own parser (in {checked.image}) refuses the command "
             f"of {spec.recipe}/{spec.engine}/{spec.method}:"]
    for rejection in verdict.rejections:
        flag = named_flag(rejection.flag, rejection.message, spec.argv)
        lines.append(f"  {rejection.message}")
        lines.append(f"    from {flag_origin(spec, flag, sources)}")
    return PreflightError("\n".join(lines), "Spell the flag as this engine's version does (its `--help`), or run an "
                                            "image whose parser knows it; nothing was started.")


def preflight_one(spec: LaunchSpec, runtime: ProbeRuntime, image: ImageInfo | None, *,
                  sources: Sequence[Path] = (), cache: Cache | None = None,
                  timeout_s: float = TIMEOUT_S) -> Checked:
    """One server's check before its start: raises the refusal; returns the check (with its warnings)."""
    checked = check([spec], runtime, image, cache=cache, timeout_s=timeout_s)[0]
    if checked.verdict.status == REJECTED:
        raise refusal(checked, sources)
    return checked


def platform_notes(spec: LaunchSpec, image_arch: str | None, host_arch: str, labels: dict[str, str] | None,
                   compute_cap: float | None) -> list[str]:
    """Whether the image can run here: its architecture against the host's, and, for a GPU server, the CUDA
    architectures it declares (CUDA_LABEL) against the GPU's compute capability (nvidia-smi). labels None: the
    image is not here to read them."""
    notes: list[str] = []
    if image_arch and preflight.arch_name(image_arch) != preflight.arch_name(host_arch):
        notes.append(f"{spec.image} is linux/{preflight.arch_name(image_arch)} but this host is "
                     f"linux/{preflight.arch_name(host_arch)}: it cannot run here")
    if not spec.gpus or spec.runtime != "container":
        return notes
    if labels is None:
        gpu = f"this GPU's sm_{compute_cap:.1f}".replace(".", "") if compute_cap else "a GPU (none answered here)"
        notes.append(f"{spec.image} is not here, so its CUDA architectures could not be compared with {gpu}")
        return notes
    # CMake's spellings: `121`, `121a`, `121a-real`, `sm_121`; a/-real/-virtual narrow the kind of kernel, not the GPU
    declared = [d.strip().removeprefix("sm_").split("-")[0]
                for d in labels.get(CUDA_LABEL, "").replace(",", ";").replace(" ", ";").split(";") if d.strip()]
    if compute_cap is None:
        notes.append(f"no GPU answered nvidia-smi here: {spec.image}'s CUDA targets "
                     f"({', '.join('sm_' + d for d in declared) or 'undeclared'}) were not compared with one")
    else:
        sm = f"{compute_cap:.1f}".replace(".", "")
        if not declared:
            notes.append(f"{spec.image} does not declare its CUDA architectures (label {CUDA_LABEL}): cannot tell "
                         f"whether it has kernels for this GPU's sm_{sm}")
        elif sm not in declared and f"{sm}a" not in declared:
            notes.append(f"{spec.image} is built for {', '.join('sm_' + d for d in declared)}, not this GPU's "
                         f"sm_{sm}: its kernels will not load here")
    return notes


def compute_capability() -> float | None:
    """The first GPU's compute capability (12.1 on GB10), where nvidia-smi answers."""
    values = memory.query_gpu(("compute_cap",))
    return values[0] if values else None


def gather(specs: Sequence[LaunchSpec], runtime: Runtime, *, pull_policy: str | None = None,
           on_pull: PullCallback | None = None, cache: Cache | None = None, timeout_s: float = TIMEOUT_S,
           platform: bool = False) -> list[Checked]:
    """Every server's check, in order: the image resolved (pulled per pull_policy; None: only an image already on
    this host, as a dry run pulls nothing), then one parser run per image. A server whose image cannot be had or
    cannot run here is not checked, and says why. platform: also say whether each image fits this host (its
    architecture; a GPU server's CUDA targets against nvidia-smi's compute capability), as `sparklab check` does."""
    pairs: list[tuple[LaunchSpec, ImageInfo | None]] = []
    skipped: dict[int, Checked] = {}
    notes: dict[int, list[str]] = {}
    cap = compute_capability() if platform and any(s.gpus for s in specs) else None
    for i, spec in enumerate(specs):
        try:
            rt = runtime.for_spec(spec)
            host_arch = rt.host_arch()
            image, why, arch = _resolve(spec, rt, pull_policy, on_pull)
        except SparklabError as exc:
            image, why, arch, host_arch = None, exc.message, None, ""
        if platform and host_arch:
            labels = _image_labels(runtime, image.ref) if image is not None and spec.runtime == "container" \
                else None
            # not here and not pulled: the platform the recipe declares for it, else the one its tag names
            declared = (spec.platform or "").partition("/")[2] or preflight.tag_platform(spec.image)
            notes[i] = platform_notes(spec, arch or declared, host_arch, labels, cap)
        if image is None or why:
            skipped[i] = Checked(spec, spec.image, image_key(image), parsers.not_checked(why or "no image"), 0.0)
            skipped[i].warnings += warnings_of(skipped[i])
            continue
        pairs.append((spec, image))
    checked = iter(check_all(pairs, runtime, cache=cache, timeout_s=timeout_s))
    out = [skipped[i] if i in skipped else next(checked) for i in range(len(specs))]
    for i, extra in notes.items():
        out[i].warnings += extra
    return out


def _image_labels(runtime: Runtime, ref: str) -> dict[str, str] | None:
    """What an image here says of itself (its labels), where Docker can be asked: this machine's or a Docker host's."""
    if isinstance(runtime, local.Runtime):
        return runtime.docker.image_labels(ref)
    return runtime.image_labels(ref) if isinstance(runtime, Docker) else None


def _resolve(spec: LaunchSpec, runtime: Any, pull_policy: str | None,
             on_pull: PullCallback | None) -> tuple[ImageInfo | None, str, str | None]:
    """(the image, why it cannot be checked or "", its architecture) for one server: its image, else the first of
    its alternatives the registry has, as a start would take it."""
    if spec.runtime != "container":
        image = runtime.ensure_image(spec.image)  # the program must exist
        return image, "", image.architecture
    host = preflight.arch_name(runtime.host_arch())
    declared = (spec.platform or "").partition("/")[2]
    if declared and preflight.arch_name(declared) != host and runtime.image_info(spec.image) is None:
        return None, (f"the recipe runs {spec.image} as {spec.platform}; this host is linux/{host}: not pulled "
                      f"here (check it on an {preflight.arch_name(declared)} host)"), declared
    candidates = (spec.image, *spec.image_alternatives)
    why = ""
    for ref in candidates:
        image = runtime.image_info(ref)
        if image is None and pull_policy is None:
            why = why or f"{ref} is not on this host and was not pulled (a dry run or --pull never; `sparklab pull` " \
                          f"or `sparklab check` fetch it)"
            continue
        if image is None or pull_policy == "always":
            platforms = runtime.registry_platforms(ref) if image is None else None
            if platforms and not any(preflight.arch_name(p.split("/")[1]) == host for p in platforms if "/" in p):
                return None, (f"the registry lists {ref} for {', '.join(platforms)} only, not this host's "
                              f"linux/{host}: not pulled"), platforms[0].split("/")[1]
            try:
                image = runtime.ensure_image(ref, pull_policy, on_pull)
            except SparklabError as exc:  # ImageUnavailableError: the next alternative, as a start tries them
                why = why or exc.message
                continue
        if preflight.arch_name(image.architecture) != host:
            return image, (f"{ref} is linux/{preflight.arch_name(image.architecture)}; this host runs "
                           f"linux/{host}"), image.architecture
        return image, "", image.architecture
    return None, why, None


__all__ = ["ACCEPTED", "NOT_CHECKED", "REJECTED", "Cache", "Checked", "check", "check_all", "gather",
           "platform_notes", "preflight_one", "refusal"]
