"""A fake `nvidia-smi` for the clock sampling tests (unit and host-process tiers): a shell script on PATH, or a
path handed to the probe, whose clock readings follow a script: steady, then throttled mid-window."""

from __future__ import annotations

import stat
from pathlib import Path

NORMAL = "2405, 2418, 92.50, 61, 0x0000000000000000"
THERMAL = "1702, 2418, 71.25, 91, 0x0000000000000040"  # HW thermal slowdown (NVML 0x40)
IDLE = "208, 2418, 11.00, 45, 0x0000000000000001"  # GPU idle (NVML 0x1): not a load sample


def fake_nvidia_smi(bin_dir: Path, script: list[str], event_field: str = "clocks_event_reasons.active",
                    cycle: bool = False) -> Path:
    """An nvidia-smi that answers the clock query with script[i] on its i-th call (after the last line: the last
    line again, or with cycle, the script from its start), the memory query as GB10 does ([N/A]), and refuses a
    reason field other than `event_field` as an old or new driver would. Returns the file logging its args."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    lines = bin_dir / "lines"
    lines.write_text("\n".join(script) + "\n")
    counter, calls = bin_dir / "count", bin_dir / "calls"
    path = bin_dir / "nvidia-smi"
    path.write_text(f"""#!/bin/sh
echo "$@" >> {calls}
case "$*" in
  *memory.used*) echo "[N/A], [N/A]"; exit 0;;
  *{event_field}*) ;;
  *clocks_*reasons*) echo "Field \\"${{1#--query-gpu=}}\\" is not a valid field to query."; exit 2;;
esac
n=$(cat {counter} 2>/dev/null || echo 0); n=$((n + 1)); echo $n > {counter}
total=$(wc -l < {lines})
{"n=$(( (n - 1) % total + 1 ))" if cycle else "[ $n -gt $total ] && n=$total"}
sed -n "${{n}}p" {lines}
""")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return calls
