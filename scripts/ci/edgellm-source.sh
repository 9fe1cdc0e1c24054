#!/usr/bin/env bash
# TensorRT Edge-LLM's server CLI source for the contract test (tests/contract/test_edgellm_parser_contract.py): the wheel
# tensorrt-edgellm==0.11.0 (seed 004 names 0.11.1, which the package index does not hold) downloaded once without
# its dependencies, and only the files the test reads kept: experimental/server/config.py (its argparse parser and
# validation, stdlib only, so it loads without a GPU or TensorRT), experimental/server/cli.py and the wheel's
# entry_points.txt. Idempotent: a second run with the files present does nothing.
#   usage: bash scripts/ci/edgellm-source.sh [PYTHON]   (prints the source directory)
set -euo pipefail
VERSION=0.11.0
CACHE="${SPARKLAB_CACHE:-$HOME/.cache/sparklab}"
DEST="$CACHE/edgellm-src/$VERSION"
PYTHON="${1:-python3}"
if [ -f "$DEST/.complete" ]; then
  echo "$DEST"
  exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --dest "$work" "tensorrt-edgellm==$VERSION" >&2
wheel="$(ls "$work"/tensorrt_edgellm-"$VERSION"-*.whl | head -1)"
mkdir -p "$DEST"
"$PYTHON" - "$wheel" "$DEST" <<'PY'
import hashlib
import sys
import zipfile
from pathlib import Path

wheel, dest = Path(sys.argv[1]), Path(sys.argv[2])
keep = ("experimental/server/config.py", "experimental/server/cli.py")
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name in keep or name.endswith(".dist-info/entry_points.txt"):
            target = dest / ("entry_points.txt" if name.endswith("entry_points.txt") else name)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(z.read(name))
digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
(dest / "WHEEL").write_text(f"{wheel.name} sha256:{digest}\n")
PY
touch "$DEST/.complete"
echo "$DEST"
