from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparklab.recipes.schema import recipes_dir


@pytest.fixture
def gb10_doc() -> dict[str, Any]:
    """The GB10 recipe as a raw document, to change and write elsewhere."""
    return copy.deepcopy(yaml.safe_load((recipes_dir() / "gb10.yaml").read_text()))


@pytest.fixture
def write_recipe(tmp_path: Path):
    def write(doc: dict[str, Any], name: str = "custom.yaml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    return write
