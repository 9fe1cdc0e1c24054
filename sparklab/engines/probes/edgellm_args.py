"""Check a TensorRT Edge-LLM server command against Edge-LLM's own server parser, without a GPU or a model.

Runs with the Python of the venv the recipe's Edge-LLM runs from (a host process: sparklab/engines/parsers.py runs
`VENV/bin/python -c THIS_FILE CASES_JSON`). Edge-LLM 0.11.0's server CLI parses with `parse_server_config`
(experimental/server/config.py:376-430: argparse plus its SpeculativeConfig/ContextCacheConfig/ApiConfig checks),
and that module imports only the standard library (config.py:17-21), so it is loaded by its path: importing the
`experimental.server` package would load TensorRT.

Input: {"cases": [{"id", "argv"}]} (the first argument, else stdin); argv is what follows the server command
(`tensorrt-edgellm-serve`, or `trtedge serve`). Output (stdout, one JSON document): {"version", "version_source",
"console_scripts", "parser", "cases": [{"id", "ok", "errors": [{"flag", "message"}]}]}, or {"error"} when this
Edge-LLM keeps its server parser elsewhere than 0.11.0 does.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import io
import json
import os
import re
import sys
from typing import Any

_OUT = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr

DIST = "tensorrt-edgellm"
_FLAG = re.compile(r"(--[\w-]+)")


def _config_module() -> tuple[Any, str]:
    spec = importlib.util.find_spec("experimental")
    for base in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(base, "server", "config.py")
        if os.path.isfile(path):
            loaded = importlib.util.spec_from_file_location("edgellm_server_config", path)
            if loaded is None or loaded.loader is None:
                continue
            module = importlib.util.module_from_spec(loaded)
            loaded.loader.exec_module(module)
            if hasattr(module, "parse_server_config"):
                return module, path
    raise LookupError("no experimental/server/config.py with parse_server_config (where Edge-LLM 0.11.0 keeps its "
                      "server parser) in this Python")


def _check(module: Any, argv: list[str]) -> dict[str, Any]:
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            module.parse_server_config(list(argv))
    except SystemExit:  # argparse's parser.error(): the message is on stderr
        lines = [line for line in stderr.getvalue().strip().splitlines() if line.strip()]
        message = lines[-1] if lines else "argument parsing failed"
        flag = _FLAG.search(message)
        return {"ok": False, "errors": [{"flag": flag.group(1) if flag else None, "message": message}]}
    except module.ServerConfigError as exc:  # cli.py:29-31 prints it so
        return {"ok": False, "errors": [{"flag": None, "message": f"invalid server configuration: {exc}"}]}
    except Exception as exc:
        return {"ok": False, "errors": [{"flag": None, "message": f"{type(exc).__name__}: {exc}"}]}
    return {"ok": True, "errors": []}


def _installed() -> tuple[str | None, list[str]]:
    try:
        dist = importlib.metadata.distribution(DIST)
    except importlib.metadata.PackageNotFoundError:
        return None, []
    scripts = sorted(ep.name for ep in dist.entry_points if ep.group == "console_scripts")
    return dist.version, scripts


def main() -> int:
    request = json.loads(sys.argv[1] if len(sys.argv) > 1 else sys.stdin.read())
    version, scripts = _installed()
    out: dict[str, Any] = {"version": version, "console_scripts": scripts,
                           "version_source": f"package metadata of the distribution {DIST!r} in this Python"}
    try:
        module, path = _config_module()
    except (LookupError, ImportError, SyntaxError) as exc:
        out["error"] = str(exc)
        _OUT.write(json.dumps(out))
        _OUT.flush()
        return 3
    out["parser"] = path
    out["cases"] = [{"id": case["id"], **_check(module, case["argv"])} for case in request["cases"]]
    _OUT.write(json.dumps(out))
    _OUT.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
