"""Where an argument of a rendered command came from: the recipe (or sweep) file's line that writes it, the command
line, or sparklab itself. What an engine's parser refuses is reported with the line to fix (pure: reads the files).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from sparklab.spec import LaunchSpec

_FLAG = re.compile(r"--?[A-Za-z][\w.-]*")


def named_flag(flag: str | None, message: str, argv: Sequence[str]) -> str | None:
    """The flag a parser's message is about: the one it names, else the first flag of the message that the command
    holds (`unrecognized arguments: --speculative-confg 3`)."""
    given = {a.split("=", 1)[0] for a in argv if a.startswith("-")}
    if flag and flag in given:
        return flag
    for found in _FLAG.findall(message):
        if found in given or found.replace("_", "-") in given:
            return found
    return flag


def flag_origin(spec: LaunchSpec, flag: str | None, sources: Sequence[Path] = ()) -> str:
    """`recipes/cpu.yaml:57: --speculative-confg, ngram,` for the first line of the recipe (then of `sources`, e.g.
    the sweep file) that writes the flag, preferring the lines under the server's engine; else where it came from."""
    if not flag:
        return f"{spec.recipe_path}: engines.{spec.engine}.methods.{spec.method}"
    token = re.compile(rf"(?<![\w-]){re.escape(flag)}(?![\w-])")
    for path in (Path(spec.recipe_path), *sources):
        found = _line_of(path, token, spec.engine)
        if found:
            return found
    position = next((i for i, a in enumerate(spec.argv) if a.split("=", 1)[0] == flag), None)
    if position is not None and position >= spec.recipe_argv_len:
        return f"--serve-arg {flag} (or a sweep file's overrides: serve_args), not {spec.recipe_path}"
    return f"a template or --set value of {spec.recipe_path} that wrote {flag}"


def _line_of(path: Path, token: re.Pattern[str], engine: str) -> str | None:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    hits = [i for i, line in enumerate(lines) if token.search(line.split("#", 1)[0])]
    if not hits:
        return None
    start = next((i for i, line in enumerate(lines) if re.match(rf"\s+{re.escape(engine)}:\s*(#.*)?$", line)), -1)
    best = next((i for i in hits if i > start), hits[0]) if start >= 0 else hits[0]
    return f"{path}:{best + 1}: {lines[best].strip()}"
