// Scenario 1 — dispatch: one callback call, closed loop at c = 1, 16, 128, 1024, with ~100 B and
// 64 KiB replies, through every path beside the floor (raw undici on the main thread):
// Toolport pool (the default), Toolport inline, global fetch, node:http keep-alive. At c=1 with
// 100 B replies, beside pool mode: a bare thread round trip, the part of pool mode's latency no
// design that runs the client in a worker can avoid.
//
// Interleaving: for each (reply size, concurrency) every path runs once per repetition, in an
// order rotated by one each repetition (A B C D E, B C D E A, …), so no path always runs first
// or right after the heaviest one. Clients are created once and stay warm across repetitions;
// each loop still has its own warm-up (idle sockets may have timed out in between).
import { captureNewThreads, CpuMeter } from './lib/cpu.js'
import { closedLoop } from './lib/loop.js'
import { benchWarmups, describeWarmups, warmupFor } from './lib/loop.js'
import type { LoopResult, Warmups } from './lib/loop.js'
import { fetchPath, loadCreateToolport, nodeHttpPath, rawUndiciPath, threadRoundTripPath, toolportPath } from './lib/clients.js'
import type { DispatchPath, Route } from './lib/clients.js'
import { fmtCpuSplit, fmtRatio, fmtRatio3, fmtRate, fmtStat, fmtUs, pairedDiff, pairedRatio, stat } from './lib/stats.js'
import type { Stat } from './lib/stats.js'
import type { BenchContext, ChartSeries, Check, Scenario, Table } from './lib/report.js'

interface Plan {
  concurrency: number[]
  sizes: Route[]
  /** Per cell: each path's first loop until CPU per call is steady, its later ones briefly. */
  warmups: Warmups
  durationMs: number
  maxCalls: number
}

function plan (ctx: BenchContext): Plan {
  return ctx.isQuick
    ? {
        concurrency: [1, 128],
        sizes: ['small', 'large'],
        warmups: benchWarmups(true),
        durationMs: 250,
        maxCalls: 20_000
      }
    : {
        concurrency: [1, 16, 128, 1024],
        sizes: ['small', 'large'],
        warmups: benchWarmups(false),
        durationMs: 1_000,
        maxCalls: 100_000
      }
}

const PATH_ORDER = [
  'raw undici', 'raw undici + JSON.parse', 'thread round trip', 'toolport pool', 'baseline pool', 'toolport inline', 'baseline inline',
  'fetch', 'node:http'
] as const

/** The paths this run measures: every path, or --paths (raw undici always), baselines with --baseline. */
function selectedPaths (ctx: BenchContext): string[] {
  return PATH_ORDER.filter((name) => {
    if (name.startsWith('baseline') && (ctx.baseline ?? null) === null) return false
    if (name === 'raw undici' || ctx.paths === null || ctx.paths === undefined) return true
    // The round trip is pool mode's floor at c=1; a baseline path runs whenever its counterpart in
    // this tree runs.
    if (name === 'thread round trip') return ctx.paths.includes('toolport pool')
    return ctx.paths.includes(name.startsWith('baseline') ? name.replace('baseline', 'toolport') : name)
  })
}
const SIZE_LABEL: Partial<Record<Route, string>> = { small: '100 B replies', large: '64 KiB replies' }

/** Results of one cell (size, concurrency, path), one entry per repetition. */
interface Cell {
  size: Route
  concurrency: number
  path: string
  runs: LoopResult[]
}

export const dispatchScenario: Scenario = {
  name: 'dispatch',
  title: '1. Dispatch: one callback call per request, closed loop',
  steps (ctx) {
    const p = plan(ctx)
    // The round trip runs in one cell only (c=1, 100 B); every other path in every cell.
    const selected = selectedPaths(ctx)
    const hasRoundTrip = selected.includes('thread round trip')
    const everyCell = selected.length - (hasRoundTrip ? 1 : 0)
    const roundTrips = hasRoundTrip && p.concurrency.includes(1) && p.sizes.includes('small') ? ctx.reps : 0
    return p.sizes.length * p.concurrency.length * ctx.reps * everyCell + roundTrips + 1
  },
  async run (ctx) {
    const p = plan(ctx)
    const server = ctx.server
    ctx.progress.step('starting clients and Toolport instances')
    const wanted = selectedPaths(ctx)
    const paths: DispatchPath[] = []
    const baseline = ctx.baseline ?? null
    const createBaseline = baseline === null ? null : await loadCreateToolport(baseline)
    for (const name of wanted) {
      switch (name) {
        case 'raw undici': paths.push(rawUndiciPath(server.origin)); break
        case 'raw undici + JSON.parse': paths.push(rawUndiciPath(server.origin, undefined, name, true)); break
        case 'thread round trip': paths.push(await captureNewThreads(threadRoundTripPath)); break
        case 'toolport pool': paths.push(await captureNewThreads(() => toolportPath(server.origin, 'pool'))); break
        case 'toolport inline': paths.push(await toolportPath(server.origin, 'inline')); break
        case 'baseline pool':
          if (createBaseline !== null) {
            paths.push(await captureNewThreads(() => toolportPath(server.origin, 'pool', {}, createBaseline, name)))
          }
          break
        case 'baseline inline':
          if (createBaseline !== null) paths.push(await toolportPath(server.origin, 'inline', {}, createBaseline, name))
          break
        case 'fetch': paths.push(fetchPath(server.origin)); break
        case 'node:http': paths.push(nodeHttpPath(server.port)); break
      }
    }
    const cells: Cell[] = []
    try {
      for (const size of p.sizes) {
        for (const concurrency of p.concurrency) {
          const row = new Map<string, Cell>()
          const cellPaths = paths.filter((path) => path.only === undefined ||
            (path.only.concurrency === concurrency && path.only.route === size))
          for (const path of cellPaths) {
            const cell: Cell = { size, concurrency, path: path.name, runs: [] }
            row.set(path.name, cell)
            cells.push(cell)
          }
          for (let rep = 0; rep < ctx.reps; rep++) {
            for (let k = 0; k < cellPaths.length; k++) {
              const path = cellPaths[(k + rep) % cellPaths.length] as DispatchPath
              ctx.progress.step(`${SIZE_LABEL[size] ?? size} c=${concurrency} ${path.name} (rep ${rep + 1}/${ctx.reps})`)
              const result = await closedLoop(path.caller(size), {
                concurrency,
                ...warmupFor(p.warmups, rep),
                durationMs: p.durationMs,
                maxCalls: p.maxCalls,
                cpu: new CpuMeter(server.pid)
              })
              row.get(path.name)?.runs.push(result)
            }
          }
        }
      }
    } finally {
      for (const path of paths) await path.close()
    }
    return summarize(cells, p)
  }
}

function series (cell: Cell | undefined, pick: (r: LoopResult) => number): number[] {
  return cell === undefined ? [] : cell.runs.map(pick)
}

function find (cells: readonly Cell[], size: Route, concurrency: number, path: string): Cell | undefined {
  return cells.find((c) => c.size === size && c.concurrency === concurrency && c.path === path)
}

function summarize (cells: readonly Cell[], p: Plan): {
  tables: Table[],
  checks: Check[],
  notes: string[],
  chart: ChartSeries[],
  data: unknown
} {
  const tables: Table[] = []
  const chart: ChartSeries[] = []
  const data: unknown[] = []
  let errors = 0
  for (const size of p.sizes) {
    const rows: string[][] = []
    for (const concurrency of p.concurrency) {
      const raw = find(cells, size, concurrency, 'raw undici')
      for (const path of PATH_ORDER) {
        const cell = find(cells, size, concurrency, path)
        if (cell === undefined) continue
        const rps = stat(series(cell, (r) => r.rps))
        const p50 = stat(series(cell, (r) => r.p50Us))
        const p99 = stat(series(cell, (r) => r.p99Us))
        // The round trip makes no call: its req/s is not comparable with a client's.
        const ratio = path === 'raw undici' || path === 'thread round trip'
          ? null
          : pairedRatio(series(cell, (r) => r.rps), series(raw, (r) => r.rps))
        const failed = cell.runs.reduce((n, r) => n + r.errors, 0)
        errors += failed
        const cpu = fmtCpuSplit(cell.runs)
        rows.push([
          String(concurrency), path, fmtStat(rps, fmtRate), fmtStat(p50, fmtUs), fmtStat(p99, fmtUs),
          path === 'raw undici' ? '1 (floor)' : ratio === null ? '–' : fmtStat(ratio, fmtRatio), cpu,
          failed === 0 ? '' : String(failed)
        ])
        data.push({
          size,
          concurrency,
          path,
          rps,
          p50Us: p50,
          p99Us: p99,
          ratioToRaw: ratio,
          errors: failed,
          runs: cell.runs
        })
      }
    }
    tables.push({
      title: `Dispatch, ${SIZE_LABEL[size] ?? size}: req/s and latency, median (min–max) of the repetitions`,
      head: ['c', 'path', 'req/s', 'p50', 'p99', 'req/s vs raw',
        'CPU µs/call: process · main · workers · other · server', 'failed'],
      rows
    })
    for (const path of PATH_ORDER) {
      // The chart draws calls; the round trip makes none.
      if (path === 'thread round trip') continue
      const points = p.concurrency.flatMap((concurrency) => {
        const cell = find(cells, size, concurrency, path)
        if (cell === undefined) return []
        return [{
          concurrency,
          rps: stat(series(cell, (r) => r.rps)).median,
          p50Us: stat(series(cell, (r) => r.p50Us)).median,
          p99Us: stat(series(cell, (r) => r.p99Us)).median
        }]
      })
      chart.push({ path, panel: SIZE_LABEL[size] ?? size, points })
    }
  }
  const notes = [
    `Each loop: a warm-up, then a window bounded by time and call count; req/s counts calls completed inside the window. In each cell, ${describeWarmups(p.warmups)}.`,
    '"req/s vs raw" is the median of per-repetition ratios (each run paired with the raw-undici run of the same repetition).',
    `raw undici and Toolport use ${64} connections per origin; fetch and node:http use their defaults (no cap).`,
    'CPU µs/call: CPU time over the window divided by the calls completed in it, from each thread\'s /proc/<pid>/task/<tid>/schedstat: the bench process (every thread), its main thread, its pool worker threads, its other threads (GC helpers, JIT compiler, libuv), and the callback server process. CPU is what runs out on 2 cores, and it moves far less than wall-clock figures when other processes compete. `*`: a repetition in which other processes took more than 25 % of the cores (run-queue wait of our threads beyond what they oversubscribed themselves).',
    '"raw undici + JSON.parse" is the fair floor for 64 KiB replies: a correct client must at least check that the reply is JSON.',
    '"thread round trip" (c=1, 100 B only) makes no call: one lane-sized message to a worker thread and its echo back on a MessageChannel, the worker idle in between. Pool mode runs the client in a worker, so its p50 at c=1 cannot go below raw undici\'s plus this.'
  ]
  if (errors > 0) notes.push(`${errors} calls failed in measuring windows (see the "failed" column).`)
  return { tables, checks: checks(cells), notes, chart, data }
}

function rpsRatio (cells: readonly Cell[], path: string, concurrency: number, size: Route = 'small',
  floor = 'raw undici'): Stat | null {
  const cell = find(cells, size, concurrency, path)
  const raw = find(cells, size, concurrency, floor)
  if (cell === undefined || raw === undefined) return null
  return pairedRatio(series(cell, (r) => r.rps), series(raw, (r) => r.rps))
}

function checks (cells: readonly Cell[]): Check[] {
  const out: Check[] = []
  const ratioCheck = (path: string, concurrency: number, target: number): void => {
    const ratio = rpsRatio(cells, path, concurrency)
    const cell = find(cells, 'small', concurrency, path)
    out.push({
      scenario: 'dispatch 100 B',
      what: `${path} req/s at c=${concurrency}`,
      measured: cell === undefined ? 'not run' : fmtStat(stat(series(cell, (r) => r.rps)), fmtRate),
      ratio: ratio === null ? '–' : `${fmtRatio3(ratio.median)} raw`,
      target: `≥ ${target.toFixed(2)}× raw`,
      met: ratio === null ? null : ratio.median >= target
    })
  }
  ratioCheck('toolport pool', 128, 0.95)
  ratioCheck('toolport pool', 1024, 1.0)
  ratioCheck('toolport pool', 16, 0.75)
  for (const [floor, target] of [['raw undici + JSON.parse', 1.0], ['raw undici', 0.5]] as const) {
    const ratio = rpsRatio(cells, 'toolport pool', 128, 'large', floor)
    const cell = find(cells, 'large', 128, 'toolport pool')
    if (ratio === null || cell === undefined) continue
    out.push({
      scenario: 'dispatch 64 KiB',
      what: 'toolport pool req/s at c=128',
      measured: fmtStat(stat(series(cell, (r) => r.rps)), fmtRate),
      ratio: `${fmtRatio3(ratio.median)} ${floor}`,
      target: `≥ ${target.toFixed(2)}× ${floor}`,
      met: ratio.median >= target
    })
  }
  const pool1 = find(cells, 'small', 1, 'toolport pool')
  const inline1 = find(cells, 'small', 1, 'toolport inline')
  const raw1 = find(cells, 'small', 1, 'raw undici')
  const hop = find(cells, 'small', 1, 'thread round trip')
  if (pool1 !== undefined && raw1 !== undefined) {
    const diff = pairedDiff(series(pool1, (r) => r.p50Us), series(raw1, (r) => r.p50Us))
    // Beside it, the floor of that difference: a bare round trip to a worker, measured in the same
    // repetitions.
    const floor = hop === undefined ? '' : ` (bare thread round trip ${fmtUs(stat(series(hop, (r) => r.p50Us)).median)})`
    out.push({
      scenario: 'dispatch 100 B',
      what: 'toolport pool p50 at c=1',
      measured: fmtStat(stat(series(pool1, (r) => r.p50Us)), fmtUs),
      ratio: `raw ${diff.median >= 0 ? '+' : '−'} ${fmtUs(Math.abs(diff.median))}${floor}`,
      target: '≤ raw + 40 µs',
      met: diff.median <= 40
    })
  }
  ratioCheck('toolport inline', 16, 0.9)
  ratioCheck('toolport inline', 128, 0.9)
  if (inline1 !== undefined && raw1 !== undefined) {
    const ratio = pairedRatio(series(inline1, (r) => r.p50Us), series(raw1, (r) => r.p50Us))
    out.push({
      scenario: 'dispatch 100 B',
      what: 'toolport inline p50 at c=1',
      measured: fmtStat(stat(series(inline1, (r) => r.p50Us)), fmtUs),
      ratio: `${fmtRatio3(ratio.median)} raw`,
      target: '≤ 1.15× raw',
      met: ratio.median <= 1.15
    })
  }
  return out
}
