// Opt-in scenario `tuning` (`npm run bench -- --scope tuning`; not part of the default run):
// the pool's settings varied one at a time from the defaults, at c = 1, 16, 128 and 1024 with
// 100 B replies, interleaved with raw undici. The numbers behind the defaults in config.ts
// (threads, per-origin in-flight bound, connections per origin, batch size).
import { closedLoop } from './lib/loop.js'
import type { LoopResult } from './lib/loop.js'
import { rawUndiciPath, toolportPath } from './lib/clients.js'
import type { DispatchPath } from './lib/clients.js'
import { fmtRatio, fmtRate, fmtStat, fmtUs, pairedRatio, stat } from './lib/stats.js'
import type { BenchContext, Scenario, Table } from './lib/report.js'
import type { ToolportOptions } from '../src/main/index.js'

type DispatchSettings = NonNullable<ToolportOptions['dispatch']>

const VARIANTS: readonly { name: string, dispatch: DispatchSettings }[] = [
  { name: 'defaults', dispatch: {} },
  { name: 'threads 2', dispatch: { threads: 2 } },
  { name: 'maxBatch 16', dispatch: { maxBatch: 16 } },
  { name: 'maxBatch 256', dispatch: { maxBatch: 256 } },
  { name: 'connectionsPerOrigin 32', dispatch: { connectionsPerOrigin: 32 } },
  { name: 'connectionsPerOrigin 128', dispatch: { connectionsPerOrigin: 128 } },
  { name: 'maxInFlightPerOrigin 64', dispatch: { maxInFlightPerOrigin: 64 } },
  { name: 'no origin bounds', dispatch: { maxInFlightPerOrigin: 1_000_000, maxQueuedPerOrigin: 0 } }
]

function plan (ctx: BenchContext): { concurrency: number[], warmupMs: number, durationMs: number } {
  return ctx.isQuick
    ? { concurrency: [128], warmupMs: 100, durationMs: 250 }
    : { concurrency: [1, 16, 128, 1024], warmupMs: 250, durationMs: 800 }
}

export const tuningScenario: Scenario = {
  name: 'tuning',
  title: 'Tuning (opt-in): pool settings one at a time, 100 B replies',
  steps (ctx) {
    return plan(ctx).concurrency.length * ctx.reps * (VARIANTS.length + 1) + 1
  },
  async run (ctx) {
    const p = plan(ctx)
    ctx.progress.step(`starting ${VARIANTS.length} pools`)
    const paths: DispatchPath[] = [rawUndiciPath(ctx.server.origin)]
    for (const variant of VARIANTS) {
      const path = await toolportPath(ctx.server.origin, 'pool', variant.dispatch)
      paths.push({ ...path, name: variant.name })
    }
    const runs = new Map<string, LoopResult[]>()
    try {
      for (const concurrency of p.concurrency) {
        for (let rep = 0; rep < ctx.reps; rep++) {
          for (let k = 0; k < paths.length; k++) {
            const path = paths[(k + rep) % paths.length] as DispatchPath
            ctx.progress.step(`c=${concurrency} ${path.name} (rep ${rep + 1}/${ctx.reps})`)
            const result = await closedLoop(path.caller('small'), {
              concurrency,
              warmupMs: p.warmupMs,
              warmupMaxCalls: Math.max(200, concurrency * 20),
              durationMs: p.durationMs,
              maxCalls: 100_000
            })
            const key = `${concurrency}|${path.name}`
            runs.set(key, [...(runs.get(key) ?? []), result])
          }
        }
      }
    } finally {
      for (const path of paths) await path.close()
    }
    const rows: string[][] = []
    for (const concurrency of p.concurrency) {
      const raw = runs.get(`${concurrency}|raw undici`) ?? []
      for (const path of paths) {
        const r = runs.get(`${concurrency}|${path.name}`) ?? []
        rows.push([
          String(concurrency), path.name,
          fmtStat(stat(r.map((x) => x.rps)), fmtRate),
          fmtStat(stat(r.map((x) => x.p50Us)), fmtUs),
          fmtStat(stat(r.map((x) => x.p99Us)), fmtUs),
          path.name === 'raw undici' ? '1' : fmtStat(pairedRatio(r.map((x) => x.rps), raw.map((x) => x.rps)), fmtRatio)
        ])
      }
    }
    const table: Table = {
      title: 'Pool settings varied one at a time (all others at their defaults)',
      head: ['c', 'variant', 'req/s', 'p50', 'p99', 'req/s vs raw'],
      rows
    }
    return { tables: [table], checks: [], notes: [], data: Object.fromEntries(runs) }
  }
}
