"""Pydantic's validation errors as sparklab says them: one line per error naming the file, the key path (the
tags that tell union members apart left out) and the fix. Shared by recipes (schema) and sweep files (sweep_file)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from sparklab.errors import RecipeError

# The tags that tell a union's members apart by shape: a request count as one number or per concurrency; a sweep
# axis as one value or a list (sweep_file.SamplingSpec). Never part of a key path a user wrote.
ONE_COUNT, PER_CONCURRENCY = "one count", "per concurrency"
ONE_VALUE, VALUES = "one value", "values"
UNION_TAGS = (ONE_COUNT, PER_CONCURRENCY, ONE_VALUE, VALUES)


def _location(loc: tuple[Any, ...]) -> str:
    path = ""
    for part in loc:
        if part in UNION_TAGS:
            continue
        if part == "[key]":
            path += " (the key)"
            continue
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "(top level)"


_WHOLE_NUMBER = "write a whole number, without quotes or a decimal point"
_FIXES = {
    "extra_forbidden": "remove it or fix its spelling (unknown keys are errors)",
    "missing": "add it",
    "int_type": _WHOLE_NUMBER,
    "int_from_float": _WHOLE_NUMBER,
    "int_parsing": _WHOLE_NUMBER,
    "int_parsing_size": _WHOLE_NUMBER,
    "finite_number": "write a finite number",
}


def explain_validation(exc: ValidationError, source: str) -> RecipeError:
    lines = []
    for err in exc.errors():
        where = _location(err["loc"])
        got = err.get("input")
        what = err["msg"]
        if err["type"] == "extra_forbidden":
            what = "unknown key"
        fix = _FIXES.get(err["type"], "")
        shown = "" if err["type"] == "missing" or isinstance(got, dict) else f", got {got!r}"
        lines.append(f"{source}: {where}: {what}{shown}" + (f"; {fix}" if fix else ""))
    return RecipeError("\n".join(lines), "See recipes/README.md for the recipe format.")
