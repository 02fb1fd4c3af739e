// The bench entry: `npm run bench [-- flags]` (node --import tsx bench/run.ts).
//
//   --quick          every scenario, small counts, ~2 min (CI smoke test; no thresholds)
//   --scope a,b      only these scenarios (dispatch, mixed, e2e, control, micro, peers, memory, events;
//                    `tuning`, the pool settings one at a time, runs only when named)
//   --json           machine-readable report on stdout instead of the tables
//   --no-write       do not write bench/results/*
//   --reps N         repetitions of each interleaved comparison (default 5, quick 2)
//   --out NAME       results file name (default: latest; quick: quick; a --scope run: scoped)
//   --baseline DIR   another checkout of Toolport (its node_modules may be a symlink): its pool and
//                    inline paths run interleaved beside this tree's in `dispatch` (A/B in one run)
//   --paths a,b      `dispatch` only runs these paths (raw undici always runs: it is the floor)
//
// Progress goes to stderr. Targets are reported as met / NOT met and never fail the run; the exit
// code is 1 only when a scenario crashed.
import { mkdir, readFile, writeFile } from 'node:fs/promises'
import { cpus, loadavg, release, totalmem, type } from 'node:os'
import { fileURLToPath } from 'node:url'
import { dispatchScenario } from './dispatch.bench.js'
import { mixedScenario } from './mixed.bench.js'
import { e2eScenario } from './e2e.bench.js'
import { controlScenario } from './control.bench.js'
import { microScenario } from './micro.bench.js'
import { peersScenario } from './peers.bench.js'
import { memoryScenario } from './memory.bench.js'
import { tuningScenario } from './tuning.bench.js'
import { eventsScenario } from './events.bench.js'
import { CONTENDED_SHARE, runForeignShare, runMeterStart, windowCounts } from './lib/cpu.js'
import { Progress } from './lib/progress.js'
import { startCallbackServer } from './lib/processes.js'
import { renderChart } from './lib/svg.js'
import { renderMarkdown, renderText } from './lib/report.js'
import type { BenchContext, MachineInfo, RunReport, Scenario, ScenarioReport } from './lib/report.js'
import { applyServerV8Flags } from '../src/main/v8-flags.js'

// Toolport is measured as `toolport serve` runs it: with the server's V8 setting (see
// src/main/v8-flags.ts and bench/README.md, "Two GC regimes"). Baselines share the process.
applyServerV8Flags(process.execArgv)

const SCENARIOS: readonly Scenario[] = [
  dispatchScenario, mixedScenario, e2eScenario, controlScenario, microScenario, peersScenario, memoryScenario,
  tuningScenario,
  eventsScenario
]
/** Run only when named in --scope. */
const OPT_IN = new Set(['tuning'])

interface Flags {
  isQuick: boolean
  scopes: string[]
  isJson: boolean
  shouldWrite: boolean
  reps: number
  out: string
  baseline: string | null
  paths: string[] | null
}

const USAGE = `usage: npm run bench -- [--quick] [--scope ${SCENARIOS.map((s) => s.name).join(',')}] [--json] [--no-write] [--reps N] [--out NAME] [--baseline DIR] [--paths a,b]`

function parseFlags (argv: readonly string[]): Flags {
  let isQuick = false
  let isJson = false
  let shouldWrite = true
  let scopes: string[] = []
  let reps = 0
  let out = ''
  let baseline: string | null = null
  let paths: string[] | null = null
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i] as string
    const [name, inline] = arg.includes('=')
      ? [arg.slice(0, arg.indexOf('=')), arg.slice(arg.indexOf('=') + 1)]
      : [arg,
          undefined]
    const value = (): string => {
      const v = inline ?? argv[++i]
      if (v === undefined || v === '') fail(`${name} needs a value`)
      return v
    }
    switch (name) {
      case '--quick': isQuick = true; break
      case '--json': isJson = true; break
      case '--no-write': shouldWrite = false; break
      case '--scope': scopes = value().split(',').map((s) => s.trim()).filter((s) => s !== ''); break
      case '--reps': reps = Number(value()); break
      case '--out': out = value(); break
      case '--baseline': baseline = value(); break
      case '--paths': paths = value().split(',').map((s) => s.trim()).filter((s) => s !== ''); break
      case '--help': case '-h':
        process.stdout.write(USAGE + '\n')
        process.exit(0)
        break
      default: fail(`unknown flag ${arg}`)
    }
  }
  const known = new Set(SCENARIOS.map((s) => s.name))
  for (const scope of scopes) if (!known.has(scope)) fail(`unknown scope '${scope}'`)
  if (!(Number.isInteger(reps) && reps >= 0 && reps <= 50)) fail('--reps must be an integer from 1 to 50')
  if (out !== '' && !/^[\w.-]+$/.test(out)) fail('--out must be a plain file name')
  const isAll = scopes.length === 0
  return {
    isQuick,
    scopes: isAll ? SCENARIOS.filter((s) => !OPT_IN.has(s.name)).map((s) => s.name) : scopes,
    isJson,
    shouldWrite,
    // Five, not three: on this VM a whole measuring window sometimes runs at half speed, and a
    // median of three moved a ratio from 0.89× to 0.65× when two of its windows did.
    reps: reps > 0 ? reps : isQuick ? 2 : 5,
    out: out !== '' ? out : isQuick ? 'quick' : isAll && baseline === null && paths === null ? 'latest' : 'scoped',
    baseline,
    paths
  }
}

function fail (message: string): never {
  process.stderr.write(`bench: ${message}\n${USAGE}\n`)
  process.exit(2)
}

async function packageVersion (name: string): Promise<string> {
  try {
    const file = fileURLToPath(new URL(`../node_modules/${name}/package.json`, import.meta.url))
    return (JSON.parse(await readFile(file, 'utf8')) as { version: string }).version
  } catch {
    return '?'
  }
}

async function machineInfo (): Promise<MachineInfo> {
  const versions: Record<string, string> = {}
  for (const name of ['undici', 'piscina', 'fastify']) versions[name] = await packageVersion(name)
  return {
    cpu: (cpus()[0]?.model ?? 'unknown CPU').replace(/\s+/g, ' ').trim(),
    cores: cpus().length,
    memoryGB: Math.round(totalmem() / 1024 ** 3),
    os: `${type()} ${release()}`,
    node: process.version,
    versions,
    loadAverageBefore: loadavg(),
    loadAverageAfter: [],
    foreignCpuShare: null,
    contendedWindows: { measured: 0, contended: 0 }
  }
}

async function main (): Promise<void> {
  const flags = parseFlags(process.argv.slice(2))
  const progress = new Progress(true)
  const machine = await machineInfo()
  const selected = SCENARIOS.filter((s) => flags.scopes.includes(s.name))
  const started = performance.now()
  progress.note(`bench: ${flags.isQuick ? 'quick' : 'full'} run of ${selected.map((s) => s.name).join(', ')}, ${flags.reps} repetitions; load average ${machine.loadAverageBefore.map((l) => l.toFixed(2)).join(' ')}`)
  const server = await startCallbackServer()
  const runMeter = runMeterStart(server.pid)
  let foreign: number | null = null
  const ctx: BenchContext = {
    isQuick: flags.isQuick, reps: flags.reps, progress, server, baseline: flags.baseline, paths: flags.paths
  }
  for (const scenario of selected) progress.plan(scenario.steps(ctx))
  const reports: ScenarioReport[] = []
  // Scenarios that threw: their sections say only "skipped" and their targets are missing from
  // the table, so they also lead the report's warnings (and the run exits with code 1).
  const crashes: { name: string, message: string }[] = []
  try {
    for (const scenario of selected) {
      progress.scenario(scenario.name)
      const t0 = performance.now()
      try {
        const result = await scenario.run(ctx)
        reports.push({ name: scenario.name, title: scenario.title, ...result, durationMs: performance.now() - t0 })
      } catch (err) {
        const message = err instanceof Error ? err.message : String(err)
        crashes.push({ name: scenario.name, message })
        progress.note(`${scenario.name} crashed: ${err instanceof Error ? (err.stack ?? message) : message}`)
        reports.push({
          name: scenario.name,
          title: scenario.title,
          skipped: `crashed: ${message}`,
          tables: [],
          checks: [],
          notes: [],
          data: null,
          durationMs: performance.now() - t0
        })
      }
    }
  } finally {
    foreign = runForeignShare(runMeter)
    await server.close()
  }
  machine.loadAverageAfter = loadavg()
  machine.foreignCpuShare = foreign
  machine.contendedWindows = { ...windowCounts }
  const warnings: string[] = []
  for (const { name, message } of crashes) {
    warnings.push(`scenario \`${name}\` crashed, so its figures and targets are missing: ${message} ` +
      '(the run exits with code 1)')
  }
  if (foreign !== null && foreign > 0.1) {
    warnings.push(`other processes took about ${(foreign * 100).toFixed(0)} % of the cores while the bench ran: ` +
      'absolute figures are low and noisy; the interleaved ratios and CPU µs per call are the figures to read')
  }
  if (windowCounts.contended > 0) {
    warnings.push(`${windowCounts.contended} of ${windowCounts.measured} measuring windows had more than ` +
      `${(CONTENDED_SHARE * 100).toFixed(0)} % of the cores taken by other processes (marked * in the CPU columns)`)
  }
  const report: RunReport = {
    suite: 'toolport-bench',
    date: new Date().toISOString(),
    mode: flags.isQuick ? 'quick' : 'full',
    scopes: flags.scopes,
    machine,
    durationS: (performance.now() - started) / 1000,
    warnings,
    scenarios: reports,
    checks: reports.flatMap((r) => r.checks)
  }
  progress.finish()
  if (flags.shouldWrite) await writeResults(report, flags.out, progress)
  const output = flags.isJson ? JSON.stringify(report, null, 2) + '\n' : renderText(report)
  process.stdout.write(output, () => {
    process.exit(crashes.length > 0 ? 1 : 0)
  })
}

async function writeResults (report: RunReport, name: string, progress: Progress): Promise<void> {
  const dir = new URL('./results/', import.meta.url)
  await mkdir(dir, { recursive: true })
  const series = report.scenarios.flatMap((s) => s.chart ?? [])
  let chartFile: string | null = null
  if (series.length > 0) {
    chartFile = name === 'latest' ? 'latency.svg' : `${name}-latency.svg`
    const title = `Toolport dispatch (${report.mode} run, ${report.date.slice(0, 10)}, Node ${report.machine.node}, ${report.machine.cores} cores)`
    await writeFile(new URL(chartFile, dir), renderChart(series, title))
  }
  await writeFile(new URL(`${name}.json`, dir), JSON.stringify(report, null, 2) + '\n')
  await writeFile(new URL(`${name}.md`, dir), renderMarkdown(report, chartFile))
  progress.note(`bench: wrote bench/results/${name}.json, ${name}.md${chartFile === null ? '' : `, ${chartFile}`}`)
}

await main()
