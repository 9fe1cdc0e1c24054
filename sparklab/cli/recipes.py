"""`sparklab recipes`: the recipes, their engines and methods."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from sparklab.cli.terminal import out


@dataclass(frozen=True)
class RecipesArgs:
    """No flags: every recipe under recipes/ is listed."""

    @classmethod
    def add_cli_args(cls, p: argparse.ArgumentParser) -> None:
        pass

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> RecipesArgs:
        return cls()


def cmd_recipes(args: RecipesArgs) -> int:
    from sparklab.cli.console import recipes_table

    out.print(recipes_table())
    return 0
