"""Reading an engine's argv: flags given as `--flag value` or `--flag=value`, dashes or underscores alike, and
the loose values a command line or a JSON config carries. Pure functions shared by the adapters and the host
checks (sparklab.host.memory reads the memory fraction with them)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from typing import Any


def norm_flag(flag: str) -> str:
    """`--speculative_config.model` → `--speculative-config.model` (vLLM normalises before the dot only)."""
    head, dot, tail = flag.partition(".")
    return head.replace("_", "-") + dot + tail


def flag_values(argv: Sequence[str], flag: str) -> list[str]:
    """Every value given to `flag` as `--flag value` or `--flag=value` (underscores and dashes alike)."""
    want = norm_flag(flag)
    values = []
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if norm_flag(name) != want:
            continue
        if eq:
            values.append(value)
        elif i + 1 < len(argv):
            values.append(argv[i + 1])
    return values


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    values = flag_values(argv, flag)
    return values[-1] if values else None


# Any: whatever JSON an engine printed, else its text
def json_or_text(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return value


# Any: a value from an engine's JSON or text, of whatever type it came
def as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    try:
        return int(str(value))
    except ValueError:
        return None


# Any: a value from an engine's JSON or text, of whatever type it came
def as_float(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    with contextlib.suppress(TypeError, ValueError):
        return float(value)
    return None
