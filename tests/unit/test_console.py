"""What `sparklab bench` prints of a result (sparklab/cli/console.py): the engine's statements come through its adapter."""

from __future__ import annotations

import copy

import pytest
from rich.console import Console

from sparklab.bench import cell
from sparklab.bench.workloads import load_workload
from sparklab.cli import console
from sparklab.records import Sampling
from tests.scripted_server import Scripted, chunk, usage


@pytest.fixture(scope="module")
def result() -> dict:
    server = Scripted(lambda body: [(0.0, chunk(content="a b", token_ids=[1, 2])), (0.0, usage(2)),
                                    (0.0, b"data: [DONE]\n\n")])
    try:
        return cell.run(cell.Endpoint.from_url(server.root, model="m"), load_workload("seed"), Sampling(max_tokens=2),
                        cell.Load(concurrency=1, requests=2, warmup=0))
    finally:
        server.close()


def _printed(result: dict) -> str:
    out = Console(record=True, width=400)
    out.print(console.bench_result(result))
    return out.export_text()


def test_sglangs_lifelong_acceptance_is_shown_as_its_adapter_reads_it(result: dict) -> None:
    stated = copy.deepcopy(result)
    stated["server"]["after"]["sglang_avg_spec_accept_length"] = 2.9  # /server_info, read by SGLang's adapter
    assert "speculative (SGLang /server_info avg_spec_accept_length): 2.90" in _printed(stated).splitlines()
    assert "avg_spec_accept_length" not in _printed(result)
