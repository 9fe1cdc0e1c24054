"""The report's data (pure): the shapes a run's stored results take once read, and how a figure is named.

A `Group` is one server config at one (workload, concurrency): its repeats are the done cells. Every number
is a mean over repeats with a 95% interval (see `sparklab.metrics.estimate`); speedups compare a group with
the same engine's `none` group at the same workload and concurrency. Reading them from the store is
`report.from_store`, grouping and the best pick `report.grouping`, memory and clocks `report.host_samples`.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sparklab import engines
from sparklab.bench.metrics import Estimate, Ratio
from sparklab.bench.stats import Difference
from sparklab.outputs import Equality, ToolCalls
from sparklab.report.roofline import Device, RooflinePoint
from sparklab.report.verdict import GroupKey
from sparklab.sweep.store_rows import CellRow, FailureRow

METHOD_NAMES = {"none": "none", "mtp": "MTP", "dflash": "DFlash", "dspark": "DSpark", "eagle": "EAGLE",
                "ngram": "ngram", "draft_model": "draft model"}
BASELINE = "none"
BEST_TIE = 0.01  # within 1% of the best score, the smaller K wins


DECODE_LEAD = "decode"  # a sweep file's `headline: decode` (seed 004's table)


def headline_metric(concurrency: int, lead: str = "seed000") -> str:
    """Seed 000's columns: per-request tok/s at C=1, aggregate tok/s above. Seed 004's (`headline: decode`):
    generation speed excluding TTFT, the mean over requests of decode tok/s."""
    if lead == DECODE_LEAD:
        return "generation tok/s (excl. TTFT)"
    return "per-request tok/s" if concurrency == 1 else "aggregate tok/s"


def headline_key(concurrency: int, lead: str = "seed000") -> str:
    if lead == DECODE_LEAD:
        return "decode_tps"
    return "per_request_tps" if concurrency == 1 else "aggregate_tps"


def headline_name(concurrency: int, lead: str = "seed000") -> str:
    return f"C={concurrency} {headline_metric(concurrency, lead)}"


def _summary(key: str, stat: str | None = None) -> Callable[[dict[str, Any]], float | None]:
    def read(result: dict[str, Any]) -> float | None:
        value = (result.get("summary") or {}).get(key)
        if stat is not None:
            value = (value or {}).get(stat)
        return None if value is None else float(value)
    return read


def acceptance(result: dict[str, Any]) -> tuple[float | None, str | None]:
    """Acceptance length and where it came from, as the engine's adapter reads its stored result (vLLM: its
    counters over the window; SGLang: its `accept len` log lines in the window, else /server_info)."""
    return engines.acceptance(result)


# metric → how to read it from one cell's stored result
METRICS: dict[str, Callable[[dict[str, Any]], float | None]] = {
    "aggregate_tps": _summary("aggregate_tps"),
    "per_request_tps": _summary("per_request_tps", "mean"),
    "decode_tps": _summary("decode_tps", "mean"),
    "ttft_p50_ms": _summary("ttft_ms", "p50"),
    "tpot_p50_ms": _summary("tpot_ms", "p50"),
    "acceptance_length": lambda result: acceptance(result)[0],
    "acceptance_rate": engines.acceptance_rate,
    "prompt_tokens": _summary("prompt_tokens", "mean"),
    "tokens_per_request": _summary("tokens_per_request"),
}


@dataclass(frozen=True)
class Server:
    """One server config as the report sees it (the stored row, with its label and up command)."""

    id: str
    seq: int
    engine: str
    method: str
    k: int | None
    recipe: str
    overrides: tuple[str, ...]
    serve_args: tuple[str, ...]
    image: str
    image_digest: str | None
    engine_version: str | None
    ready_s: float | None
    startup: dict[str, Any]
    model: dict[str, Any]
    device: Device | None
    kind: str | None = None  # the engine adapter's kind (vllm, llamacpp, ...); None in runs that did not store it
    image_check: dict[str, Any] | None = None  # its image's own parser on its command (None: runs before schema 5)
    # per-position acceptance the server was told to fake (synthetic rejection sampling), () when unreadable;
    # None: a real drafter (or none). Such a server benchmarks the engine's step cost, it is not a config to run.
    synthetic: tuple[float, ...] | None = None
    argv: tuple[str, ...] = ()  # the redacted serve command (what made it lossy, if anything)
    downloads: dict[str, Any] | None = None  # what it waited for before its latest start (schema 6)
    started_at: str | None = None

    @property
    def lossy_settings(self) -> list[str]:
        """Settings of its serve command that make drafting lossy by design (the engine adapter says which)."""
        return engines.ENGINES[self.kind].lossy_settings(self.argv) if self.kind in engines.ENGINES else []
    runtime: str | None = None  # "container" or "process"; None in runs that did not store it
    # known defects of its engine build at temperature > 0 (Engine.sampling_defects, stored at plan time)
    sampling_defects: tuple[str, ...] = ()

    @property
    def is_process(self) -> bool:
        """A host-process engine: its image is the program it runs (older runs: a path is a program, never an
        image reference)."""
        return self.runtime == "process" or (self.runtime is None and self.image.startswith("/"))

    @property
    def streams_one_chunk_per_step(self) -> bool:
        """Whether each engine step streams one chunk (vLLM, SGLang); unknown engines are taken to."""
        return engines.ENGINES[self.kind].streams_one_chunk_per_step if self.kind in engines.ENGINES else True

    @property
    def method_name(self) -> str:
        name = METHOD_NAMES.get(self.method, self.method)
        if self.synthetic is not None and "synthetic" not in name.lower():
            name += " (synthetic)"
        return name

    @property
    def is_synthetic(self) -> bool:
        return self.synthetic is not None

    @property
    def schedule(self) -> str | None:
        """The K per batch size of a K-schedule server (`sparklab tune` measures one), as `1-1: K=3, 2-1024: K=1`."""
        import json

        for arg in self.serve_args:
            flag, _, value = arg.partition("=")
            if flag.endswith("num_speculative_tokens_per_batch_size") and value:
                try:
                    ranges = json.loads(value)
                    return ", ".join(f"{a}-{b}: K={k}" for a, b, k in ranges)
                except (ValueError, TypeError):
                    return value
        return None

    @property
    def label(self) -> str:
        k = f" K={self.k}" if self.k is not None else ""
        schedule = f" (K per batch size {self.schedule})" if self.schedule else ""
        return f"{self.engine} {self.method_name}{k}{schedule}"

    @property
    def up_command(self) -> str:
        """The ready-to-run command that starts this configuration on its own."""
        argv = ["sparklab", "up", f"{self.recipe}:{self.method}", "--engine", self.engine]
        if self.k is not None:
            argv += ["-k", str(self.k)]
        for override in self.overrides:
            argv += ["--set", override]
        for arg in self.serve_args:
            argv.append(f"--serve-arg={arg}")
        return shlex.join(argv)


@dataclass(frozen=True)
class Group:
    server: Server
    workload: str
    concurrency: int
    cells: tuple[CellRow, ...]
    metrics: dict[str, Estimate | None]
    per_position: tuple[float, ...]
    ttft_ms: tuple[float, ...]  # every measured request of every repeat
    token_sources: tuple[str, ...]
    acceptance_sources: tuple[str, ...]
    speedup: Ratio | None = None
    baseline: str | None = None  # the baseline group's server label
    roofline: RooflinePoint | None = None
    rests_on_partial: bool = False  # this group or its baseline has cells with failed requests
    lead: str = "seed000"  # which figure heads the tables and drives speedups and the best pick (headline_key)
    equality: Equality | None = None  # its answers against the baseline's (drafting groups only)
    tool_calls: tuple[ToolCalls, ...] = ()  # tool calls per answer, per tool-call prompt (the runaway probe)
    loads: int = 1  # server starts its cells ran on (stored per cell since issue 25; earlier runs: 1)
    load_noise: bool = False  # its headline interval and speedup include between-load variance (report.verdicts)
    workload_name: str = ""  # the workload itself; `workload` adds the sampling when the run sweeps it
    sampling: dict[str, Any] = field(default_factory=dict)  # its cells' concrete sampling
    answers: tuple[dict[str, Any], ...] = ()  # measured answers (outputs), each with its cell id, repeat and index
    grades: tuple[dict[str, Any], ...] = ()  # a graded suite's grades, each with its cell id, repeat and index

    @property
    def n(self) -> int:
        return len(self.cells)

    @property
    def failed_requests(self) -> int:
        """Measured requests that failed, over every cell of the group (0 for whole cells)."""
        return sum(int(((c.summary or {}).get("requests") or {}).get("failed") or 0) for c in self.cells)

    @property
    def partial(self) -> bool:
        """Some cell ended partial (kept after max_attempts) or counted failed requests."""
        return self.failed_requests > 0 or any(c.status == "partial" for c in self.cells)

    @property
    def headline(self) -> Estimate | None:
        return self.metrics[headline_key(self.concurrency, self.lead)]

    @property
    def is_baseline(self) -> bool:
        return self.server.method == BASELINE

    @property
    def key(self) -> GroupKey:
        """Which group this is within its report: its server, workload (with its sampling variant), concurrency."""
        return (self.server.id, self.workload, self.concurrency)


@dataclass(frozen=True)
class Best:
    workload: str
    concurrency: int
    group: Group
    score: float
    best_score_group: Group  # the highest score before the smaller-K preference
    candidates: int
    runner_up: Group | None = None  # the next best config by score
    versus_runner_up: Ratio | None = None  # the chosen headline / the runner-up's, with its 95% interval
    synthetic_skipped: tuple[Group, ...] = ()  # synthetic configs that scored above the pick: never named best
    one_load: bool = False  # the pick or its runner-up ran on one server start only
    # configs that scored above the pick but are not the target model made faster, so never named best: answers that
    # differ from none's at temperature 0 (the equality check), sampled answers the lossless check flagged
    changed_output: tuple[Group, ...] = ()
    lossy: tuple[Group, ...] = ()


@dataclass(frozen=True)
class Lossless:
    """One drafting config's lossless check at one sampling (report.lossless.results; Report.lossless)."""

    server: Server
    baseline: Server | None
    sampling: str  # the sampling it ran at, e.g. "temperature 1, top_p 0.95"
    answers: int
    baseline_answers: int
    logprob: Difference | None
    length: Difference | None
    reason: str = ""  # why it could not be checked ("" when checked)
    flagged: tuple[str, ...] = ()  # what the test found
    declared: tuple[str, ...] = ()  # lossy by design (the engine adapter)
    identical: bool = False  # every answer scored exactly as none's: the very same samples
    known: tuple[str, ...] = ()  # the engine build's known defects when sampling (Engine.sampling_defects)
    groups: tuple[GroupKey, ...] = ()  # the groups (workloads, concurrencies) its answers came from

    @property
    def lossy(self) -> bool:
        """Flagged by the test or lossy by design: its answers are not the target's."""
        return bool(self.flagged or self.declared)

    @property
    def checked(self) -> bool:
        return self.logprob is not None and not self.reason


@dataclass
class Report:
    run_id: str
    sweep: dict[str, Any]
    meta: dict[str, str]
    host: dict[str, Any]
    counts: dict[str, int]
    servers: list[Server]
    groups: list[Group]
    best: list[Best]
    failures: list[FailureRow]
    roofline_notes: list[str] = field(default_factory=list)
    slo: str | None = None  # the latency objective the report judges configs by (report --slo, else the sweep's)
    scores: dict[tuple[str, int], Any] = field(default_factory=dict)  # the lossless check's (cell id, index) -> Score
    # the lossless check's verdicts, made once at build (report.lossless.results) for every section, check and export
    lossless: tuple[Lossless, ...] = ()

    @property
    def lossy(self) -> frozenset[GroupKey]:
        """The groups whose sampled answers are not the target's (flagged, or lossy by design): never named best."""
        return frozenset(key for r in self.lossless if r.lossy for key in r.groups)

    @property
    def workloads(self) -> list[str]:
        return list(dict.fromkeys(g.workload for g in self.groups))

    def concurrencies(self, workload: str) -> list[int]:
        return sorted({g.concurrency for g in self.groups if g.workload == workload})

    @property
    def lead(self) -> str:
        return str(self.sweep.get("headline") or "seed000")

    def engines(self, workload: str) -> list[str]:
        return list(dict.fromkeys(g.server.engine for g in self.groups if g.workload == workload))


@dataclass(frozen=True)
class Overrides:
    """What the user corrects at report time: the device's bandwidth, or model facts (`--fact KEY=VALUE`)."""

    device: Device | None = None
    facts: dict[str, float] = field(default_factory=dict)
    slo: str | None = None  # `report --slo`: a latency objective in place of the sweep file's



def cell_sampling(cell: CellRow) -> dict[str, Any]:
    return dict((cell.settings or {}).get("sampling") or {})


def variant_label(sampling: dict[str, Any], varying: list[str]) -> str:
    """The sampling keys a run sweeps over, as they read in a table: `temperature 1, max_tokens 256`."""
    return ", ".join(f"{k} {sampling.get(k):g}" if isinstance(sampling.get(k), (int, float))
                     else f"{k} {sampling.get(k)}" for k in varying)

