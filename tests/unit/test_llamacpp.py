"""The llama.cpp adapter: flags, preflight, startup log, fatal lines, acceptance from /metrics, version, reset.

The log and /metrics fixtures are the real server's (llama-server b11669, Debian's llama.cpp-tools, CPU tier);
the startup log is cut to its non-parameter lines.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from sparklab import engines
from sparklab.engines import engine
from sparklab.engines.api import Answer
from sparklab.engines.llamacpp import ENGINE, spec_counters, speculative
from sparklab.errors import EngineUnreachable
from sparklab.recipes.render import LaunchOptions, render
from sparklab.recipes.schema import load_recipe, recipes_dir
from sparklab.spec import LaunchSpec

FIXTURES = Path(__file__).parent.parent / "fixtures" / "llamacpp"


def _spec(name: str, method: str, argv: list[str] | None = None) -> tuple[LaunchSpec, Any]:
    recipe = load_recipe(recipes_dir() / f"{name}.yaml")
    spec = render(recipe, "llamacpp", method, LaunchOptions())
    if argv is not None:
        spec = dataclasses.replace(spec, argv=tuple(argv), speculative=speculative(argv))
    return spec, recipe


def _messages(spec: LaunchSpec, recipe: Any) -> list[tuple[str, str]]:
    return [(f.level, f.message) for f in engine("llamacpp").check_spec(spec, recipe)]


def test_kind_is_registered_and_recipes_load() -> None:
    assert engine("llamacpp") is ENGINE
    for name in ("llamacpp-cpu", "llamacpp-gb10"):
        recipe = load_recipe(recipes_dir() / f"{name}.yaml")
        assert recipe.engines["llamacpp"].kind == "llamacpp"


@pytest.mark.parametrize(("name", "method"), [(n, m) for n in ("llamacpp-cpu", "llamacpp-gb10")
                                               for m in ("none", "draft", "ngram")])
def test_bundled_recipes_pass_the_spec_checks(name: str, method: str) -> None:
    spec, recipe = _spec(name, method)
    assert _messages(spec, recipe) == []


def test_speculative_reads_the_current_flag_names_and_aliases() -> None:
    sp = speculative(["-m", "t.gguf", "--spec-type", "draft-simple", "-md", "d.gguf", "--spec-draft-n-max", "5",
                      "--draft-p-min", "0.6"])
    assert sp is not None
    assert (sp.method, sp.num_speculative_tokens, sp.draft_model) == ("draft-simple", 5, "d.gguf")
    assert sp.options == {"draft_p_min": "0.6"}
    # K defaults to 3, as `--spec-draft-n-max N ... (default: 3)` says; the long draft flag and = form work
    sp = speculative(["--spec-type=draft-simple", "--spec-draft-model=/m/d.gguf"])
    assert sp is not None and (sp.num_speculative_tokens, sp.draft_model) == (3, "/m/d.gguf")
    assert speculative(["-m", "t.gguf", "-md", "d.gguf"]) is None  # no --spec-type: no drafting
    assert speculative(["--spec-type", "none"]) is None


def test_a_removed_flag_is_an_error_naming_its_replacement() -> None:
    spec, _ = _spec("llamacpp-cpu", "draft")
    argv = [a if a != "--spec-draft-n-max" else "--draft-max" for a in spec.argv]
    found = _messages(*_spec("llamacpp-cpu", "draft", argv))
    assert ("error", "recipes/llamacpp-cpu.yaml: engines.llamacpp.methods.draft: --draft-max was removed from "
            "llama-server (build b11669 stops with 'the argument has been removed')") in \
        [(lvl, msg.replace(str(recipes_dir()), "recipes")) for lvl, msg in found]
    hints = [f.hint for f in engine("llamacpp").check_spec(*_spec("llamacpp-cpu", "draft", argv))]
    assert "Use --spec-draft-n-max instead." in hints


def test_a_draft_type_without_a_draft_model_is_an_error() -> None:
    spec, _ = _spec("llamacpp-cpu", "draft")
    argv = list(spec.argv)
    i = argv.index("--spec-draft-model")
    del argv[i:i + 2]
    found = _messages(*_spec("llamacpp-cpu", "draft", argv))
    assert any(lvl == "error" and "--spec-type draft-simple needs a draft model" in msg for lvl, msg in found), found


def test_an_unknown_type_and_a_missing_metrics_flag() -> None:
    spec, _ = _spec("llamacpp-cpu", "ngram")
    argv = [a if a != "ngram-simple" else "ngram-fancy" for a in spec.argv if a != "--metrics"]
    found = _messages(*_spec("llamacpp-cpu", "ngram", argv))
    assert any(lvl == "error" and "no speculative type 'ngram-fancy'" in msg for lvl, msg in found), found
    assert any(lvl == "warning" and "no --metrics" in msg for lvl, msg in found), found


def test_a_draft_without_a_type_warns_that_nothing_drafts() -> None:
    spec, _ = _spec("llamacpp-cpu", "none")
    found = _messages(*_spec("llamacpp-cpu", "none", [*spec.argv, "-md", "/models/d.gguf"]))
    assert found and found[0][0] == "warning" and "no --spec-type" in found[0][1]


def test_startup_facts_from_the_real_log() -> None:
    facts = ENGINE.parse_startup((FIXTURES / "startup-b11669.log").read_text())
    assert facts.startup_complete
    assert (facts.max_concurrency, facts.concurrency_tokens_per_request, facts.kv_cache_tokens) == (2.0, 1024, 2048)
    assert facts.model_load_seconds == pytest.approx(1.327553 - 0.022086, abs=1e-3)
    assert facts.advice == []


def test_a_unified_kv_cache_and_a_failed_draft_context() -> None:
    facts = ENGINE.parse_startup((FIXTURES / "no-draft-b11669.log").read_text())
    assert (facts.max_concurrency, facts.kv_cache_tokens) == (4.0, 8192)  # one pool shared by the slots
    assert facts.advice == ["llama-server is serving WITHOUT speculative decoding: draft-simple requires a draft "
                            "context"]


def test_fatal_lines_and_known_failures() -> None:
    fatal = ENGINE.fatal("0.00.033.447 E srv  llama_server: exiting due to model loading error")
    assert fatal is not None and fatal.meaning == "llama-server could not load the model"
    assert ENGINE.fatal("ggml/src/ggml-cuda/ggml-cuda.cu:88: GGML_ASSERT(ok) failed") is not None
    assert ENGINE.fatal("0.01.327.553 I srv  llama_server: model loaded") is None
    tail = "0.00.031.945 E gguf_init_from_file: failed to open GGUF file '/models/nope.gguf' (No such file)"
    assert "cannot open the GGUF file" in (ENGINE.explain_failure(tail) or "")
    assert "does not know" in (ENGINE.explain_failure("error: invalid argument: --bogus-flag") or "")


class FakeAPI:
    """Answers like llama-server: scripted /metrics bodies, /slots, /props; records POSTs."""

    def __init__(self, metrics: list[str] | None = None, status: int = 200) -> None:
        self.metrics = list(metrics or [])
        self.status = status
        self.posts: list[str] = []

    def get(self, path: str, timeout_s: float = 5.0, with_key: bool = True) -> Answer:
        if path == "/metrics":
            return Answer(self.status, self.metrics.pop(0) if self.status == 200 else "")
        if path == "/slots":
            return Answer(200, '[{"id": 0, "n_ctx": 1024}, {"id": 1, "n_ctx": 1024}]')
        if path == "/props":
            return Answer(200, '{"build_info": "b11669-Debian", "total_slots": 2}')
        raise EngineUnreachable(path)

    def post(self, path: str, timeout_s: float = 30.0) -> Answer:
        self.posts.append(path)
        return Answer(200, "{}")


BEFORE = """# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total 37
# TYPE llamacpp:spec_decode_num_accepted_tokens_total counter
llamacpp:spec_decode_num_accepted_tokens_total 30
# TYPE llamacpp:spec_decode_num_drafts_total counter
llamacpp:spec_decode_num_drafts_total 10
# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 10
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 8
"""


def test_acceptance_over_the_window_from_the_servers_counters() -> None:
    after_text = (FIXTURES / "metrics-b11669.txt").read_text()
    api = FakeAPI([BEFORE, after_text])
    before, after = engines.snapshot(api, "llamacpp"), engines.snapshot(api, "llamacpp")  # type: ignore[arg-type]
    window = engines.window(before, after, "llamacpp")
    spec = window["speculative"]
    assert (spec["drafts"], spec["draft_tokens"], spec["accepted_tokens"]) == (5, 18, 25)
    assert spec["acceptance_length"] == pytest.approx(1 + 25 / 5)
    assert spec["per_position_acceptance"] == [1.0, 6 / 5, 13 / 5, 13 / 5]
    assert spec["source"].startswith("llamacpp:spec_decode_")
    value, source = engines.acceptance({"speculative": spec})
    assert value == pytest.approx(6.0) and source is not None and source.startswith("llama.cpp")


def test_a_vllm_result_is_still_labelled_vllm() -> None:
    # the source as every stored vLLM result has it (tests/fixtures/report/cpu-sweep.sql)
    spec = {"acceptance_length": 2.5, "drafts": 10,
            "source": "vllm:spec_decode_* counters from /metrics, after warmup and after the window (delta)"}
    assert engines.acceptance({"speculative": spec})[1] == "vLLM spec-decode counters (/metrics delta over the window)"


def test_a_server_that_never_drafted_has_no_speculative_window() -> None:
    zero = (FIXTURES / "metrics-b11669.txt").read_text()
    for name in ("drafts", "draft_tokens", "accepted_tokens"):
        zero = re.sub(rf"(llamacpp:spec_decode_num_{name}_total) \d+", r"\1 0", zero)
    api = FakeAPI([zero, zero])
    before, after = engines.snapshot(api, "llamacpp"), engines.snapshot(api, "llamacpp")  # type: ignore[arg-type]
    assert after["llamacpp_spec"]["drafts"] == 0
    assert ENGINE.window(before, after)["speculative"] is None


def test_no_metrics_endpoint_gives_no_acceptance_and_says_why() -> None:
    api = FakeAPI(status=501)
    snap = engines.snapshot(api, "llamacpp")  # type: ignore[arg-type]
    assert "--metrics" in snap["metrics_error"]
    assert ENGINE.window(snap, snap) == {"speculative": None, "prefix_cache": None}
    assert spec_counters("# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 0\n") == {}


def test_a_refused_slot_erase_is_logged(caplog) -> None:
    api = FakeAPI()
    api.post = lambda path, timeout_s=30.0: Answer(501, '{"error": {"message": "Start it with --slot-save-path"}}')  # type: ignore[method-assign]
    ENGINE.reset_prefix_cache(api)  # type: ignore[arg-type]
    assert "kept its prompt cache: slot erase answered 501" in caplog.text


def test_version_and_slot_erase() -> None:
    api = FakeAPI()
    assert ENGINE.version(api) == "b11669-Debian"  # type: ignore[arg-type]
    ENGINE.reset_prefix_cache(api)  # type: ignore[arg-type]
    assert api.posts == ["/slots/0?action=erase", "/slots/1?action=erase"]


def test_the_api_key_travels_in_the_environment() -> None:
    spec, _ = _spec("llamacpp-cpu", "draft")
    assert spec.api_key_env == "LLAMA_API_KEY" and "--api-key" not in spec.argv
    assert ENGINE.ready_path == "/health" and not ENGINE.ready_needs_key


def test_prompt_cache_counters_over_the_window() -> None:
    """b11669's /metrics counts prompt tokens processed (excluding cached) and reused from the cache; the real
    fixture: 3 requests, 41 + 41 + 37 prompt tokens, 0 + 40 + 24 of them from the cache."""
    after_text = (FIXTURES / "metrics-prompt-cache-b11669.txt").read_text()
    api = FakeAPI(["# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 0\n", after_text])
    before, after = engines.snapshot(api, "llamacpp"), engines.snapshot(api, "llamacpp")  # type: ignore[arg-type]
    window = engines.window(before, after, "llamacpp")["prefix_cache"]
    assert (window["queried_tokens"], window["hit_tokens"]) == (41 + 41 + 37, 40 + 24)
    assert window["hit_rate"] == pytest.approx(64 / 119) and "prompt_tokens_cached_total" in window["source"]


def test_the_weights_it_serves_come_from_v1_models() -> None:
    api = FakeAPI()
    api.get = lambda path, timeout_s=5.0, with_key=True: Answer(  # type: ignore[method-assign]
        200, (FIXTURES / "models-b11669.json").read_text())
    weights = ENGINE.served_facts(api)["weights"]  # type: ignore[arg-type]
    assert (weights["bytes"], weights["params"], weights["file_type"]) == (96576768, 134515008, "Q4_1")
    assert weights["bits_per_param"] == pytest.approx(8 * 96576768 / 134515008, abs=1e-3)  # 5.744, not Q4_1's 5
    assert ENGINE.served_facts(FakeAPI()) == {}  # type: ignore[arg-type]  # no /v1/models: nothing claimed


def test_a_sweep_enables_a_whole_prefix_cache_reset_and_bench_opens_a_connection_per_request() -> None:
    # slot erase needs a slot save path; the RAM prompt cache survives an erase (measured on b11669), so it is off
    assert set(ENGINE.sweep_env()) == {"LLAMA_ARG_SLOT_SAVE_PATH=/tmp", "LLAMA_ARG_CACHE_RAM=0"}
    plan_spec = render(load_recipe(recipes_dir() / "cpu.yaml"), "llamacpp-cpu", "none",
                       LaunchOptions(mode="sweep", env=ENGINE.sweep_env()))
    assert plan_spec.env["LLAMA_ARG_CACHE_RAM"] == "0" and plan_spec.env["LLAMA_ARG_SLOT_SAVE_PATH"] == "/tmp"
    assert ENGINE.keeps_streamed_connections is False and engine("vllm").keeps_streamed_connections
