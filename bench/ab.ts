// `npm run ab -- --baseline DIR [flags]`: one dispatch path of this tree against the same path of
// another checkout, each repetition in fresh processes, interleaved (this, baseline, baseline,
// this, …).
//
//   --baseline DIR           a checkout of Toolport with its own node_modules (and a fresh dist/)
//   --path pool|inline|raw|route|mcp   the path (default pool); route: POST /api/tools/call under
//                            autocannon; mcp: the same call as MCP tools/call on one session (c ≤ 32)
//   --reply small|large      ~100 B or 64 KiB replies (default small)
//   -c N                     callers in the closed loop (default 128)
//   --seconds N              measured window per run, after a steady warm-up (default 4)
//   --reps N                 repetitions, each one run of each tree (default 3)
//   --out NAME               also write bench/results/NAME.md
//   --harness own|this       whose bench/fixtures/profile-target.ts runs the baseline: its own
//                            (default when it has one that knows --path), or this tree's, loading
//                            the baseline's createToolport (a tree older than this harness)
//   --baseline-build         the baseline's build (dist/main/index.js, what `npm start` runs)
//                            instead of its sources under tsx; implies --harness this. With
//                            `--baseline .` it measures what running the sources costs the bench
//
// Why processes of their own: `npm run bench -- --baseline` runs both trees in one process, which
// is right for most changes (same machine state, windows a second apart), but not for a change to
// how much garbage a path leaves: what one path leaves in the old generation is collected during
// the next path's window. A change that stopped large replies from surviving into the old
// generation measured 2× less CPU per call here, and slower than its baseline inside one bench
// process. Each run here is `bench/fixtures/profile-target.ts` (the process `npm run profile`
// samples) in its own tree: its own callback server, a warm-up until CPU per call is steady, one
// window, and the same per-thread schedstat accounting as the bench.
import { spawnSync } from 'node:child_process'
import { existsSync, readFileSync } from 'node:fs'
import { writeFile } from 'node:fs/promises'
import { basename, join, resolve } from 'node:path'
import { distIsFresh } from '../src/main/dispatch/worker-module.js'
import type { CpuPerCall } from './lib/cpu.js'
import { BENCH_DIR, readTargetFlag, runProfileTarget, settleTargetFlags } from './lib/processes.js'
import { MCP_MAX_CONCURRENCY } from './lib/mcp-session.js'
import type { ProfileTargetOptions, ProfileTargetResult, TargetFlags } from './lib/processes.js'
import { fmtRate, fmtRatio, fmtStat, fmtUs, pairedRatio, stat } from './lib/stats.js'

interface Flags extends TargetFlags {
  baseline: string
  reps: number
  out: string
  /** Whose profile target runs the baseline (see the header); '' until settled. */
  harness: 'own' | 'this' | ''
  /** The baseline's dist/ instead of its sources (in this tree's harness). */
  baselineBuild: boolean
}

const USAGE = 'usage: npm run ab -- --baseline DIR [--path pool|inline|raw|route|mcp] [--reply small|large] ' +
  '[-c N] [--seconds N] [--reps N] [--out NAME] [--harness own|this] [--baseline-build]'
const THIS_TREE = resolve(BENCH_DIR, '..')

function parseFlags (argv: readonly string[]): Flags {
  const flags: Flags = {
    baseline: '', path: 'pool', reply: 'small', concurrency: 128, seconds: 4, reps: 3, out: '', harness: '', baselineBuild: false
  }
  for (let i = 0; i < argv.length; i++) {
    const flag = argv[i] as string
    const value = argv[i + 1]
    const text = (): string => {
      if (value === undefined || value === '') fail(`${flag} needs a value`)
      i++
      return value
    }
    const number = (max: number): number => {
      const n = Number(text())
      if (!Number.isInteger(n) || n < 1 || n > max) fail(`${flag} needs an integer from 1 to ${max}`)
      return n
    }
    if (readTargetFlag(flag, value, flags, fail)) {
      i++
      continue
    }
    switch (flag) {
      case '--baseline': flags.baseline = resolve(text()); break
      case '--reps': flags.reps = number(50); break
      case '--harness': {
        const harness = text()
        if (harness !== 'own' && harness !== 'this') fail('--harness is own or this')
        flags.harness = harness
        break
      }
      case '--baseline-build': flags.baselineBuild = true; break
      case '--out':
        flags.out = text()
        if (!/^[\w.-]+$/.test(flags.out)) fail('--out must be a plain file name')
        break
      case '--help': case '-h':
        process.stdout.write(USAGE + '\n')
        process.exit(0)
        break
      default: fail(`unknown flag ${flag}`)
    }
  }
  if (flags.baseline === '') fail('--baseline is required')
  if (!existsSync(join(flags.baseline, 'src/main/index.ts'))) fail(`${flags.baseline} is not a Toolport checkout`)
  if (!existsSync(join(flags.baseline, 'node_modules'))) fail(`${flags.baseline} has no node_modules (run npm ci there)`)
  // An older profile target runs raw undici for a path it does not know: never compare against
  // that. Such a tree (or one with no profile target) runs in this tree's harness instead.
  const targetFile = join(flags.baseline, 'bench/fixtures/profile-target.ts')
  const baselineTarget = existsSync(targetFile) ? readFileSync(targetFile, 'utf8') : ''
  const ownKnowsPath = baselineTarget !== '' &&
    ((flags.path !== 'route' && flags.path !== 'mcp') || baselineTarget.includes(`'${flags.path}'`))
  if (flags.harness === 'own' && !ownKnowsPath) {
    fail(`the baseline's bench/fixtures/profile-target.ts is missing or has no --path ${flags.path} (use --harness this)`)
  }
  if (flags.baselineBuild) {
    if (flags.harness === 'own') fail('--baseline-build runs the baseline in this tree\'s harness (--harness this)')
    if (!existsSync(join(flags.baseline, 'dist/main/index.js'))) fail(`${flags.baseline} has no dist/ (run npm run build there)`)
    flags.harness = 'this'
  }
  if (flags.harness === '') flags.harness = ownKnowsPath ? 'own' : 'this'
  if (flags.harness === 'this' && flags.path === 'raw') fail('--path raw runs no Toolport: --harness this would compare this tree with itself')
  settleTargetFlags(flags, MCP_MAX_CONCURRENCY, fail)
  return flags
}

function fail (message: string): never {
  process.stderr.write(`ab: ${message}\n${USAGE}\n`)
  process.exit(2)
}

function step (message: string): void {
  process.stderr.write(`ab: ${message}\n`)
}

/** The tree's commit (`abc1234`, `+ changes` when its work tree differs), else its folder's name. */
function describeTree (tree: string): string {
  const head = spawnSync('git', ['-C', tree, 'rev-parse', '--short', 'HEAD'], { encoding: 'utf8' })
  if (head.status !== 0) return basename(tree)
  const status = spawnSync('git', ['-C', tree, 'status', '--porcelain', '--untracked-files=no'], { encoding: 'utf8' })
  return `${head.stdout.trim()}${status.stdout.trim() === '' ? '' : ' + changes'}`
}

function cpuText (cpu: CpuPerCall | null): string {
  if (cpu === null) return '–'
  const mark = cpu.contended ? '*' : ''
  return `${cpu.processUs.toFixed(0)} · ${cpu.mainThreadUs.toFixed(0)} · ${cpu.workerUs.toFixed(0)} · ` +
    `${cpu.otherUs.toFixed(0)} · ${cpu.peerUs.toFixed(0)}${mark}`
}

function report (flags: Flags, runs: { tree: ProfileTargetResult[], baseline: ProfileTargetResult[] }): string {
  const lines: string[] = []
  const what = `${flags.path}, ${flags.reply === 'large' ? '64 KiB' : '100 B'} replies, c=${flags.concurrency}`
  lines.push(`# A/B in separate processes: ${what}`, '')
  lines.push(`${new Date().toISOString()} · this tree (${describeTree(THIS_TREE)}) against the baseline ` +
    `(${describeTree(flags.baseline)}${flags.baselineBuild ? ', its build (dist/)' : ''}, ` +
    `${flags.harness === 'own' ? 'in its own harness' : 'in this tree\'s harness'}) · ` +
    `${flags.reps} repetitions of ${flags.seconds} s windows, interleaved · Node ${process.version}`, '')
  lines.push('| rep | tree | req/s | p50 | CPU µs/call: process · main · workers · other · server | failed |')
  lines.push('| --: | :-- | --: | --: | --: | --: |')
  for (let i = 0; i < flags.reps; i++) {
    for (const [name, run] of [['this', runs.tree[i]], ['baseline', runs.baseline[i]]] as const) {
      if (run === undefined) continue
      lines.push(`| ${i + 1} | ${name} | ${fmtRate(run.rps)} | ${fmtUs(run.p50Us)} | ${cpuText(run.cpu)} | ` +
        `${run.errors === 0 ? '' : String(run.errors)} |`)
    }
  }
  const figure = (pick: (run: ProfileTargetResult) => number): [number[], number[]] =>
    [runs.tree.map(pick), runs.baseline.map(pick)]
  const [rpsA, rpsB] = figure((r) => r.rps)
  const [cpuA, cpuB] = figure((r) => r.cpu?.processUs ?? Number.NaN)
  const [mainA, mainB] = figure((r) => r.cpu?.mainThreadUs ?? Number.NaN)
  lines.push('', '| figure | this tree | baseline | this / baseline (per repetition) |', '| :-- | --: | --: | --: |')
  lines.push(`| req/s | ${fmtStat(stat(rpsA), fmtRate)} | ${fmtStat(stat(rpsB), fmtRate)} | ` +
    `${fmtStat(pairedRatio(rpsA, rpsB), fmtRatio)} |`)
  lines.push(`| CPU µs per call, process | ${fmtStat(stat(cpuA), fmtUs)} | ${fmtStat(stat(cpuB), fmtUs)} | ` +
    `${fmtStat(pairedRatio(cpuA, cpuB), fmtRatio)} |`)
  lines.push(`| CPU µs per call, main thread | ${fmtStat(stat(mainA), fmtUs)} | ${fmtStat(stat(mainB), fmtUs)} | ` +
    `${fmtStat(pairedRatio(mainA, mainB), fmtRatio)} |`)
  // The callback server does the same work per call for both trees, so its CPU per call tracks the
  // host's speed in each window; but also the load: a tree that drives it harder gets more requests
  // per wake-up and costs it less per call. Dividing by it is a rough correction, not an exact one.
  const [serverA, serverB] = figure((r) => r.cpu?.peerUs ?? Number.NaN)
  lines.push(`| CPU µs per call, callback server (same work per call: mostly the host's speed) | ${fmtStat(stat(serverA), fmtUs)} | ` +
    `${fmtStat(stat(serverB), fmtUs)} | ${fmtStat(pairedRatio(serverA, serverB), fmtRatio)} |`)
  const overServerA = cpuA.map((cpu, i) => cpu / (serverA[i] as number))
  const overServerB = cpuB.map((cpu, i) => cpu / (serverB[i] as number))
  lines.push(`| CPU per call, process, over the callback server's | ${fmtStat(stat(overServerA), fmtRatio)} | ` +
    `${fmtStat(stat(overServerB), fmtRatio)} | ${fmtStat(pairedRatio(overServerA, overServerB), fmtRatio)} |`)
  lines.push('', '- Each run is `bench/fixtures/profile-target.ts` in a process of its own: its own callback ' +
    'server, a warm-up until CPU per call is steady, then the window (see bench/ab.ts). ' +
    (flags.harness === 'own'
      ? 'Each tree runs its own profile target.'
      : 'Both run this tree\'s profile target; the baseline\'s with the baseline\'s createToolport (and its own ' +
        'server V8 setting, if it has one)' + (flags.baselineBuild
        ? ', loaded from its build (dist/main/index.js, as `npm start` runs it); this tree\'s main thread runs its ' +
          'sources under tsx.'
        : '.')),
  '- CPU µs per call from each thread\'s /proc/<pid>/task/<tid>/schedstat; `*`: other processes took more than ' +
    '25 % of the cores during that window.',
  '- Ratios are medians of per-repetition ratios (each run paired with the other tree\'s run of the same ' +
    'repetition); the order of the two trees alternates by repetition.',
  '- The callback server is a process of its own doing the same work per call in both trees\' runs: when its ' +
    'CPU per call differs between them, mostly the host\'s speed did, partly the load (a busier server spends ' +
    'less per call). The last row divides it out: a rough correction, not an exact one.')
  return lines.join('\n') + '\n'
}

async function main (): Promise<void> {
  const flags = parseFlags(process.argv.slice(2))
  for (const tree of [THIS_TREE, flags.baseline]) {
    // Under tsx a pool's workers load dist/ only when it is fresh, else the sources through tsx:
    // then the two trees would not run the same kind of worker.
    if (distIsFresh(tree)) continue
    if (flags.baselineBuild && tree === flags.baseline) fail(`${tree}/dist is older than its sources (npm run build there)`)
    step(`warning: ${tree}/dist is older than its sources (npm run build there): its workers load from source`)
  }
  const runs = { tree: [] as ProfileTargetResult[], baseline: [] as ProfileTargetResult[] }
  for (let rep = 0; rep < flags.reps; rep++) {
    const order = rep % 2 === 0 ? ['this', 'baseline'] as const : ['baseline', 'this'] as const
    for (const which of order) {
      step(`rep ${rep + 1}/${flags.reps}: ${which}`)
      const options: ProfileTargetOptions = {
        path: flags.path, route: flags.reply, concurrency: flags.concurrency, seconds: flags.seconds
      }
      if (which === 'baseline' && flags.harness === 'this') {
        options.toolport = flags.baseline
        options.toolportBuild = flags.baselineBuild
      }
      const run = await runProfileTarget(options,
        { tree: which === 'this' || flags.harness === 'this' ? THIS_TREE : flags.baseline })
      if (which === 'this') runs.tree.push(run)
      else runs.baseline.push(run)
    }
  }
  const text = report(flags, runs)
  process.stdout.write(text)
  if (flags.out !== '') {
    const file = join(BENCH_DIR, 'results', `${flags.out}.md`)
    await writeFile(file, text)
    step(`wrote ${file}`)
  }
}

await main()
