// Shared test helpers: Toolport instances that clean up after themselves, and ModelSession fakes
// with real behaviour (they really wait, throw or hang; they record what they were given).
//
// No mocks of Toolport itself: every test drives the real runtime, the real fastify app (inject)
// or a real socket on 127.0.0.1.
import assert from 'node:assert/strict'
import { EventEmitter, once } from 'node:events'
import { existsSync, statSync } from 'node:fs'
import { request as nodeRequest, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { fileURLToPath } from 'node:url'
import { connect as http2Connect } from 'node:http2'
import fastify from 'fastify'
import fc from 'fast-check'
import type { TestContext } from 'node:test'
import { request as httpRequest } from 'undici'
import { createToolport, toolportPlugin, type Toolport, type ToolportOptions } from '../src/main/index.js'
import type { ModelSession } from '../src/main/roles/sync.js'
import type { ToolDefinition } from '../src/main/roles/tool-registry.js'
import { startCallbackServer, type CallbackServer } from './fixtures/callback-server.js'
import { distIsFresh } from '../src/main/dispatch/worker-module.js'

/** A callback URL on loopback; registration never calls it (dispatch is not exercised here). */
export const CALLBACK = 'http://127.0.0.1:9333/tools/get_weather'

const ROOT = fileURLToPath(new URL('..', import.meta.url))

/**
 * Node's arguments that run the `toolport` command as users run it: the package's bin, the bundle
 * dist/main/bin/toolport.js, when dist/ is at least as new as every source file and the bundle as
 * new as the compiled cli.js it was made from (`npm run build` makes both); the compiled
 * dist/main/cli.js when only tsc ran; else src/main/cli.ts under tsx.
 */
export function toolportCliArgs (): string[] {
  if (!distIsFresh(ROOT)) return ['--import', 'tsx', join(ROOT, 'src/main/cli.ts')]
  const bin = join(ROOT, 'dist/main/bin/toolport.js')
  const compiled = join(ROOT, 'dist/main/cli.js')
  const binStat = statSync(bin, { throwIfNoEntry: false })
  return [binStat !== undefined && binStat.mtimeMs >= statSync(compiled).mtimeMs ? bin : compiled]
}

/** Options every test Toolport starts from: silent, inline dispatch (no worker threads needed). */
function testOptions (options: ToolportOptions): ToolportOptions {
  return {
    logger: false,
    ...options,
    dispatch: { mode: 'inline', ...options.dispatch }
  }
}

/**
 * A Toolport that is not listening, for `tp.app.inject()` and library calls. Closed in `t.after`.
 */
export async function createTestToolport (t: TestContext, options: ToolportOptions = {}): Promise<Toolport> {
  const tp = await createToolport(testOptions(options))
  t.after(() => tp.close())
  return tp
}

export interface StartedToolport {
  tp: Toolport
  /** `http://127.0.0.1:<port>` */
  url: string
  port: number
}

/** A Toolport listening on 127.0.0.1, port 0. Closed in `t.after`. */
export async function startToolport (t: TestContext, options: ToolportOptions = {}): Promise<StartedToolport> {
  const tp = await createTestToolport(t, options)
  const { url, port } = await tp.listen({ host: '127.0.0.1', port: 0 })
  return { tp, url, port }
}

/**
 * Polls `predicate` every 10 ms until it holds; throws naming `what` after `timeoutMs` (a bound
 * on the wait, so a broken condition fails the test instead of hanging it).
 */
export async function waitFor (what: string, predicate: () => boolean, timeoutMs = 10_000): Promise<void> {
  const until = Date.now() + timeoutMs
  while (!predicate()) {
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`)
    await new Promise((resolve) => setTimeout(resolve, 10))
  }
}

/**
 * `promise`, or a failure after `timeoutMs` naming `what` (a function: its text is made when the
 * time is up, e.g. to list what is still missing): a hang guard, never a pass/fail on timing.
 */
export async function within<T> (promise: Promise<T>, what: string | (() => string), timeoutMs: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined
  try {
    return await Promise.race([promise, new Promise<never>((_resolve, reject) => {
      timer = setTimeout(() => {
        reject(new Error(`${typeof what === 'string' ? what : what()}: nothing within ${timeoutMs} ms (hang guard)`))
      }, timeoutMs)
    })])
  } finally {
    clearTimeout(timer)
  }
}

/** A registration body with a loopback callback; `overrides` win. */
export function tool (name: string, overrides: Record<string, unknown> = {}): Record<string, unknown> {
  return { name, callback_url: CALLBACK, ...overrides }
}

export interface JsonReply {
  statusCode: number
  headers: Record<string, unknown>
  body: any
}

/** `app.inject` with a JSON body (or none), returning the parsed reply. */
export async function inject (tp: Toolport, method: 'GET' | 'POST', url: string, payload?: unknown,
  extra: { headers?: Record<string, string>, remoteAddress?: string } = {}): Promise<JsonReply> {
  const res = await tp.app.inject({
    method,
    url,
    ...(payload === undefined ? {} : { payload: JSON.stringify(payload) }),
    headers: { ...(payload === undefined ? {} : { 'content-type': 'application/json' }), ...extra.headers },
    ...(extra.remoteAddress === undefined ? {} : { remoteAddress: extra.remoteAddress })
  })
  return { statusCode: res.statusCode, headers: res.headers, body: res.body === '' ? undefined : JSON.parse(res.body) }
}

/** A real HTTP request to a Toolport on 127.0.0.1 (undici), returning the parsed reply. */
export async function httpJson (url: string, method: 'GET' | 'POST', body?: unknown): Promise<JsonReply> {
  const res = await httpRequest(url, {
    method,
    ...(body === undefined ? {} : { body: JSON.stringify(body), headers: { 'content-type': 'application/json' } })
  })
  const text = await res.body.text()
  return { statusCode: res.statusCode, headers: res.headers, body: text === '' ? undefined : JSON.parse(text) }
}

/** A callback server on 127.0.0.1 (test/fixtures/callback-server.ts). Closed in `t.after`. */
export async function callbackServer (t: TestContext): Promise<CallbackServer> {
  const server = await startCallbackServer()
  t.after(() => server.close())
  return server
}

/**
 * Starts `server` listening on 127.0.0.1 on a free port, and closes it when the test ends: first
 * `beforeClose` (to end what the server holds), then close() with every connection closed at
 * once. Its origin, `http://127.0.0.1:<port>`.
 */
export async function listenOnLoopback (t: TestContext, server: Server, beforeClose?: () => void): Promise<string> {
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  t.after(() => new Promise<void>((resolve) => {
    beforeClose?.()
    server.close(() => resolve())
    server.closeAllConnections()
  }))
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`
}

/** Registers over real HTTP and asserts that it was accepted (HTTP 200, `ok: true`). */
export async function registerOverHttp (url: string, body: Record<string, unknown>): Promise<void> {
  const reply = await httpJson(`${url}/api/tools/register`, 'POST', body)
  assert.equal(reply.statusCode, 200)
  assert.equal(reply.body.ok, true, JSON.stringify(reply.body))
}

/** The names of the tools of one role, as `GET /api/tools` (library form) lists them. */
export function names (tp: Toolport, role: string): string[] {
  return tp.list(role).tools_by_role[role]?.map((row) => row.name) ?? []
}

/**
 * The ModelSession id of the MCP session whose `Mcp-Session-Id` is `sessionId` in `role`
 * (a random id of its own, so that sync errors do not print the session's handle); '' when
 * the role holds no such session.
 */
export function mcpModelSessionId (tp: Toolport, role: string, sessionId: string | undefined): string {
  const session = tp.roles.get(role).sessions().find((s) => (s as { sessionId?: string }).sessionId === sessionId)
  return session?.id ?? ''
}

/**
 * How a fake session answers `syncTools`:
 * - `instant`: resolves at once;
 * - `throw`: rejects with `Error(message)`;
 * - `hang`: never settles, and ignores the abort signal (the worst real session);
 * - `random`: resolves after a random delay up to `maxDelayMs` (rejects if aborted first);
 * - `gated`: waits until `release()` is called.
 */
export type SessionBehaviour = 'instant' | 'throw' | 'hang' | 'random' | 'gated'

export interface FakeSessionOptions {
  /** Rejection message for `throw` (default `session <id> refused the tools`). */
  message?: string
  /** Upper bound of the `random` delay (default 5 ms). */
  maxDelayMs?: number
}

/**
 * A ModelSession fake with real behaviour. It records every tool list it was given (`received`),
 * the last list it completed (`current`), how many pushes overlapped (`maxActive`), and the
 * abort signals it saw; it emits `call` when a push starts and `settled` when one ends.
 */
export class FakeSession extends EventEmitter implements ModelSession {
  readonly id: string
  behaviour: SessionBehaviour
  readonly message: string
  readonly maxDelayMs: number
  /** Every list pushed, in call order (names only). */
  readonly received: string[][] = []
  /** The definitions of the last push that completed successfully (what the model now sees). */
  current: readonly ToolDefinition[] | null = null
  /** Pushes running now, and the most ever running at once. */
  active = 0
  maxActive = 0
  /** Pushes whose signal was aborted (by a sync timeout). */
  aborted = 0
  readonly #gates: Array<() => void> = []

  constructor (id: string, behaviour: SessionBehaviour, options: FakeSessionOptions = {}) {
    super()
    this.id = id
    this.behaviour = behaviour
    this.message = options.message ?? `session ${id} refused the tools`
    this.maxDelayMs = options.maxDelayMs ?? 5
  }

  get calls (): number { return this.received.length }

  /** Names of the tools the session currently holds ([] before its first successful push). */
  get currentNames (): string[] {
    return this.current === null ? [] : this.current.map((d) => d.name)
  }

  async syncTools (tools: readonly ToolDefinition[], signal: AbortSignal): Promise<void> {
    const snapshot = [...tools]
    this.received.push(snapshot.map((d) => d.name))
    this.active++
    this.maxActive = Math.max(this.maxActive, this.active)
    signal.addEventListener('abort', () => { this.aborted++ }, { once: true })
    this.emit('call', snapshot)
    try {
      await this.#behave(signal)
      this.current = snapshot
    } finally {
      this.active--
      this.emit('settled')
    }
  }

  /** Lets every `gated` push that is waiting now complete. */
  release (): void {
    for (const open of this.#gates.splice(0)) open()
  }

  /** Resolves once at least `n` pushes have started. */
  async waitForCalls (n: number): Promise<void> {
    while (this.calls < n) await once(this, 'call')
  }

  /** Resolves once no push is running (a `hang` push never ends: do not wait on one). */
  async waitIdle (): Promise<void> {
    while (this.active > 0) await once(this, 'settled')
  }

  async #behave (signal: AbortSignal): Promise<void> {
    switch (this.behaviour) {
      case 'instant':
        return
      case 'throw':
        throw new Error(this.message)
      case 'hang':
        await new Promise<never>(() => {})
        return
      case 'random':
        await sleep(Math.random() * this.maxDelayMs, undefined, { signal })
        return
      case 'gated':
        await new Promise<void>((resolve) => { this.#gates.push(resolve) })
    }
  }
}

/** A fake ModelSession: `session('s1', 'random', { maxDelayMs: 3 })`. */
export function session (id: string, behaviour: SessionBehaviour, options: FakeSessionOptions = {}): FakeSession {
  return new FakeSession(id, behaviour, options)
}

/** Asserts a thrown/rejected value is a Toolport error with this code and status. */
export function isCode (code: string, statusCode: number) {
  return (err: unknown): boolean => {
    const e = err as { code?: unknown, statusCode?: unknown }
    if (e?.code !== code || e?.statusCode !== statusCode) {
      throw new Error(`expected ${code}/${statusCode}, got ${String(e?.code)}/${String(e?.statusCode)}`)
    }
    return true
  }
}

/**
 * Asserts an HTTP error reply: its status, and a body of the shape in docs/protocol.md "Errors of the API itself"
 * `{ ok: false, statusCode, code, error, message, details? }` with this code.
 */
export function assertError (reply: JsonReply, statusCode: number, code: string): void {
  assert.equal(reply.statusCode, statusCode, `status of ${JSON.stringify(reply.body)}`)
  const body = reply.body as Record<string, unknown>
  assert.equal(body.ok, false)
  assert.equal(body.statusCode, statusCode)
  assert.equal(body.code, code)
  assert.equal(typeof body.error, 'string')
  assert.equal(typeof body.message, 'string')
  const extra = Object.keys(body).filter((k) => !['ok', 'statusCode', 'code', 'error', 'message',
    'details'].includes(k))
  assert.deepEqual(extra, [], 'no keys beyond the error shape')
  assert.match(String(reply.headers['content-type']), /^application\/json/)
}

export interface Http2Reply {
  statusCode: number
  headers: Record<string, string | number | string[] | undefined>
  text: string
}

/**
 * A host app on an HTTP/2 (h2c) fastify server with `toolportPlugin` mounted, and one client
 * session to it: `request` sends one request (`:authority` is the client's own, 127.0.0.1:<port>,
 * unless `headers` set it) and resolves with the whole answer. Bounded: a server that fails the
 * stream without answering fails the test instead of hanging it.
 */
export async function startHttp2Host (t: TestContext, tp: Toolport): Promise<{
  port: number
  request: (headers: Record<string, string>, body?: string) => Promise<Http2Reply>
}> {
  const host = fastify({ http2: true, forceCloseConnections: true })
  t.after(() => host.close())
  await host.register(toolportPlugin, { runtime: tp })
  await host.listen({ host: '127.0.0.1', port: 0 })
  const address = host.server.address()
  const port = typeof address === 'object' && address !== null ? address.port : 0
  // Like a browser: a session the server closed (after refusing a request, SECURITY.md) is
  // replaced by a new one for the next request.
  let session = http2Connect(`http://127.0.0.1:${port}`)
  t.after(() => session.close())
  async function request (headers: Record<string, string>, body?: string): Promise<Http2Reply> {
    if (session.closed || session.destroyed) session = http2Connect(`http://127.0.0.1:${port}`)
    const current = session
    const stream = current.request(headers)
    stream.end(body)
    const [response] = await once(stream, 'response', { signal: AbortSignal.timeout(10_000) }) as
      [Http2Reply['headers']]
    stream.setEncoding('utf8')
    let text = ''
    for await (const chunk of stream) text += String(chunk)
    const statusCode = Number(response[':status'])
    if ((statusCode === 401 || statusCode === 403) && !current.closed && !current.destroyed) {
      await once(current, 'close', { signal: AbortSignal.timeout(10_000) })
    }
    return { statusCode, headers: response, text }
  }
  return { port, request }
}

/** An octet, 0–255 (fast-check). */
export const byte = fc.integer({ min: 0, max: 255 })

/** 127.b.c.d in spellings the WHATWG parser normalises to a dotted quad (decimal, hex, octal, fewer parts). */
export const loopbackV4Spelling = fc.tuple(byte, byte, byte, fc.integer({ min: 0, max: 5 })).map(([b, c, d, form]) => {
  switch (form) {
    case 0: return `127.${b}.${c}.${d}`
    case 1: return `0x7f.0x${b.toString(16)}.${c}.0${d.toString(8)}`
    case 2: return `0177.${b}.${c}.${d}`
    case 3: return String(127 * 2 ** 24 + b * 2 ** 16 + c * 2 ** 8 + d)
    case 4: return `127.${b * 65536 + c * 256 + d}`
    default: return `127.${b}.${c * 256 + d}`
  }
})

/** One event of `GET /api/events` as `subscribeEvents` collects it: its type and parsed data. */
export interface SseItem { event: string, data: any }

/**
 * A subscriber of `GET /api/events` (with `query`, e.g. `?types=call`) over a real socket; collects
 * every event in `items` until `close()`.
 */
export function subscribeEvents (url: string, query = ''): { items: SseItem[], close: () => void } {
  const items: SseItem[] = []
  const req = nodeRequest(`${url}/api/events${query}`, { agent: false })
  let buffer = ''
  req.on('response', (res) => {
    res.setEncoding('utf8')
    res.on('data', (chunk: string) => {
      buffer += chunk
      let end: number
      while ((end = buffer.indexOf('\n\n')) >= 0) {
        const block = buffer.slice(0, end)
        buffer = buffer.slice(end + 2)
        let event = 'message'
        let data = ''
        for (const line of block.split('\n')) {
          if (line.startsWith('event: ')) event = line.slice(7)
          else if (line.startsWith('data: ')) data += line.slice(6)
        }
        if (data !== '') items.push({ event, data: JSON.parse(data) })
      }
    })
    res.on('error', () => {})
  })
  req.on('error', () => {})
  req.end()
  return { items, close: () => { req.destroy() } }
}

/** `fc.assert`, its error carrying the failing assertion's own message (not only its counterexample). */
export async function checkProperty<T> (property: fc.IAsyncProperty<T>, params: fc.Parameters<T>): Promise<void> {
  try {
    await fc.assert(property, { includeErrorInReport: true, ...params })
  } catch (err) {
    const cause = (err as { cause?: unknown }).cause
    throw new Error(`${(err as Error).message}\n${cause instanceof Error ? cause.message : String(cause ?? '')}`)
  }
}

/** python/.venv's interpreter, which scripts/test-python.sh creates. */
export const VENV_PYTHON = fileURLToPath(new URL('../python/.venv/bin/python', import.meta.url))
/** A test's `skip` when python/.venv is missing; false when it is there. */
export const pythonMissing = existsSync(VENV_PYTHON) ? false : 'python/.venv is missing (scripts/test-python.sh creates it)'
