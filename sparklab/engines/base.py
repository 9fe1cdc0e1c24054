"""What every engine module provides, and argv helpers shared by them."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Speculative:
    """The speculative-decoding settings an argv asks for, in engine-neutral terms."""

    method: str | None
    num_speculative_tokens: int | None
    draft_model: str | None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class KnownFailure:
    """A log line that explains a startup death, and what to do about it."""

    pattern: re.Pattern[str]
    explanation: str


@dataclass(frozen=True)
class EngineKnowledge:
    kind: str
    ready_path: str
    ready_needs_key: bool
    api_key_env: str | None
    methods: frozenset[str]
    speculative: Callable[[Sequence[str]], Speculative | None]
    network_args: Callable[[str, int], list[str]]
    api_key_args: Callable[[str], list[str]]
    failures: tuple[KnownFailure, ...] = ()


def _norm(flag: str) -> str:
    """`--speculative_config.model` → `--speculative-config.model` (vLLM normalises before the dot only)."""
    head, dot, tail = flag.partition(".")
    return head.replace("_", "-") + dot + tail


def flag_values(argv: Sequence[str], flag: str) -> list[str]:
    """Every value given to `flag` as `--flag value` or `--flag=value` (underscores and dashes alike)."""
    want = _norm(flag)
    values = []
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if _norm(name) != want:
            continue
        if eq:
            values.append(value)
        elif i + 1 < len(argv):
            values.append(argv[i + 1])
    return values


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    values = flag_values(argv, flag)
    return values[-1] if values else None


def has_flag(argv: Sequence[str], flag: str) -> bool:
    want = _norm(flag)
    return any(_norm(a.partition("=")[0]) == want for a in argv)


def json_or_text(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return value


def as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    try:
        return int(str(value))
    except ValueError:
        return None
