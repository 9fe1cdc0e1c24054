"""`sparklab bench`: one load against an OpenAI-compatible endpoint, or against a running `sparklab up` server."""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sparklab.cli.args import between, positive, whole
from sparklab.cli.terminal import err, out
from sparklab.recipes.schema import (
    MAX_CONCURRENCY,
    MAX_DURATION_S,
    MAX_REQUESTS,
    MAX_TEMPERATURE,
    MAX_TOKENS,
    MAX_WARMUP,
)
from sparklab.records import Sampling

if TYPE_CHECKING:
    from sparklab.bench.cell import Load

SAMPLING = Sampling()  # bench's defaults are the one set in sparklab.records.Sampling
_THINKING = {"on": True, "off": False, "default": None}  # --thinking → chat_template_kwargs.enable_thinking


@dataclass(frozen=True)
class BenchArgs:
    """Where to send the load (a URL, else a sparklab server), what to send, and how long a request may take."""

    url: str | None
    container: str | None  # a `sparklab up` server's name; None with no url: the only one
    api_key: str | None  # for --url; SPARKLAB_API_KEY when not given
    model: str | None
    workload: str  # a built-in workload or a JSONL file
    load: Load
    sampling: Sampling
    request_timeout: float
    stall_timeout: float
    json_path: Path | None

    @classmethod
    def add_cli_args(cls, p: argparse.ArgumentParser) -> None:
        where = p.add_mutually_exclusive_group()
        where.add_argument("--url", help="endpoint, e.g. http://127.0.0.1:8000/v1")
        where.add_argument("--container", metavar="NAME",
                           help="a running `sparklab up` server (default: the only one); its key is used")
        p.add_argument("--api-key", help="API key for --url (or set SPARKLAB_API_KEY)")
        p.add_argument("--model", help="model name (default: the first in /v1/models)")
        p.add_argument("-w", "--workload", default="seed", help="built-in workload or a JSONL file (default: seed)")
        p.add_argument("-c", "--concurrency", type=whole(1, MAX_CONCURRENCY), default=1,
                       help="requests in flight (default 1)")
        amount = p.add_mutually_exclusive_group()
        amount.add_argument("-n", "--requests", type=whole(1, MAX_REQUESTS), help="measured requests (default 10)")
        amount.add_argument("--duration", type=positive(MAX_DURATION_S), metavar="SECONDS",
                            help="send requests for this long instead")
        p.add_argument("--rate", type=positive(1e6), metavar="REQ_PER_S",
                       help="Poisson arrivals instead of a closed loop")
        p.add_argument("--warmup", type=whole(0, MAX_WARMUP), default=2,
                       help="requests before the window, excluded (default 2)")
        p.add_argument("--max-tokens", type=whole(1, MAX_TOKENS), default=SAMPLING.max_tokens)
        p.add_argument("--temperature", type=between(0, MAX_TEMPERATURE), default=SAMPLING.temperature)
        p.add_argument("--top-p", type=between(0, 1, low_open=True), default=SAMPLING.top_p)
        p.add_argument("--ignore-eos", action="store_true", help="generate max-tokens tokens (vLLM, SGLang)")
        p.add_argument("--min-tokens", type=whole(1, MAX_TOKENS), help="at least this many tokens before EOS")
        p.add_argument("--thinking", choices=["on", "off", "default"], default="off",
                       help="chat_template_kwargs.enable_thinking (default off, as seed 000)")
        p.add_argument("--seed", type=int, help="sampling seed sent with each request")
        p.add_argument("--no-stream", dest="stream", action="store_false",
                       help="non-streaming requests: seed 000's bench.py exactly (no TTFT or ITL)")
        p.add_argument("--no-token-ids", dest="token_ids", action="store_false",
                       help="do not ask for per-chunk token ids (then tokens per chunk are estimated)")
        p.add_argument("--request-timeout", type=positive(MAX_DURATION_S), default=1800, metavar="SECONDS")
        p.add_argument("--stall-timeout", type=positive(MAX_DURATION_S), default=60.0, metavar="SECONDS",
                       help="end a request that received nothing this long while the server's /health fails (60)")
        p.add_argument("--json", dest="json_path", type=Path, metavar="FILE", help="write the result here")

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> BenchArgs:
        from sparklab.bench.cell import Load  # here, not at the top: it imports the chat client

        requests = args.requests if args.requests is not None or args.duration is not None else 10
        load = Load(concurrency=args.concurrency, requests=requests, duration_s=args.duration,
                    rate=args.rate, warmup=args.warmup, stream=args.stream)
        sampling = Sampling(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                            ignore_eos=args.ignore_eos, min_tokens=args.min_tokens,
                            enable_thinking=_THINKING[args.thinking], seed=args.seed, token_ids=args.token_ids)
        return cls(url=args.url, container=args.container, api_key=args.api_key, model=args.model,
                   workload=args.workload, load=load, sampling=sampling, request_timeout=args.request_timeout,
                   stall_timeout=args.stall_timeout, json_path=args.json_path)


def cmd_bench(args: BenchArgs) -> int:
    import json

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from sparklab.bench import cell
    from sparklab.bench.workloads import load_workload
    from sparklab.cli.console import bench_result

    runtime, target, watch = None, None, None
    if args.url:
        endpoint = cell.Endpoint.from_url(args.url, args.api_key or os.environ.get("SPARKLAB_API_KEY"), args.model)
    else:
        from sparklab.runtimes.follow import ServerWatch
        from sparklab.runtimes.local import Runtime

        runtime = Runtime()
        target = runtime.endpoint_of(args.container)
        err.print(f"benchmarking {target.name} at {target.url}")
        endpoint = cell.Endpoint.from_url(target.url, target.api_key, args.model, target.kind)
        # A sparklab server: its log says at once when its engine dies (its API may answer on), as in a sweep.
        watch = ServerWatch(runtime, target, "bench")
    load, sampling = args.load, args.sampling
    workload = load_workload(args.workload)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True) as progress:
        task = progress.add_task(f"{workload.name} c={load.concurrency}", total=load.requests)
        started = time.time()
        settle = (cell.log_settler(endpoint.kind, lambda: runtime.log_text(target.name, since=started))
                  if runtime is not None and target is not None else None)
        result = cell.run(endpoint, workload, sampling, load, on_done=lambda r: progress.advance(task),
                           request_timeout_s=args.request_timeout, stall_timeout_s=args.stall_timeout,
                           stop=watch.problem if watch is not None else None, before_window=settle)
    if runtime is not None and target is not None:  # a sparklab server: its log may say more (SGLang's lines)
        since = result["measurement"]["window_started_at"]
        cell.add_log_acceptance(result, endpoint.kind, lambda: runtime.log_text(target.name, since=since))
    out.print(bench_result(result))
    if args.json_path:
        args.json_path.write_text(json.dumps(result, indent=1))
        out.print(f"result written to {args.json_path} (schema {result['schema']})")
    return 0 if result["summary"]["requests"]["ok"] else 5
