#!/usr/bin/env node
// The Node test suite: node:test over test/unit and test/integration, under tsx.
//
//   node scripts/test-node.mjs                      every test file, in a few shared processes
//   node scripts/test-node.mjs test/unit/x.test.ts  the files named, each in its own process
//   node scripts/test-node.mjs --test-name-pattern=R13 [files…]   node --test flags pass through
//
// Why shards: `node --test` starts one process per file, and each pays Node's start, tsx's and
// the loading of Toolport's modules (fastify, ajv, the MCP SDK, …): about 1.3 s of CPU, which
// over ~50 files was a third of the suite's CPU on a 2-core machine. Node 20 has no
// `--test-isolation=none`, so the whole-suite run writes a few entry files (to a temporary
// directory) that each import a group of test files: their top-level tests register in that one
// process and run one after another, as they do within a file. The runner still reports every
// test by name with the file it was declared in, and prints the one summary of the whole run.
//
// Every test/*/*.test.ts file runs, whether listed below or not: a file not in WEIGHTS counts
// DEFAULT_WEIGHT. The groups are balanced by the weights (seconds measured in a whole run) so
// the processes end together. ISOLATED files keep a process of their own.
import { spawn, spawnSync } from 'node:child_process'
import { mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, relative, resolve } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'
import { withTestTmpdir } from './test-tmpdir.mjs'

const ROOT = fileURLToPath(new URL('..', import.meta.url))

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
  'test/integration/package-install.test.ts': 26,
  'test/integration/dispatch.test.ts': 23,
  'test/integration/validation-hostile.test.ts': 15,
  'test/integration/mcp-bridge.test.ts': 14,
  'test/integration/call-task.test.ts': 11,
  'test/integration/events-stream.test.ts': 7,
  'test/integration/callback-client.test.ts': 7,
  'test/integration/console-browser.test.ts': 6,
  'test/integration/mcp-transport.test.ts': 5,
  'test/integration/plugin-sdk.test.ts': 5,
  'test/integration/cli.test.ts': 4,
  'test/unit/json-scan.test.ts': 4,
  'test/integration/worker-module.test.ts': 4,
  'test/integration/mcp-conformance.test.ts': 4,
  'test/integration/definitions-size.test.ts': 3,
  'test/integration/plugin-replies.test.ts': 3,
  'test/integration/netns.test.ts': 3,
  'test/integration/dispatch-bounds.test.ts': 2,
  'test/integration/api-unregister-clear.test.ts': 2,
  'test/integration/connections.test.ts': 2,
  'test/integration/ownership.test.ts': 2,
  'test/integration/mcp-python.test.ts': 2
}
const DEFAULT_WEIGHT = 1

/**
 * Files that run first in their group, before any other file's test: a heap measurement
 * (validation-hostile's leak test) wants no other file's tests before it in the process.
 */
const FIRST = ['test/integration/validation-hostile.test.ts']

/** Files that keep a process of their own (none need one today; flags of their own would). */
const ISOLATED = []

function testFiles () {
  const files = []
  for (const dir of ['unit', 'integration']) {
    for (const name of readdirSync(join(ROOT, 'test', dir)).sort()) {
      if (name.endsWith('.test.ts')) files.push(`test/${dir}/${name}`)
    }
  }
  return files
}

/** Longest first onto the lightest group; each group keeps FIRST files ahead of the rest. */
function plan (files) {
  const groups = Array.from({ length: SHARDS }, () => ({ files: [], weight: 0 }))
  const weight = (f) => WEIGHTS[f] ?? DEFAULT_WEIGHT
  const shared = files.filter((f) => !ISOLATED.includes(f))
  for (const file of [...shared].sort((a, b) => weight(b) - weight(a) || a.localeCompare(b))) {
    const lightest = groups.reduce((min, g) => (g.weight < min.weight ? g : min))
    lightest.files.push(file)
    lightest.weight += weight(file)
  }
  for (const g of groups) g.files.sort((a, b) => Number(FIRST.includes(b)) - Number(FIRST.includes(a)))
  return groups.filter((g) => g.files.length > 0).sort((a, b) => b.weight - a.weight)
}

const args = process.argv.slice(2)
const flags = args.filter((a) => a.startsWith('-'))
const named = args.filter((a) => !a.startsWith('-'))
// Node picks TAP for a pipe and spec for a terminal: the same as `node --test` run by hand.
const node = (entries) => [process.execPath, ['--import', 'tsx', '--test', `--test-concurrency=${CONCURRENCY}`,
  ...flags, ...entries]]

const build = spawnSync('bash', [join(ROOT, 'scripts/build-if-stale.sh')], { stdio: 'inherit' })
if (build.status !== 0) {
  process.exitCode = build.status ?? 1
} else {
  run()
}

function run () {
  let entries
  let cleanup = () => {}
  if (named.length > 0) {
    entries = named.map((f) => resolve(f))
  } else {
    const dir = mkdtempSync(join(tmpdir(), 'toolport-test-shards-'))
    cleanup = () => rmSync(dir, { recursive: true, force: true })
    const groups = plan(testFiles())
    entries = []
    groups.forEach((g, i) => {
      const entry = join(dir, `group-${i + 1}.mjs`)
      writeFileSync(entry, `// ${g.files.length} test files, weight ${g.weight}\n` +
      g.files.map((f) => `import ${JSON.stringify(pathToFileURL(join(ROOT, f)).href)}\n`).join(''))
      entries.push(entry)
      console.log(`# group-${i + 1}: ${g.files.map((f) => relative('test', f)).join(' ')}`)
    })
    for (const f of ISOLATED) entries.push(f)
  }

  const [cmd, cmdArgs] = node(entries)
  // Temporary files on a RAM file system when there is one (see test-tmpdir.mjs).
  const child = spawn(cmd, cmdArgs, { cwd: ROOT, stdio: 'inherit', env: withTestTmpdir(process.env) })
  for (const signal of ['SIGINT', 'SIGTERM']) process.on(signal, () => child.kill(signal))
  child.on('exit', (code, signal) => {
    cleanup()
    process.exitCode = code ?? (signal === null ? 1 : 128)
  })
}
