// Toolport's Prometheus metrics (README "The API" `GET /metrics`, "Live events", the typed events;
// docs/architecture.md "Metrics"; src/main/metrics.ts and its header's promise of bounded labels)
// against a model of what happened, in pool and inline mode, with real worker threads, real
// sockets on 127.0.0.1, real MCP SDK clients and real event-stream subscribers.
//
// How: random sequences of operations — registrations, unregistrations and clears across roles
// with hostile names (quotes, backslashes, newlines, NUL, emoji, "(unknown)", exposition syntax);
// calls over the library, `POST /api/tools/call` and MCP that succeed, are tool errors, or fail
// with each documented kind (HTTP status, timeout, refused connection, broken reply, bad JSON,
// oversized reply, the reply-byte budget, busy origin, cancellation, a dying worker, eviction);
// local tools; MCP sessions and failing model sessions coming and going; extra event-stream
// subscribers — are replayed into a small model of the documented rules. After each run (and at
// random points) every `toolport_*` series must equal the model exactly, and agree with
// Toolport's own `call-finished`/`sync-finished`/`origin-evicted` events and the `call`, `sync`
// and `evicted` events of `GET /api/events`; gauges are back to zero; every histogram's count is
// the matching counter. Each scrape is read by a strict Prometheus text-format 0.0.4 checker
// written below (UTF-8, HELP/TYPE once and before the samples, families contiguous, no duplicate
// series, only the three escapes, histogram buckets cumulative and closed by `+Inf` = `_count`).
// Further tests scrape concurrently with bursts of calls (no torn scrape), close the runtime
// under load (what the metrics say afterwards, also in a host's app), churn tool names the way a
// hostile plugin would (bounded series), and check the security guard on `/metrics`.
//
// TP_PROPERTY_RUNS=5 multiplies the runs of every property.
import assert from 'node:assert/strict'
import { createServer, request as httpRequest, type IncomingMessage, type Server, type ServerResponse } from 'node:http'
import type { AddressInfo, Socket } from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'
import { setFlagsFromString } from 'node:v8'
import { runInNewContext } from 'node:vm'
import { test, type TestContext } from 'node:test'
import fastify from 'fastify'
import fc from 'fast-check'
import { request as undiciRequest } from 'undici'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { createToolport, toolportPlugin, type Toolport, type ToolportOptions } from '../../src/main/index.js'
import type { CallFinishedEvent, OriginEvictedEvent, SyncFinishedEvent } from '../../src/main/events.js'
import { kPendingCalls, kWorkerThreads } from '../../src/main/symbols.js'
import { STALE_TOOL_NAMES } from '../../src/main/metrics.js'
import { assertError, httpJson, session, startToolport, subscribeEvents, waitFor, within, type FakeSession, type SseItem } from '../helpers.js'
import { closedPort } from '../fixtures/callback-server.js'

const RUNS = Math.max(1, Number(process.env.TP_PROPERTY_RUNS ?? '1'))
const FAILING_TIMEOUT_MS = 600_000
const MAX_SHRINKS = 20
const GUARD_MS = 15_000

const MODES = ['pool', 'inline'] as const
type Mode = typeof MODES[number]
type Kind = CallFinishedEvent['outcome']

/** `dispatch.maxBufferedReplyBytes` (its minimum): a 3000-byte reply is dropped as `memory`. */
const BUDGET_BYTES = 1024
const MAX_RESPONSE_BYTES = 8192
/** The short tools' `timeout_seconds`; the others have 30 s. */
const SHORT_SECONDS = 0.25
const THRESHOLD = 3

/** Small per-origin bounds, so that `busy` is reachable: one call with the plugin, one waiting. */
function dispatchOptions (mode: Mode): NonNullable<ToolportOptions['dispatch']> {
  return {
    mode,
    threads: 1,
    maxInFlightPerOrigin: 1,
    maxQueuedPerOrigin: 1,
    maxBufferedReplyBytes: BUDGET_BYTES,
    maxResponseBytes: MAX_RESPONSE_BYTES,
    closeGraceMs: 100
  }
}

/** The families README "The API" lists for `/metrics`, by type (src/main/metrics.ts names them). */
const COUNTERS = ['toolport_calls_total', 'toolport_evictions_total', 'toolport_evicted_tools_total',
  'toolport_sync_failures_total']
const GAUGES = ['toolport_calls_in_flight', 'toolport_dispatch_queue_depth', 'toolport_pool_utilization',
  'toolport_reply_buffer_bytes', 'toolport_reply_buffer_limit_bytes', 'toolport_pool_threads', 'toolport_registry_tools']
const HISTOGRAMS = ['toolport_call_duration_seconds', 'toolport_dispatch_queue_seconds',
  'toolport_dispatch_callback_seconds', 'toolport_sync_duration_seconds']

/**
 * README "Live events" `call`: a dispatch outcome, or `invalid_arguments`, `check_budget`, `unknown_tool`,
 * `local_error`.
 */
const DISPATCH_KINDS = ['ok', 'http', 'timeout', 'connect', 'protocol', 'too_large', 'cancelled', 'busy', 'internal',
  'memory', 'refused']
const OUTCOMES = new Set([...DISPATCH_KINDS, 'invalid_arguments', 'check_budget', 'unknown_tool', 'local_error'])

/** Tool names a hostile plugin may choose (all valid: 1–64 code points). */
const NAMES = ['get_weather', 'q"uo"te', 'back\\slash\\n', 'new\nline', 'cr\rtab\t', '🦊 grüße', '(unknown)',
  'nul\u0000byte', 'end} 1\n# TYPE evil counter', 'z'.repeat(64)]
/** Role names a host may configure (valid: 1–128 characters, well-formed). */
const ROLES = ['Lanlan', 'r"o\\le', 'multi\nline', 'ü🦊']
const PARAMS = { type: 'object', properties: { b: { type: 'string' }, t: { type: 'string' } } }

// ---------------------------------------------------------------------------------------------
// A strict checker of the Prometheus text format 0.0.4
// (https://prometheus.io/docs/instrumenting/exposition_formats/#text-based-format)

interface Sample {
  name: string
  family: string
  labels: Record<string, string>
  value: number
}

interface Exposition {
  samples: Sample[]
  types: Map<string, string>
  /** Violations of the format: each one fails a test. */
  errors: string[]
  /** Values only Go's case-insensitive ParseFloat accepts (`Nan`, `inf`), not the documented spelling. */
  nonCanonical: string[]
}

const METRIC_NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*/
const LABEL_NAME = /^[a-zA-Z_][a-zA-Z0-9_]*/
const FLOAT = /^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?$/
const TYPES = new Set(['counter', 'gauge', 'histogram', 'summary', 'untyped'])

function parseValue (text: string): { value: number, canonical: boolean } | null {
  if (FLOAT.test(text)) return { value: Number(text), canonical: true }
  if (text === 'NaN') return { value: NaN, canonical: true }
  if (text === '+Inf') return { value: Infinity, canonical: true }
  if (text === '-Inf') return { value: -Infinity, canonical: true }
  const go = /^([+-]?)(inf|infinity|nan)$/i.exec(text)
  if (go === null) return null
  const value = go[2]!.toLowerCase() === 'nan' ? NaN : go[1] === '-' ? -Infinity : Infinity
  return { value, canonical: false }
}

/** Reads an exposition strictly; never throws (the caller asserts `errors` is empty). */
function parseExposition (raw: Uint8Array | string): Exposition {
  const errors: string[] = []
  const nonCanonical: string[] = []
  let text: string
  if (typeof raw === 'string') {
    text = raw
  } else {
    try {
      text = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true }).decode(raw)
    } catch {
      errors.push('the body is not valid UTF-8')
      text = Buffer.from(raw).toString('utf8')
    }
  }
  if (text.length > 0 && !text.endsWith('\n')) errors.push('the last line does not end with a line feed')
  const lines = text.split('\n')
  if (lines.at(-1) === '') lines.pop()
  const types = new Map<string, string>()
  const helps = new Set<string>()
  const closed = new Set<string>()
  let current: string | null = null
  const seen = new Set<string>()
  const samples: Sample[] = []
  const enter = (family: string, at: string): void => {
    if (family === current) return
    if (closed.has(family)) errors.push(`${at}: family ${family} appears again after other families (not one group)`)
    if (current !== null) closed.add(current)
    current = family
  }
  const familyOf = (name: string): string => {
    if (types.has(name)) return name
    for (const suffix of ['_bucket', '_count', '_sum']) {
      if (!name.endsWith(suffix)) continue
      const base = name.slice(0, -suffix.length)
      const type = types.get(base)
      if (type === 'histogram' || (type === 'summary' && suffix !== '_bucket')) return base
    }
    return name
  }
  lines.forEach((line, index) => {
    const at = `line ${index + 1} ${JSON.stringify(line.slice(0, 80))}`
    if (line === '') return
    if (line.startsWith('#')) {
      const meta = /^#[ \t]+(HELP|TYPE)[ \t]+(.*)$/.exec(line)
      if (meta === null) return // a plain comment
      const rest = meta[2]!
      const nameMatch = METRIC_NAME.exec(rest)
      if (nameMatch === null) {
        errors.push(`${at}: ${meta[1]} without a valid metric name`)
        return
      }
      const name = nameMatch[0]
      const tail = rest.slice(name.length)
      if (tail !== '' && !/^[ \t]/.test(tail)) {
        errors.push(`${at}: the metric name of ${meta[1]} is not followed by a blank`)
        return
      }
      const argument = tail.replace(/^[ \t]+/, '')
      if (samples.some((s) => s.family === name)) errors.push(`${at}: ${meta[1]} after the family's samples`)
      enter(name, at)
      if (meta[1] === 'HELP') {
        if (helps.has(name)) errors.push(`${at}: a second HELP for ${name}`)
        helps.add(name)
        if (/\\(?![\\n])/.test(argument.replace(/\\\\/g, ''))) errors.push(`${at}: HELP escapes other than \\\\ and \\n`)
      } else {
        if (types.has(name)) errors.push(`${at}: a second TYPE for ${name}`)
        if (!TYPES.has(argument)) errors.push(`${at}: unknown type ${JSON.stringify(argument)}`)
        types.set(name, argument)
      }
      return
    }
    const nameMatch = METRIC_NAME.exec(line)
    if (nameMatch === null) {
      errors.push(`${at}: no metric name`)
      return
    }
    const name = nameMatch[0]
    let pos = name.length
    const labels: Record<string, string> = Object.create(null)
    if (line[pos] === '{') {
      pos++
      for (;;) {
        while (line[pos] === ' ' || line[pos] === '\t') pos++
        if (line[pos] === '}') {
          pos++
          break
        }
        const labelMatch = LABEL_NAME.exec(line.slice(pos))
        if (labelMatch === null) {
          errors.push(`${at}: a bad label name at column ${pos}`)
          return
        }
        const label = labelMatch[0]
        pos += label.length
        if (label.startsWith('__')) errors.push(`${at}: reserved label name ${label}`)
        if (line[pos] !== '=' || line[pos + 1] !== '"') {
          errors.push(`${at}: label ${label} is not followed by ="`)
          return
        }
        pos += 2
        let value = ''
        for (;;) {
          const ch = line[pos]
          if (ch === undefined) {
            errors.push(`${at}: the value of label ${label} is not terminated`)
            return
          }
          pos++
          if (ch === '"') break
          if (ch === '\\') {
            const next = line[pos++]
            if (next === '\\') value += '\\'
            else if (next === '"') value += '"'
            else if (next === 'n') value += '\n'
            else {
              errors.push(`${at}: invalid escape \\${next ?? ''} in label ${label}`)
              return
            }
            continue
          }
          value += ch
        }
        if (label in labels) errors.push(`${at}: label ${label} twice`)
        labels[label] = value
        while (line[pos] === ' ' || line[pos] === '\t') pos++
        if (line[pos] === ',') {
          pos++
          continue
        }
        if (line[pos] === '}') {
          pos++
          break
        }
        errors.push(`${at}: expected , or } at column ${pos}`)
        return
      }
    }
    const tail = /^[ \t]+(\S+)(?:[ \t]+(-?\d+))?[ \t]*$/.exec(line.slice(pos))
    if (tail === null) {
      errors.push(`${at}: no value (or junk after it)`)
      return
    }
    const parsed = parseValue(tail[1]!)
    if (parsed === null) {
      errors.push(`${at}: value ${JSON.stringify(tail[1])} is not a float`)
      return
    }
    if (!parsed.canonical) nonCanonical.push(line)
    const family = familyOf(name)
    enter(family, at)
    const type = types.get(family) ?? 'untyped'
    if (type === 'histogram' && name === family) errors.push(`${at}: a histogram sample without _bucket/_sum/_count`)
    if (type === 'histogram' && name.endsWith('_bucket') && !('le' in labels)) errors.push(`${at}: a bucket without le`)
    if ((type === 'counter' || (type === 'histogram' && !name.endsWith('_sum'))) && !(parsed.value >= 0)) {
      errors.push(`${at}: a ${type} value that is negative or NaN`)
    }
    const key = `${name}{${Object.keys(labels).sort().map((k) => `${k}=${JSON.stringify(labels[k])}`).join(',')}}`
    if (seen.has(key)) errors.push(`${at}: duplicate series ${key}`)
    seen.add(key)
    samples.push({ name, family, labels, value: parsed.value })
  })
  checkHistograms(samples, types, errors)
  return { samples, types, errors, nonCanonical }
}

/** Every histogram series: `le` increasing, cumulative counts, `+Inf` last and equal to `_count`, a `_sum`. */
function checkHistograms (samples: Sample[], types: Map<string, string>, errors: string[]): void {
  const series = new Map<string, { buckets: Array<[number, number]>, count?: number, sum?: number }>()
  const seriesKey = (family: string, labels: Record<string, string>): string =>
    `${family}${JSON.stringify(Object.keys(labels).filter((k) => k !== 'le').sort().map((k) => [k, labels[k]]))}`
  for (const s of samples) {
    if (types.get(s.family) !== 'histogram') continue
    const key = seriesKey(s.family, s.labels)
    let entry = series.get(key)
    if (entry === undefined) {
      entry = { buckets: [] }
      series.set(key, entry)
    }
    if (s.name.endsWith('_bucket')) {
      const le = parseValue(s.labels.le ?? '')
      if (le === null || Number.isNaN(le.value)) errors.push(`${key}: le ${JSON.stringify(s.labels.le)} is not a float`)
      else entry.buckets.push([le.value, s.value])
    } else if (s.name.endsWith('_count')) {
      entry.count = s.value
    } else {
      entry.sum = s.value
    }
  }
  for (const [key, { buckets, count, sum }] of series) {
    for (let i = 1; i < buckets.length; i++) {
      if (!(buckets[i]![0] > buckets[i - 1]![0])) errors.push(`${key}: le not increasing`)
      if (buckets[i]![1] < buckets[i - 1]![1]) errors.push(`${key}: buckets not cumulative`)
    }
    const last = buckets.at(-1)
    if (last === undefined || last[0] !== Infinity) errors.push(`${key}: no +Inf bucket last`)
    else if (count !== last[1]) errors.push(`${key}: _count ${String(count)} is not the +Inf bucket ${last[1]}`)
    if (sum === undefined) errors.push(`${key}: no _sum`)
  }
}

function strict (raw: Uint8Array | string, what: string): Exposition {
  const exposition = parseExposition(raw)
  assert.deepEqual(exposition.errors, [], `${what}: the exposition breaks the text format`)
  return exposition
}

function value (exposition: Exposition, name: string, labels: Record<string, string> = {}): number | undefined {
  const found = exposition.samples.filter((s) => s.name === name &&
    Object.keys(labels).every((k) => s.labels[k] === labels[k]))
  if (found.length > 1) throw new Error(`${name} ${JSON.stringify(labels)} names ${found.length} series`)
  return found[0]?.value
}

/** `name` summed per value of `label` (series with value 0 left out). */
function byLabel (exposition: Exposition, name: string, label: string): Map<string, number> {
  const sums = new Map<string, number>()
  for (const s of exposition.samples) {
    if (s.name !== name || s.value === 0) continue
    const key = s.labels[label] ?? ''
    sums.set(key, (sums.get(key) ?? 0) + s.value)
  }
  return sums
}

/** toolport_calls_total as `JSON [role, tool, outcome]` → count. */
function callSeries (exposition: Exposition): Map<string, number> {
  const calls = new Map<string, number>()
  for (const s of exposition.samples) {
    if (s.name !== 'toolport_calls_total') continue
    const key = JSON.stringify([s.labels.role, s.labels.tool, s.labels.outcome])
    calls.set(key, (calls.get(key) ?? 0) + s.value)
  }
  return calls
}

function sorted (map: Map<string, number>): Record<string, number> {
  return Object.fromEntries([...map].filter(([, n]) => n !== 0).sort(([a], [b]) => a < b ? -1 : a > b ? 1 : 0))
}

function bump (map: Map<string, number>, key: string, by = 1): void {
  map.set(key, (map.get(key) ?? 0) + by)
}

interface Scraped { status: number, type: string, body: Uint8Array }

async function scrape (url: string, headers: Record<string, string> = {}): Promise<Scraped> {
  const res = await undiciRequest(`${url}/metrics`, { headers })
  const body = new Uint8Array(await res.body.arrayBuffer())
  return { status: res.statusCode, type: String(res.headers['content-type']), body }
}

async function scrapeStrict (url: string, what: string): Promise<Exposition> {
  const res = await scrape(url)
  assert.equal(res.status, 200, `${what}: GET /metrics`)
  assert.equal(res.type, 'text/plain; version=0.0.4; charset=utf-8', `${what}: content type`)
  return strict(res.body, what)
}

/** The documented families are there with their documented types. */
function assertFamilies (exposition: Exposition, what: string): void {
  for (const name of COUNTERS) assert.equal(exposition.types.get(name), 'counter', `${what}: TYPE of ${name}`)
  for (const name of GAUGES) assert.equal(exposition.types.get(name), 'gauge', `${what}: TYPE of ${name}`)
  for (const name of HISTOGRAMS) assert.equal(exposition.types.get(name), 'histogram', `${what}: TYPE of ${name}`)
  for (const s of exposition.samples) {
    if (!s.family.startsWith('toolport_')) continue
    if (s.labels.outcome !== undefined) assert.ok(OUTCOMES.has(s.labels.outcome), `${what}: undocumented outcome ${s.labels.outcome}`)
  }
}

// ---------------------------------------------------------------------------------------------
// A plugin: what it does with a call is in the call's arguments ({b, t})

const BEHAVIOURS = ['ok', 'tool_error', 'status', 'badjson', 'mem', 'big', 'rst', 'never', 'cancel', 'precancel',
  'badargs'] as const
type Behaviour = typeof BEHAVIOURS[number] | 'hold'

class Plugin {
  readonly server: Server
  readonly sockets = new Set<Socket>()
  readonly received = new Set<string>()
  readonly held = new Map<string, ServerResponse>()
  origin = ''

  constructor () {
    this.server = createServer({ keepAliveTimeout: 30_000 }, (request, response) => { this.#handle(request, response) })
    this.server.on('connection', (socket: Socket) => {
      this.sockets.add(socket)
      socket.on('close', () => this.sockets.delete(socket))
    })
  }

  async start (): Promise<void> {
    await new Promise<void>((resolve) => this.server.listen(0, '127.0.0.1', resolve))
    this.origin = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`
  }

  /** Answers a held call (`ok`). */
  release (token: string): void {
    const response = this.held.get(token)
    this.held.delete(token)
    if (response !== undefined && !response.destroyed) json(response, { output: token })
  }

  async stop (): Promise<void> {
    for (const response of this.held.values()) response.destroy()
    this.held.clear()
    const closed = new Promise<void>((resolve) => this.server.close(() => resolve()))
    for (const socket of this.sockets) socket.destroy()
    await closed
  }

  #handle (request: IncomingMessage, response: ServerResponse): void {
    const chunks: Buffer[] = []
    request.on('data', (chunk: Buffer) => chunks.push(chunk))
    request.on('end', () => {
      let args: { b: Behaviour, t: string }
      try {
        args = JSON.parse(Buffer.concat(chunks).toString('utf8')).arguments
      } catch {
        response.writeHead(400).end()
        return
      }
      this.received.add(args.t)
      switch (args.b) {
        case 'ok': json(response, { output: args.t }); return
        case 'tool_error': json(response, { error: 'nope', is_error: true }); return
        case 'status':
          response.writeHead(503, { 'content-type': 'text/plain' })
          response.end('down for maintenance')
          return
        case 'badjson':
          response.writeHead(200, { 'content-type': 'application/json' })
          response.end('{"output": not json')
          return
        case 'mem': {
          // Within maxResponseBytes, beyond the reply-byte budget.
          const body = JSON.stringify({ output: 'm'.repeat(3000) })
          response.writeHead(200, { 'content-type': 'application/json', 'content-length': String(body.length) })
          response.end(body)
          return
        }
        case 'big': {
          const body = JSON.stringify({ output: 'b'.repeat(MAX_RESPONSE_BYTES * 2) })
          response.writeHead(200, { 'content-type': 'application/json', 'content-length': String(body.length) })
          response.end(body)
          return
        }
        case 'rst':
          response.writeHead(200, { 'content-type': 'application/json', 'content-length': '100' })
          response.write('{"output":')
          setImmediate(() => request.socket.destroy())
          return
        default:
          // never, cancel, hold: answered only by release() or not at all.
          this.held.set(args.t, response)
          response.on('close', () => { if (this.held.get(args.t) === response) this.held.delete(args.t) })
      }
    })
  }
}

function json (response: ServerResponse, body: unknown): void {
  const text = JSON.stringify(body)
  response.writeHead(200, { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(text)) })
  response.end(text)
}

/**
 * A port nothing listens on: every connection to it is refused. Below the range the kernel hands
 * out for port 0 (closedPort), so that no other test's server is given it later.
 */
async function deadOrigin (): Promise<string> {
  return `http://127.0.0.1:${await closedPort()}`
}

async function startPlugin (t: TestContext): Promise<Plugin> {
  const plugin = new Plugin()
  await plugin.start()
  t.after(() => plugin.stop())
  return plugin
}

// ---------------------------------------------------------------------------------------------
// Event-stream subscribers and MCP clients

interface McpHandle { client: Client, transport: StreamableHTTPClientTransport }

/** What the tests read of a ToolResult (library, HTTP or MCP). */
interface ToolResultLike { is_error: boolean, error?: string | undefined }

async function openMcp (url: string, role: string): Promise<McpHandle> {
  const client = new Client({ name: 'metrics-properties', version: '1.0.0' })
  const transport = new StreamableHTTPClientTransport(new URL(`${url}/mcp/${encodeURIComponent(role)}`))
  transport.onerror = () => {}
  await client.connect(transport)
  client.onerror = () => {}
  return { client, transport }
}

async function closeMcp (handle: McpHandle): Promise<void> {
  await handle.transport.terminateSession().catch(() => {})
  await handle.client.close().catch(() => {})
}

/** An MCP `tools/call` as a ToolResult-like shape (an MCP protocol error becomes an error result). */
async function mcpCall (handle: McpHandle, name: string, args: unknown, signal?: AbortSignal): Promise<ToolResultLike> {
  try {
    const result = await handle.client.callTool({ name, arguments: args as Record<string, unknown> }, undefined,
      signal === undefined ? {} : { signal })
    const text = (result.content as Array<{ type: string, text?: string }>)[0]?.text ?? ''
    if (result.isError !== true) return { is_error: false }
    return { is_error: true, error: String(JSON.parse(text).error) }
  } catch (err) {
    return { is_error: true, error: (err as Error).message }
  }
}

// ---------------------------------------------------------------------------------------------
// The model

interface ToolState { local: boolean, dead: boolean, plugin: boolean, short: boolean, source: string }

class Model {
  readonly registry = new Map<string, Map<string, ToolState>>()
  /** JSON [role, tool label, outcome] → calls. */
  readonly calls = new Map<string, number>()
  /** Outcome → callback calls the dispatcher admitted (the dispatch histograms observe those). */
  readonly admitted = new Map<string, number>()
  evictions = 0
  evictedRegistrations = 0
  /** Consecutive connection failures of `plugin:` tools at the dead origin. */
  deadFailures = 0
  readonly syncs = new Map<string, number>()
  readonly syncFailures = new Map<string, number>()
  readonly mcp = new Map<string, McpHandle[]>()
  readonly throwing = new Map<string, FakeSession>()
  totalCalls = 0

  constructor (roles: readonly string[]) {
    for (const role of roles) {
      this.registry.set(role, new Map())
      this.mcp.set(role, [])
    }
  }

  tools (role: string): Map<string, ToolState> { return this.registry.get(role)! }
  sessions (role: string): number { return this.mcp.get(role)!.length + (this.throwing.has(role) ? 1 : 0) }

  /** A sync of `role` ran if it had sessions (docs/protocol.md "Sync"); it fails with a throwing one. */
  synced (role: string): void {
    if (this.sessions(role) === 0) return
    bump(this.syncs, role)
    if (this.throwing.has(role)) bump(this.syncFailures, role)
  }

  call (role: string, name: string, kind: Kind, admitted: boolean): void {
    bump(this.calls, JSON.stringify([role, kind === 'unknown_tool' ? '(unknown)' : name, kind]))
    if (admitted) bump(this.admitted, kind)
    this.totalCalls++
  }

  get syncTotal (): number { return [...this.syncs.values()].reduce((a, b) => a + b, 0) }

  /** R13: every `plugin:` tool at the dead origin leaves every role; each affected role syncs once. */
  evict (): void {
    this.deadFailures = 0
    let removed = 0
    const affected: string[] = []
    for (const [role, tools] of this.registry) {
      let lost = false
      for (const [name, tool] of tools) {
        if (tool.local || !tool.dead || !tool.plugin) continue
        tools.delete(name)
        removed++
        lost = true
      }
      if (lost) affected.push(role)
    }
    if (removed === 0) return
    this.evictions++
    this.evictedRegistrations += removed
    for (const role of affected) this.synced(role)
  }
}

/** What a call ends in by the documented rules, and whether the dispatcher admits it. */
function predict (tool: ToolState | undefined, b: Behaviour): { kind: Kind, admitted: boolean } {
  if (tool === undefined) return { kind: 'unknown_tool', admitted: false }
  if (b === 'badargs') return { kind: 'invalid_arguments', admitted: false }
  if (tool.local) return { kind: b === 'ok' ? 'ok' : 'local_error', admitted: false }
  if (b === 'precancel') return { kind: 'cancelled', admitted: false }
  if (tool.dead) return { kind: 'connect', admitted: true }
  const kinds: Record<string, Kind> = {
    ok: 'ok',
    tool_error: 'ok',
    badjson: 'ok',
    status: 'http',
    mem: 'memory',
    big: 'too_large',
    rst: 'protocol',
    never: 'timeout',
    cancel: 'cancelled',
    hold: 'ok'
  }
  return { kind: kinds[b]!, admitted: true }
}

/** A behaviour the tool can show (a long tool never gets `never`, a local one no cancellation). */
function normalise (tool: ToolState | undefined, b: Behaviour): Behaviour {
  if (tool === undefined) return b === 'cancel' ? 'ok' : b
  if (tool.local) return b === 'cancel' || b === 'precancel' || b === 'never' ? 'status' : b
  if (tool.dead) return b === 'cancel' || b === 'never' ? 'ok' : b
  if (b === 'never' && !tool.short) return 'ok'
  return b
}

/** The text a result of this kind has (the model-visible errors of docs/protocol.md). */
const RESULT_TEXT: Record<string, (error: string) => boolean> = {
  http: (e) => e.includes('returned HTTP 503'),
  timeout: (e) => e.includes('timed out after'),
  connect: (e) => e.includes('is unreachable'),
  protocol: (e) => e.includes('callback failed'),
  too_large: (e) => e.includes(`replied with more than ${MAX_RESPONSE_BYTES} bytes`),
  memory: (e) => e.includes('reply was dropped'),
  cancelled: (e) => e.includes('call was cancelled'),
  busy: (e) => e.includes('Toolport is busy') || e.includes('Toolport is shutting down'),
  unknown_tool: (e) => e.includes('unknown tool \''),
  invalid_arguments: () => true,
  local_error: (e) => e.includes('local failure'),
  internal: (e) => e.includes('internal error in Toolport')
}

/** The kind a result shows; a short tool may time out on a busy machine instead of `expected`. */
function observe (expected: Kind, result: { is_error: boolean, error?: string | undefined }, short: boolean): Kind {
  const error = result.error ?? ''
  if (short && result.is_error && error.includes('timed out after')) return 'timeout'
  if (expected === 'ok') {
    assert.ok(!result.is_error || error === 'nope', `an ok call answered ${JSON.stringify(result)}`)
  } else {
    assert.ok(result.is_error && RESULT_TEXT[expected]!(error), `a call expected to be ${expected} answered ${JSON.stringify(result)}`)
  }
  return expected
}

// ---------------------------------------------------------------------------------------------
// Operations

type Op =
  | { op: 'register', name: string, role: string | null, dead: boolean, plugin: boolean, short: boolean }
  | { op: 'unregister', name: string, role: string | null }
  | { op: 'clear', plugin: boolean, role: string | null }
  | { op: 'call', role: string, name: string, pick: number | null, b: typeof BEHAVIOURS[number], via: 'lib' | 'http' | 'mcp' }
  | { op: 'burst', pick: number }
  | { op: 'local', role: string, name: string, remove: boolean }
  | { op: 'session', role: string, kind: 'mcp-open' | 'mcp-close' | 'throw-attach' | 'throw-detach' }
  | { op: 'subscriber', open: boolean }
  | { op: 'crash', pick: number }
  | { op: 'scrape' }

const nameArb = fc.constantFrom(...NAMES)
const roleArb = fc.constantFrom(...ROLES)
const roleOrAll = fc.option(roleArb, { nil: null, freq: 3 })
/** Which registered tool a call aims at (null: the op's own role and name, often not registered). */
const pickArb = fc.option(fc.nat(63), { nil: null, freq: 8 })
const opArb: fc.Arbitrary<Op> = fc.oneof(
  { weight: 4, arbitrary: fc.record({ op: fc.constant('register' as const), name: nameArb, role: roleOrAll, dead: fc.boolean(), plugin: fc.boolean(), short: fc.boolean() }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('unregister' as const), name: nameArb, role: roleOrAll }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('clear' as const), plugin: fc.boolean(), role: roleOrAll }) },
  { weight: 12, arbitrary: fc.record({ op: fc.constant('call' as const), role: roleArb, name: nameArb, pick: pickArb, b: fc.constantFrom(...BEHAVIOURS), via: fc.constantFrom('lib' as const, 'http' as const, 'mcp' as const) }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('burst' as const), pick: fc.nat(63) }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('local' as const), role: roleArb, name: nameArb, remove: fc.boolean() }) },
  { weight: 2, arbitrary: fc.record({ op: fc.constant('session' as const), role: roleArb, kind: fc.constantFrom('mcp-open' as const, 'mcp-open' as const, 'mcp-close' as const, 'throw-attach' as const, 'throw-detach' as const) }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('subscriber' as const), open: fc.boolean() }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('crash' as const), pick: fc.nat(63) }) },
  { weight: 1, arbitrary: fc.constant({ op: 'scrape' as const }) }
)

let tokenSeq = 0

interface Run {
  tp: Toolport
  url: string
  mode: Mode
  plugin: Plugin
  dead: string
  model: Model
  finished: CallFinishedEvent[]
  syncEvents: SyncFinishedEvent[]
  evictedEvents: OriginEvictedEvent[]
  stream: { items: SseItem[], close: () => void }
  extra: Array<{ close: () => void }>
}

/** Waits until everything the model expects has been reported (calls answered, syncs run). */
async function settle (run: Run, what: string): Promise<void> {
  const { tp, model } = run
  await waitFor(`${what}: ${model.totalCalls} calls answered (got ${run.finished.length})`,
    () => run.finished.length >= model.totalCalls, GUARD_MS)
  await waitFor(`${what}: ${model.syncTotal} syncs (got ${run.syncEvents.length})`,
    () => run.syncEvents.length >= model.syncTotal, GUARD_MS)
  await waitFor(`${what}: no call pending`, () => tp[kPendingCalls] === 0, GUARD_MS)
  assert.equal(run.finished.length, model.totalCalls, `${what}: call-finished events`)
  assert.equal(run.syncEvents.length, model.syncTotal, `${what}: sync-finished events`)
}

/** Every toolport_* series against the model, at rest. */
function checkAtRest (exposition: Exposition, run: Run, what: string, closed = false): void {
  const { model, mode } = run
  assertFamilies(exposition, what)
  assert.deepEqual(sorted(callSeries(exposition)), sorted(model.calls), `${what}: toolport_calls_total by role, tool and outcome`)
  const byOutcome = new Map<string, number>()
  for (const [key, n] of model.calls) bump(byOutcome, JSON.parse(key)[2], n)
  assert.deepEqual(sorted(byLabel(exposition, 'toolport_call_duration_seconds_count', 'outcome')), sorted(byOutcome),
    `${what}: toolport_call_duration_seconds_count by outcome = the calls`)
  for (const histogram of ['toolport_dispatch_queue_seconds', 'toolport_dispatch_callback_seconds']) {
    assert.deepEqual(sorted(byLabel(exposition, `${histogram}_count`, 'outcome')), sorted(model.admitted),
      `${what}: ${histogram}_count by outcome = the callback calls admitted`)
  }
  // The whole call contains its dispatch (seconds, not milliseconds, on both sides).
  for (const outcome of byOutcome.keys()) {
    const whole = value(exposition, 'toolport_call_duration_seconds_sum', { outcome }) ?? 0
    const parts = (value(exposition, 'toolport_dispatch_queue_seconds_sum', { outcome }) ?? 0) +
      (value(exposition, 'toolport_dispatch_callback_seconds_sum', { outcome }) ?? 0)
    assert.ok(whole + 1e-6 >= parts, `${what}: ${outcome}: call seconds ${whole} < queue + callback seconds ${parts}`)
    assert.ok(whole <= (byOutcome.get(outcome) ?? 0) * 60, `${what}: ${outcome}: call seconds ${whole} (milliseconds?)`)
  }
  // A timeout took at least the short tools' 0.25 s: none is in the 0.1 s bucket.
  assert.equal(value(exposition, 'toolport_call_duration_seconds_bucket', { outcome: 'timeout', le: '0.1' }) ?? 0, 0,
    `${what}: a timeout observed in the le=0.1 bucket`)
  assert.equal(value(exposition, 'toolport_evictions_total'), model.evictions, `${what}: toolport_evictions_total`)
  assert.equal(value(exposition, 'toolport_evicted_tools_total'), model.evictedRegistrations, `${what}: toolport_evicted_tools_total`)
  assert.deepEqual(sorted(byLabel(exposition, 'toolport_sync_duration_seconds_count', 'role')), sorted(model.syncs),
    `${what}: toolport_sync_duration_seconds_count by role`)
  assert.deepEqual(sorted(byLabel(exposition, 'toolport_sync_failures_total', 'role')), sorted(model.syncFailures),
    `${what}: toolport_sync_failures_total by role`)
  const sizes = new Map<string, number>()
  for (const s of exposition.samples) if (s.name === 'toolport_registry_tools') sizes.set(s.labels.role!, s.value)
  assert.deepEqual(Object.fromEntries([...sizes].sort()),
    Object.fromEntries([...model.registry].map(([role, tools]): [string, number] => [role, tools.size]).sort()),
    `${what}: toolport_registry_tools`)
  assert.equal(value(exposition, 'toolport_calls_in_flight'), 0, `${what}: toolport_calls_in_flight`)
  assert.equal(value(exposition, 'toolport_dispatch_queue_depth'), 0, `${what}: toolport_dispatch_queue_depth`)
  assert.equal(value(exposition, 'toolport_reply_buffer_bytes'), 0, `${what}: toolport_reply_buffer_bytes`)
  assert.equal(value(exposition, 'toolport_reply_buffer_limit_bytes'), BUDGET_BYTES, `${what}: toolport_reply_buffer_limit_bytes`)
  assert.equal(value(exposition, 'toolport_pool_threads'), mode === 'pool' && !closed ? 1 : 0, `${what}: toolport_pool_threads`)
  const utilization = value(exposition, 'toolport_pool_utilization')
  assert.ok(utilization !== undefined && Number.isFinite(utilization), `${what}: toolport_pool_utilization ${String(utilization)}`)
  if (mode === 'inline' || closed) assert.equal(utilization, 0, `${what}: toolport_pool_utilization`)
  // Label values: the roles, the registered names (or "(unknown)"), the documented outcomes.
  for (const s of exposition.samples) {
    if (s.labels.role !== undefined && s.family.startsWith('toolport_')) {
      assert.ok(ROLES.includes(s.labels.role), `${what}: a role label ${JSON.stringify(s.labels.role)}`)
    }
    if (s.name === 'toolport_calls_total') {
      assert.ok(NAMES.includes(s.labels.tool!) || s.labels.tool === '(unknown)', `${what}: a tool label ${JSON.stringify(s.labels.tool)}`)
    }
  }
}

/** Toolport's own events, and the event stream's, against the model. */
async function checkEvents (run: Run, what: string): Promise<void> {
  const { model } = run
  const fromEvents = new Map<string, number>()
  for (const e of run.finished) bump(fromEvents, JSON.stringify([e.role, e.outcome === 'unknown_tool' ? '(unknown)' : e.name, e.outcome]))
  assert.deepEqual(sorted(fromEvents), sorted(model.calls), `${what}: call-finished events`)
  const syncs = new Map<string, number>()
  const failures = new Map<string, number>()
  for (const e of run.syncEvents) {
    bump(syncs, e.role)
    if (!e.ok) bump(failures, e.role)
  }
  assert.deepEqual(sorted(syncs), sorted(model.syncs), `${what}: sync-finished events by role`)
  assert.deepEqual(sorted(failures), sorted(model.syncFailures), `${what}: failed sync-finished events by role`)
  assert.equal(run.evictedEvents.length, model.evictions, `${what}: origin-evicted events`)
  const items = run.stream.items
  const count = (event: string): number => items.filter((i) => i.event === event).length
  await waitFor(`${what}: the event stream's ${model.totalCalls} call events (got ${count('call')})`,
    () => count('call') >= model.totalCalls && count('sync') >= model.syncTotal && count('evicted') >= model.evictions, GUARD_MS)
  const streamed = new Map<string, number>()
  const streamedSyncs = new Map<string, number>()
  const streamedFailures = new Map<string, number>()
  for (const item of items) {
    if (item.event === 'call') bump(streamed, JSON.stringify([item.data.role, item.data.tool ?? '(unknown)', item.data.outcome]))
    if (item.event === 'sync') {
      bump(streamedSyncs, item.data.role)
      if (item.data.ok !== true) bump(streamedFailures, item.data.role)
    }
  }
  assert.deepEqual(sorted(streamed), sorted(model.calls), `${what}: the event stream's call events`)
  assert.deepEqual(sorted(streamedSyncs), sorted(model.syncs), `${what}: the event stream's sync events`)
  assert.deepEqual(sorted(streamedFailures), sorted(model.syncFailures), `${what}: the event stream's failed sync events`)
  assert.equal(count('evicted'), model.evictions, `${what}: the event stream's evicted events`)
}

async function libCall (run: Run, role: string, name: string, args: unknown,
  signal?: AbortSignal): Promise<ToolResultLike> {
  return await run.tp.callTool(role, { name, arguments: args }, signal === undefined ? undefined : { signal })
}

/** One call, predicted, made over `via`, and recorded. */
async function doCall (run: Run, role: string, name: string, given: Behaviour, via: 'lib' | 'http' | 'mcp'): Promise<void> {
  const { model, plugin } = run
  const tool = model.tools(role).get(name)
  const b = normalise(tool, given)
  const expected = predict(tool, b)
  const t = `t${++tokenSeq}`
  const args = b === 'badargs' ? { b: 5, t } : { b, t }
  const mcp = model.mcp.get(role)![0]
  let result: { is_error: boolean, error?: string | undefined }
  if (expected.kind === 'cancelled' && expected.admitted) {
    const controller = new AbortController()
    let done = false
    const useMcp = via === 'mcp' && mcp !== undefined && tool !== undefined && !tool.short
    const { signal } = controller
    const call = useMcp ? mcpCall(mcp, name, args, signal) : libCall(run, role, name, args, signal)
    const pending = call.finally(() => { done = true })
    await waitFor(`the plugin to receive ${t}`, () => plugin.received.has(t) || done, GUARD_MS)
    controller.abort()
    result = await within(pending, `the cancelled call ${t}`, GUARD_MS)
    if (useMcp) {
      // The client gives up at once; Toolport answers the call as cancelled when the notice arrives.
      model.call(role, name, 'cancelled', true)
      return
    }
  } else if (b === 'precancel') {
    const controller = new AbortController()
    controller.abort()
    result = await libCall(run, role, name, args, controller.signal)
  } else if (via === 'http') {
    const reply = await httpJson(`${run.url}/api/tools/call`, 'POST', { role, name, arguments: args })
    assert.equal(reply.statusCode, 200, JSON.stringify(reply.body))
    result = reply.body
  } else if (via === 'mcp' && mcp !== undefined) {
    result = await within(mcpCall(mcp, name, args), `an MCP call of ${JSON.stringify(name)}`, GUARD_MS)
  } else {
    result = await within(libCall(run, role, name, args), `a call of ${JSON.stringify(name)}`, GUARD_MS)
  }
  const kind = observe(expected.kind, result, tool?.short === true && !tool.local)
  model.call(role, name, kind, expected.admitted)
  if (tool !== undefined && !tool.local && tool.dead && tool.plugin && kind === 'connect') {
    if (++model.deadFailures >= THRESHOLD) model.evict()
  }
}

/** The `pick`th of the [role, name] pairs registered now that pass `filter`, or null. */
function pickTool (model: Model, pick: number,
  filter: (tool: ToolState) => boolean = () => true): [string, string] | null {
  const pairs: Array<[string, string]> = []
  for (const [role, tools] of model.registry) {
    for (const [name, tool] of tools) if (filter(tool)) pairs.push([role, name])
  }
  return pairs.length === 0 ? null : pairs[pick % pairs.length]!
}

/** A live, long, remote tool: one the plugin can hold. */
function holdable (tool: ToolState): boolean {
  return !tool.local && !tool.dead && !tool.short
}

async function apply (run: Run, op: Op, step: number): Promise<void> {
  const { tp, model, plugin } = run
  const what = `step ${step} ${JSON.stringify(op)}`
  switch (op.op) {
    case 'register': {
      const source = op.plugin ? 'plugin:p' : 'external'
      const result = await tp.register({
        name: op.name,
        callback_url: `${op.dead ? run.dead : plugin.origin}/cb`,
        role: op.role,
        source,
        timeout_seconds: op.short ? SHORT_SECONDS : 30,
        parameters: PARAMS
      })
      if (op.dead) model.deadFailures = 0
      const targets = op.role === null ? ROLES : [op.role]
      const accepted = targets.filter((r) => model.tools(r).get(op.name)?.local !== true)
      for (const role of accepted) {
        model.tools(role).set(op.name, { local: false, dead: op.dead, plugin: op.plugin, short: op.short, source })
        model.synced(role)
      }
      assert.deepEqual([...result.affected_roles].sort(), accepted.filter((r) => !model.throwing.has(r)).sort(), `${what}: affected_roles`)
      return
    }
    case 'unregister': {
      await tp.unregister({ name: op.name, role: op.role })
      for (const role of op.role === null ? ROLES : [op.role]) {
        const tool = model.tools(role).get(op.name)
        if (tool === undefined || tool.local) continue
        model.tools(role).delete(op.name)
        model.synced(role)
      }
      return
    }
    case 'clear': {
      const source = op.plugin ? 'plugin:p' : 'external'
      await tp.clear({ source, role: op.role })
      for (const role of op.role === null ? ROLES : [op.role]) {
        let changed = false
        for (const [name, tool] of model.tools(role)) {
          if (tool.local || tool.source !== source) continue
          model.tools(role).delete(name)
          changed = true
        }
        if (changed) model.synced(role)
      }
      return
    }
    case 'call': {
      const [role, name] = (op.pick === null ? null : pickTool(model, op.pick)) ?? [op.role, op.name]
      await doCall(run, role, name, op.b, op.via)
      return
    }
    case 'burst': {
      // One call with the plugin, one waiting behind it, the third busy: the gauges say exactly that.
      const picked = pickTool(model, op.pick, holdable)
      if (picked === null) return
      const [role, name] = picked
      const [a, b, c] = [`t${++tokenSeq}`, `t${++tokenSeq}`, `t${++tokenSeq}`]
      const abortA = new AbortController()
      const first = libCall(run, role, name, { b: 'hold', t: a }, abortA.signal)
      await waitFor(`the plugin to receive ${a}`, () => plugin.received.has(a), GUARD_MS)
      const second = libCall(run, role, name, { b: 'hold', t: b })
      const third = await libCall(run, role, name, { b: 'ok', t: c })
      model.call(role, name, observe('busy', third, false), false)
      const during = await scrapeStrict(run.url, `${what}: during the burst`)
      assert.equal(value(during, 'toolport_calls_in_flight'), 2, `${what}: toolport_calls_in_flight during the burst`)
      assert.equal(value(during, 'toolport_dispatch_queue_depth'), 1, `${what}: toolport_dispatch_queue_depth during the burst`)
      abortA.abort()
      model.call(role, name, observe('cancelled', await first, false), true)
      await waitFor(`the plugin to receive ${b}`, () => plugin.received.has(b), GUARD_MS)
      plugin.release(b)
      model.call(role, name, observe('ok', await within(second, 'the queued call', GUARD_MS), false), true)
      return
    }
    case 'local': {
      const role = tp.roles.get(op.role)
      if (op.remove) {
        const outcome = await role.unregisterLocalTool(op.name)
        if (model.tools(op.role).get(op.name)?.local === true) {
          assert.equal(outcome.removed, true)
          model.tools(op.role).delete(op.name)
          model.synced(op.role)
        }
        return
      }
      await role.registerLocalTool({
        name: op.name,
        parameters: PARAMS,
        source: 'host',
        handler: (args: any) => {
          if (args?.b === 'ok') return { fine: true }
          throw new Error('local failure')
        }
      })
      model.tools(op.role).set(op.name, { local: true, dead: false, plugin: false, short: false, source: 'host' })
      model.synced(op.role)
      return
    }
    case 'session': {
      const role = tp.roles.get(op.role)
      const handles = model.mcp.get(op.role)!
      if (op.kind === 'mcp-open' && handles.length < 2) {
        handles.push(await within(openMcp(run.url, op.role), `${what}: MCP initialize`, GUARD_MS))
        model.synced(op.role)
      } else if (op.kind === 'mcp-close' && handles.length > 0) {
        await closeMcp(handles.shift()!)
      } else if (op.kind === 'throw-attach') {
        const fake = model.throwing.get(op.role) ?? session(`throwing ${op.role}`, 'throw')
        model.throwing.set(op.role, fake)
        model.synced(op.role)
        await role.replaceSessions([], [fake])
      } else if (op.kind === 'throw-detach') {
        const fake = model.throwing.get(op.role)
        if (fake !== undefined) role.detachSession(fake)
        model.throwing.delete(op.role)
      }
      await waitFor(`${what}: ${model.sessions(op.role)} sessions of the role`,
        () => role.sessions().length === model.sessions(op.role), GUARD_MS)
      return
    }
    case 'subscriber':
      if (op.open && run.extra.length < 3) run.extra.push(subscribeEvents(run.url))
      else if (!op.open) run.extra.shift()?.close()
      return
    case 'crash': {
      // Pool mode: the worker thread dies with a call in flight, which is answered `internal`.
      const picked = run.mode === 'pool' ? pickTool(model, op.pick, holdable) : null
      if (picked === null) return
      const [role, name] = picked
      const t = `t${++tokenSeq}`
      const pending = libCall(run, role, name, { b: 'hold', t })
      await waitFor(`the plugin to receive ${t}`, () => plugin.received.has(t), GUARD_MS)
      await tp[kWorkerThreads][0]!.terminate()
      model.call(role, name, observe('internal', await within(pending, 'the call of a dead worker', GUARD_MS), false), true)
      await waitFor('a new worker thread', () => tp[kWorkerThreads].length === 1 && tp.health().ok, GUARD_MS)
      return
    }
    case 'scrape':
      await settle(run, what)
      checkAtRest(await scrapeStrict(run.url, what), run, what)
  }
}

/** What the runs covered (reported per test, so a property that covers nothing shows it). */
interface Coverage {
  kinds: Map<string, number>
  evictions: number
  syncs: number
  failedSyncs: number
  ops: Map<string, number>
}

function newCoverage (): Coverage {
  return { kinds: new Map(), evictions: 0, syncs: 0, failedSyncs: 0, ops: new Map() }
}

function report (t: TestContext, coverage: Coverage): void {
  const list = (map: Map<string, number>): string => [...map].sort().map(([k, n]) => `${k} ${n}`).join(', ')
  t.diagnostic(`outcomes: ${list(coverage.kinds)}; evictions ${coverage.evictions}; syncs ${coverage.syncs} (${coverage.failedSyncs} failed); ops: ${list(coverage.ops)}`)
}

async function runOps (t: TestContext, mode: Mode, ops: readonly Op[], plugin: Plugin, dead: string,
  coverage: Coverage): Promise<void> {
  const { tp, url } = await startToolport(t, {
    roles: [...ROLES],
    evictionThreshold: THRESHOLD,
    dispatch: dispatchOptions(mode)
  })
  const run: Run = {
    tp,
    url,
    mode,
    plugin,
    dead,
    model: new Model(ROLES),
    finished: [],
    syncEvents: [],
    evictedEvents: [],
    stream: subscribeEvents(url, '?types=call,sync,evicted'),
    extra: []
  }
  tp.on('call-finished', (e) => run.finished.push(e))
  tp.on('sync-finished', (e) => run.syncEvents.push(e))
  tp.on('origin-evicted', (e) => run.evictedEvents.push(e))
  try {
    await waitFor('the event stream\'s hello', () => run.stream.items.some((i) => i.event === 'hello'), GUARD_MS)
    for (let step = 0; step < ops.length; step++) {
      await apply(run, ops[step]!, step)
      await settle(run, `after step ${step}`)
    }
    await settle(run, 'at the end')
    for (const [key, n] of run.model.calls) bump(coverage.kinds, JSON.parse(key)[2], n)
    for (const op of ops) bump(coverage.ops, op.op)
    coverage.evictions += run.model.evictions
    coverage.syncs += run.model.syncTotal
    coverage.failedSyncs += [...run.model.syncFailures.values()].reduce((a, b) => a + b, 0)
    checkAtRest(await scrapeStrict(url, 'at the end'), run, 'at the end')
    await checkEvents(run, 'at the end')
    // After close(): the counters keep what happened, the gauges are 0 (the pool is gone).
    for (const handles of run.model.mcp.values()) for (const handle of handles.splice(0)) await closeMcp(handle)
    await tp.close()
    checkAtRest(strict(await tp.metrics!.text(), 'after close'), run, 'after close', true)
  } finally {
    run.stream.close()
    for (const sub of run.extra) sub.close()
    for (const handles of run.model.mcp.values()) for (const handle of handles) await closeMcp(handle)
    await tp.close()
  }
}

for (const mode of MODES) {
  test(`${mode}: property: after random operations every /metrics series equals a model of what happened and Toolport's own events (README "The API" /metrics, "Live events"; docs/protocol.md R12, R13, "Sync")`, { timeout: FAILING_TIMEOUT_MS }, async (t) => {
    const plugin = await startPlugin(t)
    const dead = await deadOrigin()
    const coverage = newCoverage()
    await fc.assert(fc.asyncProperty(fc.limitShrink(fc.array(opArb, { minLength: 12, maxLength: 32 }), MAX_SHRINKS),
      async (ops) => { await runOps(t, mode, ops, plugin, dead, coverage) }),
    { numRuns: 4 * RUNS, includeErrorInReport: true })
    report(t, coverage)
  })
}

// ---------------------------------------------------------------------------------------------
// Hostile label values

/** Characters that break naive expositions, and any UTF-16 unit (lone surrogates included). */
const hostileChar = fc.oneof(
  { weight: 4, arbitrary: fc.constantFrom('"', '\\', '\n', '\r', '\u0000', '}', '=', ',', 'n', '\uFFFD', '🦊', '\uD800', '\uDC00') },
  { weight: 1, arbitrary: fc.string({ unit: 'binary', minLength: 1, maxLength: 1 }) })
/** A tool name R7 accepts: 1–64 code points. */
const hostileName = fc.array(hostileChar, { minLength: 1, maxLength: 2 }).map((a) => a.join(''))
  .filter((s) => [...s].length >= 1 && [...s].length <= 64)

/** Whether `s` survives UTF-8 unchanged (no lone surrogate). */
function isWellFormed (s: string): boolean {
  return !/\p{Surrogate}/u.test(s.replace(/[\uD800-\uDBFF][\uDC00-\uDFFF]/g, ''))
}

test('property: tool names a hostile plugin chooses never break the exposition: one series per name, escaped, strictly parseable (README "The API" /metrics; src/main/metrics.ts "Labels are bounded")', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const plugin = await startPlugin(t)
  const namesArb = fc.uniqueArray(hostileName, { minLength: 1, maxLength: 10 })
  await fc.assert(fc.asyncProperty(fc.limitShrink(namesArb, MAX_SHRINKS),
    async (names) => {
      const { tp, url } = await startToolport(t, { roles: ['R'] })
      try {
        const accepted: string[] = []
        for (const name of names) {
          const reply = await httpJson(`${url}/api/tools/register`, 'POST',
            { name, callback_url: `${plugin.origin}/cb`, source: 'plugin:hostile', parameters: PARAMS })
          if (reply.statusCode === 422) continue // refusing a name is fine; accepting it means serving it
          assert.equal(reply.statusCode, 200, JSON.stringify(reply.body))
          accepted.push(name)
        }
        for (const name of accepted) {
          const result = await tp.callTool('R', { name, arguments: { b: 'ok', t: `t${++tokenSeq}` } })
          assert.equal(result.is_error, false, JSON.stringify(result))
        }
        const exposition = strict((await scrape(url)).body, `names ${JSON.stringify(names)}`)
        const calls = exposition.samples.filter((s) => s.name === 'toolport_calls_total')
        assert.equal(calls.reduce((sum, s) => sum + s.value, 0), accepted.length, 'toolport_calls_total counts every call')
        for (const name of accepted.filter(isWellFormed)) {
          assert.equal(value(exposition, 'toolport_calls_total', { role: 'R', tool: name, outcome: 'ok' }), 1,
            `the series of ${JSON.stringify(name)}`)
        }
      } finally {
        await tp.close()
      }
    }), { numRuns: 25 * RUNS, includeErrorInReport: true })
})

test('regression: a tool name with a lone surrogate and one with U+FFFD are two series of one label set (README "The API" /metrics; docs/protocol.md R7)', async (t) => {
  // Both names are valid tool names (1 code point each) and distinct, so Toolport counts them apart,
  // but a lone surrogate has no UTF-8 form: both labels are written as U+FFFD, two lines with the
  // same name and labels, which the text format forbids (Prometheus drops them as duplicates).
  const plugin = await startPlugin(t)
  const { tp, url } = await startToolport(t, { roles: ['R'] })
  for (const name of ['\uD800', '\uFFFD']) {
    const reply = await httpJson(`${url}/api/tools/register`, 'POST', { name, callback_url: `${plugin.origin}/cb`, parameters: PARAMS })
    if (reply.statusCode === 422) continue
    assert.equal(reply.statusCode, 200)
    await tp.callTool('R', { name, arguments: { b: 'ok', t: `t${++tokenSeq}` } })
  }
  strict((await scrape(url)).body, 'a lone surrogate beside U+FFFD')
})

test('regression: a NUL in a tool name and in a role name never merges two series (README "The API" /metrics: calls by role/tool/outcome)', async (t) => {
  // src/main/local-metrics.ts keys a label set by its values joined with U+0000, which label values may
  // contain: role "a" + tool "b\0c" and role "a\0b" + tool "c" share the key "a\0b\0c\0ok".
  const plugin = await startPlugin(t)
  const { tp, url } = await startToolport(t, { roles: ['a', 'a\u0000b'] })
  await tp.register({ name: 'b\u0000c', role: 'a', callback_url: `${plugin.origin}/cb`, parameters: PARAMS })
  await tp.register({ name: 'c', role: 'a\u0000b', callback_url: `${plugin.origin}/cb`, parameters: PARAMS })
  await tp.callTool('a', { name: 'b\u0000c', arguments: { b: 'ok', t: `t${++tokenSeq}` } })
  await tp.callTool('a\u0000b', { name: 'c', arguments: { b: 'ok', t: `t${++tokenSeq}` } })
  const exposition = strict((await scrape(url)).body, 'NUL in names')
  assert.deepEqual(sorted(callSeries(exposition)), sorted(new Map([
    [JSON.stringify(['a', 'b\u0000c', 'ok']), 1],
    [JSON.stringify(['a\u0000b', 'c', 'ok']), 1]
  ])), 'toolport_calls_total by role, tool and outcome')
})

test('regression: a plugin that churns tool names (register, call, unregister) cannot grow toolport_calls_total without bound, and a tool registered after the churn is counted under its own name, not (other) (src/main/metrics.ts: labels are "tool names registered now … and the last STALE_TOOL_NAMES names that left every role")', async (t) => {
  const plugin = await startPlugin(t)
  const MAX_TOOLS = 3
  const CHURN = STALE_TOOL_NAMES + 40
  const { url } = await startToolport(t, { roles: ['R'], limits: { maxToolsPerRole: MAX_TOOLS } })
  const callOnce = async (name: string): Promise<void> => {
    const reply = await httpJson(`${url}/api/tools/register`, 'POST', { name, callback_url: `${plugin.origin}/cb`, source: 'plugin:churn', parameters: PARAMS })
    assert.equal(reply.statusCode, 200, JSON.stringify(reply.body))
    const call = await httpJson(`${url}/api/tools/call`, 'POST', { role: 'R', name, arguments: { b: 'ok', t: `t${++tokenSeq}` } })
    assert.equal(call.body.is_error, false)
  }
  for (let i = 0; i < CHURN; i++) {
    await callOnce(`churn_${i}`)
    assert.equal((await httpJson(`${url}/api/tools/unregister`, 'POST', { name: `churn_${i}` })).body.removed, true)
  }
  await callOnce('fresh')
  const exposition = strict((await scrape(url)).body, 'after the churn')
  const tools = new Set(exposition.samples.filter((s) => s.name === 'toolport_calls_total').map((s) => s.labels.tool))
  // The registered name, the last STALE_TOOL_NAMES that left, and nothing else.
  assert.equal(tools.size, 1 + STALE_TOOL_NAMES, `${tools.size} tool label values after ${CHURN} names came and went`)
  assert.ok(tools.has('fresh'), 'a tool registered after the churn has a series of its own, not (other)')
  assert.ok(tools.has(`churn_${CHURN - 1}`), 'a tool that came and went since the last scrape is still seen')
  assert.ok(!tools.has('churn_0'), 'the name gone longest lost its series')
  assert.ok(!tools.has('(other)'))
})

test('regression: a tool name whose last holder was a role that was removed stops counting towards the label cap, so the next tool is counted under its own name (src/main/metrics.ts: only "tool names registered now" count towards the cap)', async (t) => {
  const plugin = await startPlugin(t)
  const { tp, url } = await startToolport(t, { roles: ['A', 'B'], limits: { maxToolsPerRole: 1 } })
  const register = async (name: string, role: string): Promise<void> => {
    const reply = await httpJson(`${url}/api/tools/register`, 'POST', { name, role, callback_url: `${plugin.origin}/cb`, source: 'plugin:p', parameters: PARAMS })
    assert.equal(reply.body.ok, true, JSON.stringify(reply.body))
  }
  const call = async (name: string, role: string): Promise<void> => {
    const reply = await httpJson(`${url}/api/tools/call`, 'POST', { role, name, arguments: { b: 'ok', t: `t${++tokenSeq}` } })
    assert.equal(reply.body.is_error, false, JSON.stringify(reply.body))
  }
  await register('x', 'A')
  await register('x', 'B')
  await call('x', 'A')
  await call('x', 'B')
  assert.equal((await httpJson(`${url}/api/tools/unregister`, 'POST', { name: 'x', role: 'B' })).body.removed, true)
  tp.roles.remove('A')
  await register('y', 'B')
  await call('y', 'B')
  const exposition = strict((await scrape(url)).body, 'after the role went')
  assert.equal(value(exposition, 'toolport_calls_total', { role: 'B', tool: 'y', outcome: 'ok' }), 1)
  assert.equal(value(exposition, 'toolport_calls_total', { role: 'B', tool: '(other)', outcome: 'ok' }), undefined)
})

test('regression: roles that come and go (one per conversation) leave no series behind, also for a call still running when its role went (src/main/metrics.ts: labels are "roles that exist")', async (t) => {
  const plugin = await startPlugin(t)
  const started = await startToolport(t, { roles: ['R'] })
  const { tp, url } = started
  const ROLES = 12
  let held: Promise<unknown> | null = null
  let heldToken = ''
  for (let i = 0; i < ROLES; i++) {
    const role = `conversation-${i}`
    tp.roles.add(role)
    // A model session that refuses every sync: a sync failure series for the role.
    tp.roles.get(role).attachSession(session(`s${i}`, 'throw'))
    const reply = await httpJson(`${url}/api/tools/register`, 'POST', { name: 'known', role, callback_url: `${plugin.origin}/cb`, parameters: PARAMS })
    assert.equal(reply.statusCode, 200, JSON.stringify(reply.body))
    const call = await httpJson(`${url}/api/tools/call`, 'POST', { role, name: 'known', arguments: { b: 'ok', t: `t${++tokenSeq}` } })
    assert.equal(call.body.is_error, false)
    if (i === ROLES - 1) {
      heldToken = `t${++tokenSeq}`
      held = tp.callTool(role, { name: 'known', arguments: { b: 'hold', t: heldToken } })
      await waitFor('the held call reaches the plugin', () => plugin.held.has(heldToken))
    }
    const before = strict((await scrape(url)).body, `with ${role}`)
    assert.ok(before.samples.some((s) => s.name === 'toolport_calls_total' && s.labels.role === role), `${role} counted its call`)
    assert.ok(before.samples.some((s) => s.name === 'toolport_sync_failures_total' && s.labels.role === role), `${role} counted its failed sync`)
    assert.equal(tp.roles.remove(role), true)
  }
  plugin.release(heldToken)
  await held
  const exposition = strict((await scrape(url)).body, 'after the roles went')
  const roles = new Set(exposition.samples.filter((s) => s.labels.role !== undefined).map((s) => s.labels.role))
  assert.deepEqual([...roles].filter((r) => r !== 'R'), [], 'series of removed roles')
  // The whole call's duration is not by role: every answered call is still in it.
  const count = exposition.samples.find((s) => s.name === 'toolport_call_duration_seconds_count' && s.labels.outcome === 'ok')
  assert.equal(count?.value, ROLES + 1)
})

test('regression: a call still running when its role was removed and added again is not counted under the new role (src/main/metrics.ts: labels are "roles that exist")', async (t) => {
  const plugin = await startPlugin(t)
  const { tp, url } = await startToolport(t, { roles: ['R', 'again'] })
  const reply = await httpJson(`${url}/api/tools/register`, 'POST', { name: 'known', role: 'again', callback_url: `${plugin.origin}/cb`, parameters: PARAMS })
  assert.equal(reply.statusCode, 200, JSON.stringify(reply.body))
  const heldToken = `t${++tokenSeq}`
  const held = tp.callTool('again', { name: 'known', arguments: { b: 'hold', t: heldToken } })
  await waitFor('the held call reaches the plugin', () => plugin.held.has(heldToken))
  assert.equal(tp.roles.remove('again'), true)
  tp.roles.add('again')
  plugin.release(heldToken)
  assert.equal((await held).is_error, false)
  const exposition = strict((await scrape(url)).body, 'after the late call')
  const calls = exposition.samples.filter((s) => s.name === 'toolport_calls_total' && s.labels.role === 'again')
  assert.deepEqual(calls, [], 'the new role "again" made no call')
  // It is still a call: the duration histogram, not by role, counts it.
  const count = exposition.samples.find((s) => s.name === 'toolport_call_duration_seconds_count' && s.labels.outcome === 'ok')
  assert.equal(count?.value, 1)
  // The new role's own calls are counted under it.
  const own = await httpJson(`${url}/api/tools/register`, 'POST', { name: 'known', role: 'again', callback_url: `${plugin.origin}/cb`, parameters: PARAMS })
  assert.equal(own.statusCode, 200)
  assert.equal((await tp.callTool('again', { name: 'known', arguments: { b: 'ok', t: `t${++tokenSeq}` } })).is_error, false)
  const after = strict((await scrape(url)).body, 'after its own call')
  assert.deepEqual(after.samples.filter((s) => s.name === 'toolport_calls_total' && s.labels.role === 'again').map((s) => s.value), [1])
})

// ---------------------------------------------------------------------------------------------
// After close(), and a host's app

/** A host's own fastify app with `toolportPlugin` mounted, on 127.0.0.1 (it outlives `tp.close()`). */
async function hostApp (t: TestContext, tp: Toolport): Promise<string> {
  const host = fastify({ forceCloseConnections: true })
  t.after(() => host.close())
  await host.register(toolportPlugin, { runtime: tp })
  await host.listen({ host: '127.0.0.1', port: 0 })
  const address = host.server.address() as AddressInfo
  return `http://127.0.0.1:${address.port}`
}

async function createClosable (t: TestContext, options: ToolportOptions): Promise<Toolport> {
  const tp = await createToolport({ logger: false, ...options })
  t.after(() => tp.close())
  return tp
}

test('regression: after close() a call\'s free-text name never becomes a label (README "Live events": a name that matched no tool is the model\'s free text; src/main/metrics.ts)', async (t) => {
  const plugin = await startPlugin(t)
  const tp = await createClosable(t, { roles: ['R'], dispatch: { mode: 'inline' } })
  const url = await hostApp(t, tp)
  await registerKnown(url, plugin)
  await tp.close()
  const free = ['no such tool 1', 'say "hi"\nand leave', 'x'.repeat(500)]
  for (const name of free) {
    // The host's call route refuses (503 TP_ERR_CLOSED); the library still answers each call, busy.
    const reply = await httpJson(`${url}/api/tools/call`, 'POST', { role: 'R', name, arguments: {} })
    assert.equal(reply.statusCode, 503)
    assert.equal((await tp.callTool('R', { name, arguments: {} })).is_error, true)
  }
  assert.equal((await tp.callTool('R', { name: 'known', arguments: {} })).is_error, true)
  const exposition = strict((await scrape(url)).body, 'after close')
  const labels = exposition.samples.filter((s) => s.name === 'toolport_calls_total').map((s) => s.labels.tool)
  assert.deepEqual(labels.filter((l) => l !== 'known' && l !== '(unknown)'), [],
    'tool labels after close: only registered names and "(unknown)"')
})

async function registerKnown (url: string, plugin: Plugin, name = 'known'): Promise<void> {
  const reply = await httpJson(`${url}/api/tools/register`, 'POST', { name, callback_url: `${plugin.origin}/cb`, parameters: PARAMS })
  assert.equal(reply.statusCode, 200, JSON.stringify(reply.body))
}

for (const mode of MODES) {
  test(`${mode}: property: calls in flight and queued when close() runs are counted cancelled, and afterwards the gauges are 0 and /metrics of a host's app still parses (README "Public exports" close(); docs/architecture.md "close()")`, { timeout: FAILING_TIMEOUT_MS }, async (t) => {
    const plugin = await startPlugin(t)
    await fc.assert(fc.asyncProperty(fc.record({
      before: fc.array(fc.constantFrom<Behaviour>('ok', 'status', 'tool_error', 'mem'), { maxLength: 4 }),
      held: fc.integer({ min: 0, max: 4 }),
      after: fc.integer({ min: 0, max: 3 })
    }), async ({ before, held, after }) => {
      const tp = await createClosable(t, {
        roles: ['R'],
        dispatch: { ...dispatchOptions(mode), maxQueuedPerOrigin: 2 }
      })
      const url = await hostApp(t, tp)
      await registerKnown(url, plugin)
      const expected = new Map<string, number>()
      const admitted = new Map<string, number>()
      const add = (kind: string, isAdmitted: boolean): void => {
        bump(expected, JSON.stringify(['R', 'known', kind]))
        if (isAdmitted) bump(admitted, kind)
      }
      for (const b of before) {
        const kind = predict({ local: false, dead: false, plugin: false, short: false, source: 'external' }, b).kind
        add(observe(kind, await tp.callTool('R', { name: 'known', arguments: { b, t: `t${++tokenSeq}` } }), false), true)
      }
      // One with the plugin, two waiting, the rest busy (maxInFlightPerOrigin 1, maxQueuedPerOrigin 2).
      const pending: Array<Promise<{ is_error: boolean, error?: string | undefined }>> = []
      for (let i = 0; i < held; i++) {
        const token = `t${++tokenSeq}`
        pending.push(tp.callTool('R', { name: 'known', arguments: { b: 'hold', t: token } }))
        if (i === 0) await waitFor('the plugin to receive the first held call', () => plugin.received.has(token), GUARD_MS)
      }
      const inFlight = Math.min(held, 3)
      const during = strict((await scrape(url)).body, 'before close')
      assert.equal(value(during, 'toolport_calls_in_flight'), inFlight, 'toolport_calls_in_flight before close')
      assert.equal(value(during, 'toolport_dispatch_queue_depth'), Math.max(0, inFlight - 1), 'toolport_dispatch_queue_depth before close')
      await within(tp.close(), 'close()', GUARD_MS)
      const results = await Promise.all(pending)
      results.forEach((result, i) => { add(observe(i < 3 ? 'cancelled' : 'busy', result, false), i < 3) })
      for (let i = 0; i < after; i++) {
        add(observe('busy', await tp.callTool('R', { name: 'known', arguments: { b: 'ok', t: `t${++tokenSeq}` } }), false), false)
      }
      const exposition = strict((await scrape(url)).body, 'after close')
      assert.deepEqual(sorted(callSeries(exposition)), sorted(expected), 'toolport_calls_total after close')
      for (const histogram of ['toolport_dispatch_queue_seconds', 'toolport_dispatch_callback_seconds']) {
        assert.deepEqual(sorted(byLabel(exposition, `${histogram}_count`, 'outcome')), sorted(admitted), `${histogram}_count after close`)
      }
      for (const gauge of ['toolport_calls_in_flight', 'toolport_dispatch_queue_depth', 'toolport_reply_buffer_bytes',
        'toolport_pool_threads', 'toolport_pool_utilization']) {
        assert.equal(value(exposition, gauge), 0, `${gauge} after close`)
      }
      assert.equal(value(exposition, 'toolport_registry_tools', { role: 'R' }), 1, 'toolport_registry_tools after close')
    }), { numRuns: 4 * RUNS, includeErrorInReport: true })
  })
}

test('regression: a closed Toolport is garbage once dropped; its metrics registry does not keep it alive (README "Public exports" close(); src/main/metrics.ts "one Registry per Runtime")', async () => {
  // prom-client's default metrics (collectDefaultMetrics, called per Runtime) start a process-wide
  // GC PerformanceObserver that is never disconnected; it holds the gc histogram, which holds its
  // registry, whose scraped gauges read the Runtime: every Runtime ever created stays in memory,
  // and each adds an observer that runs on every garbage collection.
  setFlagsFromString('--expose-gc')
  const gc = runInNewContext('gc') as () => void
  const INSTANCES = 12
  const alive = async (metrics: boolean): Promise<number> => {
    const refs: Array<WeakRef<Toolport>> = []
    for (let i = 0; i < INSTANCES; i++) {
      const tp = await createToolport({ logger: false, metrics, roles: ['R'], dispatch: { mode: 'inline' } })
      if (metrics) strict(await tp.metrics!.text(), 'a short-lived Toolport')
      refs.push(new WeakRef(tp))
      await tp.close()
    }
    for (let i = 0; i < 4; i++) {
      gc()
      await sleep(5)
    }
    return refs.filter((ref) => ref.deref() !== undefined).length
  }
  const without = await alive(false)
  assert.ok(without <= 1, `control: ${without} of ${INSTANCES} closed Toolports without metrics still alive`)
  const withMetrics = await alive(true)
  assert.ok(withMetrics <= 1, `${withMetrics} of ${INSTANCES} closed Toolports with metrics still alive after garbage collection`)
})

// ---------------------------------------------------------------------------------------------
// Scrapes during calls

for (const mode of MODES) {
  test(`${mode}: property: scrapes concurrent with bursts of calls are never torn: every scrape parses, histograms match their counters, gauges and counters are consistent and never go back (README "The API" /metrics)`, { timeout: FAILING_TIMEOUT_MS }, async (t) => {
    const plugin = await startPlugin(t)
    const MAX_PENDING = 64
    await fc.assert(fc.asyncProperty(fc.record({
      calls: fc.array(fc.record({
        b: fc.constantFrom<Behaviour>('ok', 'ok', 'tool_error', 'status', 'badjson', 'badargs', 'mem', 'rst'),
        name: fc.constantFrom('fast', 'fast', 'missing'),
        via: fc.constantFrom('lib' as const, 'http' as const)
      }), { minLength: 10, maxLength: 60 }),
      chunk: fc.integer({ min: 1, max: 8 }),
      scrapers: fc.integer({ min: 1, max: 3 })
    }), async ({ calls, chunk, scrapers }) => {
      const { tp, url } = await startToolport(t, {
        roles: ['R'],
        dispatch: { ...dispatchOptions(mode), maxInFlightPerOrigin: 4, maxQueuedPerOrigin: 6, maxPending: MAX_PENDING }
      })
      try {
        await registerKnown(url, plugin, 'fast')
        let launched = 0
        const burst = { done: false }
        const problems: string[] = []
        const scraper = async (): Promise<number> => {
          let previous: Map<string, number> | null = null
          let count = 0
          while (!burst.done || count === 0) {
            const res = await scrape(url)
            const seenLaunched = launched
            count++
            const exposition = parseExposition(res.body)
            if (exposition.errors.length > 0) problems.push(...exposition.errors)
            const calls = callSeries(exposition)
            const byOutcome = new Map<string, number>()
            for (const [key, n] of calls) bump(byOutcome, JSON.parse(key)[2], n)
            const durations = byLabel(exposition, 'toolport_call_duration_seconds_count', 'outcome')
            if (JSON.stringify(sorted(byOutcome)) !== JSON.stringify(sorted(durations))) {
              problems.push(`calls_total by outcome ${JSON.stringify(sorted(byOutcome))} != call_duration_seconds_count ${JSON.stringify(sorted(durations))}`)
            }
            const queue = byLabel(exposition, 'toolport_dispatch_queue_seconds_count', 'outcome')
            const callback = byLabel(exposition, 'toolport_dispatch_callback_seconds_count', 'outcome')
            if (JSON.stringify(sorted(queue)) !== JSON.stringify(sorted(callback))) problems.push('dispatch queue and callback counts differ')
            for (const [outcome, n] of queue) {
              if (n > (byOutcome.get(outcome) ?? 0)) problems.push(`dispatch count ${n} of ${outcome} > its calls`)
            }
            const inFlight = value(exposition, 'toolport_calls_in_flight') ?? NaN
            const depth = value(exposition, 'toolport_dispatch_queue_depth') ?? NaN
            if (!(depth >= 0 && depth <= inFlight && inFlight <= MAX_PENDING)) problems.push(`in flight ${inFlight}, queue depth ${depth}`)
            const answered = [...queue.values()].reduce((a, b) => a + b, 0)
            if (answered + inFlight > seenLaunched) problems.push(`${answered} answered + ${inFlight} in flight > ${seenLaunched} launched`)
            const bytes = value(exposition, 'toolport_reply_buffer_bytes') ?? NaN
            if (!(bytes >= 0 && bytes <= BUDGET_BYTES)) problems.push(`toolport_reply_buffer_bytes ${bytes}`)
            if (previous !== null) {
              for (const [key, n] of previous) if ((calls.get(key) ?? 0) < n) problems.push(`${key} went back from ${n}`)
            }
            previous = calls
            if (problems.length > 0) break
          }
          return count
        }
        const scraping = Array.from({ length: scrapers }, scraper)
        const results: Array<Promise<{ kind: Kind, admitted: boolean }>> = []
        for (let i = 0; i < calls.length; i++) {
          const { b, name, via } = calls[i]!
          const args = b === 'badargs' ? { b: 5, t: `t${++tokenSeq}` } : { b, t: `t${++tokenSeq}` }
          launched++
          const call = via === 'http'
            ? httpJson(`${url}/api/tools/call`, 'POST', { role: 'R', name, arguments: args }).then((r) => r.body as ToolResultLike)
            : tp.callTool('R', { name, arguments: args }) as Promise<ToolResultLike>
          results.push(call.then((result) => classify(result, name)))
          if ((i + 1) % chunk === 0) await new Promise((resolve) => setImmediate(resolve))
        }
        const kinds = await within(Promise.all(results), 'the burst', GUARD_MS)
        burst.done = true
        await within(Promise.all(scraping), 'the scrapers', GUARD_MS)
        assert.deepEqual(problems, [], 'torn or inconsistent scrapes')
        const expected = new Map<string, number>()
        const admitted = new Map<string, number>()
        calls.forEach(({ name }, i) => {
          const { kind, admitted: isAdmitted } = kinds[i]!
          bump(expected, JSON.stringify(['R', kind === 'unknown_tool' ? '(unknown)' : name, kind]))
          if (isAdmitted) bump(admitted, kind)
        })
        await waitFor('no call pending', () => tp[kPendingCalls] === 0, GUARD_MS)
        const final = strict((await scrape(url)).body, 'after the burst')
        assert.deepEqual(sorted(callSeries(final)), sorted(expected), 'toolport_calls_total after the burst')
        assert.deepEqual(sorted(byLabel(final, 'toolport_dispatch_queue_seconds_count', 'outcome')), sorted(admitted),
          'toolport_dispatch_queue_seconds_count after the burst')
        assert.equal(value(final, 'toolport_calls_in_flight'), 0)
        assert.equal(value(final, 'toolport_reply_buffer_bytes'), 0)
      } finally {
        await tp.close()
      }
    }), { numRuns: 4 * RUNS, includeErrorInReport: true })
  })
}

/** The kind a result of a burst call shows, by its model-visible error text. */
function classify (result: ToolResultLike, name: string): { kind: Kind, admitted: boolean } {
  if (!result.is_error || result.error === 'nope') return { kind: 'ok', admitted: true }
  const error = result.error ?? ''
  if (name === 'missing') return { kind: 'unknown_tool', admitted: false }
  if (error.includes('Toolport is busy')) return { kind: 'busy', admitted: false }
  if (error.includes('does not match') || error.includes('must be')) return { kind: 'invalid_arguments', admitted: false }
  for (const kind of ['http', 'timeout', 'connect', 'protocol', 'too_large', 'memory', 'cancelled', 'internal'] as const) {
    if (RESULT_TEXT[kind]!(error)) return { kind, admitted: true }
  }
  return { kind: 'invalid_arguments', admitted: false }
}

// ---------------------------------------------------------------------------------------------
// MCP refusals, utilisation, value spellings

test('regression: an MCP call refused by mcp.maxCallsPerSession is counted like every answered call (README "The API" /metrics "calls by role/tool/outcome", "MCP" bounds; src/main/sessions/mcp.ts "so the call is counted")', async (t) => {
  const plugin = await startPlugin(t)
  const { tp, url } = await startToolport(t, { roles: ['R'], mcp: { maxCallsPerSession: 1 } })
  const finished: CallFinishedEvent[] = []
  tp.on('call-finished', (e) => finished.push(e))
  await registerKnown(url, plugin)
  const mcp = await openMcp(url, 'R')
  t.after(() => closeMcp(mcp))
  const a = `t${++tokenSeq}`
  const first = mcpCall(mcp, 'known', { b: 'hold', t: a })
  await waitFor('the plugin to receive the first call', () => plugin.received.has(a), GUARD_MS)
  const refused = await mcpCall(mcp, 'known', { b: 'ok', t: `t${++tokenSeq}` })
  assert.equal(refused.is_error, true)
  assert.match(refused.error ?? '', /too many calls in flight on this MCP session/)
  plugin.release(a)
  assert.equal((await within(first, 'the first MCP call', GUARD_MS)).is_error, false)
  await waitFor('the first call\'s call-finished', () => finished.length >= 1, GUARD_MS)
  const exposition = strict((await scrape(url)).body, 'after an MCP refusal')
  const total = [...callSeries(exposition).values()].reduce((sum, n) => sum + n, 0)
  assert.deepEqual({ events: finished.length, metrics: total }, { events: 2, metrics: 2 },
    'two MCP calls were answered (one refused as a tool error): both are counted and reported')
})

test('pool: toolport_pool_utilization stays within 0–1 over repeated scrapes, idle and busy (src/main/metrics.ts: "0-1, averaged")', async (t) => {
  const plugin = await startPlugin(t)
  const { tp, url } = await startToolport(t, { roles: ['R'], dispatch: { mode: 'pool', threads: 2 } })
  await registerKnown(url, plugin)
  const seen: number[] = []
  for (let i = 0; i < 120; i++) {
    if (i % 10 === 5) await tp.callTool('R', { name: 'known', arguments: { b: 'ok', t: `t${++tokenSeq}` } })
    const utilization = value(strict((await scrape(url)).body, `scrape ${i}`), 'toolport_pool_utilization')!
    seen.push(utilization)
    if (!(utilization >= 0 && utilization <= 1)) break
    if (i % 4 === 0) await sleep(i % 9)
  }
  const outside = seen.filter((u) => !(u >= 0 && u <= 1))
  assert.deepEqual(outside, [], `toolport_pool_utilization outside 0–1 (of ${seen.length} scrapes)`)
})

test('every value is spelled as the text format documents it ("NaN", not prom-client\'s "Nan") (README "The API" /metrics)', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['R'] })
  strict((await scrape(url)).body, 'a fresh Toolport')
  // Two scrapes back to back: prom-client resets the event-loop-lag histogram on each, so the
  // second finds it empty and writes its mean as NaN.
  const first = strict(await tp.metrics!.text(), 'a scrape')
  const second = strict(await tp.metrics!.text(), 'the scrape right after it')
  assert.deepEqual([...first.nonCanonical, ...second.nonCanonical], [], 'values only Go\'s case-insensitive ParseFloat reads')
})

// ---------------------------------------------------------------------------------------------
// The guard

/** A request over a real socket with headers as given (`host` included), answering status, headers, body. */
async function rawRequest (url: string, method: 'GET' | 'HEAD', path: string, headers: Record<string, string>): Promise<{ statusCode: number, headers: Record<string, unknown>, body: string }> {
  return await new Promise((resolve, reject) => {
    const req = httpRequest(`${url}${path}`, { method, headers, agent: false }, (res) => {
      let body = ''
      res.setEncoding('utf8')
      res.on('data', (chunk: string) => { body += chunk })
      res.on('end', () => resolve({ statusCode: res.statusCode ?? 0, headers: res.headers, body }))
    })
    req.on('error', reject)
    req.end()
  })
}

test('GET /metrics is behind the guard: loopback peers, loopback Host, no cross-site Origin, the token in token mode (docs/protocol.md R1, "Beyond the contract"; README "The API")', async (t) => {
  const token = 'metrics-token-0123456789abcdef0123456789'
  const open = await startToolport(t, { roles: ['R'] })
  const guarded = await startToolport(t, { roles: ['R'], security: { token } })
  const json = (reply: { statusCode: number, headers: Record<string, unknown>, body: string }) =>
    ({ statusCode: reply.statusCode, headers: reply.headers, body: JSON.parse(reply.body) })
  // R1: the peer address decides.
  const remote = await open.tp.app.inject({ method: 'GET', url: '/metrics', remoteAddress: '203.0.113.7' })
  assertError({ statusCode: remote.statusCode, headers: remote.headers, body: JSON.parse(remote.body) }, 403, 'TP_ERR_NOT_LOOPBACK')
  assert.doesNotMatch(remote.body, /toolport_/)
  for (const method of ['GET', 'HEAD'] as const) {
    const ok = await rawRequest(open.url, method, '/metrics', {})
    assert.equal(ok.statusCode, 200, method)
    assert.equal(ok.headers['content-type'], 'text/plain; version=0.0.4; charset=utf-8')
    assert.equal(ok.headers['x-content-type-options'], 'nosniff')
    assert.equal(ok.headers['cache-control'], 'no-store')
    if (method === 'GET') strict(ok.body, 'GET /metrics')
    const rebinding = await rawRequest(open.url, method, '/metrics', { host: `attacker.example:${open.port}` })
    assert.equal(rebinding.statusCode, 403, `${method} with a foreign Host`)
    const crossSite = await rawRequest(open.url, method, '/metrics', { origin: 'http://attacker.example' })
    assert.equal(crossSite.statusCode, 403, `${method} with a foreign Origin`)
    const fetchSite = await rawRequest(open.url, method, '/metrics', { 'sec-fetch-site': 'cross-site' })
    assert.equal(fetchSite.statusCode, 403, `${method} with Sec-Fetch-Site: cross-site`)
    if (method === 'GET') {
      assertError(json(rebinding), 403, 'TP_ERR_HOST_FORBIDDEN')
      assertError(json(crossSite), 403, 'TP_ERR_ORIGIN_FORBIDDEN')
      assertError(json(fetchSite), 403, 'TP_ERR_ORIGIN_FORBIDDEN')
    }
    // Token mode: no token, a wrong one, then the right one.
    const missing = await rawRequest(guarded.url, method, '/metrics', {})
    assert.equal(missing.statusCode, 401, `${method} without the token`)
    assert.equal(missing.headers['www-authenticate'], 'Bearer')
    const wrong = await rawRequest(guarded.url, method, '/metrics', { authorization: `Bearer ${token}x` })
    assert.equal(wrong.statusCode, 401, `${method} with a wrong token`)
    if (method === 'GET') assertError(json(missing), 401, 'TP_ERR_UNAUTHORIZED')
    const right = await rawRequest(guarded.url, method, '/metrics', { authorization: `Bearer ${token}` })
    assert.equal(right.statusCode, 200, `${method} with the token`)
  }
})
