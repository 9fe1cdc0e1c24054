"""Facts from an engine's startup log (pure): KV cache, concurrency, load time and memory, warnings."""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import requests
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


_SPEC = {
    "vllm:spec_decode_num_drafts_total": "drafts",
    "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens_total": "accepted",
}
_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
# vLLM's own per-request latency histograms (sum and count), for a server-side cross-check of the client.
_LATENCY = tuple(f"vllm:{name}_seconds_{part}" for name in (
    "time_to_first_token", "request_time_per_output_token", "e2e_request_latency") for part in ("sum", "count"))


def spec_counters(text: str) -> dict[str, Any]:
    """vLLM's speculative-decoding counters (summed over engines), per-position by position label.

    Matched on sample names, so it does not depend on how the exposition declares the family.
    Empty when the server has no speculative config (vLLM registers them only then).
    """
    out: dict[str, Any] = {}
    per_position: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if key := _SPEC.get(sample.name):
                out[key] = out.get(key, 0.0) + float(sample.value)
            elif sample.name == _PER_POSITION:
                pos = sample.labels.get("position", "0")
                per_position[pos] = per_position.get(pos, 0.0) + float(sample.value)
    if out:
        out["per_position"] = per_position
    return out


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def get_json(url: str, api_key: str | None, timeout_s: float = 10) -> Any:
    from sparklab.errors import SparklabError

    try:
        response = requests.get(url, headers=_headers(api_key), timeout=timeout_s)
    except requests.RequestException as exc:
        raise SparklabError(f"cannot reach {url}: {exc}", "Is the server up? Check --url (sparklab ps).") from None
    if response.status_code in (401, 403):
        raise SparklabError(f"{url} answered {response.status_code}: wrong or missing API key",
                            "Pass --api-key (sparklab up printed it) or use --container NAME.")
    if response.status_code != 200:
        raise SparklabError(f"{url} answered HTTP {response.status_code}")
    return response.json()


def server_snapshot(root: str, api_key: str | None) -> dict[str, Any]:
    """Server-side counters at one instant: vLLM's /metrics and SGLang's /server_info, whichever answer."""
    snap: dict[str, Any] = {"at": time.time()}
    try:
        response = requests.get(root + "/metrics", headers=_headers(api_key), timeout=10)
        if response.status_code == 200:
            snap["spec"] = spec_counters(response.text)
            values = parse_metrics(response.text)
            snap["generation_tokens"] = values.get("vllm:generation_tokens_total")
            snap["latency"] = {k: values[k] for k in _LATENCY if k in values}
    except (requests.RequestException, ValueError) as exc:
        snap["metrics_error"] = str(exc)
    try:
        response = requests.get(root + "/server_info", headers=_headers(api_key), timeout=10)
        if response.status_code == 200:
            states = response.json().get("internal_states") or [{}]
            snap["sglang_avg_spec_accept_length"] = states[0].get("avg_spec_accept_length")
    except (requests.RequestException, ValueError):
        pass
    return snap


_ACCEPT_LEN = re.compile(r"accept len: ([\d.]+)")


def log_acceptance(text: str) -> dict[str, Any] | None:
    """SGLang's per-batch `accept len: X` log lines (acceptance length incl. the bonus token), summarised."""
    values = [float(v) for v in _ACCEPT_LEN.findall(text)]
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return {"samples": len(values), "median": median, "mean": sum(values) / len(values), "max": ordered[-1],
            "source": "SGLang decode log lines 'accept len: X' within the window (per batch, not per token)"}


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
