"""Where sparklab keeps what outlives one command on this machine: server logs and host-process run files.

`SPARKLAB_STATE` wins; else `$XDG_STATE_HOME/sparklab`, else `~/.local/state/sparklab`.
"""

from __future__ import annotations

import os
from pathlib import Path


def state_dir() -> Path:
    env = os.environ.get("SPARKLAB_STATE")
    base = Path(env) if env else Path(os.environ.get("XDG_STATE_HOME", "~/.local/state")).expanduser() / "sparklab"
    return base
