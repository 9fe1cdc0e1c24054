"""sparklab.inputs.parse_yaml: libyaml's speed with safe_load's answers. Every bundled YAML file parses to what
safe_load gives, and every document libyaml refuses or cannot take ends exactly as safe_load ends it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sparklab import inputs
from sparklab.inputs import parse_yaml
from sparklab.recipes.schema import recipes_dir

BUNDLED = sorted(p for p in recipes_dir().rglob("*.yaml")) + sorted(
    (Path(inputs.__file__).parent / "bench").rglob("*.yaml"))


def test_this_pyyaml_has_libyaml_so_the_fast_path_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    assert inputs._LIBYAML is not None  # the PyPI wheels carry it; without it every load is the slow one
    monkeypatch.setattr(yaml, "safe_load", lambda text: pytest.fail("the pure-Python loader ran"))
    assert parse_yaml("a: [1, 2]\nb: {c: d}\n") == {"a": [1, 2], "b": {"c": "d"}}


@pytest.mark.parametrize("path", BUNDLED, ids=lambda p: str(p.relative_to(p.parents[1])))
def test_every_bundled_file_parses_as_safe_load_parses_it(path: Path) -> None:
    text = path.read_text()
    assert parse_yaml(text) == yaml.safe_load(text)


def test_the_bundled_files_are_found() -> None:
    names = {p.name for p in BUNDLED}
    assert {"gb10.yaml", "cpu.yaml", "cpu-quality.yaml"} <= names and len(BUNDLED) >= 20, names


@pytest.mark.parametrize("text", [
    "a: &x {b: 1}\nc: *x\nd:\n  <<: *x\n  e: 2\n",  # anchors and merge keys (recipes/cpu.yaml has both)
    "a: 1\na: 2\n",  # a repeated key: the last one, as safe_load
    "\ufeffa: 1\n",
    "x: 1e400\ny: 0o17\nz: .inf\nw: ~\nv: 2026-12-02\n",  # the YAML 1.1 resolver's answers, not libyaml's
    "",
    "- \"\\U0001F600 \\u00e9\"\n",
])
def test_documents_libyaml_takes_parse_as_safe_load_parses_them(text: str) -> None:
    assert parse_yaml(text) == yaml.safe_load(text)


def test_a_lone_surrogate_escape_is_taken_as_safe_load_takes_it() -> None:
    # libyaml refuses it; safe_load takes it, and check_text then names its key (tests/unit/test_input_faults.py)
    assert parse_yaml('a: "\\ud800"\n') == yaml.safe_load('a: "\\ud800"\n') == {"a": "\ud800"}


@pytest.mark.parametrize("text", [
    "a: [1, 2", "a:\n\tb: 1\n", "a: b: c\n", "\x00", "? [1]\n: 2\n", "a: !!python/object:os.system x\n",
    "a: 'unclosed\n", "- a\nb: c\n",
    "a: b\udcff\n",  # text holding a lone surrogate (a --set value from bytes that are not UTF-8): libyaml cannot
])                    # encode it (UnicodeEncodeError), safe_load refuses it as YAML
def test_a_bad_document_fails_exactly_as_safe_load_fails_it(text: str) -> None:
    with pytest.raises(yaml.YAMLError) as slow:
        yaml.safe_load(text)
    with pytest.raises(yaml.YAMLError) as fast:
        parse_yaml(text)
    assert type(fast.value) is type(slow.value) and str(fast.value) == str(slow.value)
