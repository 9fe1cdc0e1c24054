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
- the first start of a configuration builds every TensorRT engine before serving: load_model resolves the
  model (experimental/server/runtime/engine.py:2165-2170), prepare_model builds all components on a bundle-cache
  miss (runtime/engine_build.py:412-457; the bundle is keyed by checkpoint and build profile, :200-225), and
  TensorRT's build_serialized_network runs after the log line "Building serialized engine (this may take several
  minutes)..." until "Engine written to ..." (experimental/builder/core/builder.py:485-499), printing nothing in
  between at the server's INFO level. So the ETA counts the recipe's ready_timeout_s for a first start, and the
  stall detector waits out that phase (`quiet_phases`).
- the Hub: a model or draft given as a Hub id is resolved with huggingface_hub's
  snapshot_download(model, cache_dir=<cache root>/checkpoints) (engine_build.py:115-140; the draft too,
  :420-424), the cache root being --cache-dir (config.py:317-322) or ~/.cache/tensorrt-edgellm
  (engine_build.py:33, 109-112), not the Hugging Face cache. Nothing else on the serve path reads from the Hub:
  in the wheel huggingface_hub is imported only there and by the Alpamayo model's builder
  (experimental/builder/models/alpamayo/, not this model); the tokenizer and configs load from that checkpoint
  directory (builder/core/artifacts/tokenizer.py:71). Not checked here (no Hub access): whether a checkpoint's
  tokenizer config points at code in another repository. So sparklab downloads the checkpoints into that
  directory first (`process_hub_cache`) and only then runs the server with HF_HUB_OFFLINE=1, with which
  snapshot_download returns the cached snapshot; a missing file fails the start at once.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparklab.engines import knowledge, parsers
from sparklab.engines.argv import as_int, flag_value
from sparklab.engines.base import Engine, Finding, KnownFailure, RecipeView, check_k, where
from sparklab.engines.knowledge import Fact, Knowledge
from sparklab.engines.scrape import StartupFacts
from sparklab.errors import SparklabError
from sparklab.spec import Speculative

if TYPE_CHECKING:
    from collections.abc import Sequence

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


# The server command by version, as each was read: 0.11.0's wheel installs only `tensorrt-edgellm-serve`
# (entry_points.txt); seed 004 and the 0.11.1 documentation run `trtedge serve` (docs 0.11.1/user_guide/
# getting_started/cli.html); the latest documentation runs `edgellm serve` (docs latest/user_guide/examples/
# integration/aiperf.html, a version after 0.11.1 whose number it does not state). The readiness path is
# /health/ready in all three (routes.py:77 in 0.11.0; the latest docs wait on the same path).
COMMANDS = ((("0.11.0",), ("tensorrt-edgellm-serve",)), (("0.11.1",), ("trtedge", "serve")),
            (("0.11.2",), ("edgellm", "serve")))


def command_for(version: str | None) -> tuple[str, ...] | None:
    """The server command this Edge-LLM version installs (None: unknown version). Releases after 0.11.1 are taken
    to run the latest documentation's `edgellm serve`."""
    key = knowledge.dotted_key(version)
    if key is None:
        return None
    found: tuple[str, ...] | None = None
    for (first,), command in COMMANDS:
        if key >= (knowledge.dotted_key(first) or ()):
            found = command
    return found


# -- which versions this adapter's knowledge was read from (sparklab/engines/knowledge.py): each fact with its
# versions and its file:line in each. `sparklab check` and every start warn for an image outside them.
_E110 = ("0.11.0",)
KNOWLEDGE = Knowledge((
    Fact("command", "tensorrt-edgellm-serve MODEL (0.11.0's only server command)", _E110,
         "entry_points.txt of the 0.11.0 wheel; 0.11.1's documentation runs `trtedge serve` (docs "
         "0.11.1/user_guide/getting_started/cli.html) and the latest `edgellm serve` (docs latest/user_guide/"
         "examples/integration/aiperf.html): documentation only, no wheel on the index"),
    Fact("flags", "the server's flags and --speculative-config keys", _E110,
         "experimental/server/config.py:66-97, 279-373, 376-430"),
    Fact("readiness path", "GET /health/ready", _E110,
         "experimental/server/api/routes.py:77 (0.11.0; the latest documentation waits on the same path)"),
    Fact("startup lines", "Loaded model=… max_model_len=… kv_cache_dtype=… speculative_decoding=…", _E110,
         "experimental/server/cli.py:43-51"),
))


class TrtEdge(Engine):
    kind = "trtedge"
    label = "TensorRT Edge-LLM 0.11"
    name = "TensorRT Edge-LLM"
    knowledge = KNOWLEDGE
    # 0.11.0 serves chat only (api/routes.py:99; no /v1/completions), and its logprobs are those of generated tokens
    # (api/protocol.py:65-66): nothing scores given tokens.
    scoring_unsupported = ("TensorRT Edge-LLM 0.11's server has no completions endpoint and no prompt log-probabilities"
                           " (experimental/server/api/routes.py:99, api/protocol.py:65-66)")
    no_acceptance_reason = "TensorRT Edge-LLM 0.11 has no acceptance counter (no /metrics route, api/routes.py)"
    ready_path = "/health/ready"  # routes.py:77; served only once load_model returned (cli.py:39-52)
    ready_needs_key = False  # the key guards /v1/ only (api/app.py:128)
    ready_line = re.compile(r"Application startup complete|Uvicorn running on")
    api_key_warning = API_KEY_ON_COMMAND_LINE
    methods = METHODS
    failures = FAILURES
    quiet_phases = ((re.compile(r"Building serialized engine \(this may take several minutes\)"),
                     re.compile(r"Engine written to |Build completed in "), "TensorRT engine build"),)
    builds_on_first_start = True

    def process_hub_cache(self, spec: LaunchSpec, env: Mapping[str, str]) -> Path | None:
        """<--cache-dir or ~/.cache/tensorrt-edgellm>/checkpoints: where it snapshot-downloads Hub ids
        (see the module docstring), so the only place it reads the Hub from."""
        root = flag_value(spec.argv, "--cache-dir")
        home = env.get("HOME") or str(Path.home())
        base = Path(root).expanduser() if root else Path(home) / ".cache" / "tensorrt-edgellm"
        return base / "checkpoints"

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

    def parser_probe(self, specs: Sequence[LaunchSpec]) -> parsers.Probe | str:
        """Edge-LLM's own parse_server_config with the Python of the venv the server runs from
        (probes/edgellm_args.py: the code of tests/unit/test_edgellm_contract.py's check). `trtedge serve` and
        `edgellm serve` take the same flags after `serve`."""
        cases = []
        for i, spec in enumerate(specs):
            argv = parsers.key_free(parsers.command_of(spec))
            if spec.entrypoint[0].rsplit("/", 1)[-1] in ("trtedge", "edgellm") and argv[:1] == ["serve"]:
                argv = argv[1:]
            cases.append({"id": str(i), "argv": argv})
        program = specs[0].entrypoint[0]
        python = f"{program.rsplit('/', 1)[0]}/python" if "/" in program else program  # the venv's own Python
        return parsers.python_probe("experimental", python, "edgellm_args.py", cases)

    def parser_verdicts(self, specs: Sequence[LaunchSpec], run: parsers.ProbeRun) -> list[parsers.Verdict]:
        """The parser's verdicts, then the command against the version: a command this version does not install
        is refused with the one it does (the version follows COMMANDS)."""
        verdicts = parsers.case_verdicts(run, len(specs), _PARSER, "version")
        out = []
        for spec, verdict in zip(specs, verdicts, strict=True):
            wrong = self._wrong_command(spec, verdict)
            out.append(dataclasses.replace(verdict, status=parsers.REJECTED, rejections=(*verdict.rejections, wrong))
                       if wrong else verdict)
        return out

    @staticmethod
    def _wrong_command(spec: LaunchSpec, verdict: parsers.Verdict) -> parsers.Rejection | None:
        program = spec.entrypoint[0].rsplit("/", 1)[-1]
        installed = [str(s) for s in verdict.facts.get("console_scripts") or ()]
        expected = command_for(verdict.version)
        if verdict.status == parsers.NOT_CHECKED or not installed or program in installed:
            return None
        runs = f"; its server command is `{' '.join(expected)}`" if expected else ""
        return parsers.Rejection(None, f"TensorRT Edge-LLM {verdict.version} installs no `{program}` (its commands: "
                                       f"{', '.join(installed)}){runs}")


_PARSER = "TensorRT Edge-LLM's parse_server_config (its server CLI's argparse parser and config checks)"

ENGINE = TrtEdge()
