// Scenario 5 — optional peers: the same closed loop (c=128, 100 B replies, same body, same
// callback server) through Python's httpx.AsyncClient (what the original implementation of this
// API uses) and aiohttp (with uvloop when present), interleaved with Toolport pool and raw undici.
//
// Optional: it runs only when a python3 with the package exists (Debian: python3-httpx,
// python3-aiohttp, python3-uvloop; nothing is ever installed by the bench). `$PYTHON` is tried
// first, then `python3`, then `/usr/bin/python3` (Debian's packages live there, not in a pyenv).
import { benchWarmups, closedLoop, describeWarmups, warmupFor } from './lib/loop.js'
import type { LoopResult, Warmups } from './lib/loop.js'
import { captureNewThreads, CpuMeter } from './lib/cpu.js'
import { CONNECTIONS, rawUndiciPath, toolportPath } from './lib/clients.js'
import type { DispatchPath } from './lib/clients.js'
import { benchFile, pythonHas, runJson } from './lib/processes.js'
import { fmtRatio, fmtRatio3, fmtRate, fmtStat, fmtUs, pairedRatio, stat } from './lib/stats.js'
import type { BenchContext, Check, Scenario, Table } from './lib/report.js'

const CONCURRENCY = 128

interface PeerClient { name: string, client: string, python: string }

interface PeerResult {
  rps: number
  p50Us: number
  p99Us: number
  calls: number
  errors: number
  /** The Python process's CPU time per call in the window (every thread of it); null with no calls. */
  cpuUsPerCall: number | null
}

/** One client's figures, one entry per repetition. */
interface Series { rps: number[], p50: number[], p99: number[], cpu: number[] }

interface Plan {
  /** The Python clients' warm-up (CPython has no JIT to wait for). */
  warmupS: number
  /** The Node paths' warm-ups (as in `dispatch`). */
  nodeWarmups: Warmups
  durationS: number
  maxCalls: number
}

function plan (ctx: BenchContext): Plan {
  return ctx.isQuick
    ? {
        warmupS: 0.2,
        nodeWarmups: benchWarmups(true),
        durationS: 0.4,
        maxCalls: 20_000
      }
    : {
        warmupS: 0.5,
        nodeWarmups: benchWarmups(false),
        durationS: 1.5,
        maxCalls: 100_000
      }
}

/** Finds, once, an interpreter for each client; a missing one is a skip reason. */
function findPeers (): { peers: PeerClient[], skipped: string[] } {
  const candidates = [...new Set([process.env.PYTHON, 'python3',
    '/usr/bin/python3'].filter((p): p is string => p !== undefined && p !== ''))]
  const find = (code: string): string | null => candidates.find((p) => pythonHas(p, code)) ?? null
  const peers: PeerClient[] = []
  const skipped: string[] = []
  const httpx = find('import httpx')
  if (httpx !== null) peers.push({ name: 'python httpx.AsyncClient', client: 'httpx', python: httpx })
  else skipped.push('skipped: python3 httpx not installed')
  const aiohttp = find('import aiohttp')
  if (aiohttp !== null) {
    peers.push({ name: 'python aiohttp', client: 'aiohttp', python: aiohttp })
    if (pythonHas(aiohttp, 'import uvloop')) {
      peers.push({
        name: 'python aiohttp + uvloop',
        client: 'aiohttp-uvloop',
        python: aiohttp
      })
    } else skipped.push('skipped: python3 uvloop not installed')
  } else {
    skipped.push('skipped: python3 aiohttp not installed')
  }
  return { peers, skipped }
}

let found: ReturnType<typeof findPeers> | null = null

function peersOnce (): ReturnType<typeof findPeers> {
  found ??= findPeers()
  return found
}

export const peersScenario: Scenario = {
  name: 'peers',
  title: '5. Optional peers: Python httpx and aiohttp, c=128',
  steps (ctx) {
    const { peers } = peersOnce()
    return peers.length === 0 ? 0 : ctx.reps * (peers.length + 2) + 1
  },
  async run (ctx) {
    const { peers, skipped } = peersOnce()
    for (const reason of skipped) ctx.progress.note(reason)
    if (peers.length === 0) {
      return { skipped: skipped.join('; '), tables: [], checks: [], notes: skipped, data: null }
    }
    const p = plan(ctx)
    ctx.progress.step('starting Toolport pool and raw undici')
    const node: DispatchPath[] = [
      rawUndiciPath(ctx.server.origin),
      await captureNewThreads(() => toolportPath(ctx.server.origin, 'pool'))
    ]
    // Client name → its repetitions' figures (cpu: the client process's CPU µs per call).
    const results = new Map<string, Series>()
    const record = (name: string, r: { rps: number, p50Us: number, p99Us: number }, cpuUs: number): void => {
      const entry = results.get(name) ?? { rps: [], p50: [], p99: [], cpu: [] }
      entry.rps.push(r.rps)
      entry.p50.push(r.p50Us)
      entry.p99.push(r.p99Us)
      entry.cpu.push(cpuUs)
      results.set(name, entry)
    }
    try {
      const url = ctx.server.url('/small')
      for (let rep = 0; rep < ctx.reps; rep++) {
        const order: (DispatchPath | PeerClient)[] = [...node, ...peers]
        for (let k = 0; k < order.length; k++) {
          const item = order[(k + rep) % order.length] as DispatchPath | PeerClient
          ctx.progress.step(`c=${CONCURRENCY} ${item.name} (rep ${rep + 1}/${ctx.reps})`)
          if ('caller' in item) {
            const r: LoopResult = await closedLoop(item.caller('small'), {
              concurrency: CONCURRENCY,
              ...warmupFor(p.nodeWarmups, rep),
              durationMs: p.durationS * 1000,
              maxCalls: p.maxCalls,
              cpu: new CpuMeter(ctx.server.pid)
            })
            record(item.name, r, r.cpu?.processUs ?? Number.NaN)
          } else {
            const r = await runJson(item.python, [benchFile('fixtures/peers.py'), item.client, url, String(CONCURRENCY),
              String(p.warmupS), String(p.durationS), String(p.maxCalls), String(CONNECTIONS)], 120_000) as PeerResult
            record(item.name, r, r.cpuUsPerCall ?? Number.NaN)
          }
        }
      }
    } finally {
      for (const path of node) await path.close()
    }
    const pool = results.get('toolport pool')?.rps ?? []
    const poolCpu = results.get('toolport pool')?.cpu ?? []
    const rows: string[][] = []
    for (const [name, { rps, p50, p99, cpu }] of results) {
      rows.push([name, fmtStat(stat(rps), fmtRate), fmtStat(stat(p50), fmtUs), fmtStat(stat(p99), fmtUs),
        name === 'toolport pool' ? '1' : fmtStat(pairedRatio(pool, rps), fmtRatio),
        fmtStat(stat(cpu), (v) => v.toFixed(0)),
        name === 'toolport pool' ? '1' : fmtStat(pairedRatio(cpu, poolCpu), fmtRatio)])
    }
    const table: Table = {
      title: `Closed loop at c=${CONCURRENCY}, 100 B replies, ${CONNECTIONS} connections each`,
      head: ['client', 'req/s', 'p50', 'p99', 'toolport pool is …× faster', 'client CPU µs/call',
        '…× the pool\'s CPU per call'],
      rows
    }
    const checks: Check[] = []
    const peerCheck = (name: string, label: string, target: number): void => {
      const series = results.get(name)
      if (series === undefined) {
        checks.push({
          scenario: 'peers c=128',
          what: `toolport pool vs ${label}`,
          measured: 'not installed',
          ratio: '–',
          target: `≥ ${target}×`,
          met: null
        })
        return
      }
      const ratio = pairedRatio(pool, series.rps)
      const cpu = pairedRatio(series.cpu, poolCpu)
      checks.push({
        scenario: 'peers c=128',
        what: `toolport pool vs ${label}`,
        measured: `${fmtRate(stat(pool).median)} vs ${fmtRate(stat(series.rps).median)}`,
        ratio: `${fmtRatio3(ratio.median)}; it spends ${fmtRatio(cpu.median)} the pool's CPU per call`,
        target: `≥ ${target}×`,
        met: ratio.median >= target
      })
    }
    peerCheck('python aiohttp + uvloop', 'aiohttp + uvloop', 4)
    peerCheck('python httpx.AsyncClient', 'httpx', 15)
    return {
      tables: [table],
      checks,
      notes: [...skipped, `python: ${[...new Set(peers.map((x) => x.python))].join(', ')}; optional (Debian python3-httpx, python3-aiohttp, python3-uvloop).`,
        `client CPU µs/call: the client process's CPU time over the window per call: for the Node paths this bench process (every thread, process.cpuUsage; the pool's workers included), after the warm-ups of \`dispatch\` (${describeWarmups(p.nodeWarmups)}); for Python its interpreter (time.process_time, every thread), after ${p.warmupS} s of warm-up. The callback server's is not included.`],
      data: Object.fromEntries(results)
    }
  }
}
