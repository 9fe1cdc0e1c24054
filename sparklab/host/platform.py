"""Platform provenance of a run: OS release, kernel, and the GPU driver and CUDA version where nvidia-smi answers.

Seed 004 states its platform (DGX OS 7.6.0, Ubuntu 24.04.4 LTS) beside its numbers; a run does the same, so a
report years later, or `sparklab compare` across two machines, can say what differed. Read once when a run is
created; every fact says where it came from when it is missing.
"""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

# Any: host facts are JSON stored with the run (nvidia-smi and /proc readings as read)

_CUDA = re.compile(r"CUDA Version:\s*([0-9][0-9.]*)")


def os_release(path: Path = Path("/etc/os-release")) -> str | None:
    """PRETTY_NAME of os-release(5), e.g. "Debian GNU/Linux 12 (bookworm)"."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "PRETTY_NAME":
            return value.strip().strip('"').strip("'") or None
    return None


def _smi(args: list[str], timeout_s: float) -> tuple[str | None, str]:
    """nvidia-smi's output, or None and why not."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return None, "nvidia-smi not found"
    try:
        done = subprocess.run([binary, *args], capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"nvidia-smi failed: {exc}"
    if done.returncode != 0:
        first = (done.stderr or done.stdout).strip().splitlines()
        return None, f"nvidia-smi exited with {done.returncode}" + (f": {first[0][:120]}" if first else "")
    return done.stdout, ""


def gpu_facts(timeout_s: float = 10.0) -> dict[str, Any]:
    """GPUs with their driver, and the CUDA version the driver supports (nvidia-smi's header)."""
    listing, why = _smi(["--query-gpu=name,driver_version", "--format=csv,noheader"], timeout_s)
    if listing is None:
        return {"nvidia_smi": why}
    gpus = []
    for line in listing.strip().splitlines():
        name, _, driver = line.rpartition(",")
        if name.strip():
            gpus.append({"name": name.strip(), "driver": driver.strip()})
    header, _ = _smi([], timeout_s)
    found = _CUDA.search(header or "")
    return {"gpus": gpus, "cuda": found.group(1) if found else None, "nvidia_smi": "answered"}


def platform_facts() -> dict[str, Any]:
    return {"os_release": os_release(), "kernel": platform.release(), "machine": platform.machine(),
            **gpu_facts(), "source": "/etc/os-release PRETTY_NAME, uname -r, nvidia-smi (driver, CUDA header)"}
