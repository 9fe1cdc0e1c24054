"""`--set KEY=VALUE` on a recipe document before it is validated: a template variable, the model, or a dotted
path into the recipe. The value is YAML; the result is validated like the file itself (sparklab.recipes.schema)."""

from __future__ import annotations

import copy
from collections.abc import Collection
from typing import Any

import yaml

from sparklab.errors import RecipeError
from sparklab.inputs import check_text, parse_yaml
from sparklab.spec import PASSTHROUGH_ENV, is_secret_name


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
def secret_value_error(where: str, name: str) -> RecipeError:
    """A secret-named environment variable (HF_TOKEN, an API key, a password: sparklab.spec.is_secret_name) given
    a value in a recipe, a sweep file or --set: that text is stored with the run and printed in its commands."""
    if name in PASSTHROUGH_ENV:
        fix = (f"Remove it, and export {name} where sparklab runs: it passes through to the engine (up, sweep and "
               f"tune) without being printed or stored.")
    else:
        fix = (f"Remove it: `sparklab up --env {name}` passes the host's {name} to the engine without printing or "
               f"storing it (sweeps and tune pass only {' and '.join(PASSTHROUGH_ENV)} this way).")
    return RecipeError(f"{where}: a secret's value written here is kept in the run's results (the sweep file, each "
                       f"server's overrides) and shown in every printed command", fix)


# Any: a --set value is YAML: any YAML type
def _secret_in_env(path: list[str], value: Any) -> str | None:
    """The secret-named variable an override gives a value in an `env` mapping (engines.E.env.NAME, a method's, or
    a whole `env` given as a mapping), else None."""
    if "env" not in path:
        return None
    i = path.index("env")
    names = path[i + 1:i + 2] if len(path) > i + 1 else list(value) if isinstance(value, dict) else []
    return next((str(n) for n in names if is_secret_name(str(n))), None)


def apply_overrides(data: Any, overrides: list[str], source: str, keys: Collection[str],
                    origin: str = "--set") -> dict[str, Any]:
    """Apply `--set` overrides to the raw recipe document (origin: where they were written, for the errors).

    A key naming a template variable sets it (vars.<key>); `model` sets model.id; any other key is a
    dotted path into the recipe (one of `keys`, its top-level fields) and is validated like the file itself. A
    secret's value in an `env` is refused (secret_value_error), and never repeated in the error.
    """
    doc: dict[str, Any] = copy.deepcopy(data) if isinstance(data, dict) else {}
    variables = doc.setdefault("vars", {}) or {}
    doc["vars"] = variables
    for text in overrides:
        path, value = parse_override(text)
        if (name := _secret_in_env(path, value)) is not None:
            key = ".".join(path if path[-1] != "env" else [*path, name])
            raise secret_value_error(f"{origin} {key}", name)
        if path == ["model"]:
            path = ["model", "id"]
        elif path[0] in variables:
            path = ["vars", *path]
        elif path[0] not in keys or path[0] == "source":
            known = ", ".join(sorted(variables)) or "(none)"
            raise RecipeError(
                f"{origin} {text}: {path[0]!r} is neither a variable of {source} nor a recipe key",
                f"Variables: {known}; model; or a dotted recipe path such as engines.vllm.image.")
        _set_path(doc, path, value, f"{origin} {text}")
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
            raise RecipeError(f"{text}: {where} is not a mapping, so it has no key {path[i + 1]!r}")
        node = nxt
    node[path[-1]] = value
