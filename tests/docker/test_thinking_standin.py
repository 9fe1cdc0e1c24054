"""Thinking budgets through real Docker: `sampling.max_tokens` as a sweep axis on one stand-in server that thinks
24 tokens before it answers (STANDIN_REASONING_TOKENS). At 16 tokens the thinking eats the whole budget and nothing
shows; at 64 the answers come. The report flags the first, apart from ordinary truncation, and shows the answer
rate and thinking tokens by budget (seed 002: 4,096 tokens cut answers NVIDIA sized for 16,000)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sparklab.sweep.store import Store
from tests.docker.test_sweep_standin import _run, _sweep
from tests.dockerkit import Cli

pytestmark = pytest.mark.docker


def test_a_max_tokens_axis_shows_where_answers_appear(cli: Cli, tmp_path: Path) -> None:
    path = _sweep(tmp_path, cli.image, methods=["none"], concurrency=[1], requests={1: 6}, workloads=["tasks-en"],
                  sampling={"max_tokens": [16, 64], "temperature": 0, "top_p": None, "enable_thinking": True})
    doc = yaml.safe_load(path.read_text())
    doc["set"].append("engines.vllm.env={STANDIN_REASONING_TOKENS: '24', STANDIN_EOS_AFTER: '40'}")
    path.write_text(yaml.safe_dump(doc))
    done = _run(cli, path, "--no-download")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("server vllm/none: starting") == 1  # one server: the budgets are loads on it
    (db,) = (path.parent / "runs").glob("*/results.sqlite")
    with Store.open(db, readonly=True) as store:
        answers = {c.settings["sampling"]["max_tokens"]: store.outputs()[c.id] for c in store.cells("done")}
        grades = store.grades()
    measured = {k: [a for a in v if not a["warmup"]] for k, v in answers.items()}
    assert all(a["finish_reason"] == "length" and a["content_chars"] == 0 and a["reasoning_tokens"] == 16
               for a in measured[16])
    assert all(a["finish_reason"] == "stop" and a["content_chars"] > 0 and a["reasoning_tokens"] == 24
               for a in measured[64])
    assert sum(len(g) for g in grades.values()) == 12  # graded after each window, like any suite
    out = tmp_path / "report"
    shown = subprocess.run([sys.executable, "-m", "sparklab", "report", str(db.parent), "-o", str(out)],
                           capture_output=True, text=True, timeout=300)
    assert shown.returncode == 0, shown.stderr
    md = (out / "report.md").read_text()
    table = md[md.index("## Thinking budgets"):md.index("## Checks on the verdict")]
    assert "| tasks-en | 1 | vllm none | 16 | 6 | 0% (0/6) | 6 | 0 | 0 | 16 |" in table
    assert "| tasks-en | 1 | vllm none | 64 | 6 | 100% (6/6) | 0 | 0 | 0 | 24 |" in table
    checks = md[md.index("## Checks on the verdict"):md.index("## How far to trust this")]
    assert "6 of 6 answers spent the whole max_tokens (16) thinking and showed nothing" in checks
    assert "ended at max_tokens" not in checks
    doc_json = json.loads((out / "report.json").read_text())
    rates = {g["workload"]: g["answer_rate"] for g in doc_json["groups"]}
    assert rates == {"tasks-en (max_tokens 16)": 0.0, "tasks-en (max_tokens 64)": 1.0}
    (Path.home() / ".cache" / "sparklab" / "measurements").mkdir(parents=True, exist_ok=True)
    (Path.home() / ".cache" / "sparklab" / "measurements" / "thinking-standin.md").write_text(table + checks)
