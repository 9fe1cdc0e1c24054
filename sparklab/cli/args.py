"""The command line's grammar: every subcommand, flag and default, and the checks argparse makes on them.

`sparklab.cli` maps each `command` to its function; this module only parses.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from pathlib import Path

from sparklab import __version__
from sparklab.recipes.render import LaunchOptions
from sparklab.recipes.schema import (
    MAX_CONCURRENCY,
    MAX_DURATION_S,
    MAX_REQUESTS,
    MAX_SPECULATIVE_TOKENS,
    MAX_TEMPERATURE,
    MAX_TOKENS,
    MAX_WARMUP,
)
from sparklab.records import Sampling
from sparklab.sweep import rundir

SAMPLING = Sampling()  # bench's defaults are the one set in sparklab.records.Sampling


def _default_hf_cache() -> Path:
    home = os.environ.get("HF_HOME")
    return Path(home).expanduser() if home else Path("~/.cache/huggingface").expanduser()


def _whole(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number from low to high, else a usage error now rather than a traceback later."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected a whole number from {low} to {high}, got {text}")
        return value
    return parse


def _positive(high: float) -> Callable[[str], float]:
    """An argparse type: a number above 0 and at most high (not nan or inf)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not 0 < value <= high:
            raise argparse.ArgumentTypeError(f"expected a number above 0 and at most {high:g}, got {text}")
        return value
    return parse


def _between(low: float, high: float, low_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number from low (or above it) to high, as the sweep file's sampling allows."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (low < value <= high if low_open else low <= value <= high):
            raise argparse.ArgumentTypeError(f"expected a number {'above' if low_open else 'from'} {low:g} "
                                             f"{'and at most' if low_open else 'to'} {high:g}, got {text}")
        return value
    return parse


def _launch_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", metavar="RECIPE|METHOD",
                   help="a method of the target recipe (dspark), a recipe name (gb10-modelcard), "
                        "recipe:method, or a recipe file path")
    p.add_argument("-t", "--target", help="recipe to take METHOD from (default: gb10)")
    p.add_argument("--engine", help="engine of the recipe (vllm, sglang, …; default: the recipe's)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a recipe variable (max_model_len=32768), model=ID, or a dotted recipe path")
    p.add_argument("--image", help="run this image instead of the recipe's")
    p.add_argument("--port", type=_whole(1, 65535), help="serve on this port")
    p.add_argument("-k", "--num-speculative-tokens", type=_whole(1, MAX_SPECULATIVE_TOKENS), metavar="K",
                   help="speculative tokens per step")
    p.add_argument("--serve-arg", dest="extra_args", action="append", default=[], metavar="ARG",
                   help="append one argument to the serve command (repeat; use --serve-arg=--flag)")
    p.add_argument("-e", "--env", action="append", default=[], metavar="NAME[=VALUE]",
                   help="environment for the server; NAME alone passes the host's value (never printed)")
    p.add_argument("--hf-cache", type=Path, default=_default_hf_cache(),
                   help="Hugging Face cache to mount (default: $HF_HOME or ~/.cache/huggingface)")
    p.add_argument("--ulimit", dest="ulimits", action="append", default=[], metavar="NAME=SOFT[:HARD]",
                   help="override a container ulimit (the recipes ask memlock=-1, stack=67108864)")
    p.add_argument("--no-gpus", dest="gpus", action="store_false", default=None,
                   help="do not request GPUs (CPU images)")
    p.add_argument("--public", action="store_true",
                   help="listen on all interfaces instead of 127.0.0.1")
    p.add_argument("--no-api-key", dest="api_key", action="store_false",
                   help="do not protect the endpoint with a generated API key")
    p.add_argument("--ready-timeout", type=_positive(MAX_DURATION_S), metavar="SECONDS",
                   help="readiness deadline (default: the recipe's, 1800 s)")


def launch_options(args: argparse.Namespace, mode: str = "up") -> LaunchOptions:
    """The parsed launch flags of `render` and `up` as render's options."""
    return LaunchOptions(
        image=args.image, port=args.port, num_speculative_tokens=args.num_speculative_tokens,
        public=args.public, api_key=args.api_key, hf_cache=args.hf_cache.expanduser(), gpus=args.gpus,
        extra_args=tuple(args.extra_args), env=tuple(args.env), ulimits=tuple(args.ulimits),
        run_id="" if mode == "render" else rundir.new_run_id(),
        mode=mode, ready_timeout_s=args.ready_timeout)


def _host_option(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--host", dest="hosts", action="append", default=[], metavar="DOCKER_HOST", help=help)


_ACROSS = ("serve across these Docker hosts, the head first (a recipe with nodes: 2); each as "
           "DOCKER_HOST[,cluster_address=IP][,interface=IFACE][,ib_hca=HCA]")


def k_values(text: str) -> list[int]:
    """--k: 1-8, 1,2,4 or 3 (each K from 1 to MAX_SPECULATIVE_TOKENS)."""
    whole = _whole(1, MAX_SPECULATIVE_TOKENS)
    out: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        first, last = whole(low.strip()), whole((high or low).strip())
        if first > last:
            raise argparse.ArgumentTypeError(f"expected a range from low to high, got {part}")
        out += range(first, last + 1)
    return sorted(set(out))


def _tune_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("space", metavar="RECIPE|SWEEP",
                   help="a recipe (name or file) with --methods/--k/--concurrency, or a sweep file (or its name "
                        "under recipes/sweeps) whose methods x K x concurrency is the space")
    p.add_argument("--methods", nargs="+", metavar="METHOD", help="methods of the recipe (none, ngram, mtp, …)")
    p.add_argument("--k", type=k_values, metavar="K", help="speculative tokens to consider: 1-8, 1,2,4 (default 1-3)")
    p.add_argument("--concurrency", nargs="+", type=_whole(1, MAX_CONCURRENCY), metavar="C",
                   help="concurrencies to answer for (each gets its own best)")
    p.add_argument("-w", "--workload", help="one workload (default: the sweep's, else seed)")
    p.add_argument("--objective", choices=["aggregate", "per-request", "decode"], default="aggregate",
                   help="what to maximise: aggregate output tok/s, mean per-request tok/s or mean decode tok/s")
    p.add_argument("--ttft-max", type=_positive(MAX_DURATION_S * 1000), metavar="MS",
                   help="only configs whose median TTFT (mean over repeats) is at most MS count")
    p.add_argument("--repeats", type=_whole(1, 20), metavar="N",
                   help="repeats of every measured config (default: the sweep's, else 2)")
    p.add_argument("--max-repeats", type=_whole(1, 20), metavar="N",
                   help="repeats for configs whose 95%% interval overlaps the best's (default: 2 x --repeats)")
    p.add_argument("-n", "--requests", type=_whole(1, MAX_REQUESTS), help="measured requests per cell (default 10)")
    p.add_argument("--max-tokens", type=_whole(1, MAX_TOKENS), help="max_tokens per request (default: sweep's)")
    p.add_argument("--tolerance", type=_positive(1.0), default=0.15, metavar="FRACTION",
                   help="a drafter whose measured acceptance length misses its prediction by this much is "
                        "measured, not predicted; in measured mode, K values within it of the best are tried "
                        "(default 0.15)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the plan, the most model loads it can take and an ETA upper bound; start nothing")
    p.add_argument("--resume", metavar="RUN", help="continue this tune run (default: the newest unfinished one)")
    p.add_argument("--new", action="store_true", help="start a new run even if an earlier one can continue")
    p.add_argument("--runs-dir", type=Path, default=Path("runs"), help="where runs are kept (default ./runs)")
    p.add_argument("--pull", default="missing", choices=["missing", "always", "never"])
    p.add_argument("--ulimit", dest="ulimits", action="append", default=[], metavar="NAME=SOFT[:HARD]",
                   help="override a container ulimit for every server")
    p.add_argument("--no-download", dest="download", action="store_false",
                   help="do not fetch every model and draft into the Hugging Face cache first")
    p.set_defaults(command="tune")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sparklab", description="Benchmark LLM serving with speculative decoding on NVIDIA DGX Spark.")
    parser.add_argument("--version", action="version", version=f"sparklab {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("render", help="print the docker run and serve command a recipe gives")
    _launch_args(p)
    _host_option(p, _ACROSS)
    p.add_argument("--host-checks", action="store_true", help="also run the host preflight checks")
    p.set_defaults(command="render")

    p = sub.add_parser("up", help="start a server from a recipe and wait until it is ready")
    _launch_args(p)
    _host_option(p, _ACROSS)
    p.add_argument("-d", "--detach", action="store_true", help="leave it running and return")
    p.add_argument("--pull", default="missing", choices=["missing", "always", "never"],
                   help="when to pull the image (default: missing)")
    p.add_argument("--api-key", dest="api_key_value", metavar="KEY",
                   help="use this API key instead of a generated one (or set SPARKLAB_API_KEY)")
    p.add_argument("--allow-foreign-platform", action="store_true",
                   help="run an image built for another CPU architecture (needs emulation)")
    p.add_argument("--dry-run", action="store_true", help="render and preflight only")
    p.add_argument("--no-download", dest="download", action="store_false",
                   help="do not fetch the model and drafts into the Hugging Face cache first (`sparklab pull`)")
    p.add_argument("--stall-timeout", type=_positive(MAX_DURATION_S), metavar="SECONDS",
                   help="fail when the engine prints nothing for this long while loading (default: off)")
    p.set_defaults(command="up")

    p = sub.add_parser("bench", help="benchmark an OpenAI-compatible endpoint (or a sparklab server)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--url", help="endpoint, e.g. http://127.0.0.1:8000/v1")
    where.add_argument("--container", metavar="NAME",
                       help="a running `sparklab up` server (default: the only one); its key is used")
    p.add_argument("--api-key", help="API key for --url (or set SPARKLAB_API_KEY)")
    p.add_argument("--model", help="model name (default: the first in /v1/models)")
    p.add_argument("-w", "--workload", default="seed", help="built-in workload or a JSONL file (default: seed)")
    p.add_argument("-c", "--concurrency", type=_whole(1, MAX_CONCURRENCY), default=1,
                   help="requests in flight (default 1)")
    amount = p.add_mutually_exclusive_group()
    amount.add_argument("-n", "--requests", type=_whole(1, MAX_REQUESTS), help="measured requests (default 10)")
    amount.add_argument("--duration", type=_positive(MAX_DURATION_S), metavar="SECONDS",
                        help="send requests for this long instead")
    p.add_argument("--rate", type=_positive(1e6), metavar="REQ_PER_S",
                   help="Poisson arrivals instead of a closed loop")
    p.add_argument("--warmup", type=_whole(0, MAX_WARMUP), default=2,
                   help="requests before the window, excluded (default 2)")
    p.add_argument("--max-tokens", type=_whole(1, MAX_TOKENS), default=SAMPLING.max_tokens)
    p.add_argument("--temperature", type=_between(0, MAX_TEMPERATURE), default=SAMPLING.temperature)
    p.add_argument("--top-p", type=_between(0, 1, low_open=True), default=SAMPLING.top_p)
    p.add_argument("--ignore-eos", action="store_true", help="generate max-tokens tokens (vLLM, SGLang)")
    p.add_argument("--min-tokens", type=_whole(1, MAX_TOKENS), help="at least this many tokens before EOS")
    p.add_argument("--thinking", choices=["on", "off", "default"], default="off",
                   help="chat_template_kwargs.enable_thinking (default off, as seed 000)")
    p.add_argument("--seed", type=int, help="sampling seed sent with each request")
    p.add_argument("--no-stream", dest="stream", action="store_false",
                   help="non-streaming requests: seed 000's bench.py exactly (no TTFT or ITL)")
    p.add_argument("--no-token-ids", dest="token_ids", action="store_false",
                   help="do not ask for per-chunk token ids (then tokens per chunk are estimated)")
    p.add_argument("--request-timeout", type=_positive(MAX_DURATION_S), default=1800, metavar="SECONDS")
    p.add_argument("--stall-timeout", type=_positive(MAX_DURATION_S), default=60.0, metavar="SECONDS",
                   help="end a request that received nothing this long while the server's /health fails (60)")
    p.add_argument("--json", dest="json_path", type=Path, metavar="FILE", help="write the result here")
    p.set_defaults(command="bench")

    p = sub.add_parser("sweep", help="run a sweep file: servers x loads, resumable, results in SQLite")
    p.add_argument("file", type=Path, help="a sweep file (recipes/sweeps/*.yaml)")
    p.add_argument("--dry-run", action="store_true", help="print the plan, the commands and an ETA; run nothing")
    p.add_argument("--resume", metavar="RUN", help="continue this run (a directory under --runs-dir)")
    p.add_argument("--new", action="store_true", help="start a new run even if an earlier one can continue")
    p.add_argument("--retry-failed", action="store_true", help="run cells that failed max_attempts times again")
    p.add_argument("--allow-drift", action="store_true",
                   help="resume even if the recipe, the sampling or an image digest changed since the run's earlier "
                        "cells (the report marks cells from different images)")
    p.add_argument("--runs-dir", type=Path, default=Path("runs"), help="where runs are kept (default ./runs)")
    p.add_argument("--pull", default="missing", choices=["missing", "always", "never"])
    drop = p.add_mutually_exclusive_group()
    drop.add_argument("--drop-caches", dest="drop_caches", action="store_const", const=True, default=None,
                      help="free the model files' page cache before every server, not only unified-memory ones "
                           "(as root: the whole page cache)")
    drop.add_argument("--no-drop-caches", dest="drop_caches", action="store_const", const=False,
                      help="never free the page cache before a server (default: when MemFree is short on "
                           "unified memory, posix_fadvise over the model's files)")
    p.add_argument("--memory-floor-gib", type=float, metavar="GIB",
                   help="stop a server when MemAvailable falls under this (default: the sweep file's "
                        "memory_floor_gib, else 8 on unified-memory recipes; 0: off)")
    p.add_argument("--ulimit", dest="ulimits", action="append", default=[], metavar="NAME=SOFT[:HARD]",
                   help="override a container ulimit for every server")
    p.add_argument("--no-download", dest="download", action="store_false",
                   help="do not fetch every model and draft into the Hugging Face cache before the first server")
    p.add_argument("--min-free-mib", type=float, default=256.0, metavar="MIB",
                   help="stop cleanly when the runs directory's disk has less free space before a server (256)")
    _host_option(p, "spread the servers over these Docker hosts instead of the sweep file's hosts: "
                    "(repeatable; local, ssh://user@host, tcp://host:2376, or a Docker context)")
    p.set_defaults(command="sweep")

    _tune_args(sub.add_parser("tune", help="the best method and K per concurrency, loading as few servers as it can"))

    p = sub.add_parser("report", help="tables, plots, roofline and the best config from a sweep's results (offline)")
    p.add_argument("run", metavar="RUN",
                   help="a run id or sweep name (its newest run) under --runs-dir, a run directory or a results.sqlite")
    p.add_argument("--runs-dir", type=Path, default=Path("runs"), help="where runs are kept (default ./runs)")
    p.add_argument("-f", "--format", default="md", choices=["md", "csv", "json", "html"],
                   help="what to print on stdout (default md, paste-ready Markdown)")
    p.add_argument("-o", "--out", type=Path, metavar="DIR",
                   help="write report.md, .csv, .json, .html and plots/*.png here instead of printing")
    p.add_argument("--hardware", metavar="NAME", help="roofline for this device of recipes/hardware.yaml")
    p.add_argument("--bandwidth-gbps", type=float, metavar="GBPS", help="roofline with this memory bandwidth")
    p.add_argument("--fact", dest="facts", action="append", default=[], metavar="KEY=VALUE",
                   help="override a model fact for the roofline, e.g. --fact active_params_b=3 (repeatable)")
    p.set_defaults(command="report")

    p = sub.add_parser("pull", help="fetch the images and every model and draft a recipe, method or sweep needs")
    p.add_argument("spec", metavar="RECIPE|METHOD|SWEEP",
                   help="what `up` takes (dspark, gb10, recipe:method, a recipe file) or a sweep (file or name)")
    p.add_argument("-t", "--target", help="recipe to take METHOD from (default: gb10)")
    p.add_argument("--engine", help="engine of the recipe (default: the recipe's)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a recipe variable or key, as for `up`")
    p.add_argument("--all-methods", action="store_true",
                   help="everything any method of the recipe (of --engine, or of every engine) needs")
    p.add_argument("--hf-cache", type=Path, default=_default_hf_cache(),
                   help="Hugging Face cache `up` mounts (default: $HF_HOME or ~/.cache/huggingface); "
                        "a sweep uses the cache its servers mount")
    p.add_argument("--pull", default="missing", choices=["missing", "always"],
                   help="pull images only when missing (default) or always")
    p.add_argument("--no-images", dest="images", action="store_false", help="only the model checkpoints")
    p.add_argument("--no-models", dest="models", action="store_false", help="only the images")
    p.set_defaults(command="pull")

    p = sub.add_parser("down", help="stop and remove sparklab servers")
    p.add_argument("name", nargs="?", help="container name (see `sparklab ps`)")
    p.add_argument("--all", action="store_true", help="every sparklab container you started")
    p.add_argument("--all-users", action="store_true", help="every sparklab container, other users' too")
    _host_option(p, "on these Docker hosts (repeatable; default: this machine's and those in SPARKLAB_HOSTS)")
    p.set_defaults(command="down")

    p = sub.add_parser("ps", help="list sparklab containers")
    _host_option(p, "on these Docker hosts (repeatable; default: this machine's and those in SPARKLAB_HOSTS)")
    p.set_defaults(command="ps")

    p = sub.add_parser("logs", help="print a server's log")
    p.add_argument("name", nargs="?", help="container name (default: the only one)")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    p.add_argument("--tail", default="all", help="only the last N lines")
    _host_option(p, "on these Docker hosts (repeatable; default: this machine's and those in SPARKLAB_HOSTS)")
    p.set_defaults(command="logs")

    p = sub.add_parser("gc", help="remove containers left behind by a crashed sparklab run; --caches: engine caches")
    p.add_argument("--caches", action="store_true",
                   help="also list the engine caches (per image digest: size, last use) and trim them")
    p.add_argument("--keep", type=_whole(0, 1_000_000), metavar="N",
                   help="with --caches: keep the N most recently used, remove the rest")
    p.add_argument("--max-gib", type=_positive(1e6), metavar="GIB",
                   help="with --caches: remove the least recently used until the rest fits in GIB")
    _host_option(p, "on these Docker hosts (repeatable; default: this machine's and those in SPARKLAB_HOSTS)")
    p.set_defaults(command="gc")

    p = sub.add_parser("recipes", help="list recipes, engines and methods")
    p.set_defaults(command="recipes")
    return parser


# ---------------------------------------------------------------------------------------------------
