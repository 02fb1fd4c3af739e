// Scenario 3 — control plane: what registering, unregistering and clearing cost as roles, tools
// and sessions grow, the fan-out of one registration to 100 roles with live sessions, and
// `GET /api/tools` with 10 000 listed tools.
//
// Sessions are "instant" (syncTools resolves at once), so the figures are Toolport's own cost.
// Baselines, in the same run and interleaved: 0 sessions beside 1 session per role; for the
// listing, `JSON.stringify(tp.list())` (the serialisation floor) beside `app.inject` and real HTTP.
import { Pool } from 'undici'
import { createToolport } from '../src/main/index.js'
import type { Toolport } from '../src/main/index.js'
import { createHistogram } from './lib/loop.js'
import { fmtRate, fmtStat, fmtUs, stat } from './lib/stats.js'
import type { BenchContext, Check, Scenario, Table } from './lib/report.js'

interface Plan {
  roles: number[]
  tools: number[]
  /** Time cap and op cap of each measured op type, per combination and repetition. */
  capMs: number
  maxOps: number
  fanoutOps: number
  listIterations: number
}

function plan (ctx: BenchContext): Plan {
  return ctx.isQuick
    ? { roles: [1, 100], tools: [10, 1000], capMs: 60, maxOps: 300, fanoutOps: 100, listIterations: 8 }
    : { roles: [1, 10, 100], tools: [10, 1000], capMs: 300, maxOps: 3_000, fanoutOps: 1_000, listIterations: 40 }
}

const CALLBACK = 'http://127.0.0.1:9/tools/'

function instantSync (): Promise<void> {
  return Promise.resolve()
}

async function buildRuntime (roles: number, tools: number, sessions: number): Promise<Toolport> {
  const names = Array.from({ length: roles }, (_, i) => `role${i}`)
  // Inline mode: the control plane never dispatches, so no worker thread is started.
  const tp = await createToolport({ roles: names, logger: false, dispatch: { mode: 'inline' } })
  for (let i = 0; i < tools; i++) {
    await tp.register({
      name: `tool_${i}`,
      description: `prefilled tool ${i}`,
      callback_url: `${CALLBACK}${i}`,
      source: 'plugin:prefill'
    })
  }
  // Attached after the prefill, which then costs no syncs.
  for (const name of names) {
    for (let s = 0; s < sessions; s++) tp.roles.get(name).attachSession({ id: `${name}-s${s}`, syncTools: instantSync })
  }
  await Promise.all(names.map((n) => tp.roles.get(n).sync()))
  return tp
}

/** Op latencies: mean and p50 in µs (recorded in ns for sub-µs resolution). */
interface OpStats { opsPerS: number, p50Us: number, count: number }

async function measureOps (count: number, capMs: number, op: (i: number) => Promise<unknown>,
  before?: (i: number) => Promise<unknown>): Promise<OpStats> {
  const histogram = createHistogram()
  let total = 0
  let n = 0
  const end = performance.now() + capMs
  while (n < count && performance.now() < end) {
    if (before !== undefined) await before(n)
    const t0 = performance.now()
    await op(n)
    const ns = (performance.now() - t0) * 1e6
    total += ns
    histogram.recordValue(Math.max(1, Math.round(ns)))
    n++
  }
  const out = { opsPerS: n === 0 ? 0 : 1e9 / (total / n), p50Us: histogram.getValueAtPercentile(50) / 1000, count: n }
  histogram.destroy()
  return out
}

interface ComboRuns { register: OpStats[], unregister: OpStats[], clear: OpStats[] }

export const controlScenario: Scenario = {
  name: 'control',
  title: '3. Control plane: register / unregister / clear, fan-out, GET /api/tools',
  steps (ctx) {
    const p = plan(ctx)
    return p.roles.length * p.tools.length * (1 + ctx.reps * 2) + 1 + ctx.reps + 2
  },
  async run (ctx) {
    const p = plan(ctx)
    const combos = new Map<string, ComboRuns>()
    const comboRows: string[][] = []
    for (const roles of p.roles) {
      for (const tools of p.tools) {
        ctx.progress.step(`prefill ${roles} roles × ${tools} tools`)
        const runtimes = [await buildRuntime(roles, tools, 0), await buildRuntime(roles, tools, 1)]
        try {
          for (let rep = 0; rep < ctx.reps; rep++) {
            for (const [sessions, tp] of runtimes.entries()) {
              ctx.progress.step(`${roles} roles × ${tools} tools, ${sessions} session/role (rep ${rep + 1}/${ctx.reps})`)
              const key = `${roles}|${tools}|${sessions}`
              const runs = combos.get(key) ?? { register: [], unregister: [], clear: [] }
              combos.set(key, runs)
              // A new name registered (then removed, untimed) and the reverse: the registry keeps its size.
              const register = await measureOps(p.maxOps, p.capMs,
                () => tp.register({ name: 'probe_tool', callback_url: `${CALLBACK}probe`, source: 'plugin:probe' }),
                () => tp.unregister({ name: 'probe_tool' }))
              const unregister = await measureOps(p.maxOps, p.capMs,
                () => tp.unregister({ name: 'probe_tool' }),
                () => tp.register({ name: 'probe_tool', callback_url: `${CALLBACK}probe`, source: 'plugin:probe' }))
              // clear a source holding 10 tools in every role (registered untimed before each clear)
              const clear = await measureOps(Math.ceil(p.maxOps / 10), p.capMs,
                () => tp.clear({ source: 'plugin:clear' }),
                async () => {
                  for (let i = 0; i < 10; i++) {
                    await tp.register({
                      name: `clear_${i}`,
                      callback_url: `${CALLBACK}c${i}`,
                      source: 'plugin:clear'
                    })
                  }
                })
              runs.register.push(register)
              runs.unregister.push(unregister)
              runs.clear.push(clear)
            }
          }
        } finally {
          for (const tp of runtimes) await tp.close()
        }
        for (const sessions of [0, 1]) {
          const runs = combos.get(`${roles}|${tools}|${sessions}`) as ComboRuns
          const cell = (list: OpStats[]): string =>
            `${fmtStat(stat(list.map((o) => o.opsPerS)), fmtRate)} · p50 ${fmtUs(stat(list.map((o) => o.p50Us)).median)}`
          comboRows.push([String(roles), String(tools), String(sessions), cell(runs.register), cell(runs.unregister),
            cell(runs.clear)])
        }
      }
    }
    const comboTable: Table = {
      title: 'Control-plane ops/s (from the mean op time) and p50 latency, Runtime API, instant sessions',
      head: ['roles', 'tools/role', 'sessions/role', 'register (all roles)', 'unregister', 'clear (10 tools/role)'],
      rows: comboRows
    }

    // Fan-out: one registration to 100 roles, with and without a session each, interleaved.
    ctx.progress.step('fan-out: 100 roles, building')
    const fan = [await buildRuntime(100, 10, 0), await buildRuntime(100, 10, 1)]
    const fanRuns: Record<string, number[]> = {
      'runtime.register, 0 sessions': [],
      'runtime.register, 1 session/role': [],
      'POST /api/tools/register (inject), 1 session/role': []
    }
    try {
      const body = JSON.stringify({ name: 'fan_tool', callback_url: `${CALLBACK}fan`, source: 'plugin:fan' })
      const injected = fan[1] as Toolport
      for (let rep = 0; rep < ctx.reps; rep++) {
        ctx.progress.step(`fan-out to 100 roles (rep ${rep + 1}/${ctx.reps})`)
        const zero = await measureOps(p.fanoutOps, p.capMs * 3, () => (fan[0] as Toolport).register({
          name: 'fan_tool',
          callback_url: `${CALLBACK}fan`,
          source: 'plugin:fan'
        }))
        const one = await measureOps(p.fanoutOps, p.capMs * 3, () => injected.register({
          name: 'fan_tool',
          callback_url: `${CALLBACK}fan`,
          source: 'plugin:fan'
        }))
        const http = await measureOps(p.fanoutOps, p.capMs * 3, async () => {
          const res = await injected.app.inject({
            method: 'POST',
            url: '/api/tools/register',
            headers: { 'content-type': 'application/json' },
            payload: body
          })
          if (res.statusCode !== 200) throw new Error(`register answered ${res.statusCode}: ${res.body}`)
        })
        fanRuns['runtime.register, 0 sessions']?.push(zero.p50Us)
        fanRuns['runtime.register, 1 session/role']?.push(one.p50Us)
        fanRuns['POST /api/tools/register (inject), 1 session/role']?.push(http.p50Us)
      }
    } finally {
      for (const tp of fan) await tp.close()
    }
    const fanTable: Table = {
      title: 'One registration fanned out to 100 roles (10 tools each): p50 latency',
      head: ['how', 'p50'],
      rows: Object.entries(fanRuns).map(([how, values]) => [how, fmtStat(stat(values), fmtUs)])
    }

    // GET /api/tools with 10 000 listed tools (10 roles × 1000).
    ctx.progress.step('GET /api/tools: 10 roles × 1000 tools, building')
    const listed = await buildRuntime(10, 1000, 0)
    const listRuns: Record<string, number[]> = {
      'JSON.stringify(tp.list()) (floor)': [],
      'GET via app.inject': [],
      'GET via real HTTP (undici)': []
    }
    let bodyBytes = 0
    try {
      const { url } = await listed.listen({ port: 0 })
      const client = new Pool(url, { connections: 1 })
      try {
        const histograms = Object.keys(listRuns).map(() => createHistogram())
        const variants: (() => Promise<number>)[] = [
          async () => JSON.stringify(listed.list()).length,
          async () => {
            const res = await listed.app.inject({ method: 'GET', url: '/api/tools' })
            if (res.statusCode !== 200) throw new Error(`GET /api/tools answered ${res.statusCode}`)
            return res.rawPayload.length
          },
          async () => {
            const res = await client.request({ method: 'GET', path: '/api/tools' })
            const text = await res.body.text()
            if (res.statusCode !== 200) throw new Error(`GET /api/tools answered ${res.statusCode}`)
            return Buffer.byteLength(text)
          }
        ]
        ctx.progress.step(`GET /api/tools × ${p.listIterations} per variant, interleaved`)
        for (let i = 0; i < p.listIterations + 3; i++) {
          for (const [k, variant] of variants.entries()) {
            const t0 = performance.now()
            bodyBytes = await variant()
            const us = (performance.now() - t0) * 1000
            if (i >= 3) histograms[k]?.recordValue(Math.max(1, Math.round(us))) // first 3 rounds: warm-up
          }
        }
        for (const [k, key] of Object.keys(listRuns).entries()) {
          const h = histograms[k]
          if (h === undefined) continue
          listRuns[key]?.push(h.getValueAtPercentile(50), h.getValueAtPercentile(99))
          h.destroy()
        }
      } finally {
        await client.close()
      }
    } finally {
      await listed.close()
    }
    const listTable: Table = {
      title: `GET /api/tools listing 10 000 tools (10 roles × 1000; ${(bodyBytes / 1024).toFixed(0)} KiB of JSON), ${p.listIterations} requests each`,
      head: ['variant', 'p50', 'p99'],
      rows: Object.entries(listRuns).map(([k, v]) => [k, fmtUs(v[0] ?? Number.NaN), fmtUs(v[1] ?? Number.NaN)])
    }

    const fanP50 = stat(fanRuns['runtime.register, 1 session/role'] ?? [])
    const httpList = listRuns['GET via real HTTP (undici)'] ?? []
    const checks: Check[] = [
      {
        scenario: 'control plane',
        what: 'registration fanned out to 100 roles with instant sessions, p50',
        measured: fmtStat(fanP50, fmtUs),
        ratio: `${fmtUs(stat(fanRuns['runtime.register, 0 sessions'] ?? []).median)} with 0 sessions`,
        target: '≤ 2 ms',
        met: fanP50.median <= 2_000
      },
      {
        scenario: 'control plane',
        what: 'GET /api/tools with 10 000 tools (real HTTP), p50',
        measured: fmtUs(httpList[0] ?? Number.NaN),
        ratio: `floor ${fmtUs(listRuns['JSON.stringify(tp.list()) (floor)']?.[0] ?? Number.NaN)}`,
        target: '≤ 15 ms',
        met: (httpList[0] ?? Number.POSITIVE_INFINITY) <= 15_000
      }
    ]
    return {
      tables: [comboTable, fanTable, listTable],
      checks,
      notes: [
        `register/unregister: the same probe tool registered to every role and removed again (${p.maxOps} ops or ${p.capMs} ms per cell and repetition); clear: a source with 10 tools in every role.`,
        'Prefilled tools are registered before sessions attach; every measured op syncs every affected role.'
      ],
      data: { combos: Object.fromEntries(combos), fanout: fanRuns, list: listRuns, listBodyBytes: bodyBytes }
    }
  }
}
