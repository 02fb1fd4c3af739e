#!/usr/bin/env node
// `npm test`: the type check, the Python SDK's tests and the Node suite, side by side.
//
// The three share nothing but dist/, which is built first (when stale) so that neither test run
// builds it under the other. They then run at once: most of the Python tests' time is spent
// waiting on processes and timers, and the type check is one thread, so together they fill the
// machine's cores where one after another they would leave them idle.
//
// Output: the Node suite's report streams as it runs; the type check's and the Python tests'
// output is printed whole, as a block, when each ends (so lines of different runs never
// interleave). The Node summary (`# tests …`, `# pass …`) is held back and printed last, after
// one status line per part, so the log still ends with the test runner's summary. The exit code
// is 0 only when all three passed.
import { spawn, spawnSync } from 'node:child_process'
import { createInterface } from 'node:readline'
import { getPriority, setPriority } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { stripVTControlCharacters } from 'node:util'
import { withTestTmpdir } from './test-tmpdir.mjs'

const ROOT = fileURLToPath(new URL('..', import.meta.url))

/**
 * The type check and the Node suite run at a lower CPU priority (nice +5) than the Python tests.
 * Those are one chain of steps (start a Toolport, wait for it, call, restart it, …) that needs
 * under one core; at equal priority the Node suite's four processes and their children took most
 * of the CPU and stretched that chain from ~35 s to ~120 s, making it the last part to end. Given
 * priority it ends in about its own time, and the other two, wide enough to use every core left,
 * take what the chain does not use (never less than one core). Only +5: against other work on
 * the machine at normal priority a Node test still gets a fair part of a core, not a tenth.
 */
const LOWER_PRIORITY = 5

// Every part's temporary files on a RAM file system when there is one (see test-tmpdir.mjs).
const ENV = withTestTmpdir(process.env)

const build = spawnSync('bash', [join(ROOT, 'scripts/build-if-stale.sh')], { cwd: ROOT, stdio: 'inherit' })
// The Python venv before anything runs: Node tests start a Python plugin from it (the callback
// servers' differential test) while pytest runs. Quick when it is current.
const venv = build.status === 0
  ? spawnSync('bash', [join(ROOT, 'scripts/test-python.sh'), '--setup-only'], { cwd: ROOT, stdio: 'inherit', env: ENV })
  : build
if (venv.status !== 0) {
  process.exitCode = venv.status ?? 1
} else {
  await main()
}

/**
 * Runs a command with its output piped; `onLine` gets each line of stdout and stderr as it
 * comes. Resolves with its exit code and how long it took.
 */
function run (name, command, args, onLine, env = ENV, niceness = 0) {
  const started = performance.now()
  const child = spawn(command, args, { cwd: ROOT, env, stdio: ['ignore', 'pipe', 'pipe'] })
  // Set before the command starts its own processes, which inherit it. Best effort: a priority
  // that cannot be set only costs time.
  if (niceness !== 0 && child.pid !== undefined) {
    try {
      setPriority(child.pid, Math.min(19, getPriority() + niceness))
    } catch {}
  }
  for (const signal of ['SIGINT', 'SIGTERM']) process.on(signal, () => child.kill(signal))
  createInterface({ input: child.stdout }).on('line', onLine)
  createInterface({ input: child.stderr }).on('line', onLine)
  return new Promise((resolve) => {
    child.on('error', (err) => {
      onLine(`${name}: ${err.message}`)
    })
    child.on('close', (code, signal) => {
      resolve({ name, code: code ?? (signal === null ? 1 : 128), seconds: (performance.now() - started) / 1000 })
    })
  })
}

/** Runs a command and prints its whole output as one block when it ends. */
async function block (name, command, args, niceness = 0) {
  const lines = []
  const result = await run(name, command, args, (line) => lines.push(line), ENV, niceness)
  process.stdout.write(`\n== ${name} (${result.code === 0 ? 'passed' : `FAILED, exit ${result.code}`}, ` +
    `${result.seconds.toFixed(1)} s)\n${lines.join('\n')}\n== end of ${name}\n\n`)
  return result
}

async function main () {
  const summary = []
  let held = false
  // A terminal gets the spec reporter, as `node --test` run by hand would show it; a pipe (CI, a
  // log file) the TAP reporter, whose summary lines start with `# tests`.
  const tty = process.stdout.isTTY === true
  const nodeSuite = run('node tests', process.execPath,
    [join(ROOT, 'scripts/test-node.mjs'), ...(tty ? ['--test-reporter=spec'] : [])], (line) => {
      if (!held && /^(# |ℹ )tests \d+$/.test(stripVTControlCharacters(line))) held = true
      if (held) summary.push(line)
      else process.stdout.write(`${line}\n`)
    }, tty ? { ...ENV, FORCE_COLOR: '1' } : ENV, LOWER_PRIORITY)
  const results = await Promise.all([
    // `npm run typecheck` without npm's own start, ~0.3 s of CPU.
    block('typecheck', process.execPath, [join(ROOT, 'scripts/typecheck.mjs')], LOWER_PRIORITY),
    block('python tests', 'bash', [join(ROOT, 'scripts/test-python.sh')]),
    nodeSuite
  ])
  process.stdout.write('\n')
  for (const r of results) {
    process.stdout.write(`== ${r.name}: ${r.code === 0 ? 'passed' : `FAILED (exit ${r.code})`} in ${r.seconds.toFixed(1)} s\n`)
  }
  process.stdout.write(`${summary.join('\n')}\n`)
  process.exitCode = results.every((r) => r.code === 0) ? 0 : 1
}
