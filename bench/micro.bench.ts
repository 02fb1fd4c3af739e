// Scenario 4 — micro costs on the hot path (tinybench), each beside a baseline doing the bare
// minimum of the same job:
//   callback-URL validation      checkCallbackUrl       vs  new URL()
//   registry lookup              ToolRegistry.get       vs  Map.get (1000 tools)
//   arguments                    readArguments + ajv    vs  JSON.parse
//   request body building        Runtime's template     vs  JSON.stringify of the object
//   result mapping               replyToResult (bytes)  vs  JSON.parse (100 B and 64 KiB)
//                                readReply (the worker's step) and the bare JSON validity scan
//                                outcomeToResult (ok, 100 B)
//   thread crossing (pool mode)  structuredClone of a CallTask / CallOutcome (what postMessage
//                                serialises), a lower bound of the per-call cost of the pool
//   thread round trip            a piscina task that does nothing (dispatcher settings) vs
//                                one setImmediate: the fixed cost of one hop to the worker
// Sub-µs operations run INNER times per sample so the timer's own cost does not dominate.
// The Bench runs once per repetition (tasks in order, baseline first), median of repetitions.
import { pathToFileURL } from 'node:url'
import { Piscina } from 'piscina'
import { Bench } from 'tinybench'
import { checkCallbackUrl } from '../src/shared/loopback.js'
import { ToolEntry, ToolRegistry } from '../src/main/roles/tool-registry.js'
import { checkArguments, readArguments } from '../src/main/dispatch/arguments.js'
import { compileValidator, DEFAULT_SCHEMA_BUDGETS } from '../src/main/dispatch/validators.js'
import type { ArgumentsValidator } from '../src/main/roles/tool-registry.js'
import { outcomeToResult, replyToResult } from '../src/main/dispatch/result.js'
import { mapReply, readReply } from '../src/shared/reply.js'
import { isValidJson } from '../src/shared/json-scan.js'
import { jsonDepthExceeds } from '../src/main/http/json-body.js'
import type { CallOutcome, CallTask } from '../src/workers/protocol.js'
import { LANE_CALLS, pushOutcome, pushTask } from '../src/workers/protocol.js'
import { LARGE_REPLY, SMALL_REPLY } from './fixtures/payloads.js'
import { PARAMETERS, RAW_ARGUMENTS } from './lib/clients.js'
import { fmtNs, fmtRatio, fmtStat, pairedRatio, stat } from './lib/stats.js'
import { benchFile } from './lib/processes.js'
import type { Scenario, Table } from './lib/report.js'

const INNER = 100
const SMALL_BYTES = Buffer.from(SMALL_REPLY)
const LARGE_BYTES = Buffer.from(LARGE_REPLY)

interface MicroTask {
  group: string
  name: string
  /** The baseline of its group (ratios are to it). */
  isBaseline: boolean
  /** Operations per call of `fn`. */
  ops: number
  fn: () => unknown
}

// Results are written here so the JIT cannot drop the work.
let sink: unknown = null

/** The last result, so `sink` is read somewhere. */
export function lastMicroResult (): unknown {
  return sink
}

/** A piscina pool with the dispatcher's settings (1 thread, atomics disabled) and a no-op task. */
function noopPool (atomics: 'disabled' | 'async' = 'disabled'): Piscina {
  return new Piscina({
    filename: pathToFileURL(benchFile('fixtures/noop-task.ts')).href,
    minThreads: 1,
    maxThreads: 1,
    atomics,
    concurrentTasksPerWorker: 256,
    idleTimeout: 2 ** 31 - 1
  })
}

function tasks (pool: Piscina, asyncPool: Piscina, validator: ArgumentsValidator): MicroTask[] {
  const url = 'http://127.0.0.1:9333/tools/get_weather?v=1'
  const registry = new ToolRegistry()
  const map = new Map<string, ToolEntry>()
  for (let i = 0; i < 1000; i++) {
    const entry = new ToolEntry({
      name: `tool_${i}`,
      description: '',
      parameters: PARAMETERS,
      source: 'plugin:bench',
      timeoutMs: 30_000,
      callback: { href: `http://127.0.0.1:9333/t/${i}`, origin: 'http://127.0.0.1:9333', path: `/t/${i}` },
      validator
    })
    registry.set(entry)
    map.set(entry.name, entry)
  }
  const entry = registry.get('tool_500') as ToolEntry
  const noop = (): void => {}
  const callId = 'call_8f14e45fceea167a5a36dedd4bea2543'
  const task: CallTask = {
    id: 123456,
    url: 'http://127.0.0.1:9333/tools/get_weather',
    origin: 'http://127.0.0.1:9333',
    path: '/tools/get_weather',
    body: `{"name":"get_weather","arguments":${RAW_ARGUMENTS},"call_id":"${callId}","raw_arguments":${JSON.stringify(RAW_ARGUMENTS)}}`,
    callId,
    deadline: Date.now() + 30_000,
    timeoutMs: 30_000,
    maxResponseBytes: 4 * 1024 * 1024
  }
  // An ok outcome as the worker sends it: the reply already mapped (src/shared/reply.ts).
  const outcome = (body: string): CallOutcome => {
    const reply = mapReply(body, 'application/json')
    return {
      id: 123456,
      kind: 'ok',
      status: 200,
      text: reply.text,
      textIsJson: reply.textIsJson,
      toolError: reply.toolError,
      contentType: 'application/json',
      message: '',
      bytes: body.length
    }
  }
  const smallOutcome = outcome(SMALL_REPLY)
  const flatTask: unknown[] = [LANE_CALLS]
  pushTask(flatTask, task.id, task)
  const flatSmallOutcome: unknown[] = []
  pushOutcome(flatSmallOutcome, smallOutcome, [])
  const largeOutcome = outcome(LARGE_REPLY)
  const context = { name: 'get_weather', timeoutMs: 30_000 }
  const parsedArgs = JSON.parse(RAW_ARGUMENTS) as unknown
  const batch64 = Array.from({ length: 64 }, (_, i) => ({ ...task, id: i }))
  const repeat = (fn: () => unknown): () => void => () => {
    for (let i = 0; i < INNER; i++) sink = fn()
  }
  return [
    {
      group: 'callback-URL validation',
      name: 'new URL() (baseline)',
      isBaseline: true,
      ops: INNER,
      fn: repeat(() => new URL(url))
    },
    {
      group: 'callback-URL validation',
      name: 'checkCallbackUrl',
      isBaseline: false,
      ops: INNER,
      fn: repeat(() => checkCallbackUrl(url))
    },
    {
      group: 'registry lookup (1000 tools)',
      name: 'Map.get (baseline)',
      isBaseline: true,
      ops: INNER,
      fn: repeat(() => map.get('tool_500'))
    },
    {
      group: 'registry lookup (1000 tools)',
      name: 'ToolRegistry.get',
      isBaseline: false,
      ops: INNER,
      fn: repeat(() => registry.get('tool_500'))
    },
    {
      group: 'arguments',
      name: 'JSON.parse (baseline)',
      isBaseline: true,
      ops: INNER,
      fn: repeat(() => JSON.parse(RAW_ARGUMENTS))
    },
    {
      group: 'arguments',
      name: 'readArguments + checkArguments (ajv, RE2)',
      isBaseline: false,
      ops: INNER,
      fn: repeat(() => {
        const args = readArguments(RAW_ARGUMENTS, undefined)
        return args.ok ? checkArguments(entry, args.value) : ''
      })
    },
    {
      group: 'body building',
      name: 'JSON.stringify(call object) (baseline)',
      isBaseline: true,
      ops: INNER,
      fn: repeat(() => JSON.stringify({
        name: entry.name,
        arguments: parsedArgs,
        call_id: callId,
        raw_arguments: RAW_ARGUMENTS
      }))
    },
    {
      group: 'body building',
      name: 'Runtime.callTool template',
      isBaseline: false,
      ops: INNER,
      // Mirrors the body built in src/main/runtime.ts (callTool); keep the two in step.
      fn: repeat(() => `{"name":${JSON.stringify(entry.name)},"arguments":${RAW_ARGUMENTS},"call_id":${JSON.stringify(callId)},"raw_arguments":${JSON.stringify(RAW_ARGUMENTS)}}`)
    },
    {
      group: 'result mapping, 100 B',
      name: 'JSON.parse (baseline)',
      isBaseline: true,
      ops: INNER,
      fn: repeat(() => JSON.parse(SMALL_REPLY))
    },
    // Replies arrive as bytes (the worker reads them as such), so the mapping is timed on bytes.
    {
      group: 'result mapping, 100 B',
      name: 'replyToResult',
      isBaseline: false,
      ops: INNER,
      fn: repeat(() => replyToResult(SMALL_BYTES, 'application/json'))
    },
    {
      group: 'result mapping, 100 B',
      name: 'outcomeToResult',
      isBaseline: false,
      ops: INNER,
      fn: repeat(() => outcomeToResult(smallOutcome, context, 4 * 1024 * 1024))
    },
    {
      group: 'result mapping, 64 KiB',
      name: 'JSON.parse (baseline)',
      isBaseline: true,
      ops: 1,
      fn: () => { sink = JSON.parse(LARGE_REPLY) }
    },
    {
      group: 'result mapping, 64 KiB',
      name: 'replyToResult',
      isBaseline: false,
      ops: 1,
      fn: () => { sink = replyToResult(LARGE_BYTES, 'application/json') }
    },
    {
      group: 'result mapping, 64 KiB',
      name: 'readReply (worker side)',
      isBaseline: false,
      ops: 1,
      fn: () => { sink = readReply(LARGE_BYTES, 'application/json') }
    },
    {
      group: 'result mapping, 64 KiB',
      name: 'isValidJson (the scan alone)',
      isBaseline: false,
      ops: 1,
      fn: () => { sink = isValidJson(LARGE_BYTES) }
    },
    {
      group: 'result mapping, 64 KiB',
      name: 'outcomeToResult',
      isBaseline: false,
      ops: 1,
      fn: () => { sink = outcomeToResult(largeOutcome, context, 4 * 1024 * 1024) }
    },
    // What an envelope reader that slices `output` out of the body without parsing would cost:
    // one pass over the characters (the request body's depth check is such a pass).
    {
      group: 'result mapping, 64 KiB',
      name: 'one character pass (jsonDepthExceeds)',
      isBaseline: false,
      ops: 1,
      fn: () => { sink = jsonDepthExceeds(LARGE_REPLY, 1024) }
    },
    {
      group: 'thread crossing (structured clone)',
      name: 'CallTask',
      isBaseline: true,
      ops: INNER,
      fn: repeat(() => structuredClone(task))
    },
    {
      group: 'thread crossing (structured clone)',
      name: 'CallTask as a flat lane array',
      isBaseline: false,
      ops: INNER,
      fn: repeat(() => structuredClone(flatTask))
    },
    {
      group: 'thread crossing (structured clone)',
      name: 'CallOutcome, 100 B',
      isBaseline: false,
      ops: INNER,
      fn: repeat(() => structuredClone(smallOutcome))
    },
    {
      group: 'thread crossing (structured clone)',
      name: 'CallOutcome, 100 B, flat lane array',
      isBaseline: false,
      ops: INNER,
      fn: repeat(() => structuredClone(flatSmallOutcome))
    },
    {
      group: 'thread crossing (structured clone)',
      name: 'CallOutcome, 64 KiB',
      isBaseline: false,
      ops: 1,
      fn: () => { sink = structuredClone(largeOutcome) }
    },
    {
      group: 'per-call bookkeeping',
      name: 'allocate a small object (baseline)',
      isBaseline: true,
      ops: INNER,
      fn: repeat(() => ({ id: 1, done: false }))
    },
    {
      group: 'per-call bookkeeping',
      name: 'AbortController + add/removeEventListener',
      isBaseline: false,
      ops: INNER,
      fn: repeat(() => {
        const controller = new AbortController()
        controller.signal.addEventListener('abort', noop, { once: true })
        controller.signal.removeEventListener('abort', noop)
        return controller
      })
    },
    {
      group: 'per-call bookkeeping',
      name: 'setTimeout + clearTimeout',
      isBaseline: false,
      ops: INNER,
      fn: repeat(() => { clearTimeout(setTimeout(noop, 30_000)) })
    },
    {
      group: 'thread round trip (awaited, c=1)',
      name: 'await setImmediate (baseline)',
      isBaseline: true,
      ops: 1,
      fn: () => new Promise((resolve) => { setImmediate(resolve) })
    },
    {
      group: 'thread round trip (awaited, c=1)',
      name: 'piscina run, empty batch',
      isBaseline: false,
      ops: 1,
      fn: () => pool.run({ calls: [] })
    },
    {
      group: 'thread round trip (awaited, c=1)',
      name: 'piscina run, batch of 1 CallTask',
      isBaseline: false,
      ops: 1,
      fn: () => pool.run({ calls: [task] })
    },
    {
      group: 'thread round trip (awaited, c=1)',
      name: 'piscina run, batch of 64 CallTasks',
      isBaseline: false,
      ops: 1,
      fn: () => pool.run({ calls: batch64 })
    },
    {
      group: 'thread round trip (awaited, c=1)',
      name: 'piscina run, empty batch, atomics async',
      isBaseline: false,
      ops: 1,
      fn: () => asyncPool.run({ calls: [] })
    }
  ]
}

export const microScenario: Scenario = {
  name: 'micro',
  title: '4. Micro: hot-path costs (tinybench)',
  steps (ctx) {
    return ctx.reps
  },
  async run (ctx) {
    const pool = noopPool()
    const asyncPool = noopPool('async')
    const list = tasks(pool, asyncPool, await compileValidator(PARAMETERS, DEFAULT_SCHEMA_BUDGETS))
    const perRep = new Map<string, number[]>()
    try {
      for (let rep = 0; rep < ctx.reps; rep++) {
        ctx.progress.step(`tinybench, ${list.length} tasks (rep ${rep + 1}/${ctx.reps})`)
        const bench = new Bench({
          time: ctx.isQuick ? 40 : 150,
          iterations: 10,
          warmupTime: ctx.isQuick ? 10 : 40,
          warmupIterations: 5
        })
        for (const t of list) bench.add(`${t.group} :: ${t.name}`, t.fn)
        await bench.run()
        for (const [i, task] of bench.tasks.entries()) {
          const meta = list[i] as MicroTask
          const result = task.result
          const ns = 'latency' in result ? (result.latency.p50 * 1e6) / meta.ops : Number.NaN
          perRep.set(task.name, [...(perRep.get(task.name) ?? []), ns])
        }
        // Let other scenarios' timers run between repetitions.
        await new Promise((resolve) => setImmediate(resolve))
      }
    } finally {
      await pool.destroy()
      await asyncPool.destroy()
    }
    const rows: string[][] = []
    const data: Record<string, unknown> = {}
    for (const t of list) {
      const key = `${t.group} :: ${t.name}`
      const values = perRep.get(key) ?? []
      const baseline = list.find((b) => b.group === t.group && b.isBaseline)
      const base = baseline === undefined ? [] : perRep.get(`${baseline.group} :: ${baseline.name}`) ?? []
      const s = stat(values)
      const ratio = t.isBaseline ? null : pairedRatio(values, base)
      rows.push([t.group, t.name, fmtStat(s, fmtNs), fmtRate(1e9 / s.median),
        ratio === null ? '1' : fmtStat(ratio, fmtRatio)])
      data[key] = { nsPerOp: s, ratio }
    }
    const table: Table = {
      title: "Per-operation cost (each repetition's median sample), median (min–max) of the repetitions",
      head: ['group', 'operation', 'time/op', 'ops/s', 'vs baseline'],
      rows
    }
    return {
      tables: [table],
      checks: [],
      notes: [`Sub-µs operations run ${INNER}× per tinybench sample; ratios are to the first row of each group.`],
      data
    }
  }
}

function fmtRate (opsPerS: number): string {
  if (!Number.isFinite(opsPerS)) return '–'
  if (opsPerS >= 1e6) return `${(opsPerS / 1e6).toFixed(1)} M`
  if (opsPerS >= 1e3) return `${(opsPerS / 1e3).toFixed(1)} k`
  return opsPerS.toFixed(0)
}
