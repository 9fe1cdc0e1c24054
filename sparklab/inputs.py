"""Reading the files a user hands sparklab (recipes, sweep files, prompt files): errors name the file and the fix."""

from __future__ import annotations

import codecs
from pathlib import Path

from sparklab.errors import RecipeError


def read_utf8(path: Path, allow_bom: bool = False) -> str:
    """A text file that must be UTF-8: anything else is a RecipeError naming the file and the first bad byte."""
    data = path.read_bytes()
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
