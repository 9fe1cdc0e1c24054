"""The real night's length by the twin's model (pure arithmetic over the plan): before the clock, every image and
checkpoint over the network; then per server its load and init (an engine build where the engine builds), and per
cell its warmup and its requests at the twin's timing (recipes/twin.py, Timing.cell_s). Repeats beyond a sweep's
planned ones (`repeats: auto` adds up to auto_repeats.max) are counted at their most in `longest_s`."""

from __future__ import annotations

from dataclasses import dataclass

from sparklab.bench.workloads import load_workload
from sparklab.recipes.plan import Plan, ServerConfig
from sparklab.recipes.twin import GIB, Twin

TEARDOWN_S = 15.0  # between two servers: stop, port free, memory back (ASSUMED, as the sweep's own ETA)


@dataclass(frozen=True)
class ServerEta:
    label: str
    start_s: float  # load and init (and build)
    cells_s: float  # its planned cells
    extra_repeats_s: float  # what repeats: auto may add at most


@dataclass(frozen=True)
class NightEta:
    download_s: float  # before the clock: images and checkpoints not yet on the host
    servers: tuple[ServerEta, ...]

    @property
    def night_s(self) -> float:
        return sum(s.start_s + s.cells_s + TEARDOWN_S for s in self.servers)

    @property
    def longest_s(self) -> float:
        return self.night_s + sum(s.extra_repeats_s for s in self.servers)


def _words(workload: str) -> float:
    prompts = load_workload(workload).prompts
    return sum(len(" ".join(str(m.get("content", "")) for m in p.messages).split()) for p in prompts) / len(prompts)


def start_seconds(twin: Twin, server: ServerConfig, cold_images: set[str]) -> float:
    """Load (the weights from the NVMe at the twin's read rate) and init; a first start of an image adds its cold
    init once (cold_images: images started already), an engine that builds pays its build per server."""
    model = twin.engine(server.spec.kind)
    weights = twin.weights_gib(server.recipe, server.spec)
    seconds = weights * GIB / 1e9 / twin.host.disk_read_gbps + model.init_s
    if model.cold_per_server:
        seconds += model.cold_init_s
    elif server.spec.image not in cold_images:
        cold_images.add(server.spec.image)
        seconds += model.cold_init_s
    return seconds


def night_eta(plan: Plan, twin: Twin) -> NightEta:
    sweep = plan.sweep
    cold: set[str] = set()
    servers = []
    words: dict[str, float] = {}
    for server in plan.servers:
        spec = server.spec
        speculative = spec.speculative
        timing = twin.timing(spec.kind, _method(twin, server), speculative.num_speculative_tokens if speculative
                             else None, sweep.name)
        per_cell = []
        for cell in server.cells:  # each cell's own max_tokens: sampling may list values (a load axis)
            tokens = min(int(cell.sampling.get("max_tokens") or timing.output_tokens), timing.output_tokens)
            w = words.setdefault(cell.workload, _words(cell.workload))
            per_cell.append(timing.cell_s(w, tokens, cell.concurrency, cell.requests or 10, sweep.warmup))
        extra = 0.0
        if sweep.repeats == "auto" and sweep.auto_repeats.max > sweep.auto_repeats.min and server.cells:
            per_repeat = sum(per_cell) / max(1, len({c.repeat for c in server.cells}))
            extra = per_repeat * (sweep.auto_repeats.max - sweep.auto_repeats.min)
        servers.append(ServerEta(server.label, start_seconds(twin, server, cold), sum(per_cell), extra))
    images = {s.spec.image: twin.engine(s.spec.kind).image_gib for s in plan.servers}
    checkpoints = {i: m.weights_gib for s in plan.servers for i, m in twin.data.models.items()
                   if any(i in a for a in s.spec.argv)}
    download = (sum(images.values()) + sum(checkpoints.values())) * GIB / 1e6 / twin.host.download_mbps
    return NightEta(download, tuple(servers))


def _method(twin: Twin, server: ServerConfig) -> str:
    """The drafting method the twin's tables know this server by (a recipe's method name, else its argv's)."""
    if server.method == "none" or server.method in twin.data.acceptance:
        return server.method
    speculative = server.spec.speculative
    return speculative.method if speculative and speculative.method else server.method


def clock(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
