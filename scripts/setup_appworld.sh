#!/usr/bin/env bash
# Create .venv-appworld: AppWorld (appworld==0.1.3.post1) in its own venv, apps unpacked.
#
# AppWorld pins pydantic<2 (litellm needs 2), so it cannot share .venv; the
# harness talks to it through worker processes (experiments/benchmarks/appworld/).
# Idempotent: does nothing once the stamp file exists. Needs PyPI access the
# first time only; `appworld install` itself is offline. Nothing is written
# outside the repository: APPWORLD_ROOT=.appworld, APPWORLD_CACHE=.appworld/cache.
#
#   bash scripts/setup_appworld.sh            # create / verify
#   FORCE=1 bash scripts/setup_appworld.sh    # recreate from scratch
#
# Env: PYTHON (a Python >= 3.11 to build the venv from; default python3.11, then python3),
#      APPWORLD_VENV (default .venv-appworld).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${APPWORLD_VENV:-$REPO/.venv-appworld}"
VERSION="0.1.3.post1"
LOCK="$REPO/experiments/benchmarks/appworld/requirements-appworld.lock"
STAMP="$VENV/.installed-appworld-$VERSION"
export APPWORLD_ROOT="$REPO/.appworld"
export APPWORLD_CACHE="$REPO/.appworld/cache"

if [[ "${FORCE:-0}" == "1" ]]; then rm -rf "$VENV"; fi
if [[ -f "$STAMP" && -x "$VENV/bin/python" ]]; then
  echo "AppWorld $VERSION ready: $VENV"
  exit 0
fi

PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  if command -v python3.11 >/dev/null 2>&1; then PY=python3.11; else PY=python3; fi
fi
"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' \
  || { echo "setup_appworld: $PY is older than 3.11 (AppWorld needs >= 3.11); set PYTHON=..." >&2; exit 2; }

echo "Creating $VENV with $("$PY" --version) ..."
rm -rf "$VENV"
"$PY" -m venv "$VENV"
# The lock pins AppWorld's transitive dependencies to a set known to work; the two
# extra packages come from AppWorld's own `all` extra and are needed only to build
# the offline task folders (API docs in OpenAPI form, ruff-formatted ground truth).
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -c "$LOCK" \
  "appworld==$VERSION" "openapi-spec-validator>=0.7.1,<0.8" "ruff>=0.3,<0.4"

mkdir -p "$APPWORLD_ROOT" "$APPWORLD_CACHE"
(cd "$APPWORLD_ROOT" && "$VENV/bin/appworld" install)
"$VENV/bin/python" -c 'import appworld.apps.venmo.apis, appworld; print("appworld", appworld.__version__, "installed")'
"$VENV/bin/python" -m pip check
touch "$STAMP"
echo "AppWorld $VERSION ready: $VENV"
