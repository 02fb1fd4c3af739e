#!/usr/bin/env node
// The Node test suite: node:test over test/unit and test/integration.
//
//   node scripts/test-node.mjs                      every test file, in a few shared processes
//   node scripts/test-node.mjs test/unit/x.test.ts  the files named, each in its own process
//   node scripts/test-node.mjs --test-name-pattern=R13 [files…]   node --test flags pass through
//
// Why groups: `node --test` starts one process per file, and each pays Node's start and the
// loading of Toolport's modules (fastify, ajv, the MCP SDK, …): about 1.3 s of CPU, which over
// ~50 files was a third of the suite's CPU on a 2-core machine. Node 20 has no
// `--test-isolation=none`, so the whole-suite run puts the test files into a few groups, each run
// by one process: their top-level tests register in that process and run one after another, as
// they do within a file. The runner reports every test by name and prints the one summary of the
// whole run.
//
// Why bundles: each group (or named file) is bundled by esbuild, with the Toolport sources it
// imports, into one ES module; packages are left as imports. Run under tsx instead, every module
// a test process imports, packages included, passes through tsx's resolve and load hooks on a
// separate thread: ~1.5 s of CPU per group more. Each file gets the same esbuild transform tsx
// applies, and keeps its own `import.meta.url`; the bundle links the files into one module
// (ES module semantics, one scope). The bundles are written to
// node_modules/.cache/toolport/test-bundles-*/ (removed when the run ends) and have source maps:
// positions in the bundles that the report prints (failure locations, stack traces) are
// rewritten to the source files' as the report streams. `--watch` is refused (it would watch
// the bundles); APART applies to the whole-suite run only.
//
// Every test/*/*.test.ts file runs, whether listed below or not: a file not in WEIGHTS counts
// DEFAULT_WEIGHT. The groups are balanced by the weights (seconds measured in a whole run) so
// the processes end together.
import { spawn, spawnSync } from 'node:child_process'
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs'
import { readFile } from 'node:fs/promises'
import { SourceMap } from 'node:module'
import { basename, join, relative, resolve } from 'node:path'
import { createInterface } from 'node:readline'
import { fileURLToPath, pathToFileURL } from 'node:url'
import { build as esbuild, stop as stopEsbuild } from 'esbuild'
import { withTestTmpdir } from './test-tmpdir.mjs'

const ROOT = fileURLToPath(new URL('..', import.meta.url))

/** The binding that holds a bundled source's own `import.meta.url`. */
const OWN_URL = '__toolportModuleUrl'

/**
 * Processes the shared files are grouped into, all running at once: on 2 cores, four keep both
 * busy while some of them wait on timers, sockets and child processes.
 */
const SHARDS = count('TOOLPORT_TEST_SHARDS', 4)
/** Test processes running at once (a named file each, or the groups). */
const CONCURRENCY = count('TOOLPORT_TEST_CONCURRENCY', SHARDS)

/** A positive integer from the environment, else `fallback`; anything else is an error. */
function count (name, fallback) {
  const text = process.env[name]
  if (text === undefined || text === '') return fallback
  const n = Number(text)
  if (!Number.isInteger(n) || n < 1) throw new Error(`${name} must be a positive integer, not ${JSON.stringify(text)}`)
  return n
}

/**
 * Seconds a file's tests took in a whole `npm test` on 2 cores (the type check, the Python tests
 * and the four groups all running), for balancing: under that contention a file's time follows
 * its CPU (its child processes' included) more than its waits. Files not listed are light.
 */
const WEIGHTS = {
  'test/integration/package-install.test.ts': 33,
  'test/integration/dispatch.test.ts': 24,
  'test/integration/dispatch-properties.test.ts': 14,
  'test/integration/validation-hostile.test.ts': 12,
  'test/integration/mcp-bridge.test.ts': 22,
  'test/integration/call-task.test.ts': 8,
  'test/integration/console-browser.test.ts': 6,
  'test/integration/mcp-transport.test.ts': 6,
  'test/integration/callback-client.test.ts': 8,
  'test/integration/registry-properties.test.ts': 5,
  'test/integration/events-properties.test.ts': 5,
  'test/integration/mcp-properties.test.ts': 10,
  'test/integration/plugin-properties.test.ts': 9,
  'test/integration/guard-properties.test.ts': 7,
  'test/integration/realtime-properties.test.ts': 4,
  'test/integration/console-properties.test.ts': 12,
  'test/integration/config-properties.test.ts': 10,
  'test/integration/openapi-properties.test.ts': 10,
  'test/integration/health-properties.test.ts': 9,
  'test/integration/results-properties.test.ts': 8,
  'test/integration/local-definitions-properties.test.ts': 7,
  'test/integration/ownership-properties.test.ts': 7,
  'test/integration/transport-properties.test.ts': 7,
  'test/integration/lifecycle-properties.test.ts': 12,
  'test/integration/callback-security-properties.test.ts': 12,
  'test/integration/metrics-properties.test.ts': 9,
  'test/integration/bridge-properties.test.ts': 18,
  'test/integration/secrets-properties.test.ts': 11,
  'test/integration/sdk-differential-properties.test.ts': 16,
  'test/integration/sdk-client-hostile-properties.test.ts': 12,
  'test/integration/plugin-sdk.test.ts': 4,
  'test/integration/worker-module.test.ts': 4,
  'test/integration/plugin-replies.test.ts': 4,
  'test/integration/cli.test.ts': 3,
  'test/integration/mcp-python.test.ts': 3,
  'test/integration/events-stream.test.ts': 3,
  'test/integration/netns.test.ts': 3,
  'test/integration/mcp-conformance.test.ts': 3,
  'test/integration/connections.test.ts': 2,
  'test/unit/json-scan.test.ts': 2,
  'test/integration/dispatch-bounds.test.ts': 2,
  'test/integration/docs-claims.test.ts': 10,
  'test/integration/leak-properties.test.ts': 25,
  'test/integration/embedding-properties.test.ts': 3
}
const DEFAULT_WEIGHT = 1

/**
 * Files that run first in their group, before any other file's test: a heap measurement
 * (validation-hostile's leak test) wants no other file's tests before it in the process.
 */
const FIRST = ['test/integration/validation-hostile.test.ts']

/**
 * Files that must never run at the same time, so each set goes into one group, run one after
 * the other. The netns test adds network interfaces, and chromium aborts the page loads it has in
 * flight when the machine's network changes (net::ERR_NETWORK_CHANGED).
 */
const APART = [['test/integration/netns.test.ts', 'test/integration/console-browser.test.ts']]

function testFiles () {
  const files = []
  for (const dir of ['unit', 'integration']) {
    for (const name of readdirSync(join(ROOT, 'test', dir)).sort()) {
      if (name.endsWith('.test.ts')) files.push(`test/${dir}/${name}`)
    }
  }
  return files
}

/**
 * Longest first onto the lightest group, an APART set as one unit; each group keeps FIRST files
 * ahead of the rest.
 */
function plan (files) {
  const groups = Array.from({ length: SHARDS }, () => ({ files: [], weight: 0 }))
  const units = APART.map((set) => set.filter((f) => files.includes(f))).filter((set) => set.length > 0)
  for (const file of files) if (!units.some((unit) => unit.includes(file))) units.push([file])
  const weight = (unit) => unit.reduce((sum, f) => sum + (WEIGHTS[f] ?? DEFAULT_WEIGHT), 0)
  for (const unit of units.sort((a, b) => weight(b) - weight(a) || a[0].localeCompare(b[0]))) {
    const lightest = groups.reduce((min, g) => (g.weight < min.weight ? g : min))
    lightest.files.push(...unit)
    lightest.weight += weight(unit)
  }
  for (const g of groups) g.files.sort((a, b) => Number(FIRST.includes(b)) - Number(FIRST.includes(a)))
  return groups.filter((g) => g.files.length > 0).sort((a, b) => b.weight - a.weight)
}

const args = process.argv.slice(2)
const flags = args.filter((a) => a.startsWith('-'))
const named = args.filter((a) => !a.startsWith('-'))

const watch = flags.find((f) => /^--watch($|=|-)/.test(f))
if (watch !== undefined) {
  console.error(`${watch} would watch the bundles, not the sources: run \`node --import tsx --test --watch <file>\``)
  process.exitCode = 2
} else {
  const build = spawnSync('bash', [join(ROOT, 'scripts/build-if-stale.sh')], { stdio: 'inherit' })
  if (build.status !== 0) process.exitCode = build.status ?? 1
  else await run()
}

async function run () {
  // Inside the checkout (node_modules/.cache), so that the packages the bundles leave out resolve
  // from its node_modules as they do from the sources.
  const cacheDir = join(ROOT, 'node_modules/.cache/toolport')
  mkdirSync(cacheDir, { recursive: true })
  removeStaleBundles(cacheDir)
  const dir = mkdtempSync(join(cacheDir, 'test-bundles-'))
  const cleanup = () => rmSync(dir, { recursive: true, force: true })
  let child = null
  for (const signal of ['SIGINT', 'SIGTERM']) {
    process.on(signal, () => {
      // The test processes end on the signal, and their end cleans up; before they run, stop here.
      if (child !== null) {
        child.kill(signal)
      } else {
        cleanup()
        process.removeAllListeners(signal)
        process.kill(process.pid, signal)
      }
    })
  }

  /** Bundle name → the test files it runs, in order. */
  const bundles = new Map()
  if (named.length > 0) {
    named.forEach((f, i) => bundles.set(`${i + 1}-${basename(f, '.ts')}`, [resolve(f)]))
  } else {
    plan(testFiles()).forEach((g, i) => {
      bundles.set(`group-${i + 1}`, g.files.map((f) => join(ROOT, f)))
      console.log(`# group-${i + 1}: ${g.files.map((f) => relative('test', f)).join(' ')}`)
    })
  }
  let outputs
  try {
    outputs = await bundleTests(bundles, dir)
  } catch (err) {
    cleanup()
    console.error(`the test files do not bundle: ${err.message}`)
    process.exitCode = 1
    return
  }

  // Node picks TAP for a pipe and spec for a terminal; the output goes through a pipe here (see
  // below), so a terminal is asked for spec (in colour) as `node --test` would pick it.
  const tty = process.stdout.isTTY === true && !flags.some((f) => f.startsWith('--test-reporter'))
  const colour = tty && process.env.NO_COLOR === undefined
  const env = withTestTmpdir(colour ? { ...process.env, FORCE_COLOR: '1' } : process.env)
  const reporter = tty ? ['--test-reporter=spec'] : []
  child = spawn(process.execPath, ['--test', `--test-concurrency=${CONCURRENCY}`, ...reporter, ...flags, ...outputs],
    { cwd: ROOT, stdio: ['inherit', 'pipe', 'pipe'], env })
  child.on('error', (err) => { console.error(`node --test did not start: ${err.message}`) })
  // Positions in a bundle, in locations and stack traces, are reported at their source.
  const toSource = sourcePositions(dir)
  createInterface({ input: child.stdout }).on('line', (line) => { process.stdout.write(`${toSource(line)}\n`) })
  createInterface({ input: child.stderr }).on('line', (line) => { process.stderr.write(`${toSource(line)}\n`) })
  child.on('close', (code, signal) => {
    cleanup()
    process.exitCode = code ?? (signal === null ? 1 : 128)
  })
}

/** Removes bundle directories a run left behind (killed before it could) more than a day ago. */
function removeStaleBundles (cacheDir) {
  for (const entry of readdirSync(cacheDir, { withFileTypes: true })) {
    const path = join(cacheDir, entry.name)
    const stale = entry.isDirectory() && entry.name.startsWith('test-bundles-') &&
      statSync(path).mtimeMs < Date.now() - 86_400_000
    if (stale) rmSync(path, { recursive: true, force: true })
  }
}

/**
 * Bundles each entry's test files, with the Toolport modules they import, into `<dir>/<name>.mjs`
 * (one esbuild run for all; see the top of this file for why). Packages stay imports, resolved
 * from the checkout's node_modules.
 *
 * Each source keeps its own `import.meta.url` (its file, not the bundle's), so the paths the
 * tests and Toolport resolve from it (fixtures, the console's files, worker modules) are found
 * where they are. Resolves with the bundles' paths.
 */
async function bundleTests (bundles, dir) {
  const entryPoints = []
  for (const [name, files] of bundles) {
    const entry = join(dir, `${name}.entry.mjs`)
    writeFileSync(entry, files.map((f) => `import ${JSON.stringify(f)}\n`).join(''))
    entryPoints.push({ in: entry, out: name })
  }
  // Each source declares its own URL (on its first line, so no line moves in the source maps), and
  // `import.meta.url` in it becomes that binding: esbuild's define works on the syntax, per module.
  const ownUrls = {
    name: 'own-import-meta-url',
    setup (b) {
      b.onLoad({ filter: /\.ts$/ }, async ({ path }) => {
        const source = await readFile(path, 'utf8')
        const declaration = `const ${OWN_URL} = ${JSON.stringify(pathToFileURL(path).href)};`
        // After a `#!` line, which must stay first.
        const at = source.startsWith('#!') ? source.indexOf('\n') + 1 : 0
        return { contents: source.slice(0, at) + declaration + source.slice(at), loader: 'ts' }
      })
    }
  }
  await esbuild({
    absWorkingDir: ROOT,
    entryPoints,
    outdir: dir,
    outExtension: { '.js': '.mjs' },
    bundle: true,
    platform: 'node',
    format: 'esm',
    target: 'node20',
    packages: 'external',
    sourcemap: 'linked',
    plugins: [ownUrls],
    define: { 'import.meta.url': OWN_URL },
    logLevel: 'error'
  }).finally(() => stopEsbuild())
  return [...bundles.keys()].map((name) => join(dir, `${name}.mjs`))
}

/**
 * A function that rewrites every `<dir>/<bundle>.mjs:line:column` in a line of test output to the
 * source file's path, line and column (from the bundle's source map, read on first use).
 */
function sourcePositions (dir) {
  const maps = new Map()
  const escape = (text) => text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')
  // A stack frame of an ES module names it by URL (percent-encoded), a location by path.
  const position = new RegExp(`(?:(${escape(pathToFileURL(dir).href)})|${escape(dir)})` +
    '/([^/:]+?\\.mjs):(\\d+)(?::(\\d+))?', 'g')
  return (line) => line.replace(position, (match, url, file, row, column = '1') => {
    const name = url === undefined ? file : decodeURIComponent(file)
    let map = maps.get(name)
    if (map === undefined) {
      try {
        map = new SourceMap(JSON.parse(readFileSync(join(dir, `${name}.map`), 'utf8')))
      } catch {
        map = null
      }
      maps.set(name, map)
    }
    const entry = map?.findEntry(Number(row) - 1, Number(column) - 1)
    if (entry?.originalSource === undefined) return match
    const source = resolve(dir, entry.originalSource)
    const where = url === undefined ? source : pathToFileURL(source).href
    return `${where}:${entry.originalLine + 1}:${entry.originalColumn + 1}`
  })
}
