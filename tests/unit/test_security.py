"""Issue 11 §6: a shared recipe, sweep file or results file never runs code, writes outside its place or leaks a
secret; `down --all` touches only the caller's containers."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import yaml

from sparklab import report
from sparklab.cli import main
from sparklab.errors import RecipeError
from sparklab.plan import build_plan
from sparklab.recipes import load_recipe, recipes_dir
from sparklab.render import render
from sparklab.store import Store
from tests.reportkit import cpu_run

# -- templates run in a sandbox ----------------------------------------------------------------------------------

# Known ways out of a Jinja template into Python; {marker} is a file each would create if it ran.
ESCAPES = [
    "{{ cycler.__init__.__globals__.os.popen('touch {marker}').read() }}",
    "{{ joiner.__init__.__globals__.os.popen('touch {marker}').read() }}",
    "{{ namespace.__init__.__globals__.os.popen('touch {marker}').read() }}",
    "{{ lipsum.__globals__['os'].popen('touch {marker}').read() }}",
    "{{ self._TemplateReference__context.cycler.__init__.__globals__.os.popen('touch {marker}').read() }}",
    "{% for c in ''.__class__.__mro__[1].__subclasses__() %}{% if c.__name__ == 'Popen' %}"
    "{{ c(['touch', '{marker}']) }}{% endif %}{% endfor %}",
    "{{ ''|attr('__class__')|attr('__mro__') }}{{ (cycler|attr('__init__')|attr('__globals__'))['os']"
    ".popen('touch {marker}') }}",
    "{{ '{0.__class__.__init__.__globals__}'.format(cycler) }}{{ cycler.__init__.__globals__.os"
    ".system('touch {marker}') }}",
    "{{ '%s'|format(cycler.__init__.__globals__.os.popen('touch {marker}')) }}",
    "{{ lipsum|attr('__globals__')|attr('get')('os')|attr('popen')('touch {marker}') }}",
    "{{ model.__class__.__mro__[1].__subclasses__() }}",
    "{{ drafts.update({'x': 1}) }}{{ drafts.clear() }}",  # mutating the context
    "{{ range(10**9)|list|length }}",  # resource exhaustion, not code, but still a recipe's to refuse
    "{{ 'x' * 10**10 }}",
]


@pytest.mark.parametrize("payload", ESCAPES)
def test_a_recipe_template_cannot_run_code(payload: str, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    value = payload.replace("{marker}", str(marker))
    override = f"engines.vllm-cpu.methods.none.env.X={value}"
    recipe = load_recipe(recipes_dir() / "cpu.yaml", [override])
    with pytest.raises(RecipeError, match=r"engines\.vllm-cpu\.env\.X: template"):
        render(recipe, "vllm-cpu", "none")
    assert not marker.exists()


def test_the_cli_render_of_an_escape_is_one_paragraph(capsys, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    payload = f"{{{{ cycler.__init__.__globals__.os.popen('touch {marker}').read() }}}}"
    assert main(["render", "cpu:none", "--set", f"engines.vllm-cpu.methods.none.env.X={payload}"]) == 2
    err = capsys.readouterr().err
    assert "engines.vllm-cpu.env.X: template" in err.replace("\n", " ") and "Traceback" not in err
    assert not marker.exists()


def test_a_sweep_files_set_cannot_run_code(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    payload = f"{{{{ cycler.__init__.__globals__.os.popen('touch {marker}').read() }}}}"
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({"name": "t", "recipe": "cpu", "methods": ["none"], "concurrency": [1],
                                     "set": [f"engines.vllm-cpu.methods.none.env.X={payload}"]}))
    with pytest.raises(RecipeError, match="template"):
        build_plan(sweep)
    assert not marker.exists()


def test_the_sandbox_still_renders_what_recipes_use() -> None:
    recipe = load_recipe(recipes_dir() / "gb10.yaml", ["engines.vllm.methods.none.env.X={{ model|upper }}-"
                                                       "{{ '%d'|format(port) }}-{{ 'a,b'.split(',')|join('+') }}"])
    spec = render(recipe, "vllm", "none")
    assert spec.env["X"] == f"{recipe.model.id.upper()}-8000-a+b"


def test_the_report_page_template_is_sandboxed() -> None:
    import importlib

    from jinja2.sandbox import SandboxedEnvironment

    page = importlib.import_module("sparklab.report.document")  # the package's `document` is a function
    assert isinstance(page._PAGE.environment, SandboxedEnvironment)


# -- names read from a store never form paths -------------------------------------------------------------------


def _craft(path: Path, workload: str) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.execute("UPDATE cells SET workload = ?", (workload,))
        conn.commit()
    finally:
        conn.close()


@pytest.mark.parametrize("workload", ["a/../../../../escaped/x", "../../escaped", "/tmp/escaped-abs/x", "..",
                                      "file:prompts/mine.jsonl", "a\\..\\..\\x", "-rf"])
def test_a_crafted_store_cannot_make_report_write_outside_its_directory(tmp_path: Path, workload: str) -> None:
    results = cpu_run(tmp_path / "runs")
    _craft(results, workload)
    out = tmp_path / "deep" / "er" / "out"
    with Store.open(results, readonly=True) as store:
        built = report.build(store, results.parent.name, None)
    written = report.write_all(built, out)
    everything = {p for p in tmp_path.rglob("*") if p.is_file()}
    outside = {p for p in everything if out not in p.parents and results.parent not in p.parents}
    assert outside == set()
    assert all(out.resolve() in p.resolve().parents for p in written)
    assert not Path("/tmp/escaped-abs").exists()
    plots = [p for p in written if p.suffix == ".png"]
    assert plots and all(p.parent == out / "plots" for p in plots)


def test_a_recipe_name_from_a_store_is_never_a_path(tmp_path: Path, monkeypatch) -> None:
    from sparklab.report.model import _recipe_facts

    (tmp_path / "recipes").mkdir()
    (tmp_path / "outside.yaml").write_bytes((recipes_dir() / "cpu.yaml").read_bytes())
    monkeypatch.setenv("SPARKLAB_RECIPES", str(tmp_path / "recipes"))
    notes: list[str] = []
    assert _recipe_facts("../outside", notes) == {} and notes == []


def test_distinct_workloads_keep_distinct_plot_files() -> None:
    from sparklab.report.plots import safe_filename

    names = ["a/b", "a-b", "a:b", "seed", "../x", "x"]
    assert safe_filename("seed") == "seed" and safe_filename("speedbench-1k") == "speedbench-1k"
    assert len({safe_filename(n) for n in names}) == len(names)
    assert all("/" not in safe_filename(n) and not safe_filename(n).startswith(".") for n in names)
