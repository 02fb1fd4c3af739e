#!/usr/bin/env bash
# Builds dist/ (npm run build) unless the toolport bin, its last step (scripts/bundle.mjs), is newer
# than every file under src/. The test runs use the build: worker threads load dist/ when it is
# fresh (src/main/dispatch/worker-module.ts), the tests that start Toolport as a process run the
# bin (test/helpers.ts, python/tests/conftest.py), and the package-install test packs it.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f dist/main/bin/toolport.js ] || [ -n "$(find src scripts/bundle.mjs -type f -newer dist/main/bin/toolport.js -print -quit)" ]; then
  echo "== building dist/ (npm run build): the toolport bin is missing or older than src/" >&2
  npm run build --silent
fi
