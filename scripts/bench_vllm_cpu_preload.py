"""What the vLLM CPU image's preloaded libraries are worth: the same image and server with its LD_PRELOAD (tcmalloc and
Intel OpenMP, docker/vllm-cpu/build.sh) and with LD_PRELOAD emptied, in alternating order, at C=1 and C=4.

    python scripts/bench_vllm_cpu_preload.py                       # 127.0.0.1:5000/sparklab/vllm-cpu:0.27.1, 2 rounds
    python scripts/bench_vllm_cpu_preload.py --image IMAGE --rounds 3

Each server: `vllm serve` of the image's SmolLM2-135M as recipes/cpu.yaml starts it (eager fp32, host network, both
cores), timed from `docker run` to GET /health answering; one warmup request; then per concurrency C, 3*C chat requests
through C threads (64 tokens each, ignore_eos, temperature 0): tok/s is the completion tokens over the window's wall
time. Methods: none and ngram K=3. Order per round: preloaded first in even rounds, emptied first in odd ones (ABAB
over rounds, so a drifting machine favours neither). Prints each server's figures, then per method and C the ratio of
the means, preloaded over emptied. Holds /tmp/sparklab-docker-tests.lock like the other Docker benchmarks. Not part
of the test suite: about 1 minute per server, 8 servers for 2 rounds.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import fcntl
import json
import time
import urllib.request
from statistics import mean

import docker

from sparklab.host.preflight import free_port
from sparklab.recipes.schema import load_recipe, recipes_dir

LOCK = "/tmp/sparklab-docker-tests.lock"
MODEL = "/models/SmolLM2-135M-Instruct"
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 1}


def _chat(port: int, i: int) -> int:
    body = json.dumps({"model": "m", "max_tokens": 64, "temperature": 0, "ignore_eos": True,
                       "messages": [{"role": "user", "content": f"Write a story about cat number {i}."}]}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as reply:
        return int(json.loads(reply.read())["usage"]["completion_tokens"])


def serve(client: docker.DockerClient, image: str, recipe_env: dict[str, str], preloaded: bool,
          spec: dict | None) -> dict[str, float]:
    port = free_port()
    env = dict(recipe_env) if preloaded else {**recipe_env, "LD_PRELOAD": ""}
    command = ["serve", MODEL, "--served-model-name", "m", "--enforce-eager", "--dtype", "float32",
               "--max-model-len", "2048", "--host", "127.0.0.1", "--port", str(port)]
    if spec:
        command += ["--speculative-config", json.dumps(spec)]
    started = time.monotonic()
    container = client.containers.run(image, command, entrypoint=["vllm"], environment=env, network_mode="host",
                                      ipc_mode="host", ulimits=[docker.types.Ulimit(name="stack", soft=67108864,
                                                                                    hard=67108864)],
                                      detach=True, labels={"sparklab.bench": "preload"})
    try:
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).close()
                break
            except OSError:
                container.reload()
                if container.status != "running" or time.monotonic() - started > 300:
                    tail = container.logs(tail=20).decode(errors="replace")
                    raise SystemExit(f"the server did not start: {tail}") from None
                time.sleep(0.3)
        figures = {"ready_s": time.monotonic() - started}
        _chat(port, 0)
        for c in (1, 4):
            window = time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(c) as pool:
                tokens = sum(pool.map(lambda i: _chat(port, i), range(3 * c)))
            figures[f"c{c}"] = tokens / (time.monotonic() - window)
        logs = container.logs().decode(errors="replace")
        figures["warned"] = float("not found in LD_PRELOAD" in logs)
        return figures
    finally:
        container.remove(force=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", default="127.0.0.1:5000/sparklab/vllm-cpu:0.27.1")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    client = docker.from_env()
    recipe_env = load_recipe(recipes_dir() / "cpu.yaml").engines["vllm-cpu"].env  # the engine's env, as a sweep's
    results: dict[tuple[str, bool], list[dict[str, float]]] = {}
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for round_ in range(args.rounds):
            for method, spec in (("none", None), ("ngram K=3", NGRAM)):
                for preloaded in ((True, False) if round_ % 2 == 0 else (False, True)):
                    got = serve(client, args.image, recipe_env, preloaded, spec)
                    results.setdefault((method, preloaded), []).append(got)
                    print(f"round {round_} {method:<9} {'preloaded' if preloaded else 'emptied  '}: "
                          f"ready {got['ready_s']:.1f} s, C=1 {got['c1']:.1f} tok/s, C=4 {got['c4']:.1f} tok/s"
                          f"{', warned of LD_PRELOAD' if got['warned'] else ''}", flush=True)
    print(f"\n{args.image}, {args.rounds} round(s): preloaded / emptied, ratio of the means")
    for method in ("none", "ngram K=3"):
        on, off = results[(method, True)], results[(method, False)]
        cells = [f"C={c} {mean(r[f'c{c}'] for r in on) / mean(r[f'c{c}'] for r in off):.3f}" for c in (1, 4)]
        ready = mean(r["ready_s"] for r in on) / mean(r["ready_s"] for r in off)
        print(f"  {method:<9} {'  '.join(cells)}  ready {ready:.3f}")


if __name__ == "__main__":
    main()
