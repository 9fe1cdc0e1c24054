"""Published tables as sparklab runs, for `sparklab compare` (tests/fixtures/compare/*.yaml).

Each fixture run becomes a results file the way a sweep writes one: server configs (engine, method, K, model,
image, engine version), one done cell per published figure with its workload's content hash and sampling, and the
host and platform facts. The figure is the run's headline (per-request tok/s at C=1, aggregate above; or decode
tok/s with `headline: decode`), one run each: a published number has no repeats.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import yaml

from sparklab.sweep.store import PlannedCell, Store

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "compare"


def _id(*parts: Any) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:12]


def published_runs(name: str, tmp_path: Path) -> dict[str, Path]:
    """Every run of a fixture file as runs/<run>/results.sqlite under tmp_path; run name -> results file."""
    doc = yaml.safe_load((FIXTURES / f"{name}.yaml").read_text(encoding="utf-8"))
    lead = doc.get("headline", "seed000")
    out = {}
    for run, spec in doc["runs"].items():
        sampling = spec.get("sampling") or doc["sampling"]
        path = tmp_path / run / "results.sqlite"
        sweep = {"name": f"{name}-published", "recipe": "published", "headline": lead, "sampling": sampling,
                 "description": f"{name}'s published figures: {run}"}
        engine = spec["engine"]
        with Store.create(path, sweep, "published") as store:
            store.set_host_facts({"hostname": spec["host"], **({"platform": spec["platform"]} if "platform" in spec
                                                                 else {})})
            servers: dict[tuple[str, int | None], str] = {}
            for i, cell in enumerate(spec["cells"]):
                key = (cell["method"], cell.get("k"))
                if key not in servers:
                    servers[key] = _id(run, *key)
                    store.add_server_config(servers[key], engine=engine["name"], method=key[0], k=key[1],
                                            config={"recipe": "published", "kind": engine["kind"],
                                                    "model": {"id": spec["model"]}, "label": f"{key[0]}"},
                                            argv=[], image=engine["image"])
                    store.record_server_start(servers[key], image_digest=None, startup_facts={}, ready_s=None,
                                              log_path=None, engine_version=str(engine["version"]))
                workload = cell.get("workload") or doc["workload"]["name"]
                content_hash = cell.get("hash") or doc["workload"]["content_hash"]
                cell_id = _id(run, i)
                store.add_cells([PlannedCell(cell_id, servers[key], cell["c"], workload, 0,
                                             {"requests": 1, "warmup": 0, "stream": True, "sampling": sampling})])
                summary: dict[str, Any] = {"requests": {"measured": 1, "ok": 1, "failed": 0}}
                if lead == "decode":
                    summary["decode_tps"] = {"n": 1, "mean": cell["value"]}
                    if "ttft" in cell:
                        summary["ttft_ms"] = {"n": 1, "p50": cell["ttft"]}
                elif cell["c"] == 1:
                    summary["per_request_tps"] = {"n": 1, "mean": cell["value"]}
                else:
                    summary["aggregate_tps"] = cell["value"]
                result = {"summary": summary, "workload": {"name": workload, "content_hash": content_hash},
                          "sampling": sampling}
                store.start_cell(cell_id)
                store.finish_cell(cell_id, summary, result)
        out[run] = path
    return out
