"""Issue 27 item 11: small truths. What sparklab prints and reports says what happened: a failure line ends with
the engine's last words, a host process is not a container, the engine without counters is the one named, a
stored string cannot drive a terminal, a recipe fixed before any cell ran is not drift, and a two-engine run's
plots say which engine each bar and line is (a structure test of the figures)."""

from __future__ import annotations

import io
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console

from sparklab import report
from sparklab.errors import NotReadyError
from sparklab.recipes.plan import build_plan
from sparklab.recipes.schema import recipes_dir
from sparklab.sweep import provenance, runner
from sparklab.sweep.store import Store
from tests.reportkit import cpu_run, seed000_run, seed004_run

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _sweep_file(tmp_path: Path, recipe: str = "cpu", **changes: Any) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"name": "truths", "recipe": recipe, "methods": ["none"], "concurrency": [1],
                                    "requests": 2, **changes}))
    return path


def _rendered(renderable: Any) -> str:
    console = Console(record=True, width=400, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


# -- a failure line ends with the log, not with a header -----------------------------------------------------------

TAIL = "INFO loading weights\nImportError: libcudart.so.13: cannot open shared object file"
EXITED = NotReadyError("the server container exited with code 1 before it was ready (3 s after start). Last 50 log "
                       "lines:\n    INFO loading weights\n    ImportError: libcudart.so.13: cannot open shared object file",
                       None, exit_code=1, log_tail=TAIL)


def test_the_sweeps_server_failure_line_ends_with_the_engines_last_line(tmp_path: Path, monkeypatch) -> None:
    from sparklab.recipes.hosts import LOCAL
    from sparklab.sweep import serverrun as sweep_mod
    from sparklab.sweep.hoststore import HostStore

    plan = build_plan(_sweep_file(tmp_path), run_id="truths-1")
    (server,) = plan.servers
    store = Store.create(tmp_path / "run" / "results.sqlite", plan.sweep.model_dump(), "test")
    runner.register(plan, store)
    monkeypatch.setattr(sweep_mod, "_wait_port_free", lambda *a: None)
    monkeypatch.setattr(sweep_mod.launch, "checked", lambda *a, **k: None)

    def start(*args: object, **kwargs: object) -> None:
        raise EXITED

    monkeypatch.setattr(sweep_mod.launch, "start", start)
    said: list[str] = []
    with store:
        sweep_mod._run_server(sweep_mod.ServerRun(plan, HostStore(store), object(),  # type: ignore[arg-type]
                                                  tmp_path / "run", sweep_mod.Options(), said.append, LOCAL,
                                                  server, list(server.cells)))
    (line,) = [s for s in said if "failed" in s]
    assert not line.rstrip().endswith("log lines:"), line
    assert line.rstrip().endswith("ImportError: libcudart.so.13: cannot open shared object file"), line


def test_the_closing_tables_failure_note_ends_with_the_engines_last_line(tmp_path: Path) -> None:
    from sparklab.cli.console import sweep_table

    path = cpu_run(tmp_path / "runs")
    with Store.open(path) as store:
        sid = store.server_configs()[0].id
        store.fail_server_config(sid, "exited", EXITED.message, exit_code=1, log_tail=TAIL)
    text = _rendered(sweep_table(report.load(path)))
    note = next(line for line in text.splitlines() if "failure(s) recorded" in line)
    assert not note.rstrip().endswith("log lines:") and "ImportError: libcudart.so.13" in note, note


# -- a host process is a host process ---------------------------------------------------------------------------------

def test_gc_of_a_host_process_says_host_process(tmp_path: Path) -> None:
    from sparklab.runtimes.runfiles import RunRecord

    plan = build_plan(_sweep_file(tmp_path), run_id="truths-1")
    store = Store.create(tmp_path / "run" / "results.sqlite", plan.sweep.model_dump(), "test")
    runner.register(plan, store)
    for cell in store.cells():
        store.skip_cell(cell.id)
    orphan = RunRecord(name="sparklab-edge-none-x", pid=2**22 + 7, start_time="1", labels={}, argv=["trtedge"],
                       log_path=str(tmp_path / "x.log"), log_offset=0, created="2026-12-01T00:00:00Z").info()

    class Runtime:
        def gc(self) -> list[Any]:
            return [orphan]

        def host_facts(self, spec: object) -> None:  # no readings of its own: the controller is this machine
            return None

    said: list[str] = []
    with store:
        runner.run(plan, store, Runtime(), tmp_path / "run", runner.Options(), said.append)  # type: ignore[arg-type]
    assert said == ["removed leftover host process sparklab-edge-none-x (its sparklab process is gone)"]


def _process_run(tmp_path: Path, digest: str | None, started: bool = True) -> Path:
    path = seed004_run(tmp_path)  # TensorRT Edge-LLM as a host process (recipes/sweeps/seed004.yaml)
    conn = sqlite3.connect(path)
    try:
        conn.execute("UPDATE server_configs SET image = '/opt/edgellm/venv/bin/trtedge', image_digest = ?, "
                     "ready_s = ?", (digest, 12.5 if started else None))
        conn.commit()
    finally:
        conn.close()
    return path


def test_the_report_names_a_host_processs_program_not_an_image(tmp_path: Path) -> None:
    digest = "sha256:" + "ab" * 32
    text = report.render(report.load(_process_run(tmp_path, digest)), "md")
    line = next(x for x in text.splitlines() if "/opt/edgellm/venv/bin/trtedge" in x)
    assert "program" in line and digest in line and "image" not in line and "no server started" not in line, line


def test_a_started_server_without_a_digest_is_not_called_never_started(tmp_path: Path) -> None:
    text = report.render(report.load(_process_run(tmp_path, None)), "md")
    assert "no server started" not in text and "(no digest recorded)" in text
    text = report.render(report.load(_process_run(tmp_path / "b", None, started=False)), "md")
    assert "(never started)" in text


def test_the_report_blames_the_engine_that_reported_no_acceptance(tmp_path: Path) -> None:
    """seed 000's published run (vLLM, no acceptance stored) was told "TensorRT Edge-LLM has no such counter"."""
    text = report.render(report.load(seed000_run(tmp_path)), "md")
    line = next(x for x in text.splitlines() if "acceptance length (1 + accepted / drafts)" in x)
    assert "TensorRT" not in line and "vllm" in line, line
    text = report.render(report.load(seed004_run(tmp_path / "b")), "md")
    line = next(x for x in text.splitlines() if "acceptance length (1 + accepted / drafts)" in x)
    assert "TensorRT Edge-LLM" in line and "no acceptance counter" in line, line


# -- stored strings cannot drive a terminal ---------------------------------------------------------------------------

OSC52 = "\x1b]52;c;cHduZWQ=\x07"  # set the clipboard
CLEAR = "\x1b[2J\x1b[H"  # clear the screen


def test_no_report_format_passes_terminal_control_sequences(tmp_path: Path, capsys) -> None:
    from sparklab.cli.main import main

    path = cpu_run(tmp_path / "runs")
    conn = sqlite3.connect(path)
    try:
        conn.execute("UPDATE cells SET workload = ?", (f"seed{OSC52}",))
        conn.execute("UPDATE meta SET value = json_set(value, '$.description', ?) WHERE key = 'sweep'",
                     (f"night run{CLEAR}\rforged line",))
        conn.execute("INSERT INTO failures (at, kind, message) VALUES ('2026', 'exited', ?)", (f"boom{CLEAR}",))
        conn.commit()
    finally:
        conn.close()
    for fmt in ("md", "csv", "json", "html"):
        assert main(["report", str(path), "-f", fmt]) == 0
        out = capsys.readouterr().out
        assert not CONTROL.search(out), (fmt, CONTROL.search(out))
    assert main(["report", str(path), "-o", str(tmp_path / "out")]) == 0
    for written in (tmp_path / "out").glob("report.*"):
        assert not CONTROL.search(written.read_text()), written
    md = (tmp_path / "out" / "report.md").read_text()
    assert "\\x1b]52;c;cHduZWQ=\\x07" in md  # shown, not obeyed


# -- a recipe fixed before any cell finished is not drift ----------------------------------------------------------------

def _store_with_fingerprint(tmp_path: Path) -> tuple[Path, Any, Store]:
    recipe = tmp_path / "mine.yaml"
    recipe.write_text((recipes_dir() / "cpu.yaml").read_text())
    plan = build_plan(_sweep_file(tmp_path, recipe=str(recipe)), run_id="truths-1")
    store = Store.create(tmp_path / "run" / "results.sqlite", plan.sweep.model_dump(), "test")
    runner.register(plan, store)
    store.set_meta(provenance.META_KEY, provenance.plan_fingerprint(plan))
    return recipe, plan, store


def test_a_recipe_fixed_after_an_attempt_that_ran_no_cell_is_not_drift(tmp_path: Path) -> None:
    recipe, plan, store = _store_with_fingerprint(tmp_path)
    with store:
        (server,) = plan.servers
        store.fail_server_config(server.id, "exited", "bad flag", max_attempts=3)  # the first attempt: no cell ran
        recipe.write_text(recipe.read_text().replace("--enforce-eager,", "--enforce-eager, --fixed-flag,"))
        said: list[str] = []
        provenance.check_drift(plan, store, True, False, said.append)
        stored = provenance.from_meta(store.meta())
        assert stored is not None and stored["recipe_sha256"] == provenance.plan_fingerprint(plan)["recipe_sha256"]
        assert any("no cell had finished" in s for s in said), said
        assert [f.kind for f in store.failures()] == ["exited"]  # no drift row: nothing was mixed


def test_a_recipe_changed_after_a_cell_finished_is_still_drift(tmp_path: Path) -> None:
    recipe, plan, store = _store_with_fingerprint(tmp_path)
    with store:
        cell = store.cells()[0]
        store.start_cell(cell.id)
        store.finish_cell(cell.id, {"requests": {"ok": 2}}, {"summary": {}})
        recipe.write_text(recipe.read_text().replace("--enforce-eager,", "--enforce-eager, --fixed-flag,"))
        with pytest.raises(provenance.DriftError):
            provenance.check_drift(plan, store, True, False, lambda line: None)


# -- a two-engine run's plots name the engine of every bar and line -----------------------------------------------------

def _two_engine_run(tmp_path: Path) -> Path:
    """The stored CPU run, and the same configs again as a second engine (llama.cpp's adapter), as the demo's two
    engines: vLLM and llama.cpp both with none and a drafter at the same K."""
    path = cpu_run(tmp_path / "runs")
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA foreign_keys = OFF")
        columns = [r[1] for r in conn.execute("PRAGMA table_info(server_configs)")]
        rows = conn.execute(f"SELECT {', '.join(columns)} FROM server_configs").fetchall()
        for row in rows:
            values = dict(zip(columns, row, strict=True))
            values.update(id="l" + values["id"][1:], seq=values["seq"] + 100, engine="llamacpp-cpu",
                          config_json=values["config_json"].replace('"kind":"vllm"', '"kind":"llamacpp"'))
            conn.execute(f"INSERT INTO server_configs ({', '.join(values)}) VALUES ({', '.join('?' * len(values))})",
                         list(values.values()))
        cells = [r[1] for r in conn.execute("PRAGMA table_info(cells)")]
        for row in conn.execute(f"SELECT {', '.join(cells)} FROM cells").fetchall():
            values = dict(zip(cells, row, strict=True))
            values.update(id="l" + values["id"][1:], seq=values["seq"] + 1000,
                          server_config_id="l" + values["server_config_id"][1:])
            conn.execute(f"INSERT INTO cells ({', '.join(values)}) VALUES ({', '.join('?' * len(values))})",
                         list(values.values()))
        conn.commit()
    finally:
        conn.close()
    return path


def _figures(built: Any, tmp_path: Path, monkeypatch) -> dict[str, dict[str, Any]]:
    """What each plot shows, captured as it is saved: tick labels, legend texts, and each line's label, colour
    and style."""
    from matplotlib.colors import to_hex

    from sparklab.report import plots

    seen: dict[str, dict[str, Any]] = {}
    save = plots._save

    def capture(fig: Any, path: Path) -> Path:
        ticks, legends, lines = [], [], []
        for ax in fig.axes:
            ticks += [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
            if ax.get_legend() is not None:
                legends += [t.get_text() for t in ax.get_legend().get_texts()]
            lines += [(ln.get_label(), to_hex(ln.get_color()), ln.get_linestyle()) for ln in ax.get_lines()
                      if not ln.get_label().startswith("_")]
        seen[path.name.split("-seed")[0]] = {"ticks": ticks, "legends": legends, "lines": lines}
        return save(fig, path)

    monkeypatch.setattr(plots, "_save", capture)
    plots.all_plots(built, tmp_path / "plots")
    return seen


ENGINES = ("vllm-cpu", "llamacpp-cpu")


def test_every_label_of_a_two_engine_runs_plots_names_its_engine(tmp_path: Path, monkeypatch) -> None:
    built = report.load(_two_engine_run(tmp_path))
    seen = _figures(built, tmp_path, monkeypatch)
    assert set(seen) == {"throughput-vs-k", "speedup", "acceptance", "ttft", "losses.png"}
    for name, figure in seen.items():  # K and draft positions are numbers; every config label names its engine
        # the losses plot's legend names the parts of the gap (measured, drafter, verify, ...), its ticks the configs
        labels = (figure["legends"] if name != "losses.png" else []) + (
            figure["ticks"] if name in ("speedup", "ttft", "losses.png") else [])
        assert labels, name
        for label in labels:
            assert any(engine in label for engine in ENGINES), (name, label)
    for name in ("speedup", "ttft"):  # the demo's two engines' bars were labelled alike
        ticks = seen[name]["ticks"]
        assert any("vllm-cpu" in t for t in ticks) and any("llamacpp-cpu" in t for t in ticks), ticks
    baselines = [line for line in seen["throughput-vs-k"]["lines"] if "(baseline)" in line[0]]
    by_engine = {engine: {(colour, style) for label, colour, style in baselines if engine in label}
                 for engine in ENGINES}
    assert all(by_engine.values()), baselines
    assert not by_engine["vllm-cpu"] & by_engine["llamacpp-cpu"], baselines  # drawn apart, not both grey dashed


def test_a_one_engine_runs_plot_labels_stay_short(tmp_path: Path, monkeypatch) -> None:
    seen = _figures(report.load(cpu_run(tmp_path / "runs")), tmp_path, monkeypatch)
    assert seen["speedup"]["ticks"] and not any("vllm-cpu" in t for t in seen["speedup"]["ticks"])


def test_a_plots_labels_are_cut_to_a_readable_length_and_the_text_keeps_the_whole_name(tmp_path: Path,
                                                                                       monkeypatch) -> None:
    """A 5000-character engine name (a crafted store, or a generated one) is drawn cut to PLOT_TEXT_MAX characters
    by an "…" in its middle (matplotlib laid out and rendered every glyph, off the canvas, for seconds per plot);
    two names that differ only at their end are still two series, told apart. The text report keeps whole names."""
    from sparklab.report import plots

    path = _two_engine_run(tmp_path)
    long = "e" * 5000
    conn = sqlite3.connect(path)
    try:
        conn.execute("UPDATE server_configs SET engine = ? WHERE engine = 'llamacpp-cpu'", (long + "A",))
        conn.execute("UPDATE server_configs SET engine = ? WHERE engine = 'vllm-cpu'", (long + "B",))
        conn.commit()
    finally:
        conn.close()
    built = report.load(path)
    seen = _figures(built, tmp_path, monkeypatch)
    texts = [t for figure in seen.values() for t in figure["ticks"] + figure["legends"]]
    assert texts and any("…" in t for t in texts)
    assert all(len(line) <= plots.PLOT_TEXT_MAX for t in texts for line in t.splitlines()), \
        max(len(t) for t in texts)
    baselines = [line for line in seen["throughput-vs-k"]["lines"] if "(baseline)" in line[0]]
    assert len({label for label, _, _ in baselines}) == 2, baselines  # one per engine (in each panel), told apart
    assert long + "A" in report.render(built, "md")
