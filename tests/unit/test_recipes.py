"""Recipe loading: strict validation, messages that name file, key path and fix; overrides; lookup."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparklab.errors import RecipeError
from sparklab.recipes.schema import list_recipes, load_recipe, recipes_dir, resolve


def test_every_bundled_recipe_loads() -> None:
    names = {load_recipe(p).name for p in list_recipes()}
    assert {"gb10", "gb10-modelcard"} <= names


def test_unknown_key_is_an_error_naming_file_path_and_fix(gb10_doc, write_recipe) -> None:
    gb10_doc["engines"]["vllm"]["methods"]["mtp"]["argz"] = []
    path = write_recipe(gb10_doc)
    with pytest.raises(RecipeError) as exc:
        load_recipe(path)
    text = str(exc.value)
    assert f"{path}: engines.vllm.methods.mtp.argz: unknown key" in text
    assert "remove it or fix its spelling" in text


def test_wrong_type_names_the_key_and_the_value(gb10_doc, write_recipe) -> None:
    gb10_doc["engines"]["vllm"]["port"] = "eighty"
    path = write_recipe(gb10_doc)
    with pytest.raises(RecipeError, match=r"engines\.vllm\.port: .*got 'eighty'"):
        load_recipe(path)


@pytest.mark.parametrize("kind", ["vlm", 3, ["vllm"]])
def test_an_unknown_engine_kind_names_the_file_the_key_and_the_known_kinds(gb10_doc, write_recipe, kind) -> None:
    gb10_doc["engines"]["vllm"]["kind"] = kind
    path = write_recipe(gb10_doc)
    with pytest.raises(RecipeError) as exc:
        load_recipe(path)
    assert exc.value.message == (f"{path}: engines.vllm.kind: Input should be 'vllm', 'sglang', 'trtedge' or "
                                 f"'llamacpp', got {kind!r}")
    assert exc.value.hint == "See recipes/README.md for the recipe format."


def test_the_engine_kinds_are_the_registered_adapters(gb10_doc, write_recipe, monkeypatch) -> None:
    """A new engine is its adapter, registered in sparklab.engines: the recipe schema lists no kinds of its own."""
    from sparklab import engines
    from sparklab.engines.base import Engine

    class Newcomer(Engine):
        kind = "newcomer"

    gb10_doc["engines"]["vllm"]["kind"] = "newcomer"
    path = write_recipe(gb10_doc)
    monkeypatch.setitem(engines.ENGINES, "newcomer", Newcomer())
    assert load_recipe(path).engines["vllm"].kind == "newcomer"
    gb10_doc["engines"]["vllm"]["kind"] = "newcomers"
    with pytest.raises(RecipeError, match=r"engines\.vllm\.kind: Input should be 'vllm', 'sglang', 'trtedge', "
                                          r"'llamacpp' or 'newcomer', got 'newcomers'"):
        load_recipe(write_recipe(gb10_doc))


def test_list_items_are_located_by_index(gb10_doc, write_recipe) -> None:
    gb10_doc["engines"]["vllm"]["args"][3] = {"oops": 1}
    with pytest.raises(RecipeError, match=r"engines\.vllm\.args\[3\]"):
        load_recipe(write_recipe(gb10_doc))


def test_missing_required_key(gb10_doc, write_recipe) -> None:
    del gb10_doc["engines"]["sglang"]["port"]  # (a missing image has its own message: tests/unit/test_trtedge.py)
    with pytest.raises(RecipeError, match=r"engines\.sglang\.port: Field required; add it"):
        load_recipe(write_recipe(gb10_doc))


def test_default_method_must_exist(gb10_doc, write_recipe) -> None:
    gb10_doc["default_method"] = "medusa"
    with pytest.raises(RecipeError, match=r"default_method: 'medusa' is not a method of engine 'vllm'"):
        load_recipe(write_recipe(gb10_doc))


def test_bad_digest_is_rejected(gb10_doc, write_recipe) -> None:
    gb10_doc["engines"]["vllm"]["digest"] = "latest"
    with pytest.raises(RecipeError, match=r"engines\.vllm\.digest"):
        load_recipe(write_recipe(gb10_doc))


def test_yaml_syntax_error_names_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\nengines:\n  vllm: [unclosed\n")
    with pytest.raises(RecipeError, match=r"broken\.yaml: line \d+, column \d+: not valid YAML"):
        load_recipe(path)


def test_missing_file() -> None:
    with pytest.raises(RecipeError, match="no such recipe file"):
        load_recipe(Path("/nonexistent/recipe.yaml"))


class TestOverrides:
    def test_variable(self) -> None:
        recipe = load_recipe(recipes_dir() / "gb10.yaml", ["max_model_len=32768"])
        assert recipe.vars["max_model_len"] == 32768

    def test_model(self) -> None:
        recipe = load_recipe(recipes_dir() / "gb10.yaml", ["model=org/other-model"])
        assert recipe.model.id == "org/other-model"

    def test_dotted_recipe_path(self) -> None:
        recipe = load_recipe(recipes_dir() / "gb10.yaml", ["engines.vllm.image=repo/img:tag",
                                                           "model.drafts.dspark.block_size=5"])
        assert recipe.engines["vllm"].image == "repo/img:tag"
        assert recipe.model.drafts["dspark"].block_size == 5

    def test_unknown_name_lists_the_variables(self) -> None:
        with pytest.raises(RecipeError) as exc:
            load_recipe(recipes_dir() / "gb10.yaml", ["max_len=5"])
        assert "'max_len' is neither a variable" in str(exc.value)
        assert "max_model_len" in str(exc.value)

    def test_invalid_value_is_validated_like_the_file(self) -> None:
        with pytest.raises(RecipeError, match=r"engines\.vllm\.port"):
            load_recipe(recipes_dir() / "gb10.yaml", ["engines.vllm.port=-3"])

    def test_unknown_nested_key_is_an_error(self) -> None:
        with pytest.raises(RecipeError, match=r"engines\.vllm\.imag: unknown key"):
            load_recipe(recipes_dir() / "gb10.yaml", ["engines.vllm.imag=x"])

    def test_needs_equals(self) -> None:
        with pytest.raises(RecipeError, match="expected KEY=VALUE"):
            load_recipe(recipes_dir() / "gb10.yaml", ["max_model_len"])


class TestResolve:
    def test_method_of_default_target(self) -> None:
        path, method = resolve("dspark")
        assert path.name == "gb10.yaml" and method == "dspark"

    def test_method_of_named_target(self) -> None:
        path, method = resolve("mtp", target="gb10-modelcard")
        assert path.name == "gb10-modelcard.yaml" and method == "mtp"

    def test_recipe_name(self) -> None:
        path, method = resolve("gb10-modelcard")
        assert path.name == "gb10-modelcard.yaml" and method is None

    def test_recipe_colon_method(self) -> None:
        path, method = resolve("gb10:mtp")
        assert path.name == "gb10.yaml" and method == "mtp"

    def test_file_path(self, tmp_path: Path) -> None:
        path, method = resolve(str(tmp_path / "x.yaml") + ":none")
        assert path == tmp_path / "x.yaml" and method == "none"

    def test_unknown_target(self) -> None:
        with pytest.raises(RecipeError, match=r"Available recipes: .*gb10"):
            resolve("dspark", target="nope")


def test_an_engine_may_serve_its_own_copy_of_the_model() -> None:
    """cpu.yaml: vLLM serves the fp32 safetensors, llama.cpp the Q4_1 GGUF (engines.llamacpp-cpu.model); templates,
    the stored roofline facts and the drafts follow the engine."""
    from sparklab.recipes.render import render
    from sparklab.recipes.schema import load_recipe, recipes_dir, stored_facts

    recipe = load_recipe(recipes_dir() / "cpu.yaml")
    vllm, llama = render(recipe, "vllm-cpu", "none"), render(recipe, "llamacpp-cpu", "draft_model")
    assert vllm.argv[1] == "/models/SmolLM2-135M-Instruct"
    assert llama.argv[llama.argv.index("--model") + 1] == "/models/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert llama.argv[llama.argv.index("--spec-draft-model") + 1] == "/models/SmolLM2-135M-Instruct.Q4_0.gguf"
    assert stored_facts(recipe, {}, "vllm-cpu")["model"]["facts"]["weight_bits"] == 32
    assert stored_facts(recipe, {}, "llamacpp-cpu")["model"] == {
        "id": "/models/SmolLM2-135M-Instruct.Q4_1.gguf", "facts": {
            "total_params_b": 0.135, "active_params_b": 0.135, "weight_bits": 5.0, "layers": 30,
            "attention_layers": 30, "kv_bytes_per_token": 23040.0}}
