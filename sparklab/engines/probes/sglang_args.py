"""Check `python3 -m sglang.launch_server` argv against SGLang's own parser, without a GPU or model files.

Runs with the Python of an SGLang image (`sparklab check` and every start's preflight, in a throwaway container with
no network and no GPU: sparklab/engines/parsers.py) or of the venv scripts/sglang-parser/install.sh builds (the
real `sglang` wheel, for the contract test):

    ~/.cache/sparklab/sglang-parser-0.5.23/bin/python sparklab/engines/probes/sglang_args.py \\
      '{"cases": [{"id": "gb10:sglang:dspark", "argv": ["--model-path", "x", ...]}]}'

Input: one JSON document, the first argument (else stdin).

argv is what follows `-m sglang.launch_server`. Output (stdout, one JSON document):

    {"sglang_version": "0.5.23", "cases": [{"id", "ok", "errors": [{"flag", "message"}], "parsed": {...}}]}

What is run for each case:
  1. sglang.srt.server_args.prepare_server_args(argv), the function launch_server.py calls: the argparse
     parser built from the ServerArgs fields (sglang/srt/arg_groups/fields/*.py), which rejects unknown
     flags, bad types and every value outside a field's choice list (--moe-runner-backend,
     --mamba-ssm-dtype, --reasoning-parser, --tool-call-parser, ...), then ServerArgs.from_cli_args.
  2. --speculative-algorithm against SpeculativeAlgorithm.from_string (sglang/srt/speculative/spec_info.py):
     the parser gives that flag no choice list, so an unknown name would otherwise only fail at start-up.
  3. The model-independent rule the speculative hook applies to DSpark
     (sglang/srt/arg_groups/speculative_hook.py, _handle_dspark): the block size must be positive. The hook
     itself is not run: it first refuses any device but CUDA/NPU/XPU and reads the draft checkpoint.
What it cannot judge (the checkpoint, the GPU, memory) is listed by the test, with why.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import sys
from typing import Any

# SGLang logs to stdout/stderr; keep stdout for our JSON only.
_OUT = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr

import importlib.metadata  # noqa: E402

from sglang.srt.server_args import prepare_server_args  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402

_FLAG = re.compile(r"(--[\w-]+)")
SPEC_FIELDS = ("speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps",
               "speculative_eagle_topk", "speculative_num_draft_tokens", "speculative_dspark_block_size",
               "speculative_moe_runner_backend", "moe_runner_backend", "mamba_ssm_dtype",
               "cuda_graph_max_bs_decode", "reasoning_parser", "tool_call_parser", "max_running_requests",
               "mem_fraction_static", "context_length", "api_key", "nnodes", "node_rank", "dist_init_addr", "tp_size")


def check(argv: list[str]) -> dict[str, Any]:
    errors: list[dict[str, str]] = []
    parsed: dict[str, Any] = {}
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = prepare_server_args(list(argv))
    except SystemExit:  # argparse's parser.error(): the message is on stderr
        message = stderr.getvalue().strip().splitlines()[-1] if stderr.getvalue().strip() else "argparse exit"
        flag = _FLAG.search(message)
        return {"ok": False, "errors": [{"flag": flag.group(1) if flag else "", "message": message}], "parsed": {}}
    except Exception as e:  # ServerArgs construction refused the values
        return {"ok": False, "errors": [{"flag": "", "message": f"{type(e).__name__}: {e}"}], "parsed": {}}
    for name in SPEC_FIELDS:
        value = getattr(args, name, None)
        parsed[name] = value if isinstance(value, (str, int, float, bool, type(None))) else str(value)
    algorithm = parsed.get("speculative_algorithm")
    if algorithm is not None:
        try:
            SpeculativeAlgorithm.from_string(algorithm)
        except ValueError as e:
            errors.append({"flag": "--speculative-algorithm", "message": str(e)})
        if str(algorithm).upper() == "DSPARK":
            block = parsed.get("speculative_dspark_block_size")
            if block is not None and int(block) <= 0:
                errors.append({"flag": "--speculative-dspark-block-size",
                               "message": f"DSpark requires --speculative-dspark-block-size to be positive, "
                                          f"got {block}."})
    return {"ok": not errors, "errors": errors, "parsed": parsed}


def main() -> None:
    logging.disable(logging.WARNING)
    request = json.loads(sys.argv[1] if len(sys.argv) > 1 else sys.stdin.read())
    cases = []
    for case in request["cases"]:
        cases.append({"id": case["id"], **check(case["argv"])})
    _OUT.write(json.dumps({"sglang_version": importlib.metadata.version("sglang"),
                           "version_source": "package metadata of the distribution 'sglang' in the image",
                           "cases": cases}))
    _OUT.flush()


if __name__ == "__main__":
    main()
