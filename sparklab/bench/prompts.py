"""What a workload is (pure): named, ordered prompts, each with its messages and, for a graded suite, its task.

Shared by the workload sources (sparklab.bench.workloads) and the graded suites (sparklab.bench.suites).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

CHARS_PER_TOKEN = 4


@dataclass(frozen=True)
class Prompt:
    """One request's input: OpenAI chat messages and an estimate of their length in tokens; `extra`: more
    request fields (the tool-call probe's `tools` and `tool_choice`); `task`: how a graded suite's answer is
    graded (sparklab.bench.grading; never sent to the server)."""

    id: str
    messages: tuple[dict[str, str], ...]
    approx_input_tokens: int
    extra: dict[str, Any] | None = None
    task: dict[str, Any] | None = None


@dataclass(frozen=True)
class Workload:
    """A named, ordered set of prompts, sent round robin."""

    name: str
    description: str
    prompts: tuple[Prompt, ...]

    def __post_init__(self) -> None:
        if not self.prompts:
            raise ValueError(f"workload {self.name!r} has no prompts")

    def prompt(self, index: int) -> Prompt:
        return self.prompts[index % len(self.prompts)]

    @property
    def graded(self) -> bool:
        """A task suite: its answers are graded after the window (sparklab.bench.grading)."""
        return any(p.task for p in self.prompts)

    def by_id(self, prompt_id: str) -> Prompt | None:
        return next((p for p in self.prompts if p.id == prompt_id), None)

    @property
    def content_hash(self) -> str:
        """sha256 over every prompt's id and messages, in order: two runs with the same hash sent the same
        prompts, and their per-request `prompt_id`s line up prompt by prompt."""
        data = [[p.id, list(p.messages), *([p.extra] if p.extra else []), *([{"task": p.task}] if p.task else [])]
                for p in self.prompts]
        return "sha256:" + hashlib.sha256(json.dumps(data, sort_keys=True, ensure_ascii=False).encode()).hexdigest()



def approx_tokens(messages: tuple[dict[str, str], ...]) -> int:
    chars = sum(len(message["content"]) for message in messages)
    return -(-chars // CHARS_PER_TOKEN)
