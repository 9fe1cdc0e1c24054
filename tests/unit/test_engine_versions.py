"""Which engine versions each adapter's knowledge was read from, and how an adapter follows the version: the warning
for a version outside them, vLLM's KV-cache line in both shapes, SGLang's accept rate by version, Edge-LLM's server
command by version, llama.cpp's builds, and the report's mark on acceptance read from an unread format."""

from __future__ import annotations

import json

import pytest

from sparklab.engines import ENGINES, engine, knowledge, parsers, vllm
from sparklab.engines.knowledge import AREAS, Fact, Knowledge
from sparklab.engines.sglang import log_acceptance
from sparklab.engines.trtedge import command_for
from sparklab.recipes.render import LaunchOptions, render
from sparklab.recipes.schema import load_recipe, recipes_dir

DECODE = ("[2026-11-30 10:00:00] Decode batch, #running-req: 1, #token: 90, token usage: 0.00, accept len: 3.27, "
          "accept rate: 0.76, cuda graph: True, gen throughput (token/s): 96.50, #queue-req: 0, ")


@pytest.mark.parametrize("kind", sorted(ENGINES))
def test_every_adapter_names_the_versions_each_fact_was_read_from(kind: str) -> None:
    adapter = ENGINES[kind]
    facts = adapter.knowledge.facts
    assert facts and adapter.name
    assert all(f.area in AREAS and f.read_in and f.source for f in facts)
    assert {"readiness path", "flags"} <= {f.area for f in facts}
    for fact in facts:  # every version a fact names is one the adapter can compare
        assert all(adapter.version_key(v) is not None for v in fact.read_in), fact


def test_a_version_outside_the_adapters_range_gets_one_warning_naming_the_checks() -> None:
    vllm = engine("vllm")
    warning = vllm.version_warning("0.33.0", "cpu/vllm-cpu/ngram")
    assert warning is not None and warning.startswith("cpu/vllm-cpu/ngram: vLLM 0.33.0 is outside the versions")
    assert "(0.27.1, 0.32.0)" in warning
    for area in ("command", "readiness path", "startup lines", "fatal lines", "acceptance counters"):
        assert f"{area} (" in warning
    assert vllm.version_warning("0.27.1+cpu", "x") is None and vllm.version_warning("0.32.0", "x") is None
    assert vllm.version_warning("0.30.0", "x") is None  # read at both ends: taken to hold between them
    assert "0.26.0 is outside" in (vllm.version_warning("0.26.0", "x") or "")
    unknown = vllm.version_warning(None, "x", "no vLLM package metadata in the image")
    assert unknown and "could not be read (no vLLM package metadata in the image)" in unknown


def test_a_fact_read_in_one_version_holds_only_there() -> None:
    table = Knowledge((Fact("fatal lines", "a line", ("0.5.23",), "f.py:1"),
                       Fact("acceptance lines", "decode", ("0.5.12", "0.5.23"), "g.py:2")))
    assert [f.what for f in table.unverified("0.5.16")] == ["a line"]
    assert [f.what for f in table.unverified("0.5.24")] == ["a line", "decode"]
    assert table.unverified("0.5.23.post1+g0a1b") == []
    assert knowledge.dotted_key("v0.27.1+cpu") == (0, 27, 1) and knowledge.dotted_key("dev") is None
    assert table.read_from() == ("0.5.12", "0.5.23")


def test_vllm_reads_the_kv_cache_line_as_0_27_1_and_0_32_0_print_it() -> None:
    old = ("(EngineCore pid=27) INFO 11-29 14:02:37 [kv_cache_utils.py:2235] GPU KV cache size: 46,592 tokens\n"
           "(EngineCore pid=27) INFO 11-29 14:02:37 [kv_cache_utils.py:2236] Maximum concurrency for 2,048 tokens "
           "per request: 22.75x\n")
    new = ("(EngineCore pid=27) INFO 12-01 14:02:37 [kv_cache_utils.py:2326] CPU KV cache size: 46,592 tokens, "
           "Maximum concurrency for 2,048 tokens per request: 22.75x\n")
    for text in (old, new):
        facts = engine("vllm").parse_startup(text)
        assert (facts.kv_cache_tokens, facts.max_concurrency, facts.concurrency_tokens_per_request) == (
            46592, 22.75, 2048)


@pytest.mark.parametrize(("version", "rate"), [
    (None, 0.76), ("0.5.23", 0.76), ("0.5.12", 0.76), ("0.5.16.post1", 0.76),
    ("0.5.9", None),  # counted the bonus token
    ("0.5.10", None),  # between 0.5.9 and 0.5.12: never read
    ("0.6.0", None),  # after 0.5.23: never read
])
def test_sglang_keeps_accept_rate_only_where_it_was_read_to_mean_the_share_of_drafts(version: str | None,
                                                                                     rate: float | None) -> None:
    found = log_acceptance(DECODE, version)
    assert found is not None and found["mean"] == 3.27 and found["rate"] == rate
    assert ("rate_left_out" in found) is (rate is None)


def test_edgellm_follows_its_version_to_the_server_command() -> None:
    assert command_for("0.11.0") == ("tensorrt-edgellm-serve",)
    assert command_for("0.11.1") == ("trtedge", "serve")
    assert command_for("0.12.0") == ("edgellm", "serve")
    assert engine("trtedge").ready_path == "/health/ready"  # 0.11.0's routes.py:77 and the latest docs alike
    spec = render(load_recipe(recipes_dir() / "gb10.yaml"), "edgellm", "none", LaunchOptions())  # `trtedge serve`
    answer = {"version": "0.11.0", "console_scripts": ["tensorrt-edgellm-build", "tensorrt-edgellm-serve"],
              "version_source": "metadata", "cases": [{"id": "0", "ok": True, "errors": []}]}
    (verdict,) = engine("trtedge").parser_verdicts([spec], parsers.ProbeRun(0, json.dumps(answer), "", 0.3))
    assert verdict.status == parsers.REJECTED
    assert verdict.message == ("TensorRT Edge-LLM 0.11.0 installs no `trtedge` (its commands: tensorrt-edgellm-build, "
                               "tensorrt-edgellm-serve); its server command is `tensorrt-edgellm-serve`")
    right = render(load_recipe(recipes_dir() / "gb10.yaml"), "edgellm-0.11.0", "none", LaunchOptions())
    (verdict,) = engine("trtedge").parser_verdicts([right], parsers.ProbeRun(0, json.dumps(answer), "", 0.3))
    assert verdict.status == parsers.ACCEPTED


def test_llamacpp_counts_builds() -> None:
    llama = engine("llamacpp")
    for text in ("b11669", "b11669-Debian", "version: 0.7.0 (build 11669, commit Debian)", "version: 11669 (1a2b3c)"):
        assert llama.version_key(text) == (11669,)
    assert llama.version_warning("b11669-Debian", "x") is None
    assert "b11800 is outside" in (llama.version_warning("b11800", "x") or "")


def test_the_knowledge_tables_cite_both_vllm_versions_for_what_the_cpu_engine_tier_runs() -> None:
    """What the two-version engine-tier test relies on was read in both: counters, readiness, startup lines."""
    for area in ("acceptance counters", "readiness path", "startup lines", "fatal lines"):
        assert all(set(f.read_in) >= {"0.27.1", "0.32.0"} for f in vllm.KNOWLEDGE.in_area(area)), area


def test_llamacpp_reads_its_build_from_its_own_version_output_and_verdicts_from_its_parser() -> None:
    """`llama-server --version` and parse errors as build b11669 prints them (measured in the CPU image)."""
    from sparklab.engines.llamacpp_help import PROBE as _PROBE  # noqa: F401  (the probe whose output this is)

    spec = render(load_recipe(recipes_dir() / "cpu.yaml"), "llamacpp-cpu", "draft_model", LaunchOptions())
    out = ("@@version\nversion: 0.7.0 (build 11669, commit Debian)\nbuilt with GNU 16.2.0 for Linux x86_64\n@@exit 0\n"
           "@@case 0\n----- common params -----\n\n-h,    --help, --usage   print usage and exit\n@@exit 0\n"
           "@@case 1\nerror: invalid argument: --speculative-confg\n@@exit 1\n"
           "@@case 2\nerror while handling argument \"--ctx-size\": stoi\n\nusage:\n-c, --ctx-size N\n\n"
           "to show complete usage, run with -h\n@@exit 1\n"
           "@@case 3\nsomething else entirely\n@@exit 1\n")
    verdicts = engine("llamacpp").parser_verdicts([spec] * 4, parsers.ProbeRun(0, out, "", 0.4))
    assert [v.status for v in verdicts] == [parsers.ACCEPTED, parsers.REJECTED, parsers.REJECTED, parsers.NOT_CHECKED]
    assert {v.version for v in verdicts} == {"b11669"}
    assert verdicts[1].message == "error: invalid argument: --speculative-confg"
    assert verdicts[2].message == 'error while handling argument "--ctx-size": stoi'
    assert "without a parse error or its usage" in verdicts[3].why_not
