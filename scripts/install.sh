#!/usr/bin/env bash
# Install sparklab for this user: a virtual environment with `pip install -e <this repo>`, and the
# `sparklab` command linked into ~/.local/bin. Installs python3-venv first when it is missing (as root,
# or through sudo). Re-running it updates the install. Usage: bash scripts/install.sh
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${SPARKLAB_VENV:-$HOME/.local/share/sparklab/venv}"
BIN="${SPARKLAB_BIN:-$HOME/.local/bin}"

if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  echo "[install] python3-venv is missing: installing it with apt-get"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q python3-venv
fi

python3 - <<'PY'
import sys
if sys.version_info < (3, 10):
    sys.exit(f"[install] sparklab needs Python >= 3.10; this python3 is {sys.version.split()[0]}")
PY

[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -e "$REPO_ROOT[humaneval]"  # seed004 sweeps the HumanEval prompts
mkdir -p "$BIN"
ln -sf "$VENV/bin/sparklab" "$BIN/sparklab"
echo "[install] $("$BIN/sparklab" --version) installed: $BIN/sparklab (venv $VENV)"
case ":$PATH:" in
  *":$BIN:"*) ;;
  *) echo "[install] add $BIN to your PATH: export PATH=\"$BIN:\$PATH\"" ;;
esac
