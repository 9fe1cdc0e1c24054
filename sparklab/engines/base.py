"""The engine adapter: everything sparklab knows about one engine, behind one class.

An adapter says how the engine is launched (network and API-key flags, its sweep-time environment), how its
speculative flags read, what to check before it starts, what its startup log says, which log lines explain a
death, when it is ready, and how to read its counters, acceptance, version and prefix-cache reset. It is
pure: HTTP goes through the `EngineAPI` it is handed (sparklab.engines.api). A new engine is one module
subclassing `Engine`, registered in sparklab/engines/__init__.py, plus a recipe.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from sparklab.engines import knowledge, parsers
from sparklab.engines.argv import flag_value
from sparklab.engines.knowledge import Fact, Knowledge, VersionKey
from sparklab.engines.parsers import Probe, ProbeRun, Verdict
from sparklab.engines.scrape import StartupFacts, collect_warnings
from sparklab.spec import LaunchSpec, Speculative

if TYPE_CHECKING:
    from sparklab.engines.api import EngineAPI, Replies
    from sparklab.records import Sampling


class DraftView(Protocol):
    """A draft model as an adapter reads it from a recipe (sparklab.recipes.schema.DraftModel is one)."""

    @property
    def id(self) -> str: ...

    @property
    def block_size(self) -> int | None: ...


class ModelView(Protocol):
    @property
    def drafts(self) -> Mapping[str, DraftView]: ...


class RecipeView(Protocol):
    """What an adapter's preflight reads of a recipe: the model an engine serves and its drafts. Adapters sit below
    the recipes package (which validates engine kinds against them), so they see a recipe through this view."""

    def model_of(self, engine: str) -> ModelView: ...


@dataclass(frozen=True)
class KnownFailure:
    """A log line that explains a startup death, and what to do about it."""

    pattern: re.Pattern[str]
    explanation: str


@dataclass(frozen=True)
class FatalLine:
    """A log line after which the engine cannot serve, even while its container (its API server) runs on."""

    pattern: re.Pattern[str]
    meaning: str  # what died, in the user's words


# A Python exception line, as a traceback ends, after vLLM's optional process prefix `(EngineCore pid=7) ` and
# log header `ERROR 11-30 15:12:42 [core.py:1349] ` (vLLM repeats both on every line of a logged traceback).
_EXCEPTION_LINE = re.compile(r"^(?:\(\w+ pid=\d+\) )?(?:[A-Z]+ \d\d-\d\d \d\d:\d\d:\d\d \[[^\]]+\] )?"
                             r"((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception)\b(?::.*)?)$")


def root_cause(log: str, fatal_line: str) -> str | None:
    """The engine's own error behind a fatal line: the first exception line from the fatal line on.

    Python prints a chained traceback oldest first, so the first exception after the fatal line is the root.
    """
    lines = log.splitlines()
    start = next((i for i, line in enumerate(lines) if fatal_line.strip() and fatal_line.strip() in line), 0)
    for line in lines[start:]:
        if m := _EXCEPTION_LINE.match(line.strip()):
            return m.group(1).strip()[:300]
    return None


@dataclass(frozen=True)
class Finding:
    """One preflight result: an error stops the launch, a warning is printed."""

    level: str  # "error" | "warning"
    message: str
    hint: str = ""


Acceptance = tuple[float, str]  # (acceptance length incl. the bonus token, where it came from)


# Any: counter snapshots, windows and cell results are JSON as stored; each adapter defines its keys
class Engine:
    """Defaults shared by the engines; each adapter overrides what differs."""

    kind: str = ""
    # One server across several hosts (`node_command` says what each node runs); a recipe with `nodes > 1` is
    # refused for an engine without it (sparklab.recipes.schema reads this flag).
    multinode: bool = False
    ready_path: str = "/v1/models"
    ready_needs_key: bool = True
    ready_line: re.Pattern[str] = re.compile(r"(?!)")  # the startup log's "ready" line
    api_key_env: str | None = None  # the variable the engine reads its key from (None: a flag)
    api_key_warning: str | None = None  # what `up` says when the key cannot be kept out of `ps`
    memory_fraction_flag: str | None = None  # the flag giving its share of the device's (unified) memory
    # What that share is a fraction of: "total" (the device's whole memory) or "free" (what was free when the
    # engine started). The drafter's weights count inside it for every engine here (see host/headroom.py).
    memory_fraction_of: str = "total"
    methods: frozenset[str] = frozenset()
    failures: tuple[KnownFailure, ...] = ()
    fatal_lines: tuple[FatalLine, ...] = ()  # taken from the engine's source; each cites its file and line
    reads_log_acceptance: bool = False  # acceptance must be read from the log of the window
    # why a drafting run of this engine may have no acceptance at all (the report says it; "": none known)
    no_acceptance_reason: str = ""
    # False: the server closes its connection after every streamed response whatever its headers say, so the
    # client opens one per request instead of sending the next request into a closing socket and resending it.
    keeps_streamed_connections: bool = True
    # Each engine step streams one chunk of 1 + its accepted draft tokens (vLLM, SGLang), so the report can check the
    # client's tokens per chunk against the server's accepted-token counter; False: it streams token by token.
    streams_one_chunk_per_step: bool = True
    # Phases the engine may spend silent that are no stall, as (start line, end line, what): while one is open
    # the readiness wait keeps to its deadline only (Edge-LLM's TensorRT build prints nothing for minutes).
    quiet_phases: tuple[tuple[re.Pattern[str], re.Pattern[str], str], ...] = ()
    # Its first start of a configuration builds something long before it serves (Edge-LLM: TensorRT engines):
    # the ETA counts the recipe's ready deadline for such a start until one of that server was measured.
    builds_on_first_start: bool = False

    def process_hub_cache(self, spec: LaunchSpec, env: Mapping[str, str]) -> Path | None:
        """Where this engine, run as a host process, reads the Hub checkpoints its argv names, when that is all
        it reads from the Hub: sparklab fetches them there first and then runs it with HF_HUB_OFFLINE=1. None:
        not known, so it may fetch on its own and runs without the offline flag."""
        return None

    # -- launch ------------------------------------------------------------------------------------------
    def network_args(self, host: str, port: int) -> list[str]:
        return ["--host", host, "--port", str(port)]

    def api_key_args(self, key: str) -> list[str]:
        return []

    def node_command(self, entrypoint: Sequence[str], argv: Sequence[str], rank: int, nodes: int, head: str,
                     cluster_port: int, address: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(entrypoint, argv) of node `rank` of a server across `nodes` hosts (rank 0, the head, serves HTTP);
        head is the head's cluster address, address this node's (sparklab.multinode)."""
        raise NotImplementedError(f"{self.kind} has no multi-node mode in sparklab")

    def sweep_env(self) -> tuple[str, ...]:
        """Environment a sweep adds (e.g. what enables the prefix-cache reset between loads)."""
        return ()

    def cache_env(self, target: str) -> dict[str, str]:
        """Variables that put the engine's compile/JIT caches under `target`, a directory kept per image.

        Shared by the engines (each adapter adds its own root); where each library reads its variable:
        - TORCHINDUCTOR_CACHE_DIR: torch 2.13 torch/_inductor/runtime/cache_dir_utils.py:15 (else
          /tmp/torchinductor_<user>, lost with the container);
        - TRITON_CACHE_DIR: triton 3.9 triton/knobs.py:349 (else ~/.triton/cache);
        - FLASHINFER_WORKSPACE_BASE: flashinfer-python 0.7.4 flashinfer/jit/env.py:67, which appends
          .cache/flashinfer for its JIT modules and cubins (flashinfer/jit/env.py:70, 132, 396).
        """
        return {
            "TORCHINDUCTOR_CACHE_DIR": f"{target}/torchinductor",
            "TRITON_CACHE_DIR": f"{target}/triton",
            "FLASHINFER_WORKSPACE_BASE": f"{target}/flashinfer",
        }

    def method_hint(self, method: str) -> str:
        """A hint when a recipe names a method this engine spells differently."""
        return ""

    def api_key_from(self, env: dict[str, str], command: Sequence[str]) -> str | None:
        """The key a running container was started with (for `sparklab bench` against it)."""
        if self.api_key_env and env.get(self.api_key_env):
            return env[self.api_key_env]
        return flag_value(command, "--api-key")

    # -- before the start --------------------------------------------------------------------------------
    def speculative(self, argv: Sequence[str]) -> Speculative | None:
        return None

    label: str = ""  # how messages name the engine: "vLLM 0.27.1"
    method_noun: str = "speculative method"  # what the engine calls a method: "speculative algorithm"

    def check_spec(self, spec: LaunchSpec, recipe: RecipeView) -> list[Finding]:
        """What would make the engine refuse or die after loading, judged from the rendered argv: a method it
        does not have, then the engine's own checks of the speculative settings."""
        sp = spec.speculative
        if sp is None:
            return []
        found: list[Finding] = []
        if sp.method not in self.methods:
            found.append(Finding(
                "error", f"{where(spec)}: {self.label} has no {self.method_noun} {sp.method!r}",
                f"Known {self.method_noun.split()[-1]}s: {', '.join(sorted(self.methods))}."))
        return found + self.check_speculative(spec, recipe, sp)

    def check_speculative(self, spec: LaunchSpec, recipe: RecipeView, sp: Speculative) -> list[Finding]:
        """The engine's own checks of a speculative launch (draft, K, backends)."""
        return []

    # -- startup log ---------------------------------------------------------------------------------------
    def parse_startup(self, text: str) -> StartupFacts:
        facts = StartupFacts(source=f"{self.kind} startup log")
        self.read_startup(text, facts)
        facts.startup_complete = bool(self.ready_line.search(text))
        facts.warnings = collect_warnings(text)
        return facts

    def read_startup(self, text: str, facts: StartupFacts) -> None:
        """Fill in the facts this engine's startup log states."""

    def explain_failure(self, log_tail: str) -> str | None:
        """A known cause for a death, from the last log lines."""
        for failure in self.failures:
            if failure.pattern.search(log_tail):
                return failure.explanation
        return None

    def fatal(self, line: str) -> FatalLine | None:
        """The fatal pattern one log line matches: the engine is dead, whether or not its container runs."""
        for fatal in self.fatal_lines:
            if fatal.pattern.search(line):
                return fatal
        return None

    # -- while serving -------------------------------------------------------------------------------------
    def request_sampling(self, sampling: Sampling) -> Sampling:
        """The sampling as this engine's chat API takes it (an engine that refuses unknown fields drops them)."""
        return sampling

    # The paths a counter snapshot GETs for this engine. sparklab.engines.snapshot asks each path once for every
    # adapter that lists it (without a kind, vLLM, SGLang and llama.cpp all read one /metrics text).
    counter_paths: tuple[str, ...] = ()

    def read_counters(self, replies: Replies) -> dict[str, Any]:
        """Server-side counters at one instant, from the answers to `counter_paths` (merged into the bench
        result's before/after)."""
        return {}

    def cumulative_acceptance(self, snapshot: dict[str, Any]) -> Acceptance | None:
        """An acceptance length the engine states over its whole life (not the window) in one snapshot, and where
        it came from; None when it states none. `sparklab bench` shows it beside the window's own figures."""
        return None

    def window(self, before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
        """What the counters say about the window between two snapshots: `speculative`, `server_latency`."""
        return {}

    def log_acceptance(self, text: str, version: str | None = None) -> dict[str, Any] | None:
        """Acceptance stated by the log lines of the window, for engines that print it (as this version prints it)."""
        return None

    def acceptance(self, result: dict[str, Any]) -> Acceptance | None:
        """The acceptance length of a stored bench result, from what this engine reported."""
        return None

    def acceptance_rate(self, result: dict[str, Any]) -> float | None:
        """The share of proposed draft tokens accepted over the window, where this engine reported it."""
        value = (result.get("speculative") or {}).get("acceptance_rate")
        return None if value is None else float(value)

    def reset_prefix_cache(self, api: EngineAPI) -> None:
        """Between loads, so a later load's prefixes are not already cached."""

    def served_facts(self, api: EngineAPI) -> dict[str, Any]:
        """What the ready engine says of itself over HTTP (stored beside the startup facts), e.g. the bytes and
        parameters of the weights it loaded (`weights`), which the report's roofline prefers to the recipe's."""
        return {}

    def version(self, api: EngineAPI) -> str | None:
        return None

    def k_schedule_args(self, ranges: Sequence[tuple[int, int, int]], version: str | None) -> list[str] | None:
        """Serve arguments for K per batch-size range ((first, last, K), inclusive), or None when this engine
        (at this version) has no such setting."""
        return None

    def k_schedule_why_not(self, version: str | None) -> str:
        """Why k_schedule_args gives nothing at this version ("" when it gives the arguments)."""
        return f"sparklab knows no per-batch-size K setting of {self.kind}"

    def synthetic_acceptance(self, argv: Sequence[str]) -> tuple[float, ...] | None:
        """The per-position acceptance a server was told to fake instead of verifying its drafts (synthetic
        rejection sampling: a benchmark of the engine's step cost, not a drafter), () when it fakes one sparklab
        cannot read; None for a server that verifies its drafts."""
        return None

    # -- its own parser, its version, and which versions this adapter's knowledge was read from ----------------
    knowledge: Knowledge = Knowledge(())
    name: str = ""  # the engine's name without a version: "vLLM"

    def parser_probe(self, specs: Sequence[LaunchSpec]) -> Probe | str:
        """How to run the engine's own argument parser on these servers' commands (one image or program), reading
        its version in the same run; a string says why it cannot be run."""
        return f"sparklab knows no way to run {self.name or self.kind}'s own argument parser"

    def parser_verdicts(self, specs: Sequence[LaunchSpec], run: ProbeRun) -> list[Verdict]:
        """One verdict per server from the probe's run."""
        return [parsers.not_checked(f"{self.name or self.kind}'s parser did not run", run) for _ in specs]

    def version_key(self, version: str | None) -> VersionKey | None:
        return knowledge.dotted_key(version)

    def same_version(self, a: str | None, b: str | None) -> bool:
        """Two readings of the version (the image's metadata, the server's endpoint) name one release."""
        return a is None or b is None or self.version_key(a) == self.version_key(b)

    def version_warning(self, version: str | None, where: str, why_unknown: str = "") -> str | None:
        """One warning naming the checks that may not hold for this version (None: every fact was read for it)."""
        return knowledge.version_warning(self.name or self.kind, self.knowledge, version, where, self.version_key,
                                         why_unknown)

    def acceptance_fact(self, result: dict[str, Any]) -> Fact | None:
        """The fact a result's acceptance figure rests on (the counter or log line it was read from)."""
        return None

    def unverified_acceptance(self, result: dict[str, Any], version: str | None) -> Fact | None:
        """The acceptance fact, when nobody read its format for this version: the report marks the figure."""
        fact = self.acceptance_fact(result)
        if fact is None or version is None:
            return None
        return None if self.knowledge.holds(fact, version, self.version_key) else fact

    # -- the lossless check at temperature > 0 (sparklab.sweep.lossless) ----------------------------------
    # Why this engine cannot score an answer's tokens under the model, or None when score_answer works.
    scoring_unsupported: str | None = "sparklab knows no way to have this engine score given tokens"

    def score_answer(self, api: EngineAPI, model: str, messages: Sequence[dict[str, Any]],
                     extra: dict[str, Any] | None, chat_kwargs: dict[str, Any] | None,
                     answer_ids: Sequence[int]) -> float:
        """The summed log-probability of answer_ids after the chat-templated prompt, under the served model (a
        plain server: no drafting). Raises ScoringError with a one-line reason when it cannot."""
        raise ScoringError(self.scoring_unsupported or "not supported")

    def sampling_defects(self, spec: LaunchSpec) -> list[str]:
        """Known defects of the engine build that make this server's sampled answers (temperature > 0) not the
        target's, each one sentence citing the engine's source; [] for none. Read at plan time and stored with the
        server config, so the report of the run can name the cause beside the lossless check's verdict."""
        return []

    def lossy_settings(self, spec_argv: Sequence[str]) -> list[str]:
        """Settings in a server's argv that make drafting lossy by design (its answers no longer follow the
        target's distribution), each as one sentence citing the engine's source; [] for none."""
        return []

    def request_conflict(self, spec_argv: Sequence[str], extra: Mapping[str, Any]) -> str | None:
        """Why a server started with spec_argv cannot answer a request carrying these fields beyond its messages
        (a workload prompt's `extra`: tools, tool_choice, response_format, ...), as the rest of a sentence that
        begins with the prompt's name, citing the engine's source; None when it can. Read at plan time, so a sweep
        refuses the pairing before any server starts rather than losing the cell on every such server."""
        return None


class ScoringError(Exception):
    """An answer could not be scored: the message is the reason, stored with it."""


# ---------------------------------------------------------------------------------------------------
# checks shared by the adapters


def where(spec: LaunchSpec) -> str:
    return f"{spec.recipe_path}: engines.{spec.engine}.methods.{spec.method}"


def _draft_block_size(recipe: RecipeView, engine: str, draft: str | None) -> tuple[str, int] | None:
    for name, entry in recipe.model_of(engine).drafts.items():
        if entry.id == draft and entry.block_size:
            return name, entry.block_size
    return None


def check_k(spec: LaunchSpec, recipe: RecipeView, k: int | None, flag: str) -> list[Finding]:
    """K must be positive and, for a block drafter, at least the draft's block size."""
    sp = spec.speculative
    if sp is None:
        return []
    if k is None or k < 1:
        return [Finding("error", f"{where(spec)}: {flag} must be a positive integer, got {k!r}",
                        "Give --num-speculative-tokens N (N >= 1).")]
    known = _draft_block_size(recipe, spec.engine, sp.draft_model)
    if known and k < known[1]:
        name, size = known
        return [Finding(
            "error",
            f"{where(spec)}: {flag} is {k}, below the {name} draft's block size {size} "
            f"(model.drafts.{name}.block_size); the engine refuses to start below it",
            f"Use --num-speculative-tokens {size} or more.")]
    return []
