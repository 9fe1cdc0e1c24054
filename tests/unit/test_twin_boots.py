"""The stand-ins' own boots are no night time: TwinSetup.booting_s counts the wall seconds spent booting between two
moments, overlapping boots (a pair's two hosts) once, and Rehearsal.night_s takes them out."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparklab.runtimes.twin import TwinSetup


@pytest.mark.parametrize(("boots", "since", "until", "expected"), [
    ([], 0.0, 10.0, 0.0),
    ([(1.0, 3.0)], 0.0, 10.0, 2.0),
    ([(1.0, 3.0)], 0.0, 2.0, 1.0),  # a boot still going: only its part so far
    ([(1.0, 3.0)], 2.5, 10.0, 0.5),  # before the night began: not counted
    ([(1.0, 3.0), (2.0, 5.0)], 0.0, 10.0, 4.0),  # two overlapping boots: once
    ([(6.0, 7.0), (1.0, 3.0), (2.0, 2.5)], 0.0, 10.0, 3.0),  # in any order, one inside another
])
def test_booting_seconds(boots: list[tuple[float, float]], since: float, until: float, expected: float) -> None:
    setup = TwinSetup("tiny", Path("/nonexistent"), boots=boots)
    assert setup.booting_s(since, until) == pytest.approx(expected)
