"""Engine-neutral parsing (pure): the startup facts record, startup warnings, Prometheus text, exit codes.

What a particular engine's log or counters say is read by its adapter (sparklab/engines/<kind>.py).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

_WARNING = re.compile(r"\bWARNING\b")
_LOG_PREFIX = re.compile(r"^.*?\bWARNING\b.*?\[[\w.]+:\d+\] ")


@dataclass
class StartupFacts:
    """What the engine said about itself while starting. Every field names its log source."""

    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    concurrency_tokens_per_request: int | None = None
    kv_cache_memory_gib: float | None = None
    model_load_seconds: float | None = None
    model_load_gib: float | None = None
    engine_init_seconds: float | None = None
    max_num_scheduled_tokens: int | None = None
    startup_complete: bool = False
    warnings: list[str] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)
    source: str = "container log"

    # Any: JSON, stored with the run
    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def to_int(text: str) -> int:
    """`1,234,567` → 1234567."""
    return int(text.replace(",", ""))


def collect_warnings(text: str) -> list[str]:
    """Every distinct WARNING line, without its logger prefix (the same one comes from several processes)."""
    warnings: list[str] = []
    for line in text.splitlines():
        if _WARNING.search(line):
            message = _LOG_PREFIX.sub("", line).strip()
            if message not in warnings:
                warnings.append(message)
    return warnings


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text → {sample name: value summed over label sets} (prometheus_client's parser)."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + float(sample.value)
    return totals


# Any: counters as JSON, stored with the cell's result
def spec_counters(text: str, counters: dict[str, str], per_position: str) -> dict[str, Any]:
    """An engine's speculative-decoding counters from Prometheus text: each sample named in `counters` summed
    under its key (over engines and label sets), and the `per_position` sample by its position label. Matched
    on sample names, so it does not depend on how the exposition declares the family. Empty when none is there."""
    out: dict[str, Any] = {}
    positions: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if key := counters.get(sample.name):
                out[key] = out.get(key, 0.0) + float(sample.value)
            elif sample.name == per_position:
                pos = sample.labels.get("position", "0")
                positions[pos] = positions.get(pos, 0.0) + float(sample.value)
    if out:
        out["per_position"] = positions
    return out


def exit_code_meaning(code: int | None, oom_killed: bool | None = None, log_tail: str | None = None) -> str:
    """What an exit code says; oom_killed is Docker's State.OOMKilled where it was read (None: unknown).

    log_tail: where given, a SIGKILL or SIGTERM with no Python traceback in it is named for what it most
    likely was on a unified-memory host: the kernel's OOM killer or earlyoom (which sends SIGTERM at ~8 GB
    free, hasso5703/dgx-spark-qwen38 docs/gb10-memory.md), with the advice to lower the memory fraction.
    """
    if code is None:
        return ""
    if oom_killed:
        return " (killed by the kernel's OOM killer: out of memory)"
    no_traceback = log_tail is not None and "Traceback (most recent call last)" not in log_tail
    if code in (137, 143) and oom_killed is False:  # Docker counts every OOM kill in the container's cgroup
        signal = "SIGKILL" if code == 137 else "SIGTERM"
        advice = ("; if that was earlyoom, lower --gpu-memory-utilization (vLLM) or --mem-fraction-static (SGLang)"
                  if no_traceback else "")
        return (f" ({signal} from outside the container, not the kernel's OOM killer: `docker kill`, earlyoom or a "
                f"memory watchdog{advice})")
    if code in (137, 143) and no_traceback:
        signal = "SIGKILL" if code == 137 else "SIGTERM"
        return (f" ({signal} with no Python traceback in the log: most likely out of memory: the kernel's OOM killer "
                "or earlyoom ended it; lower --gpu-memory-utilization (vLLM) or --mem-fraction-static (SGLang))")
    if code == 137:
        return " (SIGKILL: most likely out of memory — the kernel OOM killer or earlyoom)"
    if code == 143:
        return " (SIGTERM: stopped from outside, e.g. earlyoom)"
    if code == 139:
        return " (segmentation fault)"
    return ""
