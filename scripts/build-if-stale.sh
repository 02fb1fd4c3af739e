#!/usr/bin/env bash
# Builds dist/ (npm run build) unless it is newer than every file under src/. The test run uses the
# build: worker threads load dist/ when it is fresh (src/main/dispatch/worker-module.ts) and the
# package-install test packs it instead of compiling its own copy.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f dist/main/bin/toolport.js ] || [ -n "$(find src scripts/bundle.mjs -type f -newer dist/main/bin/toolport.js -print -quit)" ]; then
  npm run build --silent
fi
