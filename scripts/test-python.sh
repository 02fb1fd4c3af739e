#!/usr/bin/env bash
# The Python plugin SDK's tests (python/tests) against a real Toolport built from this checkout.
#
# Needs python3 >= 3.10 (else it skips, exit 0, saying so). Installs python/requirements-test.txt
# into python/.venv (gitignored; reinstalled when the requirements change), builds dist/ when it
# is missing or older than src/, and runs pytest; extra arguments go to pytest (`--setup-only`
# stops after the venv is ready).
set -euo pipefail
here="${BASH_SOURCE[0]%/*}"
[ "$here" != "${BASH_SOURCE[0]}" ] || here=.
cd "$here/.."

py=""
for candidate in "${PYTHON:-}" python3 python3.13 python3.12 python3.11 python3.10; do
  [ -n "$candidate" ] || continue
  command -v "$candidate" >/dev/null 2>&1 || continue
  if "$candidate" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' 2>/dev/null; then
    py="$candidate"
    break
  fi
done
if [ -z "$py" ]; then
  echo "python SDK tests SKIPPED: no python3 >= 3.10 on PATH (set PYTHON=/path/to/python3.10+)"
  exit 0
fi

venv=python/.venv
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import sys' 2>/dev/null; then
  rm -rf "$venv"
  if ! "$py" -m venv "$venv"; then
    echo "python SDK tests SKIPPED: '$py -m venv' failed (on Debian/Ubuntu: apt-get install python3-venv)"
    rm -rf "$venv"
    exit 0
  fi
fi
# pip's retries back off for seconds per unreachable index; with a local mirror as the configured
# index they only slow the install down. PIP_RETRIES in the environment wins.
export PIP_RETRIES="${PIP_RETRIES:-0}" PIP_DISABLE_PIP_VERSION_CHECK=1
if ! cmp -s python/requirements-test.txt "$venv/.requirements-test.txt"; then
  echo "== python: installing python/requirements-test.txt into $venv ($("$venv/bin/python" --version))"
  "$venv/bin/python" -m pip install --quiet -r python/requirements-test.txt
  cp python/requirements-test.txt "$venv/.requirements-test.txt"
fi
# `--setup-only`: the venv is ready; `npm test` runs this first, because Node tests start a
# Python plugin from it while pytest runs.
if [ "${1:-}" = "--setup-only" ]; then
  exit 0
fi

bash scripts/build-if-stale.sh

echo "== python: pytest python/tests ($("$venv/bin/python" --version))"
cd python
exec .venv/bin/python -m pytest -p no:cacheprovider "$@"
