#!/usr/bin/env bash
# Builds dist/ (npm run build) unless the toolport bin, its last step (scripts/bundle.mjs), is newer
# than every file under src/. The test runs use the build: worker threads load dist/ when it is
# fresh (src/main/dispatch/worker-module.ts), the tests that start Toolport as a process run the
# bin (test/helpers.ts, python/tests/conftest.py). It is also package.json's `prepack`: dist/ is
# gitignored, so `npm pack` in a checkout never built would pack no code (and install no bin);
# after `npm run build` (as in .ci/run) the pack, `--dry-run` too, builds nothing again.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f dist/main/bin/toolport.js ] || [ -n "$(find src scripts/bundle.mjs -type f -newer dist/main/bin/toolport.js -print -quit)" ]; then
  echo "== building dist/ (npm run build): the toolport bin is missing or older than src/" >&2
  npm run build --silent
fi
