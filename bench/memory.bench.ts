// Scenario 6 — memory and idle sockets.
//
// RSS: a fresh child process per measurement (bench/fixtures/memory-probe.ts) holds 1000 calls in
// flight against a callback that sleeps, and reports its peak RSS; raw undici in the same
// situation is the baseline. Interleaved: pool, pool-1024, inline, raw, then again.
//
// Idle: a second callback server closes idle sockets after 5 s WITHOUT a keep-alive hint (as
// uvicorn does). Every path warms up 64 sockets, all stay idle for 6 s, then each bursts; a call
// that fails (typically "other side closed" on a socket the server already closed) is counted.
import { sleep } from './lib/loop.js'
import { fetchPath, nodeHttpPath, rawUndiciPath, toolportPath } from './lib/clients.js'
import type { DispatchPath } from './lib/clients.js'
import { runNodeJson, startCallbackServer } from './lib/processes.js'
import { fmtMB, fmtStat, stat } from './lib/stats.js'
import type { BenchContext, Check, Scenario, Table } from './lib/report.js'

const IN_FLIGHT = 1000
const IDLE_MS = 6_000
const BURST_CALLERS = 64

interface ProbeResult {
  mode: string
  rssBefore: number
  rssPeak: number
  heapBefore: number
  heapPeak: number
  pendingAtPeak: number
  pendingAtEnd: number
}

function modes (ctx: BenchContext): string[] {
  return ctx.isQuick ? ['pool', 'raw'] : ['pool', 'pool-1024', 'inline', 'raw']
}

function memoryReps (ctx: BenchContext): number {
  return ctx.isQuick ? 1 : Math.min(ctx.reps, 2)
}

const MODE_LABEL: Record<string, string> = {
  pool: 'toolport pool (64 connections)',
  'pool-1024': 'toolport pool (1024 connections, 1024 in flight)',
  inline: 'toolport inline (64 connections)',
  raw: 'raw undici (64 connections, baseline)'
}

export const memoryScenario: Scenario = {
  name: 'memory',
  title: '6. Memory with 1000 calls in flight; calls after an idle period',
  steps (ctx) {
    return modes(ctx).length * memoryReps(ctx) + 3 + 5
  },
  async run (ctx) {
    // RSS
    const probes = new Map<string, ProbeResult[]>()
    for (let rep = 0; rep < memoryReps(ctx); rep++) {
      for (const mode of modes(ctx)) {
        ctx.progress.step(`RSS with ${IN_FLIGHT} calls in flight: ${mode} (rep ${rep + 1})`)
        const result = await runNodeJson('fixtures/memory-probe.ts', [JSON.stringify({
          mode, origin: ctx.server.origin, calls: IN_FLIGHT, sampleMs: 800
        })], { timeoutMs: 60_000, nodeArgs: ['--expose-gc'] }) as ProbeResult
        probes.set(mode, [...(probes.get(mode) ?? []), result])
      }
    }
    const memRows = [...probes].map(([mode, runs]) => [
      MODE_LABEL[mode] ?? mode,
      fmtStat(stat(runs.map((r) => r.rssBefore)), fmtMB),
      fmtStat(stat(runs.map((r) => r.rssPeak)), fmtMB),
      fmtStat(stat(runs.map((r) => r.rssPeak - r.rssBefore)), fmtMB),
      fmtStat(stat(runs.map((r) => r.heapPeak)), fmtMB),
      String(stat(runs.map((r) => r.pendingAtPeak)).median)
    ])
    const memTable: Table = {
      title: `Process RSS with ${IN_FLIGHT} calls in flight (callback sleeps 1.5 s; fresh process each)`,
      head: ['client', 'RSS before', 'RSS peak', 'growth', 'heap peak', 'calls pending'],
      rows: memRows
    }

    // Idle period
    ctx.progress.step('idle: starting a callback server that closes idle sockets after 5 s, no hint')
    const idleServer = await startCallbackServer({ keepAliveMs: 5_000, sendHint: false })
    const paths: DispatchPath[] = [
      await toolportPath(idleServer.origin, 'pool'),
      await toolportPath(idleServer.origin, 'inline'),
      rawUndiciPath(idleServer.origin),
      fetchPath(idleServer.origin),
      nodeHttpPath(idleServer.port)
    ]
    const idleRows: string[][] = []
    const failedAfterIdle = new Map<string, number>()
    try {
      ctx.progress.step('idle: warming 64 sockets per path')
      const warm: number[] = []
      for (const path of paths) warm.push(await burst(path))
      ctx.progress.step(`idle: all paths idle for ${IDLE_MS / 1000} s`)
      await sleep(IDLE_MS)
      const after: number[] = []
      for (const path of paths) {
        ctx.progress.step(`idle: burst after idle, ${path.name}`)
        after.push(await burst(path))
      }
      for (const [i, path] of paths.entries()) {
        failedAfterIdle.set(path.name, after[i] ?? 0)
        idleRows.push([path.name, String(warm[i]), String(after[i])])
      }
    } finally {
      for (const path of paths) await path.close()
      await idleServer.close()
    }
    const idleTable: Table = {
      title: `Failed calls in a burst of ${BURST_CALLERS} callers × 4 rounds, before and after ${IDLE_MS / 1000} s idle (server closes idle sockets after 5 s, no hint)`,
      head: ['path', 'failed before idle', 'failed after idle'],
      rows: idleRows
    }

    const poolRss = stat((probes.get('pool') ?? []).map((r) => r.rssPeak))
    const rawRss = stat((probes.get('raw') ?? []).map((r) => r.rssPeak))
    const checks: Check[] = [
      {
        scenario: 'memory',
        what: `RSS with ${IN_FLIGHT} calls in flight (pool, default)`,
        measured: fmtStat(poolRss, fmtMB),
        ratio: `raw undici ${fmtMB(rawRss.median)}`,
        target: '≤ 250 MB',
        met: poolRss.median <= 250 * 1024 * 1024
      },
      {
        scenario: 'memory',
        what: 'failed calls after an idle period (pool + inline)',
        measured: `${failedAfterIdle.get('toolport pool') ?? '?'} + ${failedAfterIdle.get('toolport inline') ?? '?'}`,
        ratio: '',
        target: '0',
        met: failedAfterIdle.get('toolport pool') === 0 && failedAfterIdle.get('toolport inline') === 0
      }
    ]
    return {
      tables: [memTable, idleTable],
      checks,
      notes: [
        'RSS is the whole process (main thread, worker threads, sockets); "calls pending" counts calls admitted and not yet answered when the peak was sampled.',
        'With 64 connections per origin only 64 calls are at the callback at once; the rest wait, up to dispatch.maxInFlightPerOrigin (256) in the client\'s pool queue and beyond it in the dispatcher\'s per-origin queue (the 1024-connection row raises both bounds to 1024: every call on its own socket).'
      ],
      data: { probes: Object.fromEntries(probes), idle: Object.fromEntries(failedAfterIdle) }
    }
  }
}

/** 4 rounds of BURST_CALLERS concurrent calls; returns how many failed. */
async function burst (path: DispatchPath): Promise<number> {
  const call = path.caller('small')
  let failed = 0
  for (let round = 0; round < 4; round++) {
    const results = await Promise.all(Array.from({ length: BURST_CALLERS }, () => call().catch(() => false)))
    for (const ok of results) if (!ok) failed++
  }
  return failed
}
