"""PNG plots of a report with matplotlib (Agg, no display): one figure per kind and workload, one panel per
concurrency. Each function returns the files it wrote (none when the run has nothing to show)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sparklab.report.model import Group, Report, headline_metric

Plot = tuple[str, Path]


def safe_filename(name: str) -> str:
    """A name read from a store as one plain file-name part: never a path (`a/../../x`, `/abs`, `..`).

    A name that needed changing gets a short hash of the original, so distinct names stay distinct files.
    """
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip(".-") or "unnamed"
    if safe == name:
        return name
    return f"{safe[:60]}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _axes(ax: Any, xlabel: str, ylabel: str, legend: bool) -> None:
    """Labels, whole-number ticks on x (K, draft position), and a legend when something was drawn."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel(xlabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(ylabel)
    if legend:
        ax.legend(fontsize=7)


def _panels(plt: Any, count: int) -> tuple[Any, list[Any]]:
    fig, axes = plt.subplots(1, count, figsize=(max(5.0, 4.6 * count), 3.9), squeeze=False)
    return fig, list(axes[0])


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    fig.clear()
    return path


def _config(g: Group) -> str:
    return f"{g.server.engine} {g.server.method_name}"


def _tick(g: Group) -> str:
    return g.server.method_name + (f"\nK={g.server.k}" if g.server.k is not None else "")


def _per_panel(report: Report, workload: str, out: Path, name: str, title: str,
               draw: Callable[[Any, list[Group], int], bool]) -> list[Plot]:
    plt = _pyplot()
    concs = report.concurrencies(workload)
    fig, axes = _panels(plt, len(concs))
    drew = False
    for ax, c in zip(axes, concs, strict=True):
        groups = [g for g in report.groups if g.workload == workload and g.concurrency == c]
        drew = draw(ax, groups, c) or drew
        ax.set_title(f"C={c}")
        ax.grid(alpha=0.3)
    fig.suptitle(f"{title} ({workload})")
    if not drew:
        plt.close(fig)
        return []
    path = _save(fig, out / f"{name}-{safe_filename(workload)}.png")
    plt.close(fig)
    return [(f"{title}, workload {workload}", path)]


def _half(g: Group) -> tuple[float, float]:
    e = g.headline
    if e is None or e.low is None or e.high is None:
        return 0.0, 0.0
    return e.mean - e.low, e.high - e.mean


def throughput_vs_k(report: Report, workload: str, out: Path) -> list[Plot]:
    def draw(ax: Any, groups: list[Group], c: int) -> bool:
        drew = False
        for config in dict.fromkeys(_config(g) for g in groups if g.server.k is not None):
            series = sorted((g for g in groups if _config(g) == config and g.headline), key=lambda g: g.server.k or 0)
            if not series:
                continue
            errors = list(zip(*(_half(g) for g in series), strict=True))
            ax.errorbar([g.server.k for g in series], [g.headline.mean for g in series if g.headline],
                        yerr=errors, marker="o", capsize=3, label=config)
            drew = True
        for g in groups:
            if g.is_baseline and g.headline:
                ax.axhline(g.headline.mean, linestyle="--", color="grey", label=f"{_config(g)} (baseline)")
        _axes(ax, "K (num_speculative_tokens)", headline_metric(c), legend=drew)
        return drew

    return _per_panel(report, workload, out, "throughput-vs-k", "tok/s vs K, mean and 95% CI over repeats", draw)


def speedup_bars(report: Report, workload: str, out: Path) -> list[Plot]:
    def draw(ax: Any, groups: list[Group], c: int) -> bool:
        bars = [g for g in groups if not g.is_baseline and g.speedup]
        if not bars:
            return False
        values = [100 * g.speedup.value for g in bars if g.speedup]
        low = [100 * (g.speedup.value - g.speedup.low) if g.speedup and g.speedup.low is not None else 0.0
               for g in bars]
        high = [100 * (g.speedup.high - g.speedup.value) if g.speedup and g.speedup.high is not None else 0.0
                for g in bars]
        ax.bar(range(len(bars)), values, yerr=[low, high], capsize=4, color="#4c78a8")
        ax.axhline(100, color="black", linewidth=1)
        ax.set_xticks(range(len(bars)), [_tick(g) for g in bars], fontsize=7)
        ax.set_ylabel("% of baseline (none)")
        return True

    return _per_panel(report, workload, out, "speedup", "speedup vs baseline with 95% CI", draw)


def acceptance(report: Report, workload: str, out: Path) -> list[Plot]:
    def draw(ax: Any, groups: list[Group], c: int) -> bool:
        drew = False
        for g in groups:
            if g.per_position:
                ax.plot(range(1, len(g.per_position) + 1), g.per_position, marker="o", label=g.server.label)
                drew = True
        _axes(ax, "draft position", "acceptance (server counters)", legend=drew)
        ax.set_ylim(0, 1.05)
        return drew

    return _per_panel(report, workload, out, "acceptance", "per-position acceptance", draw)


def ttft(report: Report, workload: str, out: Path) -> list[Plot]:
    def draw(ax: Any, groups: list[Group], c: int) -> bool:
        shown = [g for g in groups if g.ttft_ms]
        if not shown:
            return False
        ax.boxplot([list(g.ttft_ms) for g in shown], showfliers=True)
        ax.set_xticks(range(1, len(shown) + 1), [_tick(g) for g in shown], fontsize=7)
        ax.set_ylabel("TTFT ms (every measured request)")
        return True

    return _per_panel(report, workload, out, "ttft", "TTFT distribution", draw)


def all_plots(report: Report, out: Path) -> list[Plot]:
    plots: list[Plot] = []
    for workload in report.workloads:
        for kind in (throughput_vs_k, speedup_bars, acceptance, ttft):
            plots += kind(report, workload, out)
    return plots
