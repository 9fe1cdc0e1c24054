"""Shared by the CLI tests: every read of an argparse.Namespace, with the module that made it, and a command line
per command that sets every one of its flags."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def namespace_reads() -> Iterator[list[tuple[str, str]]]:
    """(the reading module, the attribute) for each attribute read of any Namespace while inside; argparse's own
    reads (while parsing) are left out."""
    reads: list[tuple[str, str]] = []

    def traced(self: argparse.Namespace, name: str) -> Any:
        caller = sys._getframe(1).f_globals.get("__name__", "?")
        if caller != "argparse":
            reads.append((caller, name))
        return object.__getattribute__(self, name)

    assert "__getattribute__" not in vars(argparse.Namespace)  # it inherits object's, which `del` restores
    argparse.Namespace.__getattribute__ = traced  # type: ignore[method-assign]
    try:
        yield reads
    finally:
        del argparse.Namespace.__getattribute__


# Every flag of every command set to something other than its default (the dests a from_cli_args must read).
EVERY_FLAG: dict[str, list[str]] = {
    "render": ["render", "gb10:dspark", "-t", "gb10", "--engine", "sglang", "--set", "a=1", "--set", "b=2",
               "--image", "my/img:1", "--port", "9000", "-k", "3", "--serve-arg=--x", "-e", "A=1", "--hf-cache",
               "/tmp/hf", "--ulimit", "memlock=-1", "--no-gpus", "--public", "--no-api-key", "--ready-timeout", "30",
               "--host", "local", "--host-checks"],
    "up": ["up", "dspark", "-t", "gb10", "--engine", "vllm", "--set", "a=1", "--image", "i", "--port", "9001", "-k",
           "2", "--serve-arg=--y", "-e", "B", "--hf-cache", "/tmp/hf2", "--ulimit", "stack=1", "--no-gpus",
           "--public", "--no-api-key", "--ready-timeout", "60", "--host", "ssh://a", "--host", "ssh://b", "-d",
           "--pull", "always", "--api-key", "k-1", "--allow-foreign-platform", "--dry-run", "--no-download",
           "--stall-timeout", "5", "--memory-floor-gib", "3"],
    "bench": ["bench", "--url", "http://127.0.0.1:9/v1", "--api-key", "k", "--model", "m", "-w", "w.jsonl", "-c",
              "4", "--duration", "3", "--rate", "2", "--warmup", "0", "--max-tokens", "5", "--temperature", "0",
              "--top-p", "0.5", "--ignore-eos", "--min-tokens", "2", "--thinking", "on", "--seed", "7",
              "--no-stream", "--no-token-ids", "--request-timeout", "9", "--stall-timeout", "8", "--json", "o.json"],
    "sweep": ["sweep", "s.yaml", "--dry-run", "--resume", "r1", "--new", "--retry-failed", "--allow-drift",
              "--runs-dir", "rd", "--pull", "never", "--no-drop-caches", "--memory-floor-gib", "2.5", "--ulimit",
              "a=1", "--no-download", "--min-free-mib", "5", "--host", "local", "--host", "ssh://x"],
    "tune": ["tune", "cpu", "--methods", "none", "ngram", "--k", "1-3", "--concurrency", "1", "4", "-w", "seed",
             "--objective", "decode", "--ttft-max", "500", "--repeats", "3", "--max-repeats", "4", "-n", "6",
             "--max-tokens", "9", "--tolerance", "0.2", "--dry-run", "--resume", "r2", "--new", "--runs-dir", "rd",
             "--pull", "always", "--ulimit", "a=1", "--no-download"],
    "rehearse": ["rehearse", "tune", "gb10", "--fault", "oom", "--throttle", "--set", "a=1", "--engine", "vllm",
                 "--minutes", "2", "--runs-dir", "rd"],
    "report": ["report", "r3", "--runs-dir", "rd", "-f", "html", "-o", "out", "--hardware", "gb10",
               "--bandwidth-gbps", "273", "--fact", "a=1", "--fact", "b=2"],
    "compare": ["compare", "r1", "r2", "--runs-dir", "rd", "-f", "csv", "-o", "out", "--force"],
    "pull": ["pull", "gb10", "-t", "gb10", "--engine", "vllm", "--set", "a=1", "--all-methods", "--hf-cache",
             "/tmp/h", "--pull", "always", "--no-images", "--no-models"],
    "down": ["down", "n1", "--all", "--all-users", "--host", "local"],
    "ps": ["ps", "--host", "local", "--host", "ssh://x"],
    "logs": ["logs", "n2", "-f", "--tail", "10", "--host", "local"],
    "gc": ["gc", "--caches", "--keep", "2", "--max-gib", "3", "--host", "local"],
    "recipes": ["recipes"],
    "check": ["check", "cpu", "-t", "gb10", "--engine", "vllm-cpu", "--set", "a=1", "--pull", "never", "--no-cache",
              "--timeout", "30"],
}
