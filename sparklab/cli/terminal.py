"""The two consoles every command prints through: `out` (stdout) for results, `err` (stderr) for progress,
warnings and errors, so a command's result can be piped while its progress stays on the terminal."""

from __future__ import annotations

import os
import sys

from rich.console import Console

# Piped output keeps whole lines (rich would wrap tables at 80 columns) so it can be grepped.
_WIDTH = None if sys.stdout.isatty() or "COLUMNS" in os.environ else 200
out = Console(highlight=False, soft_wrap=True, width=_WIDTH)
err = Console(stderr=True, highlight=False, soft_wrap=True, width=_WIDTH)
