"""`--set KEY=VALUE` on a recipe document before it is validated: a template variable, the model, or a dotted
path into the recipe. The value is YAML; the result is validated like the file itself (sparklab.recipes.schema)."""

from __future__ import annotations

import copy
from collections.abc import Collection
from typing import Any

import yaml

from sparklab.errors import RecipeError
from sparklab.inputs import check_text, parse_yaml


# Any: a --set value is YAML: any YAML type
def parse_override(text: str) -> tuple[list[str], Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise RecipeError(f"--set {text!r}: expected KEY=VALUE",
                          "Example: --set max_model_len=32768 or --set engines.vllm.image=repo/name:tag")
    try:
        value = parse_yaml(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    check_text({key.strip(): value}, "--set")  # bytes that are not UTF-8 reach argv as lone surrogates
    return key.strip().split("."), value


# Any: YAML as loaded, before pydantic validates it
def apply_overrides(data: Any, overrides: list[str], source: str, keys: Collection[str]) -> dict[str, Any]:
    """Apply `--set` overrides to the raw recipe document.

    A key naming a template variable sets it (vars.<key>); `model` sets model.id; any other key is a
    dotted path into the recipe (one of `keys`, its top-level fields) and is validated like the file itself.
    """
    doc: dict[str, Any] = copy.deepcopy(data) if isinstance(data, dict) else {}
    variables = doc.setdefault("vars", {}) or {}
    doc["vars"] = variables
    for text in overrides:
        path, value = parse_override(text)
        if path == ["model"]:
            path = ["model", "id"]
        elif path[0] in variables:
            path = ["vars", *path]
        elif path[0] not in keys or path[0] == "source":
            known = ", ".join(sorted(variables)) or "(none)"
            raise RecipeError(
                f"--set {text}: {path[0]!r} is neither a variable of {source} nor a recipe key",
                f"Variables: {known}; model; or a dotted recipe path such as engines.vllm.image.")
        _set_path(doc, path, value, text)
    return doc


def _set_path(doc: dict[str, Any], path: list[str], value: Any, text: str) -> None:
    node: Any = doc
    for i, part in enumerate(path[:-1]):
        nxt = node.get(part) if isinstance(node, dict) else None
        if nxt is None:
            nxt = {}
            node[part] = nxt
        if not isinstance(nxt, dict):
            where = ".".join(path[: i + 1])
            raise RecipeError(f"--set {text}: {where} is not a mapping, so it has no key {path[i + 1]!r}")
        node = nxt
    node[path[-1]] = value
