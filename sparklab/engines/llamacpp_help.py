"""llama-server's own parser as sparklab's preflight check: the probe script run in the image, and its output
read into one verdict per command (sparklab/engines/parsers.py runs it; the adapter, sparklab.engines.llamacpp,
hands it over)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sparklab.engines import parsers

if TYPE_CHECKING:
    from sparklab.spec import LaunchSpec


# llama-server's own parser on each command, with --help appended: common/arg.cpp parses every argument first
# (an unknown flag: "error: invalid argument: X"; a bad value: "error while handling argument …"; a removed one:
# "the argument has been removed"), and only a whole, valid command line reaches the usage it then prints (exit 0)
# instead of loading a model. `--version` first gives the build. Cases: N followed by N arguments, in turn; each
# case's output ends with "@@exit CODE". POSIX sh only: ${10} and eval select a case's arguments.
PROBE = r"""
prog=$1; shift
printf '@@version\n'; "$prog" --version 2>&1; printf '@@exit %s\n' "$?"
idx=0
while [ $# -gt 0 ]; do
  n=$1; shift; refs=""; k=1
  while [ "$k" -le "$n" ]; do refs="$refs \"\${$k}\""; k=$((k + 1)); done
  printf '@@case %s\n' "$idx"
  eval "\"\$prog\" $refs --help" 2>&1 < /dev/null
  printf '@@exit %s\n' "$?"
  shift "$n"; idx=$((idx + 1))
done
"""
# `llama-server --version`: "version: 0.7.0 (build 11669, commit Debian)" (Debian's b11669, measured) or upstream's
# "version: 11669 (1a2b3c4)"; /props: "b11669-Debian". The build number, never the Debian package version.
BUILD_NUMBER = re.compile(r"build (\d+)|version: (\d+)(?![\d.])|^b(\d+)")
_PARSE_ERROR = re.compile(r"^(error[: ].*|.*the argument has been removed.*|.*invalid argument.*)$", re.MULTILINE)
_USAGE = re.compile(r"----- common params -----|^usage:", re.MULTILINE)


def _sections(text: str) -> tuple[str, dict[int, tuple[str, int | None]]]:
    """The probe's output: (the --version text, {case: (its output, its exit code)})."""
    version: list[str] = []
    cases: dict[int, tuple[list[str], int | None]] = {}
    into: list[str] | None = None
    current: int | None = None
    for line in text.splitlines():
        if line == "@@version":
            into, current = version, None
        elif line.startswith("@@case "):
            current = int(line.split()[1])
            cases[current] = ([], None)
            into = cases[current][0]
        elif line.startswith("@@exit "):
            if current is not None:
                cases[current] = (cases[current][0], int(line.split()[1]))
            into = None
        elif into is not None:
            into.append(line)
    return "\n".join(version), {k: ("\n".join(lines), code) for k, (lines, code) in cases.items()}


def verdicts(specs: Sequence[LaunchSpec], run: parsers.ProbeRun) -> list[parsers.Verdict]:
    """One verdict per command from the probe's output."""
    parser = "llama-server's own argument parser (common/arg.cpp), the command with --help appended"
    if run.error or run.timed_out or "@@version" not in run.stdout:
        return [parsers.not_checked("llama-server's parser did not run in the image", run, parser)] * len(specs)
    version_text, cases = _sections(run.stdout)
    build = BUILD_NUMBER.search(version_text)
    version = f"b{next(g for g in build.groups() if g)}" if build else None
    source = f"`{specs[0].entrypoint[0]} --version` in the image: {parsers.last_lines(version_text, 1)}"
    out = []
    for i in range(len(specs)):
        text, code = cases.get(i, ("", None))
        errors = [m.group(1).strip() for m in _PARSE_ERROR.finditer(text)]
        if code == 0 and _USAGE.search(text):
            out.append(parsers.Verdict(parsers.ACCEPTED, parser, version=version, version_source=source))
        elif errors:
            out.append(parsers.Verdict(parsers.REJECTED, parser, tuple(parsers.Rejection(None, e) for e in errors),
                                       version=version, version_source=source))
        else:
            why = f"llama-server exited {code} without a parse error or its usage: {parsers.last_lines(text, 3)}"
            out.append(parsers.Verdict(parsers.NOT_CHECKED, parser, why_not=why, version=version,
                                       version_source=source))
    return out
