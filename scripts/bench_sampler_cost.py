#!/usr/bin/env python3
"""Does sparklab's memory sampler disturb the measurement? (issue 12 §2)

Starts the stand-in engine in a container (127.0.0.1 only), then runs sparklab's benchmark client (`bench.run`,
in this process, as a sweep does) in interleaved rounds: without the sampler, with it at its sweep interval
(1 s), and with it at 0.05 s (20 times denser, to make any cost visible). Each round's aggregate tok/s is divided
by the mean of the neighbouring no-sampler rounds, so drift of the shared host cancels. The sampler watches the
stand-in's container (its cgroup, /proc/meminfo, nvidia-smi where present), exactly as in a sweep.

    python scripts/bench_sampler_cost.py --image 127.0.0.1:5000/sparklab/standin:memory --rounds 6
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import time
import urllib.request
from collections.abc import Iterator

from sparklab.bench import cell
from sparklab.bench.workloads import load_workload
from sparklab.host import watchdog
from sparklab.host.preflight import free_port
from sparklab.records import Sampling


@contextlib.contextmanager
def standin(image: str, port: int, token_delay: float) -> Iterator[str]:
    name = f"sampler-cost-{port}"
    container = subprocess.run(
        ["docker", "run", "-d", "--rm", "--name", name, "-p", f"127.0.0.1:{port}:8000", "-e",
         f"STANDIN_TOKEN_DELAY={token_delay}", image, "vllm", "serve", "standin-model", "--host", "0.0.0.0",
         "--port", "8000"], capture_output=True, text=True, check=True).stdout.strip()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                break
            time.sleep(0.2)
        yield container
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)


def one_round(url: str, concurrency: int, requests: int, max_tokens: int) -> float:
    sampling = Sampling(max_tokens=max_tokens, temperature=0, top_p=None, ignore_eos=True)
    load = cell.Load(concurrency=concurrency, requests=requests, warmup=concurrency)
    result = cell.run(cell.Endpoint(url, None, None, "vllm"), load_workload("seed"), sampling, load)
    return float(result["summary"]["aggregate_tps"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--image", default="127.0.0.1:5000/sparklab/standin:memory")
    parser.add_argument("--rounds", type=int, default=6, help="interleaved rounds of each arm")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--token-delay", type=float, default=0.001, help="the stand-in's seconds per chunk")
    args = parser.parse_args()
    port = free_port()
    arms: dict[str, float | None] = {"none": None, "1 s (sweep)": 1.0, "0.05 s (20x denser)": 0.05}
    ratios: dict[str, list[float]] = {name: [] for name in arms if name != "none"}
    samples: dict[str, int] = {}
    with standin(args.image, port, args.token_delay) as container:
        url = f"http://127.0.0.1:{port}"
        one_round(url, args.concurrency, args.requests, args.max_tokens)  # warm the client and server
        for r in range(args.rounds):
            base_before = one_round(url, args.concurrency, args.requests, args.max_tokens)
            for name, interval in arms.items():
                if interval is None:
                    continue
                with watchdog.Sampler(interval_s=interval, locate=lambda: container) as sampler:
                    tps = one_round(url, args.concurrency, args.requests, args.max_tokens)
                samples[name] = samples.get(name, 0) + sampler.count()
                ratios[name].append(tps)
            base_after = one_round(url, args.concurrency, args.requests, args.max_tokens)
            base = (base_before + base_after) / 2
            for name in ratios:
                ratios[name][-1] /= base
            print(f"round {r + 1}: no sampler {base_before:.0f}/{base_after:.0f} tok/s; " +
                  "; ".join(f"{name} {ratios[name][-1]:.3f}x" for name in ratios), flush=True)
    for name, values in ratios.items():
        mean = statistics.mean(values)
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        print(f"with the sampler at {name}: tok/s ratio {mean:.3f} ± {sd:.3f} (sd over {len(values)} rounds; "
              f"{samples.get(name, 0)} samples taken)")


if __name__ == "__main__":
    main()
