"""Platform provenance: OS release, kernel, and the GPU driver and CUDA version where nvidia-smi answers."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from sparklab.host import platform as host_platform
from sparklab.report.content import platform_line

SMI_HEADER = """+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 580.95.05              Driver Version: 580.95.05      CUDA Version: 13.0     |
|-----------------------------------------+------------------------+----------------------+
"""


def _fake_smi(tmp_path: Path, monkeypatch, script: str) -> None:
    binary = tmp_path / "bin" / "nvidia-smi"
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\n" + script)
    binary.chmod(binary.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{binary.parent}{os.pathsep}{os.environ.get('PATH', '')}")


def test_a_gb10_driver_and_cuda_are_read_from_nvidia_smi(tmp_path: Path, monkeypatch) -> None:
    header = tmp_path / "header.txt"
    header.write_text(SMI_HEADER)
    _fake_smi(tmp_path, monkeypatch, f'case "$1" in --query-gpu*) echo "NVIDIA GB10, 580.95.05";; '
                                     f'*) cat {header};; esac\n')
    facts = host_platform.gpu_facts()
    assert facts == {"gpus": [{"name": "NVIDIA GB10", "driver": "580.95.05"}], "cuda": "13.0",
                     "nvidia_smi": "answered"}
    line = platform_line({"os_release": "Ubuntu 24.04.4 LTS", "kernel": "6.11.0-1016-nvidia", **facts})
    assert line == "Ubuntu 24.04.4 LTS, kernel 6.11.0-1016-nvidia, NVIDIA GB10 (driver 580.95.05), CUDA 13.0"


def test_no_driver_says_why(tmp_path: Path, monkeypatch) -> None:
    _fake_smi(tmp_path, monkeypatch, 'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA '
                                     'driver." >&2; exit 9\n')
    facts = host_platform.gpu_facts()
    assert facts == {"nvidia_smi": "nvidia-smi exited with 9: NVIDIA-SMI has failed because it couldn't communicate "
                                   "with the NVIDIA driver."}
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert host_platform.gpu_facts() == {"nvidia_smi": "nvidia-smi not found"}
    assert "no NVIDIA GPU driver (nvidia-smi not found)" in platform_line({"kernel": "6.1", "nvidia_smi":
                                                                           "nvidia-smi not found"})


@pytest.mark.parametrize(("text", "name"), [
    ('PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nNAME="Debian GNU/Linux"\n', "Debian GNU/Linux 12 (bookworm)"),
    ("NAME=Ubuntu\nPRETTY_NAME='Ubuntu 24.04.4 LTS'\n", "Ubuntu 24.04.4 LTS"),
    ("NAME=x\n", None),
])
def test_os_release(tmp_path: Path, text: str, name: str | None) -> None:
    path = tmp_path / "os-release"
    path.write_text(text)
    assert host_platform.os_release(path) == name
    assert host_platform.os_release(tmp_path / "missing") is None


def test_a_run_records_its_platform() -> None:
    from sparklab.sweep.runner import host_facts

    facts = host_facts()["platform"]
    assert facts["kernel"] and facts["os_release"] and "nvidia_smi" in facts
