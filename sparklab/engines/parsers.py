"""The engine's own argument parser, run on the exact rendered command before any server starts.

An adapter says how its parser runs (`Engine.parser_probe`): a program and its arguments, run by the runtime in a
throwaway container of the image (no GPU, no network, no model, bounded time) or, for a host-process engine, with
the engine's own Python. The probe reads the engine's version from the package metadata in the same run. The
adapter then reads the run (`Engine.parser_verdicts`) into one `Verdict` per server: accepted, rejected with the
parser's own messages, or not checked, with why (never a silent pass).

The Python probes are files beside this module (`probes/`), run inside the image with `python -c`: the same code
the parser contract tests run (tests/contract), so what the tests prove of a pinned version is what a user's check
runs against whatever image the recipe names.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sparklab.spec import API_KEY_PLACEHOLDER, LaunchSpec

PROBES = Path(__file__).resolve().parent / "probes"

ACCEPTED, REJECTED, NOT_CHECKED = "accepted", "rejected", "not checked"


@dataclass(frozen=True)
class Probe:
    """What to run: `program args…` in the image (or on this host for a process engine), with this environment."""

    program: str
    args: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ProbeRun:
    """How a probe ran. error: the runtime could not run it at all (no such program, exec format error)."""

    exit_code: int | None
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False
    error: str | None = None


@dataclass(frozen=True)
class Rejection:
    flag: str | None
    message: str


# Any: a verdict round-trips as JSON (the image-check cache, the store)
@dataclass(frozen=True)
class Verdict:
    """One server's command as its engine's parser judged it, and the engine version the image states."""

    status: str  # ACCEPTED, REJECTED or NOT_CHECKED
    parser: str = ""  # what ran, in the user's words
    rejections: tuple[Rejection, ...] = ()
    why_not: str = ""  # NOT_CHECKED: why the parser could not run
    version: str | None = None
    version_source: str = ""  # where the version was read: "package metadata (importlib.metadata) in the image"
    unchecked: tuple[str, ...] = ()  # what the parser cannot judge without the model or a GPU
    facts: dict[str, Any] = field(default_factory=dict)  # what else the probe read (console scripts, …)

    @property
    def message(self) -> str:
        """The parser's own words (rejected), or why it did not run (not checked), or ""."""
        if self.status == REJECTED:
            return "; ".join(r.message for r in self.rejections)
        return self.why_not if self.status == NOT_CHECKED else ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Verdict:
        rejections = tuple(Rejection(r.get("flag"), str(r.get("message", ""))) for r in data.get("rejections", ()))
        return cls(status=str(data["status"]), parser=str(data.get("parser", "")), rejections=rejections,
                   why_not=str(data.get("why_not", "")), version=data.get("version"),
                   version_source=str(data.get("version_source", "")), unchecked=tuple(data.get("unchecked", ())),
                   facts=dict(data.get("facts") or {}))


def not_checked(why: str, run: ProbeRun | None = None, parser: str = "") -> Verdict:
    """A parser that could not run: why, with the probe's last words when it ran at all."""
    if run is not None:
        if run.error:
            why = f"{why}: {run.error}"
        elif run.timed_out:
            why = f"{why}: it did not finish in {run.seconds:.0f} s"
        else:
            tail = last_lines(run.stderr or run.stdout, 3)
            why = f"{why} (exit {run.exit_code}{': ' + tail if tail else ''})"
    return Verdict(NOT_CHECKED, parser=parser, why_not=why)


def last_lines(text: str, n: int) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines[-n:])[:600]


def script(name: str) -> str:
    return (PROBES / name).read_text(encoding="utf-8")


# A POSIX sh bootstrap: the engine's Python is the program itself when it is a Python, else the interpreter the
# program's `#!` line names (a venv's, in most images), else python3 or python on PATH, whichever can import the
# engine's package. `read` and `command -v` are
# shell builtins, so the image needs nothing but /bin/sh and that Python.
FIND_PYTHON = r"""
mod=$1; prog=$2; code=$3; payload=$4; found=""; tried=""
path=$(command -v "$prog" 2>/dev/null || true)
case "${prog##*/}" in python*) [ -n "$path" ] && found=$path ;; esac
if [ -z "$found" ] && [ -n "$path" ] && [ -r "$path" ]; then
  IFS= read -r first < "$path" || true
  case "$first" in
    '#!'*) set -- ${first#??}
           if [ "${1##*/}" = env ] && [ $# -gt 1 ]; then shift; fi
           case "$1" in *python*) found=$1 ;; esac ;;
  esac
fi
for py in $found python3 python; do
  if ! command -v "$py" >/dev/null 2>&1; then tried="$tried $py (absent)"; continue; fi
  if "$py" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$mod') is None)" 2>/dev/null; then
    exec "$py" -c "$code" "$payload"
  fi
  tried="$tried $py (cannot import $mod)"
done
echo "sparklab probe: no Python in this image can import $mod (tried:$tried)" >&2
exit 127
"""


# Any: each case is JSON handed to the probe inside the image
def python_probe(module: str, program: str, script_name: str, cases: Sequence[dict[str, Any]]) -> Probe:
    """Run probes/<script_name> with the image's Python that imports `module`; the cases go as one JSON argument."""
    payload = json.dumps({"cases": list(cases)}, separators=(",", ":"))
    return Probe("sh", ("-c", FIND_PYTHON, "sparklab-probe", module, program, script(script_name), payload))


# Any: the probe's JSON answer, as it printed it
def read_json(run: ProbeRun) -> dict[str, Any] | None:
    """The probe's one JSON document on stdout (None when it wrote none)."""
    text = run.stdout.strip()
    if not text:
        return None
    try:
        data = json.loads(text.splitlines()[-1] if not text.startswith("{") else text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def command_of(spec: LaunchSpec) -> list[str]:
    """What follows the program (entrypoint[0]) in the server's command, with the API key's placeholder in place of
    the key: the parser sees the command's shape; the key itself never leaves sparklab."""
    return [*spec.entrypoint[1:], *spec.argv]


def key_free(argv: Sequence[str]) -> list[str]:
    """The placeholder stands for a key the parser takes as any string."""
    return ["sparklab-check-key" if a == API_KEY_PLACEHOLDER else a for a in argv]


def case_verdicts(run: ProbeRun, count: int, parser: str, version_field: str) -> list[Verdict]:
    """The verdicts of a JSON probe (probes/*_args.py): {version_field, "version_source", "cases": [{"id": "0", "ok",
    "errors": [{"flag", "message"}], "unchecked": [{"flag", "reason"}]}]}, case ids being the servers' indices."""
    data = read_json(run)
    if data is None or not isinstance(data.get("cases"), list):
        why = str(data["error"]) if data and data.get("error") else "the parser did not run in the image"
        return [not_checked(why, None if data and data.get("error") else run, parser)] * count
    version = data.get(version_field)
    version = str(version) if version else None
    source = str(data.get("version_source", ""))
    facts = {k: v for k, v in data.items() if k not in ("cases", version_field, "version_source")}
    by_id = {str(case.get("id")): case for case in data["cases"] if isinstance(case, dict)}
    out = []
    for i in range(count):
        case = by_id.get(str(i))
        if case is None:
            out.append(not_checked(f"the parser gave no verdict for server {i}", run, parser))
            continue
        internal = [e for e in case.get("errors", ()) if str(e.get("message", "")).startswith("internal error")]
        if internal:  # the probe itself failed on this case: not the engine's verdict
            out.append(not_checked(f"sparklab's probe failed: {internal[0].get('message')}", None, parser))
            continue
        unchecked = tuple(str(u.get("flag")) for u in case.get("unchecked", ()) if isinstance(u, dict))
        rejections = tuple(Rejection(e.get("flag") or None, str(e.get("message", ""))) for e in case.get("errors", ())
                           if isinstance(e, dict))
        if not case.get("ok") and not rejections:
            rejections = (Rejection(None, "the parser refused the command without a message"),)
        status = ACCEPTED if case.get("ok") and not rejections else REJECTED
        out.append(Verdict(status, parser, rejections, version=version, version_source=source, unchecked=unchecked,
                           facts=facts))
    return out
