// Mixed: in pool mode, 1 ms and 200 ms tools called concurrently. The calls of one event-loop
// turn travel to the worker as one batch; this proves a fast call is answered when it is done,
// not when the slowest call of its batch is (results stream back per call).
//
// Two measurements, interleaved with their baseline:
// - closed loops: 16 callers of the fast tool alone, vs the same 16 beside 16 callers of the slow
//   tool (fast and slow calls keep landing in the same turns, hence the same batches);
// - same-batch probe: a slow and a fast call issued in the same synchronous block (so the same
//   batch, by construction), every 10 ms; the fast call's latency is recorded.
// The same loops run inline as a reference (no batching there).
import { closedLoop, createHistogram, sleep } from './lib/loop.js'
import type { LoopResult } from './lib/loop.js'
import { toolportPath } from './lib/clients.js'
import type { DispatchPath } from './lib/clients.js'
import { fmtStat, fmtUs, stat } from './lib/stats.js'
import type { BenchContext, Check, Scenario, Table } from './lib/report.js'

const CALLERS = 16

function plan (ctx: BenchContext): { warmupMs: number, durationMs: number, probes: number } {
  return ctx.isQuick
    ? { warmupMs: 100, durationMs: 300, probes: 20 }
    : {
        warmupMs: 250,
        durationMs: 1_500,
        probes: 100
      }
}

interface Runs {
  alone: LoopResult[]
  mixed: LoopResult[]
  slow: LoopResult[]
  probeP50: number[]
  probeP99: number[]
}

export const mixedScenario: Scenario = {
  name: 'mixed',
  title: 'Mixed: 1 ms and 200 ms tools in the same batches (pool mode)',
  steps (ctx) {
    return 2 * ctx.reps * 3
  },
  async run (ctx) {
    const p = plan(ctx)
    const paths = [await toolportPath(ctx.server.origin, 'pool'), await toolportPath(ctx.server.origin, 'inline')]
    const runs = new Map<string, Runs>()
    for (const path of paths) runs.set(path.name, { alone: [], mixed: [], slow: [], probeP50: [], probeP99: [] })
    try {
      for (let rep = 0; rep < ctx.reps; rep++) {
        for (const path of paths) {
          const r = runs.get(path.name) as Runs
          ctx.progress.step(`${path.name}: fast tool alone (rep ${rep + 1}/${ctx.reps})`)
          r.alone.push(await closedLoop(path.caller('fast'), loopOptions(p)))
          ctx.progress.step(`${path.name}: fast beside slow (rep ${rep + 1}/${ctx.reps})`)
          const [fast, slow] = await Promise.all([
            closedLoop(path.caller('fast'), loopOptions(p)),
            closedLoop(path.caller('slow'), { ...loopOptions(p), maxCalls: 1_000_000 })
          ])
          r.mixed.push(fast)
          r.slow.push(slow)
          ctx.progress.step(`${path.name}: same-batch probe (rep ${rep + 1}/${ctx.reps})`)
          const probe = await sameBatchProbe(path, p.probes)
          r.probeP50.push(probe.p50Us)
          r.probeP99.push(probe.p99Us)
        }
      }
    } finally {
      for (const path of paths) await path.close()
    }
    const rows: string[][] = []
    for (const path of paths) {
      const r = runs.get(path.name) as Runs
      rows.push([path.name, 'fast alone (16 callers)', fmtStat(stat(r.alone.map((x) => x.p50Us)), fmtUs),
        fmtStat(stat(r.alone.map((x) => x.p99Us)), fmtUs)])
      rows.push([path.name, 'fast beside 16 slow callers', fmtStat(stat(r.mixed.map((x) => x.p50Us)), fmtUs),
        fmtStat(stat(r.mixed.map((x) => x.p99Us)), fmtUs)])
      rows.push([path.name, 'slow (200 ms) in that mix', fmtStat(stat(r.slow.map((x) => x.p50Us)), fmtUs),
        fmtStat(stat(r.slow.map((x) => x.p99Us)), fmtUs)])
      rows.push([path.name, 'fast, same batch as a slow call', fmtStat(stat(r.probeP50), fmtUs),
        fmtStat(stat(r.probeP99), fmtUs)])
    }
    const table: Table = {
      title: 'Fast-call latency (1 ms tool) with and without 200 ms calls in the same batches',
      head: ['path', 'calls', 'p50', 'p99'],
      rows
    }
    const pool = runs.get('toolport pool') as Runs
    const aloneP50 = stat(pool.alone.map((x) => x.p50Us)).median
    const mixedP50 = stat(pool.mixed.map((x) => x.p50Us)).median
    const mixedP99 = stat(pool.mixed.map((x) => x.p99Us)).median
    const probeP99 = stat(pool.probeP99).median
    const checks: Check[] = [{
      scenario: 'mixed (pool)',
      what: 'fast-call p99 in batches with 200 ms calls',
      measured: `${fmtUs(mixedP99)} (same-batch probe ${fmtUs(probeP99)})`,
      ratio: `p50 ${(mixedP50 / aloneP50).toFixed(2)}× alone`,
      target: 'not held back: p99 < 100 ms',
      met: mixedP99 < 100_000 && probeP99 < 100_000
    }]
    return {
      tables: [table],
      checks,
      notes: [`Closed loops of ${CALLERS} callers per tool; the probe issues a slow and a fast call in one synchronous block every 10 ms (${p.probes} probes).`],
      data: Object.fromEntries(runs)
    }
  }
}

function loopOptions (p: { warmupMs: number, durationMs: number }): {
  concurrency: number,
  warmupMs: number,
  durationMs: number,
  maxCalls: number
} {
  return { concurrency: CALLERS, warmupMs: p.warmupMs, durationMs: p.durationMs, maxCalls: 200_000 }
}

async function sameBatchProbe (path: DispatchPath, probes: number): Promise<{ p50Us: number, p99Us: number }> {
  const fast = path.caller('fast')
  const slow = path.caller('slow')
  const histogram = createHistogram()
  const slowCalls: Promise<boolean>[] = []
  for (let i = 0; i < probes; i++) {
    const t0 = performance.now()
    // Same synchronous block: both calls are queued in the same turn, so they share one batch.
    slowCalls.push(slow())
    const ok = await fast()
    const t1 = performance.now()
    if (ok) histogram.recordValue(Math.max(1, Math.round((t1 - t0) * 1000)))
    const wait = 10 - (performance.now() - t0)
    if (wait > 0) await sleep(wait)
  }
  await Promise.all(slowCalls)
  const out = { p50Us: histogram.getValueAtPercentile(50), p99Us: histogram.getValueAtPercentile(99) }
  histogram.destroy()
  return out
}
