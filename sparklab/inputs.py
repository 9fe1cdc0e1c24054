"""Reading the files a user hands sparklab (recipes, sweep files, prompt files): errors name the file and the fix.

Every such file is read with a bound: a regular file (or a pipe, for `-w <(…)`) of at most `limit` bytes; a
device such as /dev/zero, a socket or a directory is refused before a byte is read.
"""

from __future__ import annotations

import codecs
import os
import stat
from pathlib import Path
from typing import Any

import yaml

from sparklab.errors import RecipeError

MAX_TEXT_BYTES = 4 * 2**20  # a recipe, sweep file or tune space: far more than any recipe needs
MAX_PROMPTS_BYTES = 64 * 2**20  # a prompts file (JSONL); HumanEval's 164 problems are 0.2 MiB


def _mib(size: int) -> str:
    return f"{size / 2**20:g} MiB"


def read_bounded(path: Path, limit: int) -> bytes:
    """The file's bytes, at most `limit` of them; anything else is a RecipeError naming the file.
    FileNotFoundError and other OSErrors pass through for the caller to word."""
    mode = os.stat(path).st_mode
    if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
        kind = ("a directory" if stat.S_ISDIR(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "a socket" if stat.S_ISSOCK(mode) else "not a file")
        raise RecipeError(f"{path}: not a regular file ({kind}{', via a link' if path.is_symlink() else ''})",
                          "Give the path of a file sparklab can read to its end.")
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise RecipeError(f"{path}: larger than {_mib(limit)} (sparklab reads at most {limit:,} bytes of it)",
                          "Split it, or give a smaller file.")
    return data


def read_utf8(path: Path, allow_bom: bool = False, limit: int = MAX_TEXT_BYTES) -> str:
    """A text file that must be UTF-8: anything else is a RecipeError naming the file and the first bad byte."""
    data = read_bounded(path, limit)
    skip = len(codecs.BOM_UTF8) if allow_bom and data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[skip:].decode("utf-8")
    except UnicodeDecodeError as exc:
        offset = skip + exc.start
        line = data.count(b"\n", 0, offset) + 1
        raise RecipeError(
            f"{path}: not UTF-8 text: byte 0x{data[offset]:02x} at offset {offset} (line {line}) is not valid "
            "UTF-8", "Save the file as UTF-8, e.g. iconv -f latin1 -t utf-8 FILE > NEW (if it was Latin-1).",
        ) from None


SURROGATE_HINT = ("A \\ud800-\\udfff escape alone is half of a character: no server can receive it (UTF-8 cannot "
                  "encode it). Remove it, or write the whole character (itself, or as a pair such as "
                  "\\ud83d\\ude00).")


_LIBYAML = getattr(yaml, "CSafeLoader", None)  # PyYAML built with libyaml (the wheels are)


# Any: YAML as parsed, before anything validates it
def parse_yaml(text: str) -> Any:
    """`yaml.safe_load(text)`, parsed by libyaml where PyYAML has it: 7.5x faster on recipes/gb10.yaml (1.0 ms
    against 7.5 ms, this machine), which every plan, check and report loads. A document libyaml refuses is parsed
    again by PyYAML's own loader, so what is accepted and every error stay exactly safe_load's: libyaml refuses a
    lone surrogate escape (\\ud800) that safe_load accepts and check_text then names by its key, and cannot take
    text holding one (a `--set` value from bytes that are not UTF-8)."""
    if _LIBYAML is not None:
        try:
            return yaml.load(text, Loader=_LIBYAML)  # CSafeLoader: safe_load's loader, in C
        except (yaml.YAMLError, UnicodeError):
            pass
    return yaml.safe_load(text)


def lone_surrogate(text: str) -> int | None:
    """Where a string holds a lone surrogate (an escape JSON and YAML accept, UTF-8 cannot encode), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return int(exc.start)
    return None


# Any: a parsed YAML or JSON document, whatever its shape (walked, never trusted)
def check_text(value: Any, where: str, key: str = "") -> None:
    """Every string in a parsed document (keys too) can be sent as UTF-8; else a RecipeError naming the key."""
    if isinstance(value, str):
        at = lone_surrogate(value)
        if at is not None:
            raise RecipeError(f"{where}: {key or 'the document'}: a lone surrogate \\u{ord(value[at]):04x} at "
                              f"character {at}", SURROGATE_HINT)
    elif isinstance(value, dict):
        for name, item in value.items():
            shown = str(name).encode("utf-8", "backslashreplace").decode("utf-8")  # printable even if it is bad
            path = f"{key}.{shown}" if key else shown
            check_text(str(name), where, path)
            check_text(item, where, path)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            check_text(item, where, f"{key}[{i}]")
