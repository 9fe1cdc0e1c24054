"""How hard a rehearsal compresses its night: as asked (--minutes), but never so hard that the sweep's load-stall
window (a silence detector) shrinks below MIN_WINDOW_WALL_S of wall time, where a busy machine's own delays in
delivering a log line would read as a hung engine; the verdict says when that floor set the pace."""

from __future__ import annotations

import pytest

from sparklab.rehearse.night import MIN_SCALE, MIN_WINDOW_WALL_S, choose_scale


def test_the_asked_compression_when_the_window_stays_wide() -> None:
    scale, note = choose_scale(wall_s=600.0, night_s=6000.0, asked=None, load_stall_s=600.0)
    assert scale == pytest.approx(0.1) and note is None


def test_a_window_that_would_shrink_below_the_floor_sets_the_pace_and_says_so() -> None:
    scale, note = choose_scale(wall_s=18.0, night_s=3 * 3600.0, asked=None, load_stall_s=600.0)
    assert scale == pytest.approx(MIN_WINDOW_WALL_S / 600.0)
    assert note is not None and "load_stall_s" in note and "600 s" in note and f"{MIN_WINDOW_WALL_S:g} s" in note


def test_no_window_no_floor_but_min_scale() -> None:
    scale, note = choose_scale(wall_s=1.0, night_s=1e9, asked=None, load_stall_s=None)
    assert scale == MIN_SCALE and note is None


def test_an_explicit_scale_is_kept() -> None:
    assert choose_scale(wall_s=18.0, night_s=3 * 3600.0, asked=1e-3, load_stall_s=600.0) == (1e-3, None)


def test_never_slower_than_the_real_night() -> None:
    assert choose_scale(wall_s=1e6, night_s=10.0, asked=None, load_stall_s=600.0) == (1.0, None)
