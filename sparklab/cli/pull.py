"""`sparklab pull`: the command line's side of sparklab.runtimes.pull (progress bars, the pulled refs printed)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparklab.cli.args import default_hf_cache
from sparklab.runtimes.pull import PullImage, pull, servers_for


@dataclass(frozen=True)
class PullArgs:
    spec: str  # what `up` takes (a method, recipe or file) or a sweep (file or name)
    target: str | None
    engine: str | None
    overrides: list[str]
    all_methods: bool  # everything any method of the recipe (of engine, or of every engine) needs
    hf_cache: Path
    pull: str  # images: when missing, or always
    images: bool
    models: bool

    @classmethod
    def add_cli_args(cls, p: argparse.ArgumentParser) -> None:
        p.add_argument("spec", metavar="RECIPE|METHOD|SWEEP",
                       help="what `up` takes (dspark, gb10, recipe:method, a recipe file) or a sweep (file or name)")
        p.add_argument("-t", "--target", help="recipe to take METHOD from (default: gb10)")
        p.add_argument("--engine", help="engine of the recipe (default: the recipe's)")
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override a recipe variable or key, as for `up`")
        p.add_argument("--all-methods", action="store_true",
                       help="everything any method of the recipe (of --engine, or of every engine) needs")
        p.add_argument("--hf-cache", type=Path, default=default_hf_cache(),
                       help="Hugging Face cache `up` mounts (default: $HF_HOME or ~/.cache/huggingface); "
                            "a sweep uses the cache its servers mount")
        p.add_argument("--pull", default="missing", choices=["missing", "always"],
                       help="pull images only when missing (default) or always")
        p.add_argument("--no-images", dest="images", action="store_false", help="only the model checkpoints")
        p.add_argument("--no-models", dest="models", action="store_false", help="only the images")

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> PullArgs:
        return cls(spec=args.spec, target=args.target, engine=args.engine, overrides=list(args.overrides),
                   all_methods=args.all_methods, hf_cache=args.hf_cache, pull=args.pull, images=args.images,
                   models=args.models)


def cmd_pull(args: PullArgs, pull_image: PullImage | None = None) -> int:
    from sparklab.cli.progress import DownloadProgress, PullProgress

    servers = servers_for(args.spec, target=args.target, engine=args.engine, overrides=args.overrides,
                          hf_cache=args.hf_cache.expanduser(), all_methods=args.all_methods)
    with DownloadProgress.to_stderr() as downloads, PullProgress(downloads.console) as layers:
        if args.images and pull_image is None:
            from sparklab.runtimes.containers import Docker

            docker = Docker()

            def pull_image(ref: str) -> Any:
                return docker.ensure_image(ref, args.pull, layers.update)

        pulled = pull(servers, pull_image=pull_image if args.images else None, models=args.models,
                      on_progress=downloads.update, say=downloads.say)
    for ref, digest in pulled.images.items():
        sys.stdout.write(f"{ref} {digest or '(no digest)'}\n")
    for fetched in pulled.models:
        sys.stdout.write(f"{fetched.checkpoint.repo_id} {fetched.commit} {fetched.path}\n")
    return 0
