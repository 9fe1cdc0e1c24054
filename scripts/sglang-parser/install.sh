#!/usr/bin/env bash
# A venv holding SGLang's own argument parser (sglang.srt.server_args.prepare_server_args), for the SGLang
# parser contract test (tests/contract/test_sglang_parser_contract.py). Idempotent; cached under
# ${SPARKLAB_CACHE:-~/.cache/sparklab}/sglang-parser-<version>.
#
# Not the whole of SGLang: `pip install --no-deps sglang==VERSION`, then only the modules importing
# server_args.py needs (found by importing it and adding each missing module in turn). torch is one of them
# and triton (both imported at module level by sglang/srt/utils/common.py); the CPU torch build from the
# machine's pip find-links keeps the venv at ~2.3 GB instead of ~5.8 GB with CUDA torch (measured here).
set -euo pipefail
VERSION="${SPARKLAB_SGLANG_VERSION:-0.5.23}"
CACHE="${SPARKLAB_CACHE:-$HOME/.cache/sparklab}"
VENV="$CACHE/sglang-parser-$VERSION"
STAMP="$VENV/.complete"
DEPS=(numpy orjson psutil pybase64 requests packaging pillow starlette msgspec pydantic pyzmq tqdm ipython
      aiohttp pyyaml triton)

if [ -f "$STAMP" ] && "$VENV/bin/python" -c 'from sglang.srt.server_args import prepare_server_args' 2>/dev/null; then
  echo "sglang parser venv $VENV up to date"
  exit 0
fi
rm -rf "$VENV"
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --no-deps "sglang==$VERSION"
# Prefer the CPU torch build; fall back to whatever torch the index offers.
"$VENV/bin/pip" install -q "torch==2.13.0+cpu" "${DEPS[@]}" 2>/dev/null \
  || "$VENV/bin/pip" install -q torch "${DEPS[@]}"
"$VENV/bin/python" -c 'from sglang.srt.server_args import prepare_server_args'
"$VENV/bin/python" -c 'import importlib.metadata as m; print("sglang", m.version("sglang"))'
touch "$STAMP"
