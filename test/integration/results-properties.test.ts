// Properties of the way back: what a plugin's callback answers → the ToolResult (README "Tool
// results", "Errors and images from a plugin"; docs/protocol.md R10–R12, "Model-visible result",
// "Images") → what every exit renders of it: the library's `callTool`, `POST /api/tools/call`,
// an MCP `tools/call` through the real SDK client over Streamable HTTP, `toolResultBlock`
// (README "Tool results for your own LLM loop") and the Realtime adapter's
// `function_call_output` — in pool mode (worker thread) and in inline mode alike.
//
// A callback server on 127.0.0.1 that this file controls writes the exact reply bytes (status,
// Content-Type with and without charset, Content-Length or chunked framing, the body cut at
// random places — inside multi-byte UTF-8 and JSON tokens — with 0–2 ms between the pieces).
// The expected ToolResult is built from the docs (a small model: decode as UTF-8 with one BOM
// dropped, "JSON" is what JSON.parse accepts of that, the envelope rules, the image checks), and
// each exit is compared with it. A second, differential property checks that for a reply that is
// valid JSON the result's value is JSON.parse of the body, and that the same body mutated into
// invalid JSON is text output.
import assert from 'node:assert/strict'
import { once } from 'node:events'
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'
import { test, type TestContext } from 'node:test'
import fc from 'fast-check'
import { request as httpRequest } from 'undici'
import { WebSocket, WebSocketServer } from 'ws'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import {
  createRealtimeSession, toolResultBlock, type RealtimeSession, type Toolport, type ToolResult
} from '../../src/main/index.js'
import { startToolport, within } from '../helpers.js'

const MODES = ['pool', 'inline'] as const
type Mode = typeof MODES[number]

const ROLE = 'Lanlan'
const TOOL = 'reply_probe'
/** A small reply cap, so that bodies around it (and around 16 KiB) stay cheap to generate. */
const MAX_RESPONSE_BYTES = 48 * 1024
const MAX_IMAGES = 2
const MAX_IMAGE_BYTES = 2 * 1024 * 1024
/**
 * MCP (README "MCP: one endpoint per role"): no `structuredContent` for an output nested more than
 * 4096 levels deep, nor for one whose text passes 256 KiB: the text carries it.
 */
const MAX_STRUCTURED_DEPTH = 4096
const MAX_STRUCTURED_TEXT_BYTES = 256 * 1024

const RUNS = Math.max(1, Number(process.env.TP_PROPERTY_RUNS ?? '1'))
function runs (n: number): number {
  return Math.max(1, Math.round(n * RUNS))
}
/** Each call is guarded: a hang fails the run instead of the file. */
const CALL_GUARD_MS = 15_000
const MAX_SHRINKS = 60
const FAILING_TIMEOUT_MS = 600_000

// ---------------------------------------------------------------------------------------------
// The callback server: writes exactly the planned bytes.

/** One planned reply of the callback. */
interface ReplyPlan {
  status: number
  /** The Content-Type header, or null for none. */
  contentType: string | null
  /** `length`: a Content-Length header; `chunked`: one chunk per piece. */
  framing: 'length' | 'chunked'
  body: Uint8Array
  /** Where the body is cut into pieces (sorted, inside (0, length)). */
  cuts: number[]
  /** Delay before each piece after the first, 0–2 ms. */
  delays: number[]
  /** A Content-Encoding header, or null for none. */
  encoding: string | null
  /** A 103 Early Hints response first (informational: the real reply follows). */
  earlyHints: boolean
  /** The plugin drops the connection before its last piece (a broken reply). */
  abort: boolean
}

class ReplyServer {
  plan: ReplyPlan | null = null
  calls = 0
  readonly #server: Server

  constructor () {
    this.#server = createServer((req, res) => { this.#serve(req, res) })
    this.#server.keepAliveTimeout = 10_000
  }

  async start (): Promise<string> {
    this.#server.listen(0, '127.0.0.1')
    await once(this.#server, 'listening')
    return `http://127.0.0.1:${(this.#server.address() as AddressInfo).port}`
  }

  /** Plans by the call's `arguments.k`, for concurrent calls; `plan` answers the others. */
  readonly plans = new Map<string, ReplyPlan>()

  #serve (req: IncomingMessage, res: ServerResponse): void {
    const chunks: Buffer[] = []
    req.on('data', (chunk: Buffer) => chunks.push(chunk))
    req.on('end', () => {
      this.calls++
      let key: unknown
      try {
        key = (JSON.parse(Buffer.concat(chunks).toString()) as { arguments?: { k?: unknown } }).arguments?.k
      } catch {}
      const plan = typeof key === 'string' ? this.plans.get(key) ?? null : this.plan
      if (plan === null) {
        res.writeHead(599).end()
        return
      }
      writePlan(res, plan).catch(() => { res.destroy() })
    })
  }

  async close (): Promise<void> {
    this.#server.closeAllConnections()
    await new Promise<void>((resolve) => this.#server.close(() => resolve()))
  }
}

async function writePlan (res: ServerResponse, plan: ReplyPlan): Promise<void> {
  const headers: Record<string, string> = {}
  if (plan.contentType !== null) headers['content-type'] = plan.contentType
  if (plan.framing === 'length') headers['content-length'] = String(plan.body.length)
  if (plan.encoding !== null) headers['content-encoding'] = plan.encoding
  if (plan.earlyHints) res.writeEarlyHints({ link: '</style.css>; rel=preload; as=style' })
  res.writeHead(plan.status, headers)
  const pieces = cutPieces(plan.body, plan.cuts)
  for (let i = 0; i < pieces.length; i++) {
    if (plan.abort && i === Math.max(0, pieces.length - 1)) {
      res.destroy()
      return
    }
    if (i > 0) {
      const ms = plan.delays[(i - 1) % Math.max(1, plan.delays.length)] ?? 0
      if (ms > 0) await sleep(ms)
      else await new Promise((resolve) => setImmediate(resolve))
    }
    if (res.destroyed) return
    res.write(pieces[i])
  }
  if (plan.abort) {
    // No body: nothing sent at all (a Content-Length: 0 reply would already be complete).
    res.destroy()
    return
  }
  res.end()
}

function cutPieces (body: Uint8Array, cuts: readonly number[]): Uint8Array[] {
  if (body.length === 0) return []
  const points = [...new Set(cuts.map((c) => c % body.length).filter((c) => c > 0))].sort((a, b) => a - b)
  const pieces: Uint8Array[] = []
  let from = 0
  for (const at of points) {
    pieces.push(body.subarray(from, at))
    from = at
  }
  pieces.push(body.subarray(from))
  return pieces
}

// ---------------------------------------------------------------------------------------------
// The model: what the docs say the ToolResult is.

/** Placeholder for one `_image_warnings` entry: the wording is not documented, the count is. */
const WARNING = '<image warning>'

interface ExpectedImage { mime_type: string, data_base64: string, prompt?: string }

interface Expected {
  is_error: boolean
  /** Exact error, or a prefix (for failures whose wording carries details). */
  error?: { exact: string } | { prefix: string, includes?: string } | { jsonOf: unknown }
  output: unknown
  /** The text: exactly this string, or a JSON text that parses to this value. */
  text: { exact: string } | { json: unknown }
  images?: ExpectedImage[]
}

const utf8 = new TextDecoder('utf-8')

function hasOwn (value: object, key: string): boolean {
  return Object.prototype.hasOwnProperty.call(value, key)
}

function isPlainObject (value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value)
}

function expectedResult (plan: ReplyPlan): Expected {
  // "a connection failure" (here: the reply broken off) is a tool error the model sees.
  if (plan.abort) return { is_error: true, output: null, error: { prefix: '' }, text: { json: null } }
  if (plan.status >= 300) {
    return {
      is_error: true,
      output: null,
      error: { prefix: `tool callback returned HTTP ${plan.status}` },
      text: { json: null } // checked against the error below
    }
  }
  // "so is a compressed one (`Content-Encoding` is never decoded)"
  if (plan.encoding !== null && plan.encoding.trim().toLowerCase() !== 'identity') {
    return { is_error: true, output: null, error: { prefix: '' }, text: { json: null } }
  }
  if (plan.body.length > MAX_RESPONSE_BYTES) {
    return { is_error: true, output: null, error: { prefix: `tool '${TOOL}'`, includes: String(MAX_RESPONSE_BYTES) }, text: { json: null } }
  }
  // "an empty body is """
  if (plan.body.length === 0) return { is_error: false, output: '', text: { exact: '' } }
  // "JSON" means what JSON.parse accepts of the UTF-8 decoding (a leading BOM dropped).
  const decoded = utf8.decode(plan.body)
  let value: unknown
  try {
    value = JSON.parse(decoded)
  } catch {
    // "a non-JSON body is text output"
    return { is_error: false, output: decoded, text: { exact: decoded } }
  }
  if (isPlainObject(value) && (hasOwn(value, 'output') || hasOwn(value, 'is_error'))) return envelope(value)
  // "any other JSON value is taken as the output itself"
  return { is_error: false, output: value, text: typeof value === 'string' ? { exact: value } : { json: value } }
}

function envelope (reply: Record<string, unknown>): Expected {
  // "`is_error` counts only when it is the JSON value `true`"
  const isError = reply.is_error === true
  const raw = hasOwn(reply, 'output') ? reply.output : undefined
  const { images, warnings } = modelImages(hasOwn(reply, 'images') ? reply.images : undefined)
  const warned = warnings === 0 ? undefined : new Array<string>(warnings).fill(WARNING)
  // "to an object output as a key, to no output as {"_image_warnings": […]}, and around any
  // other output as {"output": …, "_image_warnings": […]}"
  let seen: unknown = raw === undefined ? null : raw
  if (warned !== undefined) {
    if (raw === undefined || raw === null) seen = { _image_warnings: warned }
    else if (isPlainObject(raw)) seen = { ...copyOwn(raw), _image_warnings: warned }
    else seen = { output: raw, _image_warnings: warned }
  }
  const expected: Expected = isError
    ? errorEnvelope(reply, raw, seen)
    : { is_error: false, output: seen, text: typeof seen === 'string' ? { exact: seen } : { json: seen } }
  if (images.length > 0) expected.images = images
  return expected
}

function errorEnvelope (reply: Record<string, unknown>, raw: unknown, seen: unknown): Expected {
  // "Without an `error` string, the output (or a fixed text) is the error message."
  // A non-string output's message is its JSON text as the plugin wrote it, without whitespace.
  let message: string | undefined
  let jsonOf = false
  if (typeof reply.error === 'string' && reply.error !== '') message = reply.error
  else if (typeof raw === 'string' && raw !== '') message = raw
  else if (raw !== undefined && raw !== null && raw !== '') {
    try {
      JSON.stringify(raw)
      jsonOf = true
    } catch {
      // Too deep for this thread's JSON.stringify to compare: any message (both modes must agree).
    }
  }
  // "the error result's `output` is that value, else `null`"; the text carries `output` only when non-null.
  const text: Record<string, unknown> = { error: message ?? null }
  if (seen !== null) text.output = seen
  return {
    is_error: true,
    output: seen,
    error: message !== undefined ? { exact: message } : jsonOf ? { jsonOf: raw } : { prefix: '' },
    text: { json: text }
  }
}

/** Own enumerable properties (JSON.parse makes `__proto__` an own one), copied as own ones. */
function copyOwn (value: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = {}
  for (const key of Object.keys(value)) {
    Object.defineProperty(out, key, { value: value[key], enumerable: true, writable: true, configurable: true })
  }
  return out
}

const MIME_ALIASES: Record<string, string> = {
  'image/png': 'image/png', 'image/jpeg': 'image/jpeg', 'image/jpg': 'image/jpeg', 'image/webp': 'image/webp', 'image/gif': 'image/gif'
}

/** docs/protocol.md "Images": which images pass, and how many warnings the model reads. */
function modelImages (value: unknown): { images: ExpectedImage[], warnings: number } {
  const images: ExpectedImage[] = []
  if (value === undefined || value === null) return { images, warnings: 0 }
  if (!Array.isArray(value)) return { images, warnings: 1 }
  let warnings = 0
  for (let i = 0; i < Math.min(value.length, MAX_IMAGES); i++) {
    const image = value[i] as unknown
    if (!isPlainObject(image)) { warnings++; continue }
    const data = image.data_b64
    if (typeof data !== 'string' || data === '' || data.length > MAX_IMAGE_BYTES || !strictBase64(data)) { warnings++; continue }
    const actual = sniff(Buffer.from(data, 'base64'))
    if (actual === '') { warnings++; continue }
    const mime = image.mime
    if (mime !== undefined && mime !== null && mime !== '') {
      const declared = typeof mime === 'string' ? MIME_ALIASES[mime.trim().toLowerCase()] : undefined
      if (declared !== actual) { warnings++; continue }
    }
    const out: ExpectedImage = { mime_type: actual, data_base64: data }
    if (typeof image.vision_prompt === 'string' && image.vision_prompt !== '') out.prompt = image.vision_prompt
    images.push(out)
  }
  if (value.length > MAX_IMAGES) warnings++
  return { images, warnings }
}

function strictBase64 (data: string): boolean {
  return data.length % 4 === 0 && /^[A-Za-z0-9+/]*={0,2}$/.test(data) &&
    Buffer.from(data, 'base64').toString('base64') === data
}

function sniff (b: Buffer): string {
  if (b.length >= 8 && b.subarray(0, 8).equals(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]))) return 'image/png'
  if (b.length >= 3 && b[0] === 0xff && b[1] === 0xd8 && b[2] === 0xff) return 'image/jpeg'
  if (b.length >= 6 && /^GIF8[79]a$/.test(b.subarray(0, 6).toString('latin1'))) return 'image/gif'
  if (b.length >= 12 && b.subarray(0, 4).toString('latin1') === 'RIFF' && b.subarray(8, 12).toString('latin1') === 'WEBP') return 'image/webp'
  return ''
}

// ---------------------------------------------------------------------------------------------
// Comparisons (iterative: outputs may be nested thousands of levels deep).

/** Replaces the strings of every `_image_warnings` array with WARNING (their wording is free). */
function maskWarnings (value: unknown): unknown {
  if (!isPlainObject(value) || !Array.isArray(value._image_warnings)) return value
  const warnings = value._image_warnings as unknown[]
  if (!warnings.every((w) => typeof w === 'string' && w !== '')) return value
  const out = copyOwn(value)
  out._image_warnings = warnings.map(() => WARNING)
  return out
}

function maskDeep (value: unknown): unknown {
  const masked = maskWarnings(value)
  if (isPlainObject(masked) && hasOwn(masked, 'output') && hasOwn(masked, '_image_warnings')) {
    return { ...copyOwn(masked), output: masked.output }
  }
  return masked
}

/**
 * Deep equality of JSON-like values: own keys (incl. `__proto__`), Object.is on numbers. Null when
 * equal, else where they differ.
 */
function difference (actual: unknown, expected: unknown): string | null {
  const stack: Array<[unknown, unknown, string]> = [[actual, expected, '$']]
  while (stack.length > 0) {
    const [a, e, path] = stack.pop() as [unknown, unknown, string]
    if (typeof e !== 'object' || e === null) {
      if (!Object.is(a, e)) return `${path}: ${describe(a)} !== ${describe(e)}`
      continue
    }
    if (typeof a !== 'object' || a === null) return `${path}: ${describe(a)} is not an object/array like ${describe(e)}`
    if (Array.isArray(e) !== Array.isArray(a)) return `${path}: array vs object`
    const ka = Object.keys(a).sort()
    const ke = Object.keys(e).sort()
    if (ka.join('\u0000') !== ke.join('\u0000')) return `${path}: keys ${JSON.stringify(ka).slice(0, 300)} !== ${JSON.stringify(ke).slice(0, 300)}`
    for (const key of ke) stack.push([(a as Record<string, unknown>)[key], (e as Record<string, unknown>)[key], `${path}.${key}`])
  }
  return null
}

function describe (v: unknown): string {
  try {
    return (typeof v === 'number' && Object.is(v, -0)) ? '-0' : (JSON.stringify(v) ?? String(v)).slice(0, 200)
  } catch {
    return String(v).slice(0, 200)
  }
}

function assertSame (actual: unknown, expected: unknown, what: string): void {
  const diff = difference(actual, expected)
  if (diff !== null) assert.fail(`${what}: ${diff}`)
}

/** A ToolResult (library object or parsed HTTP body) against the model. */
function checkResult (result: ToolResult, expected: Expected, where: string): void {
  assert.equal(result.is_error, expected.is_error, `${where}: is_error`)
  if (expected.error === undefined) {
    assert.equal(result.error, undefined, `${where}: no error on success`)
  } else {
    assert.equal(typeof result.error, 'string', `${where}: error is a string`)
    const error = result.error as string
    if ('exact' in expected.error) assert.equal(error, expected.error.exact, `${where}: error`)
    else if ('jsonOf' in expected.error) {
      // The output's JSON text as the plugin wrote it (so 9007199254740993 stays as written).
      let parsed: unknown
      try {
        parsed = JSON.parse(error)
      } catch {
        assert.fail(`${where}: error ${JSON.stringify(error.slice(0, 200))} is not the output's JSON`)
      }
      assertSame(parsed, expected.error.jsonOf, `${where}: error is the output's JSON`)
    } else {
      assert.ok(error.startsWith(expected.error.prefix), `${where}: error ${JSON.stringify(error.slice(0, 200))} starts with ${JSON.stringify(expected.error.prefix)}`)
      assert.ok(error !== '', `${where}: error is not empty`)
      if (expected.error.includes !== undefined) assert.ok(error.includes(expected.error.includes), `${where}: error mentions ${expected.error.includes}`)
    }
  }
  assertSame(maskDeep(result.output), expected.output, `${where}: output`)
  assert.equal(typeof result.text, 'string', `${where}: text is a string`)
  if ('exact' in expected.text) {
    assert.equal(result.text, expected.text.exact, `${where}: text`)
  } else {
    let parsed: unknown
    try {
      parsed = JSON.parse(result.text)
    } catch {
      assert.fail(`${where}: text is not JSON: ${JSON.stringify(result.text.slice(0, 200))}`)
    }
    if (expected.error !== undefined && !('exact' in expected.error) && expected.text.json === null) {
      // A failure that is not the tool's own: `{"error": "…"}` with the result's message.
      assertSame(parsed, { error: result.error }, `${where}: text of a failure`)
    } else if (expected.is_error) {
      const want = { ...(expected.text.json as Record<string, unknown>) }
      if (want.error === null) want.error = result.error
      const got = isPlainObject(parsed) ? copyOwn(parsed) : parsed
      if (isPlainObject(got) && hasOwn(got, 'output')) got.output = maskDeep(got.output)
      assertSame(got, want, `${where}: text of a tool error`)
    } else {
      assertSame(maskDeep(parsed), expected.text.json, `${where}: text`)
    }
  }
  assertSame(result.images, expected.images, `${where}: images`)
}

/** The JSON depth MCP counts (the root object or array is level 1). */
function depthOf (value: unknown): number {
  let max = 0
  const stack: Array<[unknown, number]> = [[value, 1]]
  while (stack.length > 0) {
    const [node, depth] = stack.pop() as [unknown, number]
    if (typeof node !== 'object' || node === null) continue
    if (depth > max) max = depth
    for (const child of Object.values(node)) stack.push([child, depth + 1])
  }
  return max
}

// ---------------------------------------------------------------------------------------------
// The exits.

interface Exits {
  mode: Mode
  tp: Toolport
  url: string
  callbacks: ReplyServer
  mcp: Client
  realtime: FakeProvider
}

class FakeProvider {
  readonly received: Array<Record<string, any>> = []
  readonly #waiters = new Set<() => void>()
  socket: WebSocket | null = null
  readonly server: WebSocketServer

  constructor (server: WebSocketServer) {
    this.server = server
    server.on('connection', (socket) => {
      this.socket = socket
      socket.on('message', (data) => {
        const event = JSON.parse(data.toString()) as Record<string, any>
        this.received.push(event)
        if (event.type === 'session.update') this.play({ type: 'session.updated', session: { ...event.session } })
        for (const wake of this.#waiters) wake()
      })
    })
  }

  play (event: Record<string, unknown>): void {
    this.socket?.send(JSON.stringify({ event_id: `evt_${Math.random().toString(36).slice(2)}`, ...event }))
  }

  async outputFor (callId: string): Promise<Record<string, any>> {
    for (;;) {
      const found = this.received.find((e) => e.type === 'conversation.item.create' && e.item?.call_id === callId)
      if (found !== undefined) return found
      await new Promise<void>((resolve) => {
        const wake = (): void => { this.#waiters.delete(wake); resolve() }
        this.#waiters.add(wake)
      })
    }
  }
}

async function setupExits (t: TestContext, mode: Mode): Promise<Exits> {
  const { tp, url } = await startToolport(t, {
    roles: [ROLE],
    dispatch: { mode, maxResponseBytes: MAX_RESPONSE_BYTES, maxImages: MAX_IMAGES, maxImageBytes: MAX_IMAGE_BYTES }
  })
  const callbacks = new ReplyServer()
  const base = await callbacks.start()
  t.after(() => callbacks.close())
  const registered = await tp.register({ name: TOOL, callback_url: `${base}/tools/${TOOL}`, source: 'external', timeout_seconds: 20 })
  assert.equal(registered.ok, true)

  const mcp = new Client({ name: 'results-properties', version: '1.0.0' })
  await mcp.connect(new StreamableHTTPClientTransport(new URL(`${url}/mcp/${ROLE}`)))
  t.after(() => mcp.close())

  const wss = new WebSocketServer({ host: '127.0.0.1', port: 0 })
  await once(wss, 'listening')
  const realtime = new FakeProvider(wss)
  const ws = new WebSocket(`ws://127.0.0.1:${(wss.address() as AddressInfo).port}`)
  await once(ws, 'open')
  const session: RealtimeSession = createRealtimeSession({
    toolport: tp,
    role: ROLE,
    rateLimit: false,
    send: (event) => { ws.send(JSON.stringify(event)) }
  })
  ws.on('message', (data) => session.handleServerEvent(data.toString()))
  t.after(async () => {
    session.close()
    ws.terminate()
    for (const client of wss.clients) client.terminate()
    await new Promise<void>((resolve) => wss.close(() => resolve()))
  })
  await tp.roles.get(ROLE).sync()
  return { mode, tp, url, callbacks, mcp, realtime }
}

let callSeq = 0

async function viaLibrary (exits: Exits, args: Record<string, unknown> = {}): Promise<ToolResult> {
  return await exits.tp.callTool(ROLE, { name: TOOL, call_id: `lib_${++callSeq}`, raw_arguments: JSON.stringify(args) })
}

async function viaHttp (exits: Exits, args: Record<string, unknown> = {}): Promise<ToolResult> {
  const res = await httpRequest(`${exits.url}/api/tools/call`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ role: ROLE, name: TOOL, arguments: args, call_id: `http_${++callSeq}` })
  })
  const text = await res.body.text()
  assert.equal(res.statusCode, 200, `HTTP API status (${text.slice(0, 200)})`)
  return JSON.parse(text) as ToolResult
}

async function viaMcp (exits: Exits): Promise<any> {
  return await exits.mcp.callTool({ name: TOOL, arguments: {} }, undefined, { timeout: CALL_GUARD_MS })
}

async function viaRealtime (exits: Exits): Promise<string> {
  const n = ++callSeq
  const callId = `call_rt_${n}`
  const item = { id: `item_${n}`, type: 'function_call', status: 'completed', call_id: callId, name: TOOL, arguments: '{}' }
  exits.realtime.play({ type: 'response.function_call_arguments.done', response_id: `resp_${n}`, item_id: item.id, output_index: 0, call_id: callId, name: TOOL, arguments: '{}' })
  exits.realtime.play({ type: 'response.done', response: { id: `resp_${n}`, object: 'realtime.response', status: 'completed', output: [item] } })
  const event = await exits.realtime.outputFor(callId)
  assert.equal(event.item.type, 'function_call_output')
  return event.item.output as string
}

/** README "Tool results for your own LLM loop": what each format must be for this result. */
function checkBlocks (result: ToolResult, where: string): void {
  const text = result.text
  const images = result.images ?? []
  const anthropic = toolResultBlock(result, 'anthropic', 'toolu_1')
  const responses = toolResultBlock(result, 'openai-responses', 'call_1')
  const chat = toolResultBlock(result, 'openai-chat', 'call_1')
  const anthropicContent: unknown = images.length === 0
    ? text
    : [...(text === '' ? [] : [{ type: 'text', text }]), ...images.flatMap((image) => [
        ...(image.prompt === undefined ? [] : [{ type: 'text', text: image.prompt }]),
        { type: 'image', source: { type: 'base64', media_type: image.mime_type, data: image.data_base64 } }])]
  assertSame(anthropic, { type: 'tool_result', tool_use_id: 'toolu_1', content: anthropicContent, ...(result.is_error ? { is_error: true } : {}) }, `${where}: anthropic block`)
  const responsesOutput: unknown = images.length === 0
    ? text
    : [...(text === '' ? [] : [{ type: 'input_text', text }]), ...images.flatMap((image) => [
        ...(image.prompt === undefined ? [] : [{ type: 'input_text', text: image.prompt }]),
        { type: 'input_image', image_url: `data:${image.mime_type};base64,${image.data_base64}`, detail: 'auto' }])]
  assertSame(responses, { type: 'function_call_output', call_id: 'call_1', output: responsesOutput }, `${where}: openai-responses item`)
  assert.equal(chat.role, 'tool')
  assert.equal(chat.tool_call_id, 'call_1')
  checkTextOnly(chat.content, result, `${where}: openai-chat message`)
}

/** Text-only sessions: the text, then (with images) a last line saying how many were left out. */
function checkTextOnly (actual: string, result: ToolResult, where: string): void {
  const count = result.images?.length ?? 0
  if (count === 0) {
    assert.equal(actual, result.text, `${where}: the result's text`)
    return
  }
  const lead = result.text === '' ? '' : `${result.text}\n`
  assert.ok(actual.startsWith(lead), `${where}: starts with the text`)
  const last = actual.slice(lead.length)
  assert.ok(!last.includes('\n') && last.includes(`${count} image`) && /omit/.test(last), `${where}: a last line saying ${count} image(s) were omitted, got ${JSON.stringify(last)}`)
}

function checkMcp (answer: any, result: ToolResult, where: string): void {
  assert.equal(answer.isError, result.is_error, `${where}: isError`)
  const content = answer.content as Array<Record<string, unknown>>
  assert.ok(Array.isArray(content) && content.length >= 1, `${where}: content`)
  assertSame(content[0], { type: 'text', text: result.text }, `${where}: the first content item is the text`)
  const images = (result.images ?? []).map((image) => ({ type: 'image', data: image.data_base64, mimeType: image.mime_type }))
  assertSame(content.slice(1), images, `${where}: image items after the text`)
  const isObject = !result.is_error && isPlainObject(result.output)
  const isTooDeep = isObject && depthOf(result.output) > MAX_STRUCTURED_DEPTH
  const isTooLong = isObject && Buffer.byteLength(result.text) > MAX_STRUCTURED_TEXT_BYTES
  if (isObject && !hasOwn(result.output as object, '__proto__') && !isTooDeep && !isTooLong) {
    // JSON-RPC carries JSON: the output as JSON encodes it (1e400 is null there, -0 is 0).
    assertSame(answer.structuredContent, JSON.parse(JSON.stringify(result.output)), `${where}: structuredContent is the object output`)
  } else {
    const why = result.is_error
      ? 'an error'
      : !isObject
          ? 'a non-object output'
          : isTooDeep
            ? `an output nested > ${MAX_STRUCTURED_DEPTH} deep`
            : isTooLong ? 'an output whose text passes 256 KiB' : 'an output with a top-level "__proto__" key'
    assert.equal(answer.structuredContent, undefined, `${where}: no structuredContent for ${why}`)
  }
}

/** One reply plan through every exit of one Toolport, each compared with the model. */
async function checkEveryExit (exits: Exits, plan: ReplyPlan, expected: Expected): Promise<ToolResult> {
  exits.callbacks.plan = plan
  const where = (exit: string): string => `${exits.mode} ${exit}`
  const library = await within(viaLibrary(exits), `${exits.mode}: callTool`, CALL_GUARD_MS)
  checkResult(library, expected, where('callTool'))
  checkBlocks(library, where('toolResultBlock'))
  const http = await within(viaHttp(exits), `${exits.mode}: POST /api/tools/call`, CALL_GUARD_MS)
  checkResult(http, expected, where('POST /api/tools/call'))
  const mcp = await within(viaMcp(exits), `${exits.mode}: MCP tools/call`, CALL_GUARD_MS)
  checkMcp(mcp, library, where('MCP tools/call'))
  const realtime = await within(viaRealtime(exits), `${exits.mode}: Realtime function_call_output`, CALL_GUARD_MS)
  checkTextOnly(realtime, library, where('Realtime function_call_output'))
  return library
}

// ---------------------------------------------------------------------------------------------
// Generators.

const enc = new TextEncoder()

function bytesOf (text: string): Uint8Array {
  return enc.encode(text)
}

function concat (...parts: Uint8Array[]): Uint8Array {
  return new Uint8Array(Buffer.concat(parts))
}

const BOM = new Uint8Array([0xef, 0xbb, 0xbf])

const ws = fc.constantFrom('', '', ' ', '\n', '\r\n', '\t', '  \n ')

/** A JSON string literal, sometimes with every character escaped, lone surrogates included. */
const stringText = fc.oneof(
  fc.string({ unit: 'grapheme', maxLength: 12 }).map((s) => JSON.stringify(s)),
  fc.string({ unit: 'binary', maxLength: 8 }).map((s) => JSON.stringify(s)),
  fc.constantFrom('"\\ud800"', '"a\\udfff"', '"\\ud83d\\ude00"', '"\\ud83d"', '"\\u0000"', '"\\/\\b\\f\\n\\r\\t"', '"\\ufeffbom"', '"\ufeff"', '"€😀é"', '""'),
  fc.string({ maxLength: 6 }).map((s) => `"${[...s].map((c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`).join('')}"`)
)

const numberText = fc.oneof(
  fc.constantFrom('0', '-0', '1e400', '-1e400', '1E-400', '123456789012345678901234567890', '0.1', '-0.0', '1e+2', '9007199254740993', '5e-324'),
  fc.double({ noNaN: true, noDefaultInfinity: true }).map((d) => JSON.stringify(d)),
  fc.integer().map(String)
)

/** Deep nesting: objects (counted by MCP's structured depth) or arrays. Avoids the 4096 boundary itself. */
const deepText = fc.record({
  depth: fc.oneof(fc.integer({ min: 1, max: 40 }), fc.integer({ min: 3000, max: 4090 }),
    fc.integer({ min: 4100, max: 6000 })),
  kind: fc.constantFrom('object', 'array', 'mixed'),
  leaf: fc.constantFrom('1', '"x"', 'null', '{}', '[]')
}).map(({ depth, kind, leaf }) => {
  let open = ''
  let close = ''
  for (let i = 0; i < depth; i++) {
    const obj = kind === 'object' || (kind === 'mixed' && i % 2 === 0)
    open += obj ? '{"a":' : '['
    close = (obj ? '}' : ']') + close
  }
  return open + leaf + close
})

/** Any JSON value as text, with random whitespace. */
const valueText: fc.Arbitrary<string> = fc.letrec<{ value: string }>((tie) => ({
  value: fc.oneof(
    { depthSize: 'small', withCrossShrink: true },
    fc.constantFrom('true', 'false', 'null'),
    numberText,
    stringText,
    fc.tuple(fc.array(tie('value'), { maxLength: 3 }), ws).map(([items, w]) => `[${w}${items.join(`${w},`)}]`),
    fc.tuple(fc.array(fc.tuple(keyText(fc.constantFrom('a', 'output', 'is_error', '__proto__', 'constructor', 'b', 'error')), tie('value')), { maxLength: 3 }), ws)
      .map(([members, w]) => `{${w}${members.map(([k, v]) => `${k}${w}:${v}`).join(',')}${w}}`)
  )
})).value

/** A key spelled plainly or with escapes (`"\u006futput"` is `output` to JSON.parse). */
function keyText (names: fc.Arbitrary<string>): fc.Arbitrary<string> {
  return fc.tuple(names, fc.constantFrom('plain', 'plain', 'escaped', 'first')).map(([name, how]) => {
    if (how === 'plain') return JSON.stringify(name)
    if (how === 'escaped') return `"${[...name].map((c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`).join('')}"`
    return name === '' ? '""' : `"\\u${name.charCodeAt(0).toString(16).padStart(4, '0')}${JSON.stringify(name.slice(1)).slice(1)}`
  })
}

/** Small images: good ones of each type, and ones each check refuses. */
const PNG = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 13, 73, 72, 68, 82, 1, 2]).toString('base64')
const JPEG = Buffer.from([0xff, 0xd8, 0xff, 0xe0, 0, 16, 74, 70, 73, 70, 0]).toString('base64')
const GIF = Buffer.from('GIF89a\u0001\u0000\u0001\u0000', 'latin1').toString('base64')
const WEBP = Buffer.from('RIFF\u0010\u0000\u0000\u0000WEBPVP8 ', 'latin1').toString('base64')
const goodImage = fc.record({
  pick: fc.constantFrom<[string, string]>(['image/png', PNG], ['image/jpeg', JPEG], ['image/gif', GIF], ['image/webp', WEBP]),
  mime: fc.constantFrom('same', 'none', 'upper', 'jpg'),
  prompt: fc.option(fc.constantFrom('Describe the weather map.', 'é😀', ''), { nil: undefined })
}).map(({ pick: [mime, data], mime: how, prompt }) => ({
  data_b64: data,
  ...(how === 'none' ? {} : { mime: how === 'upper' ? ` ${mime.toUpperCase()}` : how === 'jpg' && mime === 'image/jpeg' ? 'image/jpg' : mime }),
  ...(prompt === undefined ? {} : { vision_prompt: prompt })
}))
const imageItem = fc.oneof(
  { weight: 4, arbitrary: goodImage },
  fc.record({
    data_b64: fc.constantFrom(PNG, JPEG, GIF, WEBP, `${PNG.slice(0, -4)} ${PNG.slice(-3)}`, 'AAAA', 'not base64!', '', PNG.replace(/=+$/, '')),
    mime: fc.constantFrom(undefined, null, '', 'image/png', 'IMAGE/PNG ', 'image/jpeg', 'image/jpg', 'image/gif', 'image/webp', 'image/bmp', 5),
    vision_prompt: fc.constantFrom(undefined, '', 'Describe it.', 'é😀', 7)
  }, { requiredKeys: ['data_b64'] }),
  fc.constantFrom<unknown>(5, 'x', null, [PNG], {})
) as fc.Arbitrary<unknown>
const imagesText = fc.oneof(
  { weight: 4, arbitrary: fc.array(imageItem, { maxLength: 4 }).map((items) => JSON.stringify(items)) },
  { weight: 1, arbitrary: fc.constantFrom('null', '{}', '"x"', '5') }
)

/** An envelope-ish object: members in any order, duplicates, escaped keys, `__proto__`, nested envelopes. */
const envelopeText = fc.tuple(
  fc.array(fc.oneof(
    fc.tuple(keyText(fc.constant('output')), fc.oneof(valueText, deepText, fc.constant('{"output":1,"is_error":true,"error":"inner"}'))),
    fc.tuple(keyText(fc.constant('is_error')), fc.constantFrom('true', 'false', 'null', '1', '"true"', '0', '[true]')),
    fc.tuple(keyText(fc.constant('error')), fc.oneof(stringText, fc.constant('null'))),
    fc.tuple(keyText(fc.constant('images')), imagesText),
    fc.tuple(keyText(fc.constantFrom('__proto__', 'Output', 'output ', 'isError', 'images_', 'text', '_image_warnings')), valueText)
  ), { minLength: 1, maxLength: 6 }),
  ws
).map(([members, w]) => `{${w}${members.map(([k, v]) => `${k}${w}:${w}${v}`).join(`${w},${w}`)}${w}}`)

/** The documented envelope (README "Errors and images from a plugin"), members optional, in any order. */
const docEnvelopeText = fc.record({
  output: fc.option(fc.oneof(valueText, deepText, fc.constantFrom('{}', '{"reason":"no_data"}', '""', 'null', '"text"', '[1,2]', '{"_image_warnings":5}')), { nil: undefined }),
  is_error: fc.option(fc.constantFrom('true', 'true', 'false'), { nil: undefined }),
  error: fc.option(fc.oneof(stringText, fc.constantFrom('"NO_DATA"', '""', 'null')), { nil: undefined, freq: 2 }),
  images: fc.option(imagesText, { nil: undefined }),
  order: fc.array(fc.nat(), { minLength: 4, maxLength: 4 }),
  w: ws
}).map(({ order, w, ...members }) => {
  const keys = Object.keys(members).map((k, i) => [k, order[i] ?? 0] as const)
    .sort((a, b) => a[1] - b[1]).map(([k]) => k)
  const parts = keys.filter((k) => (members as Record<string, string | undefined>)[k] !== undefined)
    .map((k) => `"${k}"${w}:${w}${(members as Record<string, string>)[k]}`)
  return `{${w}${parts.join(`,${w}`)}${w}}`
})

/** A body of exactly `size` bytes: a JSON string, an envelope's string output, or text (with multi-byte padding). */
type SizedShape = 'string' | 'envelope' | 'text' | 'array' | 'images' | 'error'
const SIZED_ENDS: Record<SizedShape, [string, string]> = {
  string: ['"', '"'],
  envelope: ['{"output":"', '","is_error":false}'],
  text: ['', ''],
  array: ['["', '"]'],
  images: ['{"is_error":false,"images":[{"data_b64":"' + PNG + '","mime":"image/png","vision_prompt":"p"}],"output":"', '"}'],
  error: ['{"is_error":true,"error":"', '"}']
}
function sizedBody (size: number, shape: SizedShape, fill: string): Uint8Array {
  const [head, tail] = SIZED_ENDS[shape]
  const room = Math.max(0, size - Buffer.byteLength(head + tail))
  const fillBytes = Buffer.byteLength(fill)
  const copies = Math.floor(room / fillBytes)
  return bytesOf(head + fill.repeat(copies) + 'a'.repeat(room - copies * fillBytes) + tail)
}

const sizedArb = fc.record({
  size: fc.oneof(
    fc.integer({ min: 16 * 1024 - 24, max: 16 * 1024 + 24 }),
    fc.integer({ min: MAX_RESPONSE_BYTES - 24, max: MAX_RESPONSE_BYTES + 24 })
  ),
  shape: fc.constantFrom<SizedShape>('string', 'envelope', 'text', 'array', 'images', 'error'),
  fill: fc.constantFrom('a', 'é', '€', '😀', 'x y'),
  bom: fc.boolean()
}).map(({ size, shape, fill, bom }) =>
  bom ? concat(BOM, sizedBody(size - 3, shape, fill)) : sizedBody(size, shape, fill))

/** Mutates a body: a byte replaced, inserted or removed (fast-check's way to invalid JSON). */
const mutation = fc.record({
  op: fc.constantFrom('replace', 'insert', 'delete', 'truncate'),
  at: fc.nat(),
  // JSON's structural and token bytes, and bytes that break UTF-8.
  byte: fc.constantFrom(0x7b, 0x7d, 0x5b, 0x5d, 0x2c, 0x3a, 0x22, 0x5c, 0x20, 0x30, 0x2d, 0x2e, 0x65, 0x74, 0x6e,
    0x00, 0x0a, 0x80, 0xc3, 0xe2, 0xff, 0x61, 0xef)
})

function mutate (body: Uint8Array, m: { op: string, at: number, byte: number }): Uint8Array {
  if (body.length === 0) return new Uint8Array([m.byte])
  const at = m.at % body.length
  const b = Buffer.from(body)
  switch (m.op) {
    case 'replace': b[at] = m.byte; return new Uint8Array(b)
    case 'insert': return concat(b.subarray(0, at), new Uint8Array([m.byte]), b.subarray(at))
    case 'delete': return concat(b.subarray(0, at), b.subarray(at + 1))
    default: return new Uint8Array(b.subarray(0, at))
  }
}

const jsonBody = fc.tuple(fc.oneof(valueText, envelopeText, docEnvelopeText, docEnvelopeText, deepText), ws, ws,
  fc.boolean())
  .map(([text, before, after, bom]) => {
    const body = bytesOf(before + text + after)
    return bom ? concat(BOM, body) : body
  })

const bodyArb: fc.Arbitrary<Uint8Array> = fc.oneof(
  { weight: 8, arbitrary: jsonBody },
  { weight: 2, arbitrary: fc.tuple(jsonBody, mutation).map(([b, m]) => mutate(b, m)) },
  { weight: 2, arbitrary: fc.string({ unit: 'grapheme', maxLength: 40 }).map(bytesOf) },
  { weight: 1, arbitrary: fc.uint8Array({ maxLength: 40 }) },
  { weight: 1, arbitrary: fc.constantFrom(new Uint8Array(0), BOM, concat(BOM, BOM, bytesOf('{}')), bytesOf('   '), bytesOf('{"output":"\xff"}'), new Uint8Array([0x22, 0xe2, 0x82, 0x22]), new Uint8Array([0x22, 0xed, 0xa0, 0x80, 0x22]), new Uint8Array([0x7b, 0x22, 0x6f, 0x75, 0x74, 0x70, 0x75, 0x74, 0x22, 0x3a, 0x22, 0xc0, 0xaf, 0x22, 0x7d])) },
  { weight: 1, arbitrary: sizedArb }
)

const CONTENT_TYPES = [null, 'application/json', 'application/json; charset=utf-8', 'Application/JSON;charset=UTF-8',
  'text/plain', 'text/plain; charset=utf-8', 'application/problem+json', 'text/html', 'application/octet-stream']

const SUCCESS_STATUSES = [200, 200, 200, 201, 202, 203, 206, 299]
const ERROR_STATUSES = [300, 301, 302, 307, 400, 404, 418, 422, 500, 503]

function planArb (body: fc.Arbitrary<Uint8Array>, statuses: fc.Arbitrary<number>): fc.Arbitrary<ReplyPlan> {
  return fc.record({
    status: statuses,
    contentType: fc.constantFrom(...CONTENT_TYPES),
    framing: fc.constantFrom('length', 'chunked') as fc.Arbitrary<'length' | 'chunked'>,
    body,
    cuts: fc.array(fc.nat(), { maxLength: 4 }),
    delays: fc.array(fc.integer({ min: 0, max: 2 }), { maxLength: 4 }),
    encoding: fc.oneof({ weight: 12, arbitrary: fc.constant(null) }, { weight: 1, arbitrary: fc.constantFrom('identity', 'gzip', 'br', ' Identity') }),
    earlyHints: fc.oneof({ weight: 6, arbitrary: fc.constant(false) }, { weight: 1, arbitrary: fc.constant(true) }),
    abort: fc.oneof({ weight: 15, arbitrary: fc.constant(false) }, { weight: 1, arbitrary: fc.constant(true) })
  }).map((plan) => Object.defineProperty(plan, fc.toStringMethod, { value: () => showPlan(plan), enumerable: false }))
}

const anyPlan = planArb(bodyArb, fc.oneof(
  { weight: 9, arbitrary: fc.constantFrom(...SUCCESS_STATUSES) },
  { weight: 1, arbitrary: fc.constantFrom(...ERROR_STATUSES) }))

function showPlan (plan: ReplyPlan): string {
  const body = Buffer.from(plan.body)
  const shown = body.length > 300 ? `${body.subarray(0, 150).toString('latin1')}…(${body.length} bytes)…${body.subarray(-60).toString('latin1')}` : body.toString('latin1')
  return `status ${plan.status}${plan.earlyHints ? ' after 103' : ''}${plan.abort ? ' (connection dropped before the last piece)' : ''}, content-type ${String(plan.contentType)}, content-encoding ${String(plan.encoding)}, ${plan.framing}, cuts ${JSON.stringify(plan.cuts)}, body hex ${body.length <= 120 ? body.toString('hex') : '(long)'} latin1 ${JSON.stringify(shown)}`
}

// ---------------------------------------------------------------------------------------------
// Properties.

async function setupBoth (t: TestContext): Promise<Exits[]> {
  const both: Exits[] = []
  for (const mode of MODES) both.push(await setupExits(t, mode))
  return both
}

test('property: any callback reply becomes the documented ToolResult, the same in pool and inline mode, at every exit (callTool, POST /api/tools/call, MCP tools/call, toolResultBlock, Realtime function_call_output)', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const both = await setupBoth(t)
  await fc.assert(fc.asyncProperty(fc.limitShrink(anyPlan, MAX_SHRINKS), async (plan) => {
    const expected = expectedResult(plan)
    try {
      const pool = await checkEveryExit(both[0] as Exits, plan, expected)
      const inline = await checkEveryExit(both[1] as Exits, plan, expected)
      // "the same in pool mode and inline mode": also where the docs leave the wording open.
      assert.equal(pool.is_error, inline.is_error, 'pool and inline: is_error')
      if (plan.status < 300 && !plan.abort) assert.equal(pool.error, inline.error, 'pool and inline: error')
      if (plan.status < 300 && !plan.abort) assert.equal(pool.text, inline.text, 'pool and inline: text')
    } catch (err) {
      throw new Error(`${(err as Error).message}\n  plan: ${showPlan(plan)}`, { cause: err })
    }
  }), { numRuns: runs(60), includeErrorInReport: true })
})

const validJsonBody = fc.tuple(fc.oneof(valueText, deepText, fc.json({ depthSize: 'small' }), fc.jsonValue().map((v) => JSON.stringify(v, null, 1))), ws, ws, fc.boolean())
  .map(([text, before, after, bom]) => ({ text: before + text + after, bom }))
  .filter(({ text }) => {
    const v = JSON.parse(text) as unknown
    return !(isPlainObject(v) && (hasOwn(v, 'output') || hasOwn(v, 'is_error')))
  })

test('property (differential): a valid JSON reply\'s output is JSON.parse of the body, and the same body made invalid by a mutation is text output, in both modes', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const both = await setupBoth(t)
  const arb = fc.record({
    valid: validJsonBody,
    mutation,
    contentType: fc.constantFrom(...CONTENT_TYPES),
    framing: fc.constantFrom('length', 'chunked') as fc.Arbitrary<'length' | 'chunked'>,
    cuts: fc.array(fc.nat(), { maxLength: 4 }),
    delays: fc.array(fc.integer({ min: 0, max: 2 }), { maxLength: 4 })
  })
  await fc.assert(fc.asyncProperty(fc.limitShrink(arb, MAX_SHRINKS), async (run) => {
    const { valid, mutation: m, contentType, framing, cuts, delays } = run
    const body = valid.bom ? concat(BOM, bytesOf(valid.text)) : bytesOf(valid.text)
    const mutated = mutate(body, m)
    for (const exits of both) {
      for (const [bytes, label] of [[body, 'valid'], [mutated, 'mutated']] as const) {
        const plan: ReplyPlan = {
          status: 200, contentType, framing, body: bytes, cuts, delays, encoding: null, earlyHints: false, abort: false
        }
        exits.callbacks.plan = plan
        const decoded = utf8.decode(bytes)
        let parsed: { value: unknown } | null = null
        try {
          parsed = { value: JSON.parse(decoded) }
        } catch {}
        const isEnvelope = parsed !== null && isPlainObject(parsed.value) && (hasOwn(parsed.value, 'output') || hasOwn(parsed.value, 'is_error'))
        if (isEnvelope || bytes.length > MAX_RESPONSE_BYTES) continue // the main property covers those
        const where = `${exits.mode} ${label} ${showPlan(plan)}`
        for (const [exit, result] of [
          ['callTool', await within(viaLibrary(exits), `${exits.mode}: callTool`, CALL_GUARD_MS)],
          ['POST /api/tools/call', await within(viaHttp(exits), `${exits.mode}: HTTP`, CALL_GUARD_MS)]
        ] as const) {
          assert.equal(result.is_error, false, `${where} ${exit}: is_error`)
          if (bytes.length === 0) {
            assert.equal(result.output, '', `${where} ${exit}: an empty body is ""`)
          } else if (parsed !== null) {
            assertSame(result.output, parsed.value, `${where} ${exit}: output is JSON.parse of the body`)
            if (typeof parsed.value === 'string') assert.equal(result.text, parsed.value)
            else assertSame(JSON.parse(result.text), parsed.value, `${where} ${exit}: text is the output's JSON`)
          } else {
            assert.equal(result.output, decoded, `${where} ${exit}: a non-JSON body is text output`)
            assert.equal(result.text, decoded, `${where} ${exit}: text`)
          }
        }
      }
    }
  }), { numRuns: runs(80), includeErrorInReport: true })
})

test('property: concurrent calls whose plugin answers differently each get the result of their own reply, in both modes (callTool and POST /api/tools/call)', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const both = await setupBoth(t)
  const callsArb = fc.array(fc.tuple(anyPlan, fc.boolean()), { minLength: 2, maxLength: 6 })
  await fc.assert(fc.asyncProperty(fc.limitShrink(callsArb, MAX_SHRINKS), async (calls) => {
    for (const exits of both) {
      exits.callbacks.plans.clear()
      calls.forEach(([plan], i) => exits.callbacks.plans.set(String(i), plan))
      const results = await within(Promise.all(calls.map(async ([, overHttp], i) =>
        overHttp ? await viaHttp(exits, { k: String(i) }) : await viaLibrary(exits, { k: String(i) }))), `${exits.mode}: concurrent calls`, CALL_GUARD_MS)
      results.forEach((result, i) => {
        const [plan, overHttp] = calls[i] as [ReplyPlan, boolean]
        try {
          checkResult(result, expectedResult(plan), `${exits.mode} call ${i} ${overHttp ? 'POST /api/tools/call' : 'callTool'}`)
        } catch (err) {
          throw new Error(`${(err as Error).message}\n  plan: ${showPlan(plan)}`, { cause: err })
        }
      })
    }
  }), { numRuns: runs(10), includeErrorInReport: true })
})

// ---------------------------------------------------------------------------------------------
// Regressions: each a minimal case the properties found.

test('MCP tools/call: an object output with a top-level "__proto__" key is sent as text only, never as a structuredContent that silently lost the key (README "MCP: one endpoint per role")', { timeout: 60_000 }, async (t) => {
  const exits = await setupExits(t, 'inline')
  const body = '{"__proto__":{"x":1},"a":2}'
  exits.callbacks.plan = { status: 200, contentType: 'application/json', framing: 'length', body: bytesOf(body), cuts: [], delays: [], encoding: null, earlyHints: false, abort: false }
  const library = await within(viaLibrary(exits), 'callTool', CALL_GUARD_MS)
  assertSame(library.output, JSON.parse(body), 'callTool output (own "__proto__" key, as JSON.parse makes it)')
  const answer = await within(viaMcp(exits), 'MCP tools/call', CALL_GUARD_MS)
  assert.equal(answer.isError, false)
  assert.equal(answer.content[0].text, body)
  // The SDK's validation of a result rebuilds structuredContent, turning the key into a prototype:
  // the answer would carry {"a":2}. Without structuredContent the text is the whole output.
  assert.equal(answer.structuredContent, undefined)
})

test('a tool error without an `error` string has its output\'s JSON as its message, the same in pool and inline mode, also for an output nested 5000 levels deep (README "Errors and images from a plugin"; docs/protocol.md R11)', { timeout: 60_000 }, async (t) => {
  const depth = 5000
  const output = '{"a":'.repeat(depth - 1) + '{}' + '}'.repeat(depth - 1)
  const body = `{"is_error":true,"output":${output}}`
  assert.ok(body.length < MAX_RESPONSE_BYTES)
  const errors: Record<string, string | undefined> = {}
  for (const mode of MODES) {
    const exits = await setupExits(t, mode)
    exits.callbacks.plan = { status: 200, contentType: 'application/json', framing: 'length', body: bytesOf(body), cuts: [], delays: [], encoding: null, earlyHints: false, abort: false }
    const result = await within(viaLibrary(exits), `${mode}: callTool`, CALL_GUARD_MS)
    assert.equal(result.is_error, true)
    errors[mode] = result.error
  }
  // Pool mode answers the output's JSON; inline mode (a smaller stack for JSON.stringify on the
  // main thread) answers the literal text "[output could not be encoded as JSON]", quotes included.
  const short = (text: string | undefined): string => JSON.stringify(text?.slice(0, 60))
  assert.ok(errors.inline === errors.pool, `the same message in both modes: pool ${short(errors.pool)}…, inline ${short(errors.inline)}`)
  assert.ok(errors.inline === output, `the message is the output's JSON, got ${short(errors.inline)}`)
})
