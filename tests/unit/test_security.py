"""Issue 11 §6: a shared recipe, sweep file or results file never runs code, writes outside its place or leaks a
secret; `down --all` touches only the caller's containers."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from sparklab import report
from sparklab.cli.main import main
from sparklab.errors import RecipeError
from sparklab.recipes.plan import build_plan
from sparklab.recipes.render import render
from sparklab.recipes.schema import load_recipe, recipes_dir
from sparklab.redaction import redact, redacted_lines
from sparklab.sweep.store import Store
from tests.fakes import FakeRuntime
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
    from sparklab.report.from_store import _recipe_facts

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


# -- secrets ---------------------------------------------------------------------------------------------------

SECRET = b"sk-Secret_0123456789abcdef"


@pytest.mark.parametrize("cut", range(1, len(SECRET)))
def test_a_secret_split_across_two_chunks_is_redacted_at_every_position(cut: int) -> None:
    chunks = [b"INFO api_key='" + SECRET[:cut], SECRET[cut:] + b"' port=30000\nnext line\n"]
    out = b"".join(redacted_lines(iter(chunks), [SECRET]))
    assert out == b"INFO api_key='***' port=30000\nnext line\n"


@pytest.mark.parametrize("cut", range(1, len(SECRET)))
@pytest.mark.parametrize("wrap", [b"\n", b"\r\n", b"\n    "])
def test_a_secret_split_across_two_log_lines_is_redacted(cut: int, wrap: bytes) -> None:
    """An engine that wraps long lines (rich logging, server_args dumps) puts a newline inside the key."""
    text = b"ServerArgs(api_key='" + SECRET[:cut] + wrap + SECRET[cut:] + b"', port=1)\n"
    chunks = [text[:i] for i in (len(text) // 2,)] + [text[len(text) // 2:]]
    for out in (b"".join(redacted_lines(iter(chunks), [SECRET])), redact(text, [SECRET])):
        assert out == b"ServerArgs(api_key='***" + wrap + b"', port=1)\n"


def test_every_byte_boundary_of_a_wrapped_secret() -> None:
    text = b"x " + SECRET[:9] + b"\n  " + SECRET[9:] + b" y\nz\n"
    for cut in range(len(text) + 1):
        out = b"".join(redacted_lines(iter([text[:cut], text[cut:]]), [SECRET]))
        assert out == b"x ***\n   y\nz\n", (cut, out)


@pytest.mark.parametrize("cut", range(1, len(SECRET) - 5))
def test_a_read_that_starts_inside_a_wrapped_secret_hides_its_second_half(cut: int) -> None:
    """`docker logs --tail N` (a failure's log tail) may begin with the second line of a wrapped key."""
    text = SECRET[cut:] + b"', port=1)\nnext\n"
    assert redact(text, [SECRET]) == b"***', port=1)\nnext\n"
    assert b"".join(redacted_lines(iter([text]), [SECRET], starts_mid_log=True)) == b"***', port=1)\nnext\n"


def test_redaction_leaves_ordinary_text_and_flushes_a_held_tail() -> None:
    out = b"".join(redacted_lines(iter([b"ready\n", b"sk-Sec"]), [SECRET]))
    assert out == b"ready\nsk-Sec"  # a prefix that turned out not to be the key is written at the end


def test_up_does_not_print_a_key_it_was_given(capsys, monkeypatch) -> None:
    from sparklab.cli import up

    ready = SimpleNamespace(
        seconds_to_ready=1.0, api_key="my-own-key-123",
        server=SimpleNamespace(spec=SimpleNamespace(ready_path="/health", endpoint="http://127.0.0.1:1"),
                               name="c", log_path=Path("x.log")),
        image=SimpleNamespace(ref="img", digest=None),
        facts=SimpleNamespace(kv_cache_tokens=None, max_concurrency=None, kv_cache_memory_gib=None,
                              model_load_seconds=None, engine_init_seconds=None, advice=[], source="log"))
    up._print_ready(ready, key_given=True)  # type: ignore[arg-type]
    printed = capsys.readouterr().out
    assert "my-own-key-123" not in printed and "api key     the one you gave" in printed
    up._print_ready(ready, key_given=False)  # type: ignore[arg-type]
    assert "my-own-key-123" in capsys.readouterr().out  # a generated key is shown once


def test_sglang_cannot_take_its_key_from_the_environment_and_up_says_so() -> None:
    from sparklab.engines import sglang

    spec = render(load_recipe(recipes_dir() / "gb10.yaml"), "sglang", "none")
    assert "--api-key" in spec.argv and spec.api_key_env is None
    assert "ps" in sglang.API_KEY_ON_COMMAND_LINE and "server_args" in sglang.API_KEY_ON_COMMAND_LINE


def test_up_says_an_sglang_key_is_visible_in_ps(capsys, tmp_path: Path) -> None:
    # not a GB10: its --mem-fraction-static 0.85 of this host's memory is not judged here (unified_memory=false)
    assert main(["up", "gb10:none", "--engine", "sglang", "--dry-run", "--hf-cache", str(tmp_path),
                 "--port", "18998", "--set", "unified_memory=false"]) == 0
    assert "every local user can read the key with `ps`" in capsys.readouterr().err.replace("\n", " ")
    assert main(["up", "gb10:none", "--engine", "sglang", "--dry-run", "--hf-cache", str(tmp_path),
                 "--port", "18998", "--no-api-key", "--set", "unified_memory=false"]) == 0
    assert "ps" not in capsys.readouterr().err


# -- down --all is the caller's ----------------------------------------------------------------------------------


def _info(name: str, uid: str | None, mode: str = "up") -> Any:
    from sparklab.runtimes.base import ServerInfo

    labels = {"sparklab": "1", "sparklab.mode": mode}
    if uid is not None:
        labels["sparklab.uid"] = uid
    return ServerInfo(id=name, name=name, status="running", exit_code=None, labels=labels, created="")


@pytest.mark.parametrize(("flags", "removed"), [
    (["--all"], ["mine-1", "mine-2"]),
    (["--all-users"], ["mine-1", "theirs", "mine-2", "unlabelled"]),
    ([], ["mine-1"]),
])
def test_down_all_removes_only_the_callers_containers(flags: list[str], removed: list[str], monkeypatch,
                                                       capsys) -> None:
    import os

    import sparklab.runtimes.containers

    me, other = str(os.getuid()), str(os.getuid() + 1)
    fake = FakeRuntime(servers=[_info("mine-1", me), _info("theirs", other), _info("mine-2", me, mode="sweep"),
                                _info("unlabelled", None)])
    monkeypatch.setattr(sparklab.runtimes.containers, "Docker", lambda: fake)
    assert main(["down", *flags]) == 0
    assert fake.removed == removed


def test_launch_labels_the_container_with_its_user() -> None:
    import os

    from sparklab.runtimes.containers import USER_ID, Docker

    created: dict[str, Any] = {}

    def create(image: str, **kwargs: Any) -> Any:
        created.update(kwargs)
        return SimpleNamespace(name=kwargs["name"], id="abc", start=lambda: None, attrs={"Config": {}})

    def get(name: str) -> Any:
        import docker.errors

        raise docker.errors.NotFound("none")

    client = SimpleNamespace(containers=SimpleNamespace(create=create, get=get))
    spec = render(load_recipe(recipes_dir() / "cpu.yaml"), "vllm-cpu", "none")
    Docker(client).launch(spec, {})  # type: ignore[arg-type]
    assert created["labels"][USER_ID] == str(os.getuid())
