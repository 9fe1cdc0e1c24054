"""`sparklab up`: preflight → pull → run → wait → report facts; one code path up to the first side effect."""

from __future__ import annotations

import dataclasses
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sparklab.engines import caches, engine
from sparklab.engines.api import EngineAPI
from sparklab.engines.logwatch import CAUSE_LINES, DEAD_STOP_GRACE_S, FATAL_GRACE_S, LogWatch, fatal_error, indent
from sparklab.engines.scrape import StartupFacts
from sparklab.errors import ImageUnavailableError, MemoryFloorError, NotReadyError, SparklabError
from sparklab.host import downloads, preflight, watchdog
from sparklab.host.facts import HostFacts
from sparklab.recipes import multinode
from sparklab.recipes.render import LaunchOptions, render
from sparklab.recipes.schema import Recipe, load_recipe, resolve
from sparklab.runtimes import imagecheck
from sparklab.runtimes.base import ImageInfo, PullCallback, Runtime, Server
from sparklab.runtimes.health import LOG_TAIL_LINES, exited_error, wait_ready
from sparklab.runtimes.state import state_dir
from sparklab.spec import LaunchSpec

log = logging.getLogger(__name__)


@dataclass
class Launch:
    """A rendered, preflighted launch: what `--dry-run` prints and `up` runs."""

    recipe: Recipe
    spec: LaunchSpec
    warnings: list[preflight.Finding] = field(default_factory=list)
    sources: tuple[Path, ...] = ()  # files besides the recipe that may write its flags (a sweep file)
    check: imagecheck.Checked | None = None  # the image's own parser on the command, once the image is here


def server_api_key(given: str | None) -> str:
    """The API key a server starts with: the one given (`--api-key`, SPARKLAB_API_KEY), else 48 new hex digits.

    It goes on the engine's command line as the value after `--api-key`, and the engines parse that with argparse,
    which reads a value that starts with '-' as another flag and refuses the command. Run here against the real
    parsers: vLLM 0.27.1 (vllm/entrypoints/openai/cli_args.py:283, through FlexibleArgumentParser) exits with
    "argument --api-key: expected at least one argument"; SGLang 0.5.23 (srt/arg_groups/fields/serving.py:160,
    through ServerArgs.add_cli_args) with "expected one argument". token_urlsafe's alphabet has '-' (1 key in 64
    began with it; seen in CI as a stand-in server whose every cell got 401); hex has not."""
    if given is None or given == "":
        return secrets.token_hex(24)
    if given.startswith("-"):
        raise SparklabError("--api-key: a key that starts with '-' is read as a flag by the engines' argument "
                            "parsers (argparse), so the server would not start",
                            "Give a key that does not start with '-' (or leave it out: sparklab makes one).")
    return given


def prepare(spec_text: str, *, target: str | None, engine_name: str | None, overrides: list[str],
            options: LaunchOptions, check_host: bool = True, hosts_given: int | None = None) -> Launch:
    """Resolve, load, render and preflight: everything up to the first side effect. hosts_given: how many
    Docker hosts the command names; a recipe served across more says so before any other check."""
    path, method = resolve(spec_text, target)
    recipe = load_recipe(path, overrides)
    if hosts_given is not None:
        multinode.require_hosts(recipe, engine_name, hosts_given)
    return checked(recipe, render(recipe, engine_name, method, options), check_host)


def checked(recipe: Recipe, spec: LaunchSpec, check_host: bool = True, floor_gib: float | None = None,
            facts: HostFacts | None = None) -> Launch:
    """The engine's own checks of the rendered launch, then the host's; errors raise, warnings are kept.
    floor_gib: the memory floor a sweep configured for it (None: the default; 0: off). facts: the host it starts
    on (default this machine); on another host (check_host False) only its memory is checked, through them."""
    findings = engine(spec.kind).check_spec(spec, recipe)
    if check_host:
        findings += preflight.check_host(spec, recipe, floor_gib=floor_gib, facts=facts)
    elif facts is not None:
        findings += preflight.check_memory(spec, recipe, facts.meminfo(), floor_gib)
    return Launch(recipe, spec, preflight.raise_errors(findings))


@dataclass
class Ready:
    """A started server that answers, with what it took to get there: what every start returns (one server or one
    across hosts, sparklab.runtimes.cluster)."""

    server: Server
    image: ImageInfo
    seconds_to_ready: float
    api_key: str | None
    facts: StartupFacts
    watch: LogWatch | None = None  # the engine's log as it arrives: its first fatal line
    check: imagecheck.Checked | None = None  # the image's parser verdict and the engine version it read
    served_version: str | None = None  # what the ready server's version endpoint answered (read_served_version)
    image_s: float | None = None  # making sure the image is here: a pull, or a look-up when it was already here


def start(p: Launch, runtime: Runtime, *, pull_policy: str = "missing",
          allow_foreign_platform: bool = False, on_pull: PullCallback | None = None,
          api_key: str | None = None, detach: bool = False,
          on_wait: Callable[[float], None] | None = None, log_path: Path | None = None,
          stall_s: float | None = None, poll_s: float = 1.0, sources: tuple[Path, ...] = ()) -> Ready:
    """Pull, run and wait. The returned server is already torn down if anything here fails.

    A fatal line in the engine's log fails the wait at once; with stall_s, so does a log silent that long.
    sources: files besides the recipe that may write a flag the image's parser refuses (a sweep file).
    The server runs where its recipe says (`runtime.for_spec`: a container or a host process). poll_s: the
    readiness poll's longest interval (a rehearsal's compressed night polls as often, in its own time)."""
    runtime = runtime.for_spec(p.spec)
    p.sources = p.sources or sources
    host_arch = runtime.host_arch()
    p.warnings += preflight.check_platform_tag(p.spec, host_arch, allow_foreign_platform)
    platform = p.spec.platform if allow_foreign_platform else None
    pull_started = time.monotonic()
    image = _ensure_image(p, runtime, pull_policy, on_pull, platform)
    image_s = time.monotonic() - pull_started
    p.spec = caches.bind(p.spec, p.spec.image, image.digest, image.id)  # the digest is known only now
    spec = p.spec
    preflight.raise_errors(preflight.check_image_platform(spec.image, image.architecture, host_arch,
                                                          allow_foreign_platform))
    p.check = parser_preflight(p, runtime, image)
    key = server_api_key(api_key) if spec.needs_api_key else None
    provided = {"api_key": key} if key else {}
    adapter = engine(spec.kind)
    api_env = adapter.api_key_env
    if key and api_env:
        provided[api_env] = key
    log_path = log_path or state_dir() / "logs" / f"{spec.name}.log"
    offline = downloads.offline_for(spec)  # models were fetched first: a missing file fails at start
    if offline:
        spec = dataclasses.replace(spec, env={**offline, **spec.env})
    log_watch = LogWatch(adapter)
    server = runtime.launch(spec, provided, log_path, detach=detach, on_log=log_watch.feed)
    try:
        headers = {"Authorization": f"Bearer {key}"} if key and adapter.ready_needs_key else None
        seconds = wait_ready(server, spec.endpoint + spec.ready_path, kind=spec.kind,
                             timeout_s=spec.ready_timeout_s, headers=headers, on_try=on_wait, watch=log_watch,
                             stall_s=stall_s, max_interval_s=poll_s)
        facts = facts_after_ready(server, spec)
    except NotReadyError as exc:
        server.stop(DEAD_STOP_GRACE_S if exc.kind else 10)  # a dead or hung engine has nothing to finish
        raise
    except BaseException:
        server.stop()
        raise
    return Ready(server, image, seconds, key, facts, log_watch, p.check, image_s=image_s)


def image_version(ready: Ready) -> str | None:
    """The engine version the image's package metadata states (read by the parser check before the start)."""
    return ready.check.version if ready.check is not None else None


def read_served_version(ready: Ready, api: EngineAPI) -> str | None:
    """Ask the ready server its version (where it has an endpoint for it); says when it disagrees with the image's
    package metadata, else None."""
    adapter = engine(ready.server.spec.kind)
    ready.served_version = adapter.version(api)
    image = image_version(ready)
    if adapter.same_version(image, ready.served_version):
        return None
    return (f"the image's package metadata says {adapter.name} {image}, the server answers {ready.served_version}: "
            f"sparklab reads the server as {image} (the version its parser check ran)")


def parser_preflight(p: Launch, runtime: Runtime, image: ImageInfo | None) -> imagecheck.Checked:
    """The image's own parser on the exact command, before anything starts (cached per image digest and command):
    a refusal raises a PreflightError; its warnings (the parser could not run, the engine's version is outside what
    sparklab's knowledge was read from) join the launch's."""
    checked = imagecheck.preflight_one(p.spec, runtime.for_spec(p.spec), image, sources=p.sources)
    p.warnings += [preflight.Finding("warning", w) for w in checked.warnings]
    return checked


def _ensure_image(p: Launch, runtime: Runtime, policy: str, on_pull: PullCallback | None,
                  platform: str | None) -> ImageInfo:
    """Pull the recipe's image; if the registry has no such image, try its alternatives in order."""
    candidates = [p.spec.image, *p.spec.image_alternatives]
    for i, ref in enumerate(candidates):
        try:
            image = runtime.ensure_image(ref, policy, on_pull, platform)
        except ImageUnavailableError as exc:
            if i == len(candidates) - 1:
                raise
            p.warnings.append(preflight.Finding("warning", f"{exc.message}; trying {candidates[i + 1]}"))
            continue
        if ref != p.spec.image:
            p.spec = dataclasses.replace(p.spec, image=ref)
        return image
    raise AssertionError("unreachable")


def facts_after_ready(server: Server, spec: LaunchSpec, settle_s: float = 2.0) -> StartupFacts:
    """Parse the startup log; the ready line may trail the first 200 by a moment."""
    deadline = time.monotonic() + settle_s
    adapter = engine(spec.kind)
    facts = adapter.parse_startup(server.full_log())
    while not facts.startup_complete and time.monotonic() < deadline:
        time.sleep(0.2)
        facts = adapter.parse_startup(server.full_log())
    return facts


# A server that prints nothing and answers no health check this long while serving looks hung: the same default
# as a sweep's stall_timeout_s (recipes/sweep_file.py), whose requests fail after it while the health check fails.
SERVING_STALL_S = 60.0
HEALTH_TIMEOUT_S = 5.0


def watch(server: Server, log_watch: LogWatch | None = None, poll_s: float = 1.0, *,
          memory: watchdog.Sampler | None = None, stall_s: float | None = None, api: EngineAPI | None = None,
          clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
    """Block while the server runs (foreground `up`), and end it as a sweep would, raising why: it exited; its engine
    logged a fatal line while its container runs on; `memory`'s floor stopped it; or (with stall_s and its `api`)
    its log stayed silent and its health check unanswered that long. Ctrl-C / SIGTERM / SIGHUP end it too."""
    fatal_since: float | None = None
    alive_at = clock()  # the last sign of life: the log grew, or the health check answered
    output = log_watch.output if log_watch is not None else 0
    while True:
        if memory is not None and memory.tripped is not None:
            server.stop(DEAD_STOP_GRACE_S)  # the floor killed it already; what is left is removed
            raise floor_error(memory)
        running, code = server.state()
        if not running:
            raise exited_error(server, server.spec.kind, code, "the server", "while serving")
        if log_watch is not None and log_watch.fatal is not None:
            fatal_since = fatal_since or clock()
            if clock() - fatal_since >= FATAL_GRACE_S:  # its traceback has come by now
                error = fatal_error(log_watch, server.log_tail(CAUSE_LINES), "while serving")
                server.stop(DEAD_STOP_GRACE_S)
                raise error
        elif stall_s and api is not None and log_watch is not None:
            if log_watch.output != output:
                output, alive_at = log_watch.output, clock()
            elif clock() - alive_at >= stall_s / 2 and api.alive(min(HEALTH_TIMEOUT_S, stall_s)):
                alive_at = clock()  # quiet but answering: an idle engine (asked every stall_s / 2 at most)
            if clock() - alive_at >= stall_s:
                error = hung_error(server, stall_s)
                server.stop(DEAD_STOP_GRACE_S)
                raise error
        sleep(poll_s if fatal_since is None else 0.2)


def hung_error(server: Server, stall_s: float) -> NotReadyError:
    tail = server.log_tail(LOG_TAIL_LINES)
    return NotReadyError(
        f"the engine stopped answering: nothing in its log and no answer to its health check for {stall_s:.0f} s "
        f"while serving; sparklab stopped it. Last {LOG_TAIL_LINES} log lines:\n{indent(tail)}",
        "The last lines say what it was doing. If it is only busy and quiet, raise the limit: --stall-timeout "
        "SECONDS.", log_tail=tail, kind="stalled")


def floor_error(memory: watchdog.Sampler) -> MemoryFloorError:
    """The floor stopped the server: why, with the last memory samples."""
    message, samples = watchdog.floor_failure(memory, memory.floor_gib or 0.0)
    return MemoryFloorError(f"{message}\n{samples}",
                            "Free memory on this machine, or set --memory-floor-gib (0: off) if the floor is wrong "
                            "for it.")
