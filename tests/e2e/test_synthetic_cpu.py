"""Synthetic acceptance on the real vLLM 0.27.1 CPU engine (docker/vllm-cpu-synthetic): a sweep of none and the
synthetic method at K=3 accepts drafts at the profile's per-position rates (the engine's own counters say so), its
answers differ from none's, and the report labels it and does not name it best."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from sparklab import report
from sparklab.recipes.schema import recipes_dir
from sparklab.sweep.store import Store
from tests.dockerkit import image_from_env, make_cli

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

PROFILE = [0.9, 0.6, 0.3]


@pytest.fixture(scope="module")
def synthetic_image(docker_client) -> str:
    return image_from_env("SPARKLAB_TEST_VLLM_CPU_SYNTHETIC_IMAGE",
                          " (build it with docker/vllm-cpu-synthetic/build.sh)")


def test_synthetic_acceptance_follows_its_profile_and_is_never_named_best(synthetic_image: str, tmp_path: Path,
                                                                         measured) -> None:
    doc = yaml.safe_load((recipes_dir() / "sweeps" / "cpu-tune-dspark.yaml").read_text())
    doc.update(name="synthetic-e2e", recipe=str(recipes_dir() / "cpu.yaml"), num_speculative_tokens=[3],
               concurrency=[1], requests={1: 6}, repeats=1,
               set=[f"synthetic_acceptance_rates={json.dumps(PROFILE)}",
                    f"engines.vllm-cpu-synthetic.image={synthetic_image}"],
               sampling={**doc["sampling"], "max_tokens": 128})
    sweep = tmp_path / "synthetic-e2e.yaml"
    sweep.write_text(yaml.safe_dump(doc))
    cli = make_cli(synthetic_image, tmp_path)
    done = cli.run("sweep", str(sweep), "--runs-dir", str(tmp_path / "runs"), "--pull", "always", timeout=900)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-2000:]
    (path,) = (tmp_path / "runs").glob("*/results.sqlite")
    with Store.open(path, readonly=True) as store:
        built = report.build(store, path.parent.name)
    synthetic = next(g for g in built.groups if g.server.is_synthetic)
    spec = synthetic.cells[0].result["speculative"]  # type: ignore[index]
    rates, drafts = spec["per_position_acceptance"], spec["drafts"]
    measured["synthetic K=3 per-position acceptance (profile 0.9 0.6 0.3)"] = (
        f"{' '.join(f'{r:.3f}' for r in rates)} over {drafts:.0f} drafts")
    assert drafts >= 100
    for got, want in zip(rates, PROFILE, strict=True):  # the engine's counters: 4 binomial sd of the profile
        assert abs(got - want) <= 4 * math.sqrt(want * (1 - want) / drafts) + 0.02, (rates, drafts)
    assert synthetic.server.synthetic == tuple(PROFILE)
    assert synthetic.equality is not None and synthetic.equality.differs  # accepted drafts the target would not
    (best,) = built.best
    assert not best.group.server.is_synthetic
    markdown = report.render(built, "md")
    assert "## Synthetic acceptance: not drafters" in markdown and "(synthetic: expected to differ)" in markdown
