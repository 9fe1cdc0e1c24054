"""TensorRT Edge-LLM's OpenAI server: its speculative flag, readiness, startup log and known deaths.

Everything here is read from the package itself (`pip download --no-deps tensorrt-edgellm==0.11.0`, the version
the package index holds; seed 004 names 0.11.1). Paths are inside that wheel:
- console script: `tensorrt-edgellm-serve = experimental.server.cli:main` (entry_points.txt). 0.11.0 installs no
  `trtedge` command; seed 004's tutorial (0.11.1) runs `trtedge serve MODEL`. The flags are the same parser.
- flags: experimental/server/config.py:279-373 (`create_argument_parser`, prog "tensorrt-edgellm-serve");
  `--speculative-config` is a JSON object with only `method`, `num_speculative_tokens` and `model`
  (config.py:66-97), method one of eagle3, mtp, dflash, jetspec, dspark, a draft `model` for all but mtp.
- endpoints: experimental/server/api/routes.py:44 `GET /health` (status, model, capabilities incl.
  speculative_decoding/speculative_method), :77 `GET /health/ready`, :87 `GET /v1/models`, :99
  `POST /v1/chat/completions`. The key guards only `/v1/` paths (api/app.py:128). No /metrics route and no
  acceptance counter anywhere in the server: speed is measured by sparklab's client, acceptance is unknown.
- the API key is a flag only (`--api-key`, config.py:293; no environment variable), so it shows in `ps`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sparklab.engines.base import Engine, Finding, KnownFailure, RecipeView, as_int, check_k, flag_value, where
from sparklab.engines.scrape import StartupFacts
from sparklab.errors import SparklabError
from sparklab.spec import Speculative

if TYPE_CHECKING:
    from sparklab.records import Sampling
    from sparklab.spec import LaunchSpec

METHODS = frozenset({"eagle3", "mtp", "dflash", "jetspec", "dspark"})  # config.py:73
NEEDS_DRAFT = METHODS - {"mtp"}  # config.py:90-94
SPEC_KEYS = frozenset({"method", "num_speculative_tokens", "model"})  # config.py:66

API_KEY_ON_COMMAND_LINE = (
    "TensorRT Edge-LLM reads its API key only from its command line (--api-key, "
    "experimental/server/config.py:293 in tensorrt-edgellm 0.11.0; no environment variable), so every local user "
    "can read the key with `ps`. On a shared host, treat the endpoint as open to local users.")

FAILURES = (
    # experimental/server/cli.py:31: a ServerConfigError from parse_server_config ends the process.
    KnownFailure(re.compile(r"invalid server configuration: (.+)"),
                 "Edge-LLM refused its command line: fix the flag the message names (see "
                 "`tensorrt-edgellm-serve --help`)."),
    # experimental/server/cli.py:41: TensorRT/CUDA missing or too old for the engine bundle.
    KnownFailure(re.compile(r"TensorRT prerequisite error"),
                 "TensorRT or CUDA is missing or the wrong version on this host: the venv needs the system's "
                 "TensorRT (create it with --system-site-packages; seed 004 used CUDA 13 and TensorRT 10.16)."),
    KnownFailure(re.compile(r"out of memory|CUDA error: out of memory|OutOfMemory", re.IGNORECASE),
                 "the GPU ran out of memory: lower --max-kv-cache-capacity or --max-input-len."),
)

# experimental/server/cli.py:43-51, logged once the model is loaded, before the HTTP server starts.
_LOADED = re.compile(r"Loaded model=(?P<model>\S+) max_model_len=(?P<len>\S+) kv_cache_dtype=(?P<dtype>\S+) "
                     r"speculative_decoding=(?P<spec>\S+)")


def speculative(argv: Sequence[str]) -> Speculative | None:
    raw = flag_value(argv, "--speculative-config")
    if not raw:
        return None
    try:
        config = json.loads(raw)
    except ValueError:
        return Speculative(method=None, num_speculative_tokens=None, draft_model=None, options={"invalid": raw})
    if not isinstance(config, dict):
        return Speculative(method=None, num_speculative_tokens=None, draft_model=None, options={"invalid": raw})
    extra = {k: v for k, v in config.items() if k not in SPEC_KEYS}
    return Speculative(method=config.get("method"), num_speculative_tokens=as_int(config.get("num_speculative_tokens")),
                       draft_model=config.get("model"), options=extra)


class TrtEdge(Engine):
    kind = "trtedge"
    label = "TensorRT Edge-LLM 0.11"
    no_acceptance_reason = "TensorRT Edge-LLM 0.11 has no acceptance counter (no /metrics route, api/routes.py)"
    ready_path = "/health/ready"  # routes.py:77; served only once load_model returned (cli.py:39-52)
    ready_needs_key = False  # the key guards /v1/ only (api/app.py:128)
    ready_line = re.compile(r"Application startup complete|Uvicorn running on")
    api_key_warning = API_KEY_ON_COMMAND_LINE
    methods = METHODS
    failures = FAILURES

    def api_key_args(self, key: str) -> list[str]:
        return ["--api-key", key]

    def speculative(self, argv: Sequence[str]) -> Speculative | None:
        return speculative(argv)

    def check_speculative(self, spec: LaunchSpec, recipe: RecipeView, sp: Speculative) -> list[Finding]:
        """Edge-LLM's own refusals (config.py:58-94), found before the engine builds for minutes."""
        if "invalid" in sp.options:
            return [Finding("error", f"{where(spec)}: --speculative-config must be a JSON object, got "
                                     f"{sp.options['invalid']!r}", "Write it as JSON with double quotes.")]
        found: list[Finding] = []
        if sp.options:
            found.append(Finding("error", f"{where(spec)}: Edge-LLM refuses --speculative-config keys "
                                          f"{', '.join(sorted(sp.options))}",
                                 "Only method, num_speculative_tokens and model are accepted (config.py:66)."))
        if sp.method in NEEDS_DRAFT and not sp.draft_model:
            found.append(Finding("error", f"{where(spec)}: Edge-LLM method {sp.method!r} needs a draft model",
                                 "Add \"model\": \"<draft id or path>\" to --speculative-config."))
        if sp.num_speculative_tokens is not None:  # absent: the engine's own default (config.py:77)
            found += check_k(spec, recipe, sp.num_speculative_tokens, "num_speculative_tokens")
        return found

    def read_startup(self, text: str, facts: StartupFacts) -> None:
        if m := _LOADED.search(text):
            facts.advice.append(f"Edge-LLM loaded {m['model']}: max_model_len {m['len']}, KV cache {m['dtype']}, "
                                f"speculative decoding {m['spec']} (its startup log)")

    def request_sampling(self, sampling: Sampling) -> Sampling:
        """Edge-LLM's request models forbid unknown fields (experimental/server/api/protocol.py:34,
        `extra="forbid"`): no vLLM `return_token_ids`, and no `ignore_eos`/`min_tokens` (so no forced length).
        `chat_template_kwargs.enable_thinking` it takes (protocol.py:129-141)."""
        if sampling.ignore_eos or sampling.min_tokens is not None:
            raise SparklabError(
                "TensorRT Edge-LLM cannot force the output length: its chat API has no ignore_eos or min_tokens "
                "(experimental/server/api/protocol.py:59-92 in tensorrt-edgellm 0.11.0; unknown fields are refused)",
                "Remove ignore_eos/min_tokens from the sweep's sampling (or --ignore-eos/--min-tokens) for this "
                "engine.")
        return dataclasses.replace(sampling, token_ids=False)

    def acceptance(self, result: dict[str, Any]) -> None:
        return None  # the server reports none (see the module docstring)


ENGINE = TrtEdge()
