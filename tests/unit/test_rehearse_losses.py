"""What a rehearsal says the night would lose: the cells lost, then every failure with its cause, each said once. A
host that is gone refuses each later start the same way, and the retries of one config said the same line three
times under a header that counted cells (`would lose 8 cell(s):` over 13 lines)."""

from __future__ import annotations

from sparklab.rehearse.verdict import Verdict, losses

GONE = "vllm/dspark K=3: container: cannot start sparklab-gb10-vllm-dspark-x: the twin of gb10 is gone"


def test_a_failure_said_again_is_counted_not_repeated_and_the_header_says_what_follows() -> None:
    verdict = Verdict(failures=["vllm/none: killed: the server exited with code 137", GONE, GONE, GONE],
                      lost_cells=2)
    assert losses(verdict) == ["the real night would lose 2 cell(s); what failed, and why:",
                               "  - vllm/none: killed: the server exited with code 137",
                               f"  - {GONE} (3 times)"]


def test_a_night_that_loses_a_start_but_no_cell_and_one_that_loses_nothing() -> None:
    assert losses(Verdict(failures=[GONE])) == ["the real night would lose no cell; what failed, and why:",
                                               f"  - {GONE}"]
    assert losses(Verdict()) == ["the real night keeps every server and every cell: 0 floor trips, 0 cells lost"]
