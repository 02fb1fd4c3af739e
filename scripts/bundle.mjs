#!/usr/bin/env node
// The second half of `npm run build` (after tsc): the `toolport` command and the worker threads'
// modules as bundles, so that starting them reads a few files instead of ~750.
//
//   dist/main/bin/toolport.js      the `toolport` bin (package.json "bin"): dist/main/cli.js and
//                                  everything it imports at start, in one module; what a command
//                                  imports only when it runs (the MCP SDK, the stdio bridge) is
//                                  split into chunks beside it, loaded on first use
//   dist/workers/call-task.js      the pool's worker module and the schema compiler's, each
//   dist/workers/schema-compiler.js  replaced by itself with its imports inlined
//
// Why: a start of `toolport serve` spent about a third of its CPU resolving, reading and
// compiling modules one by one (Node's ESM loader stats and reads every file and package.json on
// the way), and each worker thread paid the same again for its own imports. The library entry
// (dist/main/index.js) stays tsc's output, file per module, for programs that import Toolport.
//
// The inputs are tsc's output (dist/**/*.js with their source maps), so the bundles' source maps
// lead back to src/. Packages that read files of their own at run time (relative to their
// __dirname) or start threads from their own files stay outside the bundles and load from
// node_modules as before. Every bundle keeps its modules' relative layout where it matters: the
// bin sits two folders deep in dist/ like the modules that locate dist/workers and console/ from
// their own URL (src/main/dispatch/worker-module.ts, src/main/http/console.ts).
import { build } from 'esbuild'
import { readFileSync, rmSync } from 'node:fs'
import { fileURLToPath } from 'node:url'

const ROOT = fileURLToPath(new URL('..', import.meta.url))

/**
 * Packages loaded from node_modules, not bundled: each reads its own files or starts a thread
 * from its own file at run time (piscina's worker.js, pino's transports, re2-wasm's .wasm, the
 * Swagger UI's static files, @fastify/swagger's package.json).
 */
const EXTERNAL = ['piscina', 'pino', 're2-wasm', '@fastify/static', '@fastify/swagger', '@fastify/swagger-ui']

/** The worker threads' modules, each bundled in place (dist/workers/<name>.js). */
const WORKERS = ['call-task', 'schema-compiler']

/**
 * Bundled CommonJS packages call `require`, `__filename` and `__dirname`, which an ES module does
 * not have: each output file defines them for its own location.
 */
const BANNER = [
  "import { createRequire as __toolportCreateRequire } from 'node:module';",
  "import { fileURLToPath as __toolportFileURLToPath } from 'node:url';",
  "import { dirname as __toolportDirname } from 'node:path';",
  'const require = __toolportCreateRequire(import.meta.url);',
  'const __filename = __toolportFileURLToPath(import.meta.url);',
  'const __dirname = __toolportDirname(__filename);'
].join(' ')

const COMMON = {
  absWorkingDir: ROOT,
  bundle: true,
  platform: 'node',
  target: 'node20',
  format: 'esm',
  external: EXTERNAL,
  banner: { js: BANNER },
  // Less to parse at every start; identifiers keep their names, so stack traces stay readable.
  minifyWhitespace: true,
  minifySyntax: true,
  sourcemap: 'linked',
  // The maps name the files; the sources are in the package (dist/) and in node_modules.
  sourcesContent: false,
  legalComments: 'eof',
  logLevel: 'warning'
}

// The worker bundles replace their inputs: a second run over its own output (without tsc first)
// would bundle a bundle. `npm run build` always runs tsc first.
for (const name of WORKERS) {
  if (readFileSync(`${ROOT}dist/workers/${name}.js`, 'utf8').includes('__toolportCreateRequire')) {
    throw new Error(`dist/workers/${name}.js is already a bundle; run \`npm run build\` (tsc, then this script)`)
  }
}

const binDir = `${ROOT}dist/main/bin`
rmSync(binDir, { recursive: true, force: true })

await Promise.all([
  build({
    ...COMMON,
    entryPoints: { toolport: 'dist/main/cli.js' },
    outdir: binDir,
    splitting: true,
    chunkNames: '[name]-[hash]'
  }),
  ...WORKERS.map((name) => build({
    ...COMMON,
    entryPoints: [`dist/workers/${name}.js`],
    outfile: `dist/workers/${name}.js`,
    allowOverwrite: true
  }))
])
