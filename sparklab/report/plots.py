"""PNG plots of a report with matplotlib (Agg, no display): one figure per kind and workload, one panel per
concurrency. Each function returns the files it wrote (none when the run has nothing to show)."""

from __future__ import annotations

import hashlib
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sparklab.report.document import visible
from sparklab.report.model import Group, Report, headline_metric

Plot = tuple[str, Path]


def safe_filename(name: str) -> str:
    """A name read from a store as one plain file-name part: never a path (`a/../../x`, `/abs`, `..`).

    A name that needed changing, or is over 60 characters, gets a short hash of the original, so distinct names
    stay distinct files.
    """
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip(".-") or "unnamed"
    if safe == name and len(name) <= 60:  # longer: a file name the filesystem may refuse (255 bytes at most)
        return name
    return f"{safe[:60]}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


DPI = 110  # of the PNGs


def _figure(width: float, height: float) -> Any:
    """A figure of its own on an Agg canvas, outside pyplot (no global registry of figures to close it from), at
    the DPI it is saved at: tight_layout and the draw then share one renderer, so the text measured for the layout
    is not measured again (matplotlib caches a text's layout per renderer)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def _axes(ax: Any, xlabel: str, ylabel: str, legend: bool) -> None:
    """Labels, whole-number ticks on x (K, draft position), and a legend when something was drawn."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel(xlabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(ylabel)
    if legend:
        ax.legend(fontsize=7)


def _panels(count: int, bars: int = 0) -> tuple[Any, list[Any]]:
    """One panel per concurrency, wide enough for `bars` labelled bars each."""
    width = max(4.6, 0.55 * bars + 1.5)
    fig = _figure(max(5.0, width * count), 4.3)
    return fig, list(fig.subplots(1, count, squeeze=False)[0])


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():  # labels too long to fit (a name from the store): drawn as they are
        warnings.filterwarnings("ignore", message="Tight layout not applied")
        fig.tight_layout()
    # tight_layout leaves a placeholder layout engine behind, and savefig lays out every artist once more (a draw
    # with rendering disabled) whenever a figure has an engine: the same pixels for twice the text layout. Without
    # it a plot is drawn once (matplotlib 3.11 backend_bases.print_figure).
    fig.set_layout_engine(None)
    fig.savefig(path, dpi=DPI, metadata={"Software": None})
    return path


PLOT_TEXT_MAX = 60  # characters per line of a label drawn in a plot; the text report keeps whole names


def _shown(text: str) -> str:
    """A label as drawn: each line cut to PLOT_TEXT_MAX characters by an "…" in its middle, so its start and its end
    (K=, "(baseline)", what tells two long names apart) stay (a 5000-character name from a crafted store was laid
    out glyph by glyph, off the canvas, for seconds per plot)."""
    tail = PLOT_TEXT_MAX // 3
    return "\n".join(line if len(line) <= PLOT_TEXT_MAX else line[:PLOT_TEXT_MAX - tail - 1] + "…" + line[-tail:]
                     for line in visible(text).split("\n"))


def _config(g: Group) -> str:
    """A config's series key (whole: two names alike up to the cut stay two series); drawn through _shown."""
    return visible(f"{g.server.engine} {g.server.method_name}")


def _engine(g: Group, multi: bool) -> str:
    """The engine's name before a label in a run of several engines (their configs are otherwise alike)."""
    return f"{g.server.engine} " if multi else ""


def _tick(g: Group, multi: bool = False) -> str:
    name = (f"{g.server.engine}\n" if multi else "") + g.server.method_name
    return _shown(name + (f"\nK={g.server.k}" if g.server.k is not None else ""))


def _label(g: Group, multi: bool = False) -> str:
    """A one-line bar label (a rotated label cannot hold a line break without overlapping its neighbour)."""
    return _shown(_engine(g, multi) + g.server.method_name + (f" K={g.server.k}" if g.server.k is not None else ""))


def _several_engines(report: Report) -> bool:
    return len({s.engine for s in report.servers}) > 1


# Each engine's baseline in the tok/s-vs-K plot: its own colour and dash, so two engines' `none` never look alike.
_BASELINE_STYLES = (("dimgrey", "--"), ("tab:brown", ":"), ("black", "-."), ("tab:olive", (0, (5, 1))))


def _per_panel(report: Report, workload: str, out: Path, name: str, title: str,
               draw: Callable[[Any, list[Group], int], bool]) -> list[Plot]:
    concs = report.concurrencies(workload)
    most = max((sum(1 for g in report.groups if g.workload == workload and g.concurrency == c) for c in concs),
               default=0)
    fig, axes = _panels(len(concs), most)
    drew = False
    for ax, c in zip(axes, concs, strict=True):
        groups = [g for g in report.groups if g.workload == workload and g.concurrency == c]
        drew = draw(ax, groups, c) or drew
        ax.set_title(f"C={c}")
        ax.grid(alpha=0.3)
    fig.suptitle(_shown(f"{title} ({workload})"))
    if not drew:
        return []
    path = _save(fig, out / f"{name}-{safe_filename(workload)}.png")
    return [(f"{title}, workload {workload}", path)]


def _interval(g: Group) -> tuple[float, float] | None:
    """The headline's measured 95% half-widths (below, above); None for a single run or identical repeats:
    nothing was measured to draw (a zero-length whisker would read as certainty)."""
    e = g.headline
    if e is None or e.low is None or e.high is None or e.identical:
        return None
    return e.mean - e.low, e.high - e.mean


def throughput_vs_k(report: Report, workload: str, out: Path) -> list[Plot]:
    def draw(ax: Any, groups: list[Group], c: int) -> bool:
        drew = False
        for config in dict.fromkeys(_config(g) for g in groups if g.server.k is not None):
            series = sorted((g for g in groups if _config(g) == config and g.headline), key=lambda g: g.server.k or 0)
            if not series:
                continue
            line = ax.plot([g.server.k for g in series], [g.headline.mean for g in series if g.headline], marker="o",
                           label=_shown(config))[0]
            measured = [(g, i) for g in series if (i := _interval(g)) is not None]
            if measured:  # whiskers only where repeats measured an interval
                ax.errorbar([g.server.k for g, _ in measured], [g.headline.mean for g, _ in measured if g.headline],
                            yerr=list(zip(*(i for _, i in measured), strict=True)), fmt="none", capsize=3,
                            ecolor=line.get_color())
            drew = True
        engines = list(dict.fromkeys(s.engine for s in report.servers))
        for g in groups:
            if g.is_baseline and g.headline:
                color, dash = _BASELINE_STYLES[engines.index(g.server.engine) % len(_BASELINE_STYLES)]
                ax.axhline(g.headline.mean, linestyle=dash, color=color, label=_shown(f"{_config(g)} (baseline)"))
        _axes(ax, "K (num_speculative_tokens)", headline_metric(c, report.lead), legend=drew)
        return drew

    return _per_panel(report, workload, out, "throughput-vs-k",
                      "tok/s vs K, mean and 95% CI over repeats (no whisker: a single run or identical repeats)", draw)


def speedup_bars(report: Report, workload: str, out: Path) -> list[Plot]:
    def draw(ax: Any, groups: list[Group], c: int) -> bool:
        bars = [g for g in groups if not g.is_baseline and g.speedup]
        if not bars:
            return False
        values = [100 * g.speedup.value for g in bars if g.speedup]
        single = [g.speedup is None or g.speedup.low is None or g.speedup.high is None or g.speedup.identical
                  for g in bars]
        ax.bar(range(len(bars)), values, color=["#c7d3e3" if s else "#4c78a8" for s in single],
               edgecolor="#4c78a8")
        measured = [(i, g.speedup) for i, g in enumerate(bars) if g.speedup and g.speedup.low is not None
                    and g.speedup.high is not None and not g.speedup.identical]
        if measured:  # whiskers only where both sides were repeated: a single run has no interval to draw
            ax.errorbar([i for i, _ in measured], [100 * r.value for _, r in measured],
                        yerr=[[100 * (r.value - (r.low or r.value)) for _, r in measured],
                              [100 * ((r.high or r.value) - r.value) for _, r in measured]],
                        fmt="none", capsize=4, ecolor="black")
        for i, is_single in enumerate(single):
            if is_single:
                same = (speedup := bars[i].speedup) is not None and speedup.identical
                ax.annotate("identical repeats" if same else "1 run", (i, values[i]), ha="center", va="bottom",
                            fontsize=6, xytext=(0, 2), textcoords="offset points")
        ax.axhline(100, color="black", linewidth=1)
        # one label per bar, rotated so neighbours never run into each other ("draft modeldraft model")
        ax.set_xticks(range(len(bars)), [_label(g, _several_engines(report)) for g in bars], fontsize=7,
                      rotation=35, ha="right")
        ax.set_ylabel("% of baseline (none)")
        return True

    return _per_panel(report, workload, out, "speedup", "speedup vs baseline, 95% CI where repeated (pale bar: a "
                      "single run or identical repeats, no interval)", draw)


def acceptance(report: Report, workload: str, out: Path) -> list[Plot]:
    def draw(ax: Any, groups: list[Group], c: int) -> bool:
        drew = False
        for g in groups:
            if g.per_position:
                ax.plot(range(1, len(g.per_position) + 1), g.per_position, marker="o", label=_shown(g.server.label))
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
        ax.set_xticks(range(1, len(shown) + 1), [_tick(g, _several_engines(report)) for g in shown], fontsize=7)
        ax.set_ylabel("TTFT ms (every measured request)")
        return True

    return _per_panel(report, workload, out, "ttft", "TTFT distribution", draw)


def loss_bars(report: Report, out: Path) -> list[Plot]:
    """One stacked bar per drafting config (report.losses): the measured speed-up at the bottom, each part of the
    gap above it, up to the ideal (its acceptance length, a black tick)."""
    from sparklab.report.losses import COLORS, PARTS, losses

    rows = losses(report)
    if not rows:
        return []
    fig = _figure(max(5.0, 0.7 * len(rows) + 2.5), 4.5)
    ax = fig.subplots()
    labels = [_label(x.group, _several_engines(report)) + f"\nC={x.group.concurrency}" for x in rows]
    bottoms = [0.0] * len(rows)
    for part in PARTS:
        heights = [max(0.0, x.parts[part]) for x in rows]
        ax.bar(range(len(rows)), heights, bottom=bottoms, color=COLORS[part], label=part)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    ax.plot(range(len(rows)), [x.ideal for x in rows], "k_", markersize=18, label="ideal (acceptance length)")
    ax.axhline(1.0, color="black", linewidth=0.6, linestyle=":")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("speed-up over none (x)")
    ax.set_title("Why acceptance does not become speed", fontsize=9)
    ax.legend(fontsize=7)
    path = _save(fig, out / "losses.png")
    return [("Why acceptance does not become speed: one stacked bar per drafting config", path)]


def all_plots(report: Report, out: Path) -> list[Plot]:
    plots: list[Plot] = []
    for workload in report.workloads:
        for kind in (throughput_vs_k, speedup_bars, acceptance, ttft):
            plots += kind(report, workload, out)
    return plots + loss_bars(report, out)


def compare_plots(comparison: Any, out: Path) -> list[Plot]:
    """`sparklab compare`: per matched cell, each config's headline in each run (bars side by side), with the 95%
    interval over repeats as whiskers where repeats measured one."""
    plots: list[Plot] = []
    runs = comparison.run_ids
    for cell in comparison.cells:
        configs = list(dict.fromkeys(c for groups in cell.groups for c in groups))
        fig, (ax,) = _panels(1, len(configs) * len(runs))
        width = 0.8 / len(runs)
        for i, run in enumerate(runs):
            means, errors, xs = [], [], []
            for j, config in enumerate(configs):
                g = cell.groups[i].get(config)
                if g is None or g.headline is None:
                    continue
                e = g.headline
                xs.append(j + (i - (len(runs) - 1) / 2) * width)
                means.append(e.mean)
                errors.append(0.0 if e.high is None else e.high - e.mean)
            if xs:
                ax.bar(xs, means, width, yerr=[e or 0.0 for e in errors] if any(errors) else None, capsize=3,
                       label=_shown(run))
        ax.set_xticks(range(len(configs)))
        ax.set_xticklabels([_shown(c) for c in configs], fontsize=8)
        ax.set_ylabel(headline_metric(cell.key[2], comparison.reports[0].lead))
        ax.set_title(_shown(cell.label), fontsize=9)
        ax.legend(fontsize=7)
        plots.append((f"compare: {cell.label}", _save(fig, out / f"compare-{safe_filename(cell.label)}.png")))
    return plots
