// Scenario 5 — optional peers: the same closed loop (c=128, 100 B replies, same body, same
// callback server) through Python's httpx.AsyncClient (what the original implementation of this
// API uses) and aiohttp (with uvloop when present), interleaved with Toolport pool and raw undici.
//
// Optional: it runs only when a python3 with the package exists (Debian: python3-httpx,
// python3-aiohttp, python3-uvloop; nothing is ever installed by the bench). `$PYTHON` is tried
// first, then `python3`, then `/usr/bin/python3` (Debian's packages live there, not in a pyenv).
import { closedLoop } from './lib/loop.js'
import type { LoopResult, SteadyWarmup } from './lib/loop.js'
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

interface Plan {
  /** The Python clients' warm-up (CPython has no JIT to wait for). */
  warmupS: number
  /** The Node paths' first warm-up, until CPU per call is steady (as in `dispatch`) … */
  steady: SteadyWarmup
  /** … and their later ones. */
  nodeWarmupMs: number
  durationS: number
  maxCalls: number
}

function plan (ctx: BenchContext): Plan {
  return ctx.isQuick
    ? {
        warmupS: 0.2,
        steady: { minMs: 100, maxMs: 400, chunkMs: 100, tolerance: 0.2 },
        nodeWarmupMs: 50,
        durationS: 0.4,
        maxCalls: 20_000
      }
    : {
        warmupS: 0.5,
        steady: { minMs: 1_000, maxMs: 3_000, chunkMs: 250, tolerance: 0.08 },
        nodeWarmupMs: 200,
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
    const results = new Map<string, number[][]>() // name → [rps[], p50[], p99[], client CPU µs per call[]]
    const record = (name: string, r: { rps: number, p50Us: number, p99Us: number }, cpuUs: number): void => {
      const entry = results.get(name) ?? [[], [], [], []]
      entry[0]?.push(r.rps)
      entry[1]?.push(r.p50Us)
      entry[2]?.push(r.p99Us)
      entry[3]?.push(cpuUs)
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
              warmupMs: p.nodeWarmupMs,
              ...(rep === 0 ? { steady: p.steady } : {}),
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
    const pool = results.get('toolport pool')?.[0] ?? []
    const poolCpu = results.get('toolport pool')?.[3] ?? []
    const rows: string[][] = []
    for (const [name, [rps = [], p50 = [], p99 = [], cpu = []]] of results) {
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
      const rps = results.get(name)?.[0]
      if (rps === undefined) {
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
      const ratio = pairedRatio(pool, rps)
      const cpu = pairedRatio(results.get(name)?.[3] ?? [], poolCpu)
      checks.push({
        scenario: 'peers c=128',
        what: `toolport pool vs ${label}`,
        measured: `${fmtRate(stat(pool).median)} vs ${fmtRate(stat(rps).median)}`,
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
        `client CPU µs/call: the client process's CPU time over the window per call: for the Node paths this bench process (every thread, process.cpuUsage; the pool's workers included), after a warm-up until CPU per call is steady in the first repetition and of ${p.nodeWarmupMs} ms in later ones; for Python its interpreter (time.process_time, every thread), after ${p.warmupS} s of warm-up. The callback server's is not included.`],
      data: Object.fromEntries(results)
    }
  }
}
