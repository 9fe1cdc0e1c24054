"""Engine caches: the per-image-digest mount and the engine's cache variables, the opt-out, and `gc --caches`."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sparklab.engines import caches as engine_cache
from sparklab.engines import engine
from sparklab.errors import RecipeError
from sparklab.recipes.render import LaunchOptions, docker_command, render
from sparklab.recipes.schema import load_recipe, recipes_dir
from sparklab.spec import Mount

TARGET = engine_cache.TARGET
DIGEST = "sha256:" + "0123456789abcdef" * 4


def _render(recipe: str, engine_name: str | None, method: str | None, root: Path,
            overrides: list[str] | None = None, **options: Any):
    loaded = load_recipe(recipes_dir() / f"{recipe}.yaml", overrides)
    return render(loaded, engine_name, method, LaunchOptions(engine_cache_root=root, **options))


def _cache_mount(spec) -> Mount | None:
    return next((m for m in spec.mounts if m.target == TARGET), None)


# -- what each engine gets --------------------------------------------------------------------------


def test_vllm_adapter_points_vllm_torch_triton_and_flashinfer_into_the_cache() -> None:
    assert engine("vllm").cache_env("/c") == {
        "VLLM_CACHE_ROOT": "/c/vllm",
        "TORCHINDUCTOR_CACHE_DIR": "/c/torchinductor",
        "TRITON_CACHE_DIR": "/c/triton",
        "FLASHINFER_WORKSPACE_BASE": "/c/flashinfer",
    }


def test_sglang_adapter_points_its_cache_dir_and_the_shared_ones_into_the_cache() -> None:
    assert engine("sglang").cache_env("/c") == {
        "SGLANG_CACHE_DIR": "/c/sglang",
        "SGLANG_JIT_CACHE_DIR": "/c/sglang/jit",
        "TORCHINDUCTOR_CACHE_DIR": "/c/torchinductor",
        "TRITON_CACHE_DIR": "/c/triton",
        "FLASHINFER_WORKSPACE_BASE": "/c/flashinfer",
    }


@pytest.mark.parametrize(("recipe", "engine_name", "method", "own"), [
    ("cpu", "vllm-cpu", "ngram", "VLLM_CACHE_ROOT"),
    ("gb10", "vllm", "dspark", "VLLM_CACHE_ROOT"),
    ("gb10", "sglang", "dspark", "SGLANG_CACHE_DIR"),
])
def test_every_container_mounts_the_cache_with_the_digest_still_unknown(
        recipe: str, engine_name: str, method: str, own: str, tmp_path: Path) -> None:
    spec = _render(recipe, engine_name, method, tmp_path / "engine-cache")
    assert _cache_mount(spec) == Mount(str(tmp_path / "engine-cache" / engine_cache.DIGEST_PLACEHOLDER), TARGET)
    assert spec.engine_cache == str(tmp_path / "engine-cache")
    assert spec.env[own].startswith(TARGET + "/")
    assert spec.env["TRITON_CACHE_DIR"] == f"{TARGET}/triton"


def test_a_pinned_digest_resolves_the_mount_at_render_time(tmp_path: Path) -> None:
    spec = _render("gb10", "vllm", "none", tmp_path, [f"engines.vllm.digest={DIGEST}"])
    assert _cache_mount(spec) == Mount(str(tmp_path / "0123456789abcdef"), TARGET)


def test_the_recipe_env_wins_over_the_cache_variables(tmp_path: Path) -> None:
    spec = _render("cpu", None, "none", tmp_path, ["engines.vllm-cpu.env.TRITON_CACHE_DIR=/elsewhere"])
    assert spec.env["TRITON_CACHE_DIR"] == "/elsewhere"
    spec = _render("cpu", None, "none", tmp_path, env=("VLLM_CACHE_ROOT=/mine",))
    assert spec.env["VLLM_CACHE_ROOT"] == "/mine"


def test_a_recipe_opts_out_with_engine_cache_false(tmp_path: Path) -> None:
    spec = _render("cpu", None, "ngram", tmp_path, ["engines.vllm-cpu.engine_cache=false"])
    assert _cache_mount(spec) is None and spec.engine_cache is None
    assert not {"VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"} & set(spec.env)


def test_engine_cache_is_strictly_a_boolean(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match=r"engines\.vllm-cpu\.engine_cache"):
        _render("cpu", None, "none", tmp_path, ["engines.vllm-cpu.engine_cache=sometimes"])


def test_the_printed_docker_run_shows_the_mount_and_the_variables(monkeypatch) -> None:
    monkeypatch.delenv("SPARKLAB_CACHE", raising=False)
    spec = _render("cpu", None, "ngram", engine_cache.default_root())
    printed = docker_command(spec, multiline=False)
    assert f"-v ~/'.cache/sparklab/engine-cache/<image-digest>:{TARGET}'" in printed
    assert f"-e VLLM_CACHE_ROOT={TARGET}/vllm" in printed


def test_the_cache_root_follows_sparklab_cache(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SPARKLAB_CACHE", str(tmp_path))
    assert engine_cache.default_root() == tmp_path / "engine-cache"
    monkeypatch.delenv("SPARKLAB_CACHE")
    assert engine_cache.default_root() == Path.home() / ".cache" / "sparklab" / "engine-cache"


# -- binding after the pull -------------------------------------------------------------------------


def test_bind_creates_the_digest_directory_and_records_the_image(tmp_path: Path) -> None:
    spec = _render("cpu", None, "ngram", tmp_path)
    bound = engine_cache.bind(spec, "127.0.0.1:5000/sparklab/vllm-cpu:0.27.1", DIGEST)
    mount = _cache_mount(bound)
    assert mount is not None and mount.source == str(tmp_path / "0123456789abcdef")
    assert Path(mount.source).is_dir()
    stamp = json.loads((Path(mount.source) / engine_cache.STAMP).read_text())
    assert stamp["digest"] == DIGEST and stamp["image"] == "127.0.0.1:5000/sparklab/vllm-cpu:0.27.1"
    assert abs(stamp["last_used"] - time.time()) < 5
    assert [m for m in bound.mounts if m.target != TARGET] == [m for m in spec.mounts if m.target != TARGET]


def test_bind_leaves_an_opted_out_spec_alone(tmp_path: Path) -> None:
    spec = _render("cpu", None, "none", tmp_path, ["engines.vllm-cpu.engine_cache=false"])
    assert engine_cache.bind(spec, "img", DIGEST) is spec
    assert list(tmp_path.iterdir()) == []


def test_bind_without_a_registry_digest_keys_by_the_image_id(tmp_path: Path) -> None:
    spec = _render("cpu", None, "none", tmp_path)
    bound = engine_cache.bind(spec, "local/img:1", None, image_id="sha256:" + "fe" * 32)
    assert _cache_mount(bound).source == str(tmp_path / ("fe" * 8))  # type: ignore[union-attr]


# -- gc --caches ------------------------------------------------------------------------------------


def _fake_cache(root: Path, key: str, size: int, last_used: float, image: str = "img") -> Path:
    path = root / key
    (path / "vllm").mkdir(parents=True)
    (path / "vllm" / "blob").write_bytes(b"x" * size)
    (path / engine_cache.STAMP).write_text(json.dumps(
        {"image": image, "digest": f"sha256:{key}", "last_used": last_used}))
    return path


@pytest.fixture
def caches(tmp_path: Path) -> Path:
    now = time.time()
    _fake_cache(tmp_path, "aaaa", 3 << 20, now - 3600 * 24 * 3, "old:1")
    _fake_cache(tmp_path, "bbbb", 2 << 20, now - 3600, "mid:1")
    _fake_cache(tmp_path, "cccc", 1 << 20, now - 60, "new:1")
    return tmp_path


def test_scan_lists_each_digest_with_size_and_last_use_newest_first(caches: Path) -> None:
    entries = engine_cache.scan(caches, mounted=[str(caches / "aaaa")])
    assert [e.key for e in entries] == ["cccc", "bbbb", "aaaa"]
    assert [e.image for e in entries] == ["new:1", "mid:1", "old:1"]
    assert entries[2].size_bytes >= 3 << 20 and entries[0].size_bytes < 2 << 20
    assert [e.in_use for e in entries] == [False, False, True]


def test_scan_of_a_missing_root_is_empty(tmp_path: Path) -> None:
    assert engine_cache.scan(tmp_path / "nope", mounted=[]) == []


def test_keep_n_trims_the_oldest_but_never_one_in_use(caches: Path) -> None:
    entries = engine_cache.scan(caches, mounted=[str(caches / "aaaa")])
    assert [e.key for e in engine_cache.choose_trim(entries, keep=1)] == ["bbbb"]
    assert [e.key for e in engine_cache.choose_trim(entries, keep=0)] == ["cccc", "bbbb"]
    assert engine_cache.choose_trim(entries) == []


def test_max_gib_trims_oldest_first_until_the_rest_fits(caches: Path) -> None:
    entries = engine_cache.scan(caches, mounted=[])
    # 6 MiB in all; a 3.5 MiB budget removes the oldest (3 MiB) only
    assert [e.key for e in engine_cache.choose_trim(entries, max_gib=3.5 / 1024)] == ["aaaa"]
    in_use = engine_cache.scan(caches, mounted=[str(caches / "aaaa")])
    assert [e.key for e in engine_cache.choose_trim(in_use, max_gib=3.5 / 1024)] == ["bbbb", "cccc"]


def test_trim_removes_the_directories_and_describe_says_so(caches: Path) -> None:
    entries = engine_cache.scan(caches, mounted=[str(caches / "aaaa")])
    removed = engine_cache.remove(engine_cache.choose_trim(entries, keep=0))
    assert sorted(p.name for p in caches.iterdir()) == ["aaaa"]
    lines = engine_cache.describe(entries, removed)
    assert any("aaaa" in line and "in use" in line and "old:1" in line for line in lines)
    assert any("cccc" in line and "removed" in line for line in lines)
    assert lines[-1].startswith("3 engine cache(s)")


def test_docker_reports_the_cache_mounts_of_existing_containers() -> None:
    from sparklab.runtimes.containers import Docker

    def container(name: str, sources: list[str]) -> Any:
        return SimpleNamespace(name=name, attrs={"Mounts": [{"Type": "bind", "Source": s} for s in sources]})

    listed: list[dict[str, Any]] = []

    def list_(**kwargs: Any) -> list[Any]:
        listed.append(kwargs)
        return [container("a", ["/x/cache/aaaa", "/hf"]), container("b", [])]

    docker = Docker(SimpleNamespace(containers=SimpleNamespace(list=list_)))  # type: ignore[arg-type]
    assert docker.mount_sources() == {"/x/cache/aaaa", "/hf"}
    assert listed[0]["all"] is True  # a stopped container may be started again: it protects its cache too


def test_cli_gc_caches_lists_and_trims_but_spares_the_mounted_one(caches: Path, monkeypatch, capsys) -> None:
    import sparklab.runtimes.containers
    from sparklab.cli.main import main

    root = caches.parent / "engine-cache"
    os.rename(caches, root)

    from tests.fakes import FakeRuntime

    monkeypatch.setattr(sparklab.runtimes.containers, "Docker", lambda: FakeRuntime(mounts={str(root / "aaaa")}))
    monkeypatch.setenv("SPARKLAB_CACHE", str(caches.parent))
    assert main(["gc", "--caches"]) == 0
    shown = capsys.readouterr().out
    assert "aaaa" in shown and "bbbb" in shown and "in use" in shown and "3.0 MiB" in shown
    assert sorted(p.name for p in root.iterdir()) == ["aaaa", "bbbb", "cccc"]
    assert main(["gc", "--caches", "--keep", "0"]) == 0
    assert sorted(p.name for p in root.iterdir()) == ["aaaa"]
