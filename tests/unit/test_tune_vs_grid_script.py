"""scripts/bench_tune_vs_grid.py's split of a prediction error into acceptance and decode steps (the script itself runs
real engines for an hour and is not part of the suite; its arithmetic is)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_tune_vs_grid.py"


@pytest.fixture(scope="module")
def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_tune_vs_grid", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def test_an_error_splits_into_acceptance_times_steps(script: ModuleType) -> None:
    # the second full-size dspark run's C=1 K=6 point: tune predicted 40.33 tok/s at acceptance length 4.014; the
    # grid's one load measured 30.27 at a counted 3.458; the server was told 1 + 0.867 + ... + 0.053 = 3.728
    told = 1 + 0.867 + 0.752 + 0.652 + 0.282 + 0.122 + 0.053
    x = script.split_error(40.33, 4.014, 30.27, 3.458, told, 1, 6)
    assert x.tok_s == pytest.approx(40.33 / 30.27 - 1)
    assert x.acceptance == pytest.approx(4.014 / 3.458 - 1)
    assert (1 + x.acceptance) * (1 + x.steps) == pytest.approx(1 + x.tok_s)
    assert x.acceptance == pytest.approx(0.161, abs=0.001) and x.steps == pytest.approx(0.148, abs=0.001)
    assert x.told == pytest.approx(3.458 / told - 1) and x.told < -0.07
    assert x.predicted_told == pytest.approx(4.014 / told - 1) and x.predicted_told > 0.07


def test_a_real_drafter_has_no_told_length_and_a_right_length_leaves_the_steps(script: ModuleType) -> None:
    x = script.split_error(50.0, 2.0, 40.0, 2.0, None, 4, 3)
    assert x.acceptance == 0 and x.steps == pytest.approx(0.25) and x.told is None and x.predicted_told is None
    y = script.split_error(40.0, 2.2, 40.0, 2.0, None, 4, 3)  # acceptance over by 10%, steps under by as much
    assert y.tok_s == 0 and math.isclose((1 + y.acceptance) * (1 + y.steps), 1)


def test_the_draw_variance_is_that_of_a_drafts_accepted_count(script: ModuleType) -> None:
    assert script.draw_variance((1.0, 1.0, 1.0)) == pytest.approx(0)  # always 3 accepted
    assert script.draw_variance((0.5,)) == pytest.approx(0.25)  # one Bernoulli(0.5)
    # the dspark profile at K=6, against the count drawn as the engine draws it: position i kept while u_i < c_i
    import random
    rates = (0.867, 0.752, 0.652, 0.282, 0.122, 0.053)
    conditional = [rates[0]] + [rates[i] / rates[i - 1] for i in range(1, len(rates))]
    draw = random.Random(7)
    counts = []
    for _ in range(40000):
        n = 0
        while n < len(conditional) and draw.random() < conditional[n]:
            n += 1
        counts.append(n)
    mean = sum(counts) / len(counts)
    variance = sum((x - mean) ** 2 for x in counts) / (len(counts) - 1)
    assert mean == pytest.approx(sum(rates), rel=0.01)
    assert variance == pytest.approx(script.draw_variance(rates), rel=0.03)


def test_the_draw_floor_shrinks_with_drafts_and_grows_when_read_off_a_probe(script: ModuleType) -> None:
    rates = (0.867, 0.752, 0.652, 0.282, 0.122, 0.053)
    knew, read = script.draw_floor(rates, 100, 100)
    assert read == pytest.approx(knew * math.sqrt(2))  # two independent sets of draws of one size
    sd = math.sqrt(script.draw_variance(rates) / 100) / (1 + sum(rates))
    assert knew == pytest.approx(sd * math.sqrt(2 / math.pi))
    assert script.draw_floor(rates, 400, None) == pytest.approx((knew / 2, knew / 2))


def test_the_rules_floor_counts_what_any_tune_must_load_for_the_grids_verdict(script: ModuleType) -> None:
    """README "The same holds for any tune": the grid loads N + V + S, a tune that knew the answer 2V + S. A grid over
    9 configs whose C=1 pick is K=5 by a tie-break (its best K=6) and whose C=4 pick is none (runner-up K=1), with a
    K schedule measured, the best K=6's own runner-up K=8: its verdict rests on those 5 configs. A store from before
    `best_runner_up` was kept counts 4 (the tie-break's runner-up is the best): a floor still."""
    from sparklab.tune.search import Space

    space = Space(("none", "ngram"), tuple(range(1, 9)), (1, 4), {"none": False, "ngram": True})
    picks = [{"concurrency": 1, "label": "ngram K=5", "best_mean": "ngram K=6", "runner_up": "ngram K=6",
              "best_runner_up": "ngram K=8"},
             {"concurrency": 4, "label": "none", "best_mean": "none", "runner_up": "ngram K=1",
              "best_runner_up": "ngram K=1"}]
    floor = script.rules_floor({"picks": picks, "schedule": {"serve_args": ["--x"]}, "loads": 20}, space)
    assert floor["configs"] == 9
    assert floor["verdict_configs"] == ["ngram K=1", "ngram K=5", "ngram K=6", "ngram K=8", "none"]
    assert floor["oracle_loads"] == 2 * 5 + 1 and floor["rule_loads"] == 9 + 5 + 1
    assert floor["oracle_share_of_grid"] == pytest.approx(11 / 20)  # of the loads the grid made (contenders too)
    older = [{k: v for k, v in pick.items() if k != "best_runner_up"} for pick in picks]
    assert script.rules_floor({"picks": older, "schedule": {"serve_args": ["--x"]}, "loads": 20}, space)[
        "oracle_loads"] == 2 * 4 + 1
    one_pair = [{"concurrency": c, "label": "ngram K=1", "best_mean": "ngram K=1", "runner_up": "none"} for c in (1, 4)]
    floor = script.rules_floor({"picks": one_pair, "schedule": None, "loads": 11}, space)
    assert floor["oracle_loads"] == 4 and floor["rule_loads"] == 11 and floor["oracle_share_of_grid"] == pytest.approx(4 / 11)
