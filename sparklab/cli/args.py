"""The command line's shared vocabulary: argument types that turn text into checked values (a usage error now
rather than a traceback later) and the flags several commands share.

Each command's own flags live beside it, in its `XArgs.add_cli_args` (sparklab/cli/<command>.py), next to the
`from_cli_args` that reads them back; `main.build_parser` assembles them in the order `sparklab --help` lists.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from pathlib import Path

from sparklab.recipes.schema import MAX_SPECULATIVE_TOKENS


def default_hf_cache() -> Path:
    home = os.environ.get("HF_HOME")
    return Path(home).expanduser() if home else Path("~/.cache/huggingface").expanduser()


def whole(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number from low to high, else a usage error now rather than a traceback later."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected a whole number from {low} to {high}, got {text}")
        return value
    return parse


def positive(high: float) -> Callable[[str], float]:
    """An argparse type: a number above 0 and at most high (not nan or inf)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not 0 < value <= high:
            raise argparse.ArgumentTypeError(f"expected a number above 0 and at most {high:g}, got {text}")
        return value
    return parse


def between(low: float, high: float, low_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number from low (or above it) to high, as the sweep file's sampling allows."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (low < value <= high if low_open else low <= value <= high):
            raise argparse.ArgumentTypeError(f"expected a number {'above' if low_open else 'from'} {low:g} "
                                             f"{'and at most' if low_open else 'to'} {high:g}, got {text}")
        return value
    return parse


def k_values(text: str) -> list[int]:
    """--k: 1-8, 1,2,4 or 3 (each K from 1 to MAX_SPECULATIVE_TOKENS)."""
    k = whole(1, MAX_SPECULATIVE_TOKENS)
    out: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        first, last = k(low.strip()), k((high or low).strip())
        if first > last:
            raise argparse.ArgumentTypeError(f"expected a range from low to high, got {part}")
        out += range(first, last + 1)
    return sorted(set(out))


def host_option(p: argparse.ArgumentParser, help: str) -> None:
    """--host, repeatable: Docker hosts by name or URL (render, up, sweep, ps, down, logs, gc)."""
    p.add_argument("--host", dest="hosts", action="append", default=[], metavar="DOCKER_HOST", help=help)


ON_HOSTS = "on these Docker hosts (repeatable; default: this machine's and those in SPARKLAB_HOSTS)"
