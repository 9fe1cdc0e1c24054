"""Facts from an engine's startup log (pure): KV cache, concurrency, load time and memory, warnings."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from sparklab.engines import knowledge

_NUM = r"([\d,]+)"
_VLLM_KV = re.compile(r"GPU KV cache size: " + _NUM + r" tokens")
_VLLM_CONCURRENCY = re.compile(r"Maximum concurrency for " + _NUM + r" tokens per request: ([\d.]+)x")
_VLLM_LOAD = re.compile(r"Model loading took ([\d.]+) GiB(?: memory)? and ([\d.]+) seconds")
_VLLM_WEIGHTS = re.compile(r"Loading weights took ([\d.]+) seconds")  # the CPU build prints only this
_VLLM_KV_MEMORY = re.compile(r"Available KV cache memory: ([\d.]+) GiB")
_VLLM_KV_MEMORY_CPU = re.compile(r"Explicitly set \(([\d.]+)/[\d.]+\) GiB for KV cache")
_VLLM_ENGINE_INIT = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s")
_VLLM_SPEC_BUDGET = re.compile(r"max_num_scheduled_tokens is set to (-?\d+) based on the speculative decoding")
_SGL_KV = re.compile(r"KV Cache is allocated\. #tokens: " + _NUM)
_SGL_MAX_TOKENS = re.compile(r"max_total_num_tokens=(\d+)")
_SGL_MAX_RUNNING = re.compile(r"max_running_requests=(\d+)")
_SGL_CONTEXT = re.compile(r"context_len=(\d+)")
_SGL_LOAD_TIME = re.compile(r"Load weight end\..*?elapsed=([\d.]+) s")
_SGL_LOAD_MEM = re.compile(r"Load weight end\..*?mem usage=([\d.]+) GB")
_READY = {
    "vllm": re.compile(r"Application startup complete\."),
    "sglang": re.compile(r"The server is fired up and ready to roll!"),
}
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

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def parse_startup(kind: str, text: str) -> StartupFacts:
    facts = StartupFacts(source=f"{kind} startup log")
    if kind == "vllm":
        _parse_vllm(text, facts)
    else:
        _parse_sglang(text, facts)
    facts.startup_complete = bool(_READY[kind].search(text))
    for line in text.splitlines():
        if _WARNING.search(line):
            message = _LOG_PREFIX.sub("", line).strip()  # the same warning comes from several processes
            if message not in facts.warnings:
                facts.warnings.append(message)
    return facts


def _parse_vllm(text: str, facts: StartupFacts) -> None:
    if m := _VLLM_KV.search(text):
        facts.kv_cache_tokens = _int(m.group(1))
    if m := _VLLM_CONCURRENCY.search(text):
        facts.concurrency_tokens_per_request = _int(m.group(1))
        facts.max_concurrency = float(m.group(2))
    if m := _VLLM_LOAD.search(text):
        facts.model_load_gib = float(m.group(1))
        facts.model_load_seconds = float(m.group(2))
    elif m := _VLLM_WEIGHTS.search(text):
        facts.model_load_seconds = float(m.group(1))
    if m := _VLLM_KV_MEMORY.search(text) or _VLLM_KV_MEMORY_CPU.search(text):
        facts.kv_cache_memory_gib = float(m.group(1))
    if m := _VLLM_ENGINE_INIT.search(text):
        facts.engine_init_seconds = float(m.group(1))
    if m := _VLLM_SPEC_BUDGET.search(text):
        facts.max_num_scheduled_tokens = int(m.group(1))
        facts.advice.append(
            f"vLLM capped max_num_scheduled_tokens at {m.group(1)} for the draft slots, which limits the "
            f"speculative speed-up: raise --max-num-batched-tokens (or lower K / --max-num-seqs).")


def _parse_sglang(text: str, facts: StartupFacts) -> None:
    if m := _SGL_KV.search(text):
        facts.kv_cache_tokens = _int(m.group(1))
    elif m := _SGL_MAX_TOKENS.search(text):
        facts.kv_cache_tokens = int(m.group(1))
    if (m := _SGL_MAX_RUNNING.search(text)) is not None:
        facts.max_concurrency = float(m.group(1))
        if c := _SGL_CONTEXT.search(text):
            facts.concurrency_tokens_per_request = int(c.group(1))
    if m := _SGL_LOAD_TIME.search(text):
        facts.model_load_seconds = float(m.group(1))
    if m := _SGL_LOAD_MEM.search(text):
        facts.model_load_gib = float(m.group(1))


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text → {sample name: value summed over label sets} (prometheus_client's parser)."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + float(sample.value)
    return totals


def explain_failure(kind: str, log_tail: str) -> str | None:
    """A known cause for a startup death, from the last log lines."""
    for failure in knowledge(kind).failures:
        if failure.pattern.search(log_tail):
            return failure.explanation
    return None


def exit_code_meaning(code: int | None) -> str:
    if code is None:
        return ""
    if code == 137:
        return " (SIGKILL: most likely out of memory — the kernel OOM killer or earlyoom)"
    if code == 143:
        return " (SIGTERM: stopped from outside, e.g. earlyoom)"
    if code == 139:
        return " (segmentation fault)"
    return ""
