// Scenario 2 — end to end over HTTP: autocannon (its own process) → `POST /api/tools/call` on a
// listening Toolport (in this process) → the callback server (its own process), pool vs inline,
// against the ceiling: autocannon → the callback server directly, same body, and the floor: a bare
// node:http server that calls the callback with raw undici (bench/lib/proxy.ts). Beside them, at
// concurrencies an MCP session accepts (`mcp.maxCallsPerSession`, 32), the same call as MCP
// `tools/call` on one session of the pool's `/mcp/<role>` endpoint (what an MCP client costs).
//
// This is where pool mode should win: the main thread is busy parsing and answering HTTP, so
// moving the callback client off it frees it; inline mode does both on one thread.
import { CpuMeter } from './lib/cpu.js'
import type { CpuPerCall } from './lib/cpu.js'
import { createBenchToolport, RAW_ARGUMENTS, toolName } from './lib/clients.js'
import { runNodeJson } from './lib/processes.js'
import { startBareProxy, startBareResponder, type BareProxy } from './lib/proxy.js'
import { MCP_CALL_BODY, MCP_MAX_CONCURRENCY, mcpSession, type McpSession } from './lib/mcp-session.js'
import { cpuSeries, fmtRatio, fmtRatio3, fmtRate, fmtStat, fmtUs, pairedRatio, stat } from './lib/stats.js'
import type { BenchContext, Check, Scenario, Table } from './lib/report.js'

interface LoadResult {
  rps: number
  p50Us: number
  p99Us: number
  total: number
  durationS: number
  errors: number
  timeouts: number
  non2xx: number
  /** The load generator's own CPU per request. */
  cpuUsPerRequest: number
  /** Toolport's process (this one) and the callback server, per request (added here). */
  cpu?: CpuPerCall
}

function cpuCell (runs: readonly LoadResult[], isCeiling: boolean): string {
  const m = (f: (r: LoadResult) => number | undefined): string => {
    const v = stat(runs.map((r) => f(r) ?? Number.NaN)).median
    return Number.isFinite(v) ? v.toFixed(0) : '–'
  }
  const toolport = isCeiling ? '–' : `${m((r) => r.cpu?.processUs)} (${m((r) => r.cpu?.mainThreadUs)})`
  return `${m((r) => r.cpuUsPerRequest)} · ${toolport} · ${m((r) => r.cpu?.peerUs)}`
}

interface Target {
  name: string
  url: string
  body: string
  headers: Record<string, string>
  /** Measured only at concurrencies up to this. */
  maxConcurrency?: number
}

const MCP_TARGET = 'toolport pool, MCP tools/call'
const CEILING = 'ceiling: callback server'
const FLOOR = 'floor: bare node:http + undici'
const HTTP_FLOOR = 'floor: bare node:http, no call'
/** The targets every concurrency runs, in the table's order (MCP's row comes last, where it runs). */
const HTTP_TARGETS = [CEILING, HTTP_FLOOR, FLOOR, 'toolport pool', 'toolport inline'] as const

interface Plan {
  concurrency: number[]
  /** Each target's first load, discarded: TurboFan compiles its hot path here, not in a window. */
  firstWarmupS: number
  /** Before each measured window. */
  warmupS: number
  durationS: number
  maxRequests: number
}

function plan (ctx: BenchContext): Plan {
  return ctx.isQuick
    ? { concurrency: [16, 128], firstWarmupS: 0.5, warmupS: 0.2, durationS: 0.5, maxRequests: 200_000 }
    : { concurrency: [16, 128], firstWarmupS: 3, warmupS: 0.5, durationS: 2, maxRequests: 200_000 }
}

/** One run of the load generator against `target`; `onMeasuring` when its measured run starts. */
async function load (target: Target,
  run: { connections: number, warmupS: number, durationS: number, maxRequests: number },
  onMeasuring?: () => void): Promise<LoadResult> {
  return await runNodeJson('fixtures/load-generator.ts', [JSON.stringify({
    url: target.url,
    ...run,
    body: target.body,
    headers: target.headers
  })], { timeoutMs: 60_000, onEvent: () => { onMeasuring?.() } }) as LoadResult
}

const CALL_BODY = JSON.stringify({ role: 'bench', name: toolName('small'), raw_arguments: RAW_ARGUMENTS })
const JSON_HEADERS = { 'content-type': 'application/json' }

export const e2eScenario: Scenario = {
  name: 'e2e',
  title: '2. End to end: autocannon → POST /api/tools/call → callback',
  steps (ctx) {
    const p = plan(ctx)
    const withMcp = p.concurrency.filter((c) => c <= MCP_MAX_CONCURRENCY).length
    const http = HTTP_TARGETS.length
    // One first load per target, then each target at each concurrency it runs at, every repetition.
    return (http + (withMcp > 0 ? 1 : 0)) + p.concurrency.length * ctx.reps * http + withMcp * ctx.reps + 1
  },
  async run (ctx) {
    const p = plan(ctx)
    ctx.progress.step('starting Toolport servers')
    const pool = await createBenchToolport(ctx.server.origin, { dispatch: { mode: 'pool' } })
    const inline = await createBenchToolport(ctx.server.origin, { dispatch: { mode: 'inline' } })
    const results = new Map<string, LoadResult[]>()
    let mcp: McpSession | null = null
    let proxy: BareProxy | null = null
    let responder: BareProxy | null = null
    try {
      proxy = await startBareProxy(ctx.server.origin)
      responder = await startBareResponder()
      const poolUrl = (await pool.listen({ port: 0 })).url
      const inlineUrl = (await inline.listen({ port: 0 })).url
      const urls: Record<typeof HTTP_TARGETS[number], string> = {
        [CEILING]: ctx.server.url('/small'),
        [HTTP_FLOOR]: responder.url,
        [FLOOR]: proxy.url,
        'toolport pool': `${poolUrl}/api/tools/call`,
        'toolport inline': `${inlineUrl}/api/tools/call`
      }
      const targets: Target[] = HTTP_TARGETS.map((name) =>
        ({ name, url: urls[name], body: CALL_BODY, headers: JSON_HEADERS }))
      if (p.concurrency.some((c) => c <= MCP_MAX_CONCURRENCY)) {
        const mcpUrl = `${poolUrl}/mcp/bench`
        mcp = await mcpSession(mcpUrl)
        targets.push({
          name: MCP_TARGET, url: mcpUrl, body: MCP_CALL_BODY, headers: mcp.headers, maxConcurrency: MCP_MAX_CONCURRENCY
        })
      }
      // A steady start for every target before any window (the windows alone warm up for
      // warmupS each, too short for the first compile of a path).
      for (const target of targets) {
        const c = Math.min(Math.max(...p.concurrency), target.maxConcurrency ?? Infinity)
        ctx.progress.step(`warming up ${target.name} (${p.firstWarmupS} s at c=${c})`)
        await load(target, { connections: c, warmupS: 0, durationS: p.firstWarmupS, maxRequests: p.maxRequests })
      }
      for (const c of p.concurrency) {
        const cTargets = targets.filter((t) => c <= (t.maxConcurrency ?? Infinity))
        for (let rep = 0; rep < ctx.reps; rep++) {
          for (let k = 0; k < cTargets.length; k++) {
            const target = cTargets[(k + rep) % cTargets.length] as Target
            ctx.progress.step(`c=${c} ${target.name} (rep ${rep + 1}/${ctx.reps})`)
            const meter = new CpuMeter(ctx.server.pid)
            const result = await load(target,
              { connections: c, warmupS: p.warmupS, durationS: p.durationS, maxRequests: p.maxRequests },
              () => { meter.begin() })
            result.cpu = meter.end(result.total, (result.cpuUsPerRequest ?? 0) * result.total)
            const key = `${c}|${target.name}`
            results.set(key, [...(results.get(key) ?? []), result])
          }
        }
      }
    } finally {
      await mcp?.close()
      await pool.close()
      await inline.close()
      await proxy?.close()
      await responder?.close()
    }
    const get = (c: number, name: string): LoadResult[] => results.get(`${c}|${name}`) ?? []
    const rows: string[][] = []
    for (const c of p.concurrency) {
      const ceiling = get(c, CEILING)
      const inlineRuns = get(c, 'toolport inline')
      for (const name of [...HTTP_TARGETS, MCP_TARGET]) {
        const runs = get(c, name)
        if (runs.length === 0) continue
        const failed = runs.reduce((n, r) => n + r.errors + r.non2xx, 0)
        rows.push([
          String(c), name,
          fmtStat(stat(runs.map((r) => r.rps)), fmtRate),
          fmtStat(stat(runs.map((r) => r.p50Us)), fmtUs),
          fmtStat(stat(runs.map((r) => r.p99Us)), fmtUs),
          name === CEILING
            ? '1'
            : fmtStat(pairedRatio(runs.map((r) => r.rps), ceiling.map((r) => r.rps)),
              fmtRatio),
          name === 'toolport pool'
            ? fmtStat(pairedRatio(runs.map((r) => r.rps), inlineRuns.map((r) => r.rps)),
              fmtRatio)
            : '',
          cpuCell(runs, name === CEILING),
          failed === 0 ? '' : String(failed)
        ])
      }
    }
    const table: Table = {
      title: 'End to end over HTTP (100 B replies), median (min–max) of the repetitions',
      head: ['c', 'target', 'req/s', 'p50', 'p99', 'vs ceiling', 'pool vs inline',
        'CPU µs/req: load gen · Toolport (main) · callback', 'failed'],
      rows
    }
    const checks: Check[] = []
    const c128Pool = get(128, 'toolport pool')
    const c128Inline = get(128, 'toolport inline')
    const c128Ceiling = get(128, CEILING)
    const c128Floor = get(128, FLOOR)
    if (c128Pool.length > 0) {
      const vsInline = pairedRatio(c128Pool.map((r) => r.rps), c128Inline.map((r) => r.rps))
      const vsCeiling = pairedRatio(c128Pool.map((r) => r.rps), c128Ceiling.map((r) => r.rps))
      const measured = fmtStat(stat(c128Pool.map((r) => r.rps)), fmtRate)
      // Beside it, what the bare two-hop server reaches against the same ceiling.
      const floor = c128Floor.length === 0
        ? ''
        : ` (bare node:http + undici ${fmtRatio3(pairedRatio(c128Floor.map((r) => r.rps), c128Ceiling.map((r) => r.rps)).median)})`
      const cpuVsInline = pairedRatio(cpuSeries(c128Pool, 'processUs'), cpuSeries(c128Inline, 'processUs'))
      checks.push({
        scenario: 'e2e c=128',
        what: 'pool req/s vs inline',
        measured,
        ratio: `${fmtRatio3(vsInline.median)} inline (Toolport CPU per request ${fmtRatio(cpuVsInline.median)} inline's)`,
        target: '≥ 1.10× inline',
        met: vsInline.median >= 1.1
      })
      checks.push({
        scenario: 'e2e c=128',
        what: 'pool req/s vs callback ceiling',
        measured,
        ratio: `${fmtRatio3(vsCeiling.median)} ceiling${floor}`,
        target: '≥ 0.45× ceiling',
        met: vsCeiling.median >= 0.45
      })
      // Beside it, what HTTP alone costs a thread in the same run.
      const main = stat(cpuSeries(c128Pool, 'mainThreadUs'))
      const floorMain = stat(cpuSeries(get(128, HTTP_FLOOR), 'mainThreadUs')).median
      checks.push({
        scenario: 'e2e c=128',
        what: 'pool: main-thread CPU per request',
        measured: fmtStat(main, (v) => `${v.toFixed(0)} µs`),
        ratio: Number.isFinite(floorMain) ? `bare node:http answering without a call: ${floorMain.toFixed(0)} µs` : '–',
        target: '≤ 35 µs',
        met: Number.isFinite(main.median) ? main.median <= 35 : null
      })
    }
    return {
      tables: [table],
      checks,
      notes: [
        'autocannon runs in its own process (programmatic API), one connection per concurrent request, no pipelining; latency from its per-response times.',
        `Each target is loaded once for ${p.firstWarmupS} s before any measured window (discarded: its first compile), and each window follows ${p.warmupS} s of warm-up.`,
        `"${HTTP_FLOOR}" (bench/lib/proxy.ts): a node:http server in this process that reads the body and answers the bytes Toolport's call route answers, calling nothing: HTTP alone, the floor of pool mode's main thread, whose callback calls run on a worker.`,
        `"${FLOOR}" (bench/lib/proxy.ts): a node:http server in this process that reads the body, sends Toolport's exact callback request with raw undici on its main thread and answers the reply's text. No routing, guard, parsing or validation, on one thread: what the two HTTP hops alone cost (pool mode, on two threads, can beat it).`,
        'CPU µs/req: CPU time during the measured run divided by the requests answered, for autocannon, the Toolport process (all threads; its main thread in parentheses; in the floor\'s row, the bare server\'s) and the callback server. With every process on the same 2 cores, req/s ≈ 2 cores / total CPU per request.',
        `"${MCP_TARGET}": the same call as a JSON-RPC \`tools/call\` POSTed on one MCP session of the pool's /mcp/bench (the MCP SDK's streamable HTTP transport answers each with an event stream), at concurrencies up to ${MCP_MAX_CONCURRENCY}, the calls one session takes at once.`
      ],
      data: Object.fromEntries(results)
    }
  }
}
