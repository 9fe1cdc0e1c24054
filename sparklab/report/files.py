"""Where a report comes from and where it goes: RUN to a results file, a results file to a Report, and the
report's files into `-o DIR`, all or nothing.

A results file may have been changed by hand or by another tool, or be damaged: whatever is wrong in it, the
report is either whole or one error naming the file; the file itself is only ever opened read-only.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path

from sparklab.errors import SparklabError
from sparklab.report.model import Overrides, Report, build
from sparklab.sweep import rundir
from sparklab.sweep.store import Store

_PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
# What stored data of the wrong shape raises as it is read (a JSON text that is not JSON, a list where an
# object belongs, a missing table or column): a damaged file, reported as one, never as a traceback.
MALFORMED = (ValueError, KeyError, IndexError, TypeError, AttributeError, ArithmeticError, sqlite3.Error)


def locate(run: str, runs_dir: Path) -> tuple[Path, str | None]:
    """(results.sqlite, a note) for RUN: a results file, a run directory, a run id under runs_dir, or a sweep
    name (its newest run, which the note names). RUN is never a pattern: `*` is a name no run has."""
    given = Path(run)
    if given.is_file():
        return given, None
    if given.is_dir():
        if (given / "results.sqlite").is_file():
            return given / "results.sqlite", None
        if given.is_absolute() or os.sep in run:  # a directory named on purpose, not a run id by chance
            raise SparklabError(f"{given}: a directory without a results.sqlite (not a run directory)",
                                "Give a run directory (runs/<sweep>-<id>), its results.sqlite, a run id or a "
                                "sweep name.")
    if _PLAIN_NAME.fullmatch(run):
        if (runs_dir / run / "results.sqlite").is_file():
            return runs_dir / run / "results.sqlite", None
        newest = rundir.runs_of(runs_dir, run)
        if newest:
            return newest[-1] / "results.sqlite", f"newest run of sweep {run}: {newest[-1].name}"
    runs = sorted(p.parent.name for p in runs_dir.glob("*/results.sqlite")) if runs_dir.is_dir() else []
    raise SparklabError(f"no results for run {run!r}: neither a results.sqlite file, nor a run directory, nor a "
                        f"run id or sweep name under {runs_dir} (names are matched exactly, never as patterns)",
                        f"Runs under {runs_dir}: {', '.join(runs) or 'none'} (another place: --runs-dir DIR).")


@contextlib.contextmanager
def malformed(path: Path) -> Iterator[None]:
    """Data of the wrong shape read from `path` while this block runs is an error naming the file."""
    try:
        yield
    except MALFORMED as exc:
        detail = " ".join(str(exc).split())
        detail = detail if len(detail) <= 160 else detail[:159] + "…"
        raise SparklabError(
            f"{path}: cannot report from this results file, its content is not what sparklab stores "
            f"({type(exc).__name__}: {detail})",
            "It was changed outside sparklab or is damaged; it is left as it is. Report from a copy of the run "
            "made by sparklab, or run the sweep again.") from None


def load(path: Path, overrides: Overrides | None = None) -> Report:
    """The report of one results file, opened read-only."""
    with malformed(path), Store.open(path, readonly=True) as store:
        return build(store, path.parent.name, overrides)


def check_out(out: Path) -> None:
    """`-o DIR` must be a directory, or not exist yet; checked before anything is read or drawn."""
    if out.exists() and not out.is_dir():
        raise SparklabError(f"-o {out}: not a directory (a report is several files: report.md, .csv, .json, "
                            ".html and plots/)", "Give a directory (it is created if missing), or use -f FORMAT to "
                            "print one format on stdout.")


def staged(out: Path) -> contextlib.AbstractContextManager[Path]:
    """A fresh directory beside `out` to build the report in; removed afterwards (published or not)."""
    check_out(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except OSError as exc:
        raise SparklabError(f"-o {out}: cannot write there ({exc.strerror})",
                            "Give a directory you can write to.") from None

    @contextlib.contextmanager
    def cleanup() -> Iterator[Path]:
        try:
            yield staging
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    return cleanup()


def publish(staging: Path, out: Path, files: list[Path]) -> list[Path]:
    """Move what was built in `staging` into `out` (a new directory in one rename; into an existing one file by
    file, replacing an older report's files and keeping anything else there). Returns the paths under out."""
    relative = [f.relative_to(staging) for f in files]
    try:
        if not out.exists():
            os.rename(staging, out)
            staging.mkdir()  # the cleanup removes an empty directory, not the report
        else:
            for rel in relative:
                (out / rel).parent.mkdir(parents=True, exist_ok=True)
                os.replace(staging / rel, out / rel)
    except OSError as exc:
        raise SparklabError(f"-o {out}: cannot write the report there ({exc.strerror})",
                            "Give a directory you can write to.") from None
    return [out / rel for rel in relative]
