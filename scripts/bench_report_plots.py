#!/usr/bin/env python3
"""What a report's plots cost: `sparklab.report.plots.all_plots` on the bundled CPU sweep (the unit tier's report
fixture, tests/fixtures/report/cpu-sweep.sql: one engine, none and ngram K 1-3, C 1 and 4), as shipped against a
reference that leaves matplotlib's placeholder layout engine on the figure after tight_layout (as sparklab did
before: savefig then lays out every artist once more, in a draw with rendering disabled).

Rounds alternate the two (A B, then B A), so a change in the machine's load hits both alike; the first report of
each is a warm-up (imports, font cache) and is not counted. Prints the median seconds per report of each, their
ratio, and whether every PNG came out byte for byte the same.

    python scripts/bench_report_plots.py [--rounds 8]

Not a test. Run from the repository's root (it reads the fixture from tests/). Never imported by the package.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from matplotlib.figure import Figure

from sparklab import report
from sparklab.report.plots import all_plots

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.reportkit import cpu_run  # noqa: E402  (the fixture loader lives with the tests)


@contextmanager
def engine_left_on():
    """The reference: set_layout_engine(None) after tight_layout does nothing, as before the change."""
    original = Figure.set_layout_engine

    def keep(self: Figure, layout: object = None, **kwargs: object) -> None:
        if layout is not None:
            original(self, layout, **kwargs)

    Figure.set_layout_engine = keep  # type: ignore[method-assign]  # restored below
    try:
        yield
    finally:
        Figure.set_layout_engine = original  # type: ignore[method-assign]


def draw(built: report.Report, out: Path, reference: bool) -> tuple[float, dict[str, bytes]]:
    started = time.perf_counter()
    if reference:
        with engine_left_on():
            plots = all_plots(built, out)
    else:
        plots = all_plots(built, out)
    took = time.perf_counter() - started
    return took, {path.name: path.read_bytes() for _, path in plots}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-report-plots-"))
    built = report.load(cpu_run(work / "runs"))
    times: dict[bool, list[float]] = {True: [], False: []}
    images: dict[bool, dict[str, bytes]] = {}
    for reference in (True, False):  # warm-up, not counted
        draw(built, work / f"warm-{reference}", reference)
    for r in range(args.rounds):
        for reference in (True, False) if r % 2 == 0 else (False, True):
            took, images[reference] = draw(built, work / f"{r}-{reference}", reference)
            times[reference].append(took)
    before, after = statistics.median(times[True]), statistics.median(times[False])
    same = images[True] == images[False]
    print(f"{len(images[False])} plots per report, {args.rounds} reports each, alternating")
    print(f"median seconds per report: reference {before:.3f}, shipped {after:.3f}, ratio {after / before:.2f}")
    print(f"PNG files byte for byte the same: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
