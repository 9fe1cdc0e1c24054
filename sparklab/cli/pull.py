"""`sparklab pull`: the command line's side of sparklab.runtimes.pull (progress bars, the pulled refs printed)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sparklab.runtimes.pull import PullImage, pull, servers_for


def cmd_pull(args: argparse.Namespace, pull_image: PullImage | None = None) -> int:
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
