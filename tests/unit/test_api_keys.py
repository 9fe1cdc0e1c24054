"""The API key a server starts with is one every engine's argument parser reads as a value.

Seen in CI: a generated key began with '-' (token_urlsafe's alphabet has it: 1 key in 64), so `--api-key -Xy…` was
read as a flag; the stand-in then served with no key and answered 401 to every cell of that server. The real
engines parse with argparse and refuse the command outright (run against vLLM 0.27.1's and SGLang 0.5.23's own
parsers: see sparklab.runtimes.launch.server_api_key): 1 server in 64 of a night lost at its start."""

from __future__ import annotations

import argparse

import pytest

from sparklab.errors import SparklabError
from sparklab.runtimes.launch import server_api_key


def _argparse_reads(key: str) -> str:
    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--api-key")
    parser.add_argument("--port")
    return str(parser.parse_args(["--api-key", key, "--port", "8000"]).api_key)


def test_a_generated_key_is_read_as_a_value_by_argparse_every_time() -> None:
    keys = {server_api_key(None) for _ in range(3000)}  # token_urlsafe: P(no key starts with '-') = (63/64)^3000
    assert len(keys) == 3000
    for key in keys:
        assert not key.startswith("-") and len(key) >= 32
        assert _argparse_reads(key) == key


def test_a_given_key_is_kept_or_refused_in_one_paragraph() -> None:
    assert server_api_key("my-night-key") == "my-night-key"
    with pytest.raises(SparklabError) as refused:
        server_api_key("-starts-with-a-dash")
    assert "--api-key" in refused.value.message and "'-'" in refused.value.message
    assert refused.value.hint


def test_the_stand_in_refuses_a_key_that_starts_with_a_dash_as_the_engines_do(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: it took `-Xy…` as a flag, served with no key, and the sweep saw 401 on every cell of the server."""
    import sys
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "docker" / "standin"))
    monkeypatch.delitem(sys.modules, "standin_args", raising=False)
    import standin_args

    for mode, argv in (("vllm", ["serve", "m"]), ("sglang", ["--model-path", "m"])):
        with pytest.raises(SystemExit, match="argument --api-key: expected one argument"):
            standin_args.parse_args(mode, [*argv, "--api-key", "-Xabc", "--port", "8000"])
        assert standin_args.parse_args(mode, [*argv, "--api-key", "abc", "--port", "8000"]).api_key == "abc"
