// The CLIENT side of both plugin SDKs against a broken or hostile "Toolport" (README "Plugin SDK" →
// Keeping registrations alive, Start and stop, the PluginError table; README "Python plugin SDK";
// python/README.md).
//
// How: a fake Toolport (a node:http server on 127.0.0.1, in this process) answers registrations,
// lists and `GET /api/events` as each scenario says: odd statuses (3xx to foreign or loopback
// hosts, 4xx with odd bodies, 429, 5xx), invalid JSON or JSON of the wrong shape (missing fields,
// wrong types, `__proto__`/`toString` keys), headers but no body, connection resets, slow drips,
// bodies larger than the SDKs' caps, and event streams that are malformed, endless, or close at
// once. Each scenario lives under its own path prefix (`/s<n>/`), which both SDKs keep as the API
// base. The TypeScript SDK (src/plugin) runs in this process; the Python SDK (python/src) runs in
// one real python/.venv process (test/fixtures/sdkclient_driver.py) driven over stdin/stdout.
//
// Properties: neither SDK crashes or lets a non-PluginError escape (no unhandled rejection here, a
// `PluginError` with a documented code from Python), neither follows a redirect (a trap server
// sees nothing), both end within their documented timeouts (generous hang guards only), both
// bound what they buffer (the fake server counts how much it wrote before the SDK hung up), a
// stream that never comes up is retried with backoff (connections counted over a fixed window),
// the follower and the checks survive malformed events and lists, and — differential — both SDKs
// answer the same hostile registration answer with the same outcome, code and status.
import assert from 'node:assert/strict'
import { spawn, type ChildProcess } from 'node:child_process'
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http'
import type { AddressInfo, Socket } from 'node:net'
import { test, type TestContext } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { fileURLToPath } from 'node:url'
import fc from 'fast-check'
import { createPlugin, PLUGIN_ERROR_CODES, PluginError, type Plugin } from '../../src/plugin/index.js'
import { VENV_PYTHON as PY, pythonMissing, waitFor, within } from '../helpers.js'

const RUNS = Math.max(1, Number(process.env.TP_PROPERTY_RUNS ?? '1'))
const MAX_SHRINKS = 20
const FAILING_TIMEOUT_MS = 300_000
const PY_DRIVER = fileURLToPath(new URL('../fixtures/sdkclient_driver.py', import.meta.url))
const CODES = new Set<string>(Object.values(PLUGIN_ERROR_CODES))
/** Both SDKs' cap on one API answer (toolport-client.ts MAX_ANSWER_BYTES, _client.py _MAX_ANSWER_BYTES). */
const MAX_ANSWER_BYTES = 64 * 1024 * 1024

// ---- the fake Toolport -----------------------------------------------------------------------

/** What the fake server does with one request; `rel` is the path after the scenario's prefix. */
type Handler = (rel: string, req: IncomingMessage, res: ServerResponse, body: string) => void

interface Seen { prefix: string, method: string, rel: string, at: number }

class FakeToolport {
  readonly server: Server
  url = ''
  readonly handlers = new Map<string, Handler>()
  readonly seen: Seen[] = []
  readonly sockets = new Set<Socket>()
  #next = 0

  constructor () {
    this.server = createServer((req, res) => {
      const chunks: Buffer[] = []
      req.on('data', (c: Buffer) => chunks.push(c))
      req.on('end', () => {
        const match = /^\/(s\d+)\/(.*)$/.exec(req.url ?? '')
        const prefix = match?.[1] ?? ''
        const rel = (match?.[2] ?? '').split('?')[0] ?? ''
        this.seen.push({ prefix, method: req.method ?? '', rel, at: Date.now() })
        const handler = this.handlers.get(prefix) ?? defaultHandler
        try {
          handler(rel, req, res, Buffer.concat(chunks).toString('utf8'))
        } catch {
          res.destroy()
        }
      })
    })
    this.server.on('connection', (s: Socket) => {
      this.sockets.add(s)
      s.on('close', () => this.sockets.delete(s))
    })
  }

  async listen (t: TestContext): Promise<void> {
    await new Promise<void>((resolve) => this.server.listen(0, '127.0.0.1', resolve))
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`
    t.after(() => new Promise<void>((resolve) => {
      for (const s of this.sockets) s.destroy()
      this.server.close(() => resolve())
    }))
  }

  /** A new scenario prefix with its handler; returns the API base both SDKs are given. */
  scenario (handler: Handler): { prefix: string, base: string } {
    const prefix = `s${this.#next++}`
    this.handlers.set(prefix, handler)
    return { prefix, base: `${this.url}/${prefix}/` }
  }

  count (prefix: string, rel: string, since = 0): number {
    return this.seen.filter((s) => s.prefix === prefix && s.rel === rel && s.at >= since).length
  }
}

function json (res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body)
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) })
  res.end(text)
}

/** A good JSON answer, written in `pieces` chunks 30 ms apart (a slow link, a busy Toolport). */
function dripJson (res: ServerResponse, body: unknown, pieces: number): void {
  const text = Buffer.from(JSON.stringify(body))
  res.writeHead(200, { 'content-type': 'application/json', 'content-length': text.length })
  const size = Math.ceil(text.length / pieces)
  let i = 0
  const next = (): void => {
    if (res.destroyed) return
    const part = text.subarray(i * size, (i + 1) * size)
    i++
    if (i >= pieces) { res.end(part); return }
    res.write(part)
    setTimeout(next, 30)
  }
  next()
}

/** A well-behaved Toolport: registrations, clears and lists succeed; no event stream (404). */
const defaultHandler: Handler = (rel, _req, res, body) => {
  if (rel === 'api/tools/register') {
    const name = (JSON.parse(body) as { name: string }).name
    json(res, 200, { ok: true, registered: name, affected_roles: ['default'], failed_roles: [] })
  } else if (rel === 'api/tools/clear') {
    json(res, 200, { ok: true, removed: 1 })
  } else if (rel === 'api/tools') {
    json(res, 200, { ok: true, tools_by_role: { default: [] } })
  } else {
    json(res, 404, { ok: false, statusCode: 404, code: 'TP_ERR_NOT_FOUND', error: 'Not Found', message: 'no route' })
  }
}

// ---- the two SDKs ----------------------------------------------------------------------------

interface Outcome { ok: boolean, code: string | null, status: number | null, type: string, message: string }

interface SdkOptions {
  useEvents?: boolean
  pollSeconds?: number
  startTimeoutSeconds?: number
  requestTimeoutSeconds?: number
  maxBackoffSeconds?: number
}

function tsPlugin (base: string, o: SdkOptions = {}): Plugin {
  return createPlugin({
    toolportUrl: base,
    source: 'plugin:sdkclient-ts',
    role: 'default',
    logger: false,
    watchEvents: o.useEvents ?? false,
    pollIntervalMs: (o.pollSeconds ?? 60) * 1000,
    startTimeoutMs: (o.startTimeoutSeconds ?? 0) * 1000,
    requestTimeoutMs: (o.requestTimeoutSeconds ?? 3) * 1000,
    maxBackoffMs: (o.maxBackoffSeconds ?? 30) * 1000,
    tools: { probe: { description: 'A probe.', parameters: { type: 'object', properties: {} }, handler: () => ({ ok: true }) } }
  })
}

async function tsStart (plugin: Plugin): Promise<Outcome> {
  try {
    await plugin.start()
    return { ok: true, code: null, status: null, type: '', message: '' }
  } catch (err) {
    const e = err as { code?: unknown, statusCode?: unknown, message?: unknown }
    return {
      ok: false,
      code: typeof e.code === 'string' ? e.code : null,
      status: typeof e.statusCode === 'number' ? e.statusCode : null,
      type: err instanceof PluginError ? 'PluginError' : (err as Error)?.constructor?.name ?? typeof err,
      message: String(e.message ?? err)
    }
  }
}

interface PyLine {
  op: string
  id: string
  code?: string | null
  status?: number | null
  type?: string
  message?: string
}

/** The Python driver process (test/fixtures/sdkclient_driver.py), one per test. */
class PyDriver {
  readonly child: ChildProcess
  readonly lines: PyLine[] = []
  stderr = ''
  #n = 0

  constructor (t: TestContext) {
    this.child = spawn(PY, [PY_DRIVER], {
      stdio: ['pipe', 'pipe', 'pipe'],
      env: { ...process.env, PYTHONPATH: fileURLToPath(new URL('../../python/src', import.meta.url)) }
    })
    this.child.stderr?.on('data', (d: Buffer) => { this.stderr = (this.stderr + d.toString()).slice(-20_000) })
    let buffered = ''
    this.child.stdout?.on('data', (d: Buffer) => {
      buffered += d.toString()
      let nl: number
      while ((nl = buffered.indexOf('\n')) >= 0) {
        this.lines.push(JSON.parse(buffered.slice(0, nl)) as PyLine)
        buffered = buffered.slice(nl + 1)
      }
    })
    t.after(async () => {
      this.child.stdin?.end()
      const exited = new Promise((resolve) => this.child.once('exit', resolve))
      await Promise.race([exited, sleep(8000)])
      if (this.child.exitCode === null && this.child.signalCode === null) this.child.kill('SIGKILL')
    })
  }

  get alive (): boolean { return this.child.exitCode === null && this.child.signalCode === null }

  async #await (what: string, pred: (l: PyLine) => boolean, guardMs: number): Promise<PyLine> {
    await waitFor(`${what} (python alive: ${String(this.alive)}; stderr: ${this.stderr.slice(-2000)})`,
      () => this.lines.some(pred) || !this.alive, guardMs)
    const line = this.lines.find(pred)
    if (line === undefined) throw new Error(`the Python driver died: ${this.stderr.slice(-3000)}`)
    return line
  }

  async start (base: string, o: SdkOptions = {}, guardMs = 60_000): Promise<{ id: string, outcome: Outcome }> {
    const id = `p${this.#n++}`
    this.child.stdin?.write(JSON.stringify({
      op: 'start',
      id,
      url: base,
      role: 'default',
      use_events: o.useEvents ?? false,
      poll: o.pollSeconds ?? 60,
      start_timeout: o.startTimeoutSeconds ?? 0,
      request_timeout: o.requestTimeoutSeconds ?? 3,
      max_backoff: o.maxBackoffSeconds ?? 30
    }) + '\n')
    const line = await this.#await(`the Python plugin ${id} starts or fails`,
      (l) => l.id === id && (l.op === 'started' || l.op === 'failed'), guardMs)
    return {
      id,
      outcome: line.op === 'started'
        ? { ok: true, code: null, status: null, type: '', message: '' }
        : { ok: false, code: line.code ?? null, status: line.status ?? null, type: line.type ?? '', message: line.message ?? '' }
    }
  }

  async stop (id: string, guardMs = 30_000): Promise<PyLine> {
    this.child.stdin?.write(JSON.stringify({ op: 'stop', id }) + '\n')
    return await this.#await(`the Python plugin ${id} stops`, (l) => l.id === id && l.op === 'stopped', guardMs)
  }

  errors (id: string): Array<string | null | undefined> {
    return this.lines.filter((l) => l.id === id && l.op === 'error').map((l) => l.code)
  }
}

/** Fails the test on an unhandled rejection or uncaught exception while it runs. */
function watchProcess (t: TestContext): () => void {
  const problems: string[] = []
  const onRejection = (reason: unknown): void => { problems.push(`unhandledRejection: ${String((reason as Error)?.stack ?? reason)}`) }
  const onException = (err: Error): void => { problems.push(`uncaughtException: ${err.stack ?? String(err)}`) }
  process.on('unhandledRejection', onRejection)
  process.on('uncaughtException', onException)
  t.after(() => {
    process.off('unhandledRejection', onRejection)
    process.off('uncaughtException', onException)
  })
  return () => { assert.deepEqual(problems, [], 'the TypeScript SDK let a failure escape') }
}

/** Every test here drives the Python SDK too. */
const WITH_PYTHON = { skip: pythonMissing, timeout: FAILING_TIMEOUT_MS }

/** The process watch, a fake Toolport listening and a Python driver, each ended after `t`. */
async function hostileSetup (t: TestContext): Promise<{ checkProcess: () => void, fake: FakeToolport, py: PyDriver }> {
  const checkProcess = watchProcess(t)
  const fake = new FakeToolport()
  await fake.listen(t)
  return { checkProcess, fake, py: new PyDriver(t) }
}

/** A trap origin on loopback: a redirect the SDK followed would show up here. */
async function trap (t: TestContext): Promise<{ url: string, hits: () => number }> {
  let hits = 0
  const server = createServer((_req, res) => { hits++; res.end('{}') })
  server.on('connection', () => { hits++ })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  t.after(() => new Promise<void>((resolve) => { server.close(() => resolve()); server.closeAllConnections() }))
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, hits: () => hits }
}

// ---- hostile registration answers --------------------------------------------------------------

/** A JSON value with the keys and shapes a hostile answer uses. */
const oddKey = fc.constantFrom('ok', 'registered', 'affected_roles', 'failed_roles', 'error', 'code', 'message',
  'details', 'statusCode', '__proto__', 'toString', 'path', 'constructor')
const oddLeaf = fc.oneof(fc.constantFrom(null, true, false, 0, -1, 1e308, '', 'x', '__proto__', 'TP_ERR_NOT_OWNER'),
  fc.string({ maxLength: 8 }))
const oddJson: fc.Arbitrary<unknown> = fc.letrec((tie) => ({
  value: fc.oneof({ depthSize: 'small', withCrossShrink: true }, oddLeaf, tie('array'), tie('object')),
  array: fc.array(tie('value'), { maxLength: 3 }),
  object: fc.dictionary(oddKey, tie('value'), { maxKeys: 4 })
})).value

/** The body of a registration answer: well-shaped but odd, or not JSON at all. */
const answerBody = fc.oneof(
  oddJson.map((v) => JSON.stringify(v)),
  fc.record({
    ok: fc.constantFrom(true, false, 'true', 1, null),
    registered: oddLeaf,
    affected_roles: fc.oneof(oddJson, fc.constant([{ toString: 1 }])),
    failed_roles: fc.oneof(oddJson, fc.constantFrom(5, 'x', true, { a: 1 })),
    code: oddLeaf,
    message: oddLeaf,
    details: fc.oneof(oddJson, fc.constant([null]), fc.constant([{ path: { toString: 0 }, message: 'm' }]))
  }, { requiredKeys: ['ok'] }).map((v) => JSON.stringify(v)),
  fc.constantFrom('', 'not json', '{"ok":true', '[]', 'null', '"ok"', '{"__proto__":{"ok":true}}',
    '<html>502 Bad Gateway</html>', '\u0000\u00ff', `{"ok":true,"affected_roles":[${'"r",'.repeat(20_000)}"r"]}`)
)

type Reg =
  | { kind: 'answer', status: number, contentType: string | null, body: string, location: 'foreign' | 'trap' | null }
  | { kind: 'reset' | 'headers-only' | 'short-body' }
  /** A good answer, written in `pieces` chunks with a short pause between them. */
  | { kind: 'drip', pieces: number }

const regArb: fc.Arbitrary<Reg> = fc.oneof(
  {
    weight: 6,
    arbitrary: fc.record({
      kind: fc.constant('answer' as const),
      status: fc.constantFrom(200, 201, 204, 301, 302, 303, 307, 308, 400, 401, 403, 404, 409, 413, 422, 429,
        500, 502, 503),
      contentType: fc.constantFrom(null, 'application/json', 'text/html', 'text/event-stream', 'application/octet-stream'),
      body: answerBody,
      location: fc.constantFrom(null, 'foreign' as const, 'trap' as const)
    })
  },
  { weight: 1, arbitrary: fc.constantFrom<Reg>({ kind: 'reset' }, { kind: 'headers-only' }, { kind: 'short-body' }) },
  { weight: 1, arbitrary: fc.integer({ min: 2, max: 4 }).map((pieces): Reg => ({ kind: 'drip', pieces })) }
)

function regHandler (reg: Reg, trapUrl: string): Handler {
  return (rel, _req, res, body) => {
    if (rel !== 'api/tools/register') { defaultHandler(rel, _req, res, body); return }
    if (reg.kind === 'reset') { res.socket?.resetAndDestroy(); return }
    if (reg.kind === 'headers-only') {
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': '100' })
      res.flushHeaders()
      setTimeout(() => res.socket?.destroy(), 20)
      return
    }
    if (reg.kind === 'short-body') {
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': '100' })
      res.write('{"ok":true')
      setTimeout(() => res.socket?.destroy(), 20)
      return
    }
    if (reg.kind === 'drip') {
      const name = (JSON.parse(body) as { name: string }).name
      dripJson(res, { ok: true, registered: name, affected_roles: ['default'], failed_roles: [] }, reg.pieces)
      return
    }
    if (reg.kind !== 'answer') return
    const a = reg
    const headers: Record<string, string> = {}
    if (a.contentType !== null) headers['content-type'] = a.contentType
    if (a.location === 'foreign') headers.location = 'http://203.0.113.7/api/tools/register'
    if (a.location === 'trap') headers.location = `${trapUrl}/api/tools/register`
    if (a.status === 429) headers['retry-after'] = '1'
    const text = a.status === 204 ? '' : a.body
    headers['content-length'] = String(Buffer.byteLength(text))
    res.writeHead(a.status, headers)
    res.end(text)
  }
}

function describeReg (reg: Reg): string {
  return reg.kind === 'answer'
    ? `HTTP ${reg.status} ${reg.contentType ?? '(no type)'} ${reg.location ?? ''} body ${reg.body.slice(0, 200)}`
    : reg.kind
}

test('README "Plugin SDK" → Start and stop + PluginError table, "Python plugin SDK": a hostile answer to a registration makes start() succeed or fail with a documented PluginError, the same in both SDKs, following no redirect', WITH_PYTHON, async (t) => {
  const checkProcess = watchProcess(t)
  const fake = new FakeToolport()
  await fake.listen(t)
  const trapServer = await trap(t)
  const py = new PyDriver(t)
  await fc.assert(fc.asyncProperty(fc.limitShrink(regArb, MAX_SHRINKS), async (reg) => {
    const { base } = fake.scenario(regHandler(reg, trapServer.url))
    const ts = tsPlugin(base)
    const [tsOut, pyRun] = await within(Promise.all([tsStart(ts), py.start(base)]),
      `start() with ${describeReg(reg)}`, 60_000)
    const pyOut = pyRun.outcome
    await within(Promise.all([ts.stop({ graceMs: 0 }), py.stop(pyRun.id)]), 'stop()', 60_000)
    const what = `${describeReg(reg)}\n  TS: ${JSON.stringify(tsOut)}\n  PY: ${JSON.stringify(pyOut)}`
    for (const [sdk, out] of [['TS', tsOut], ['PY', pyOut]] as const) {
      if (!out.ok) {
        assert.equal(out.type, 'PluginError', `${sdk} start() failed with a non-PluginError: ${what}`)
        assert.ok(out.code !== null && CODES.has(out.code), `${sdk} start() failed with an undocumented code: ${what}`)
      }
    }
    assert.equal(trapServer.hits(), 0, `a redirect was followed: ${what}`)
    // Differential: the same answer, the same outcome.
    assert.equal(tsOut.ok, pyOut.ok, `the SDKs disagree on success: ${what}`)
    assert.equal(tsOut.code, pyOut.code, `the SDKs disagree on the code: ${what}`)
    assert.equal(tsOut.status, pyOut.status, `the SDKs disagree on the status: ${what}`)
    checkProcess()
  }), { numRuns: 20 * RUNS, includeErrorInReport: true })
  assert.ok(py.alive, `the Python driver died: ${py.stderr}`)
})

/** One fixed registration answer against both SDKs: their outcomes. */
async function bothStart (t: TestContext, fake: FakeToolport, py: PyDriver, handler: Handler,
  o: SdkOptions = {}): Promise<{ ts: Outcome, py: Outcome }> {
  const { base } = fake.scenario(handler)
  const plugin = tsPlugin(base, o)
  t.after(() => plugin.stop({ graceMs: 0 }))
  const [tsOut, pyRun] = await within(Promise.all([tsStart(plugin), py.start(base, o)]), 'start()', 60_000)
  await within(Promise.all([plugin.stop({ graceMs: 0 }), py.stop(pyRun.id)]), 'stop()', 60_000)
  return { ts: tsOut, py: pyRun.outcome }
}

test('README "Plugin SDK" PluginError table (regressions): odd JSON in a registration answer (`toString` keys, null details, a non-list failed_roles) is a PluginError, never a TypeError', WITH_PYTHON, async (t) => {
  const { checkProcess, fake, py } = await hostileSetup(t)
  const cases: Array<[number, string]> = [
    [200, '{"ok":true,"affected_roles":[{"toString":1}]}'],
    [200, '{"ok":true,"registered":{"toString":1}}'],
    [422, '{"ok":false,"details":[null]}'],
    [503, '{"ok":false,"details":[{"path":{"toString":0},"message":"m"}]}'],
    [200, '{"ok":true,"failed_roles":5}'],
    [200, '{"ok":true,"failed_roles":{"a":1}}']
  ]
  const problems: string[] = []
  for (const [status, body] of cases) {
    const out = await bothStart(t, fake, py, (rel, req, res, reqBody) => {
      if (rel !== 'api/tools/register') { defaultHandler(rel, req, res, reqBody); return }
      res.writeHead(status, { 'content-type': 'application/json' })
      res.end(body)
    })
    for (const [sdk, o] of [['TS', out.ts], ['PY', out.py]] as const) {
      if (!o.ok && (o.type !== 'PluginError' || o.code === null || !CODES.has(o.code))) {
        problems.push(`${sdk}: HTTP ${status} ${body} → ${o.type} ${o.message}`)
      }
    }
  }
  assert.deepEqual(problems, [], 'start() let a non-PluginError escape')
  checkProcess()
})

test('README "Python plugin SDK" → Start and stop: a good answer that arrives in several pieces is read whole (both SDKs register; both list)', WITH_PYTHON, async (t) => {
  const { checkProcess, fake, py } = await hostileSetup(t)
  const out = await bothStart(t, fake, py, (rel, req, res, body) => {
    if (rel !== 'api/tools/register') { defaultHandler(rel, req, res, body); return }
    const name = (JSON.parse(body) as { name: string }).name
    dripJson(res, { ok: true, registered: name, affected_roles: ['default'], failed_roles: [] }, 2)
  })
  assert.deepEqual({ ts: out.ts.ok, py: out.py.ok }, { ts: true, py: true },
    `a registration answered in two pieces: TS ${JSON.stringify(out.ts)}, PY ${JSON.stringify(out.py)}`)
  checkProcess()
})

test('README "Plugin SDK" PluginError table, "Python plugin SDK": an answer larger than the 64 MiB cap is refused (TP_ERR_PLUGIN_REFUSED) by both, without reading on; an endless drip ends at the request timeout (TP_ERR_PLUGIN_UNREACHABLE)', WITH_PYTHON, async (t) => {
  const { checkProcess, fake, py } = await hostileSetup(t)
  const chunk = Buffer.alloc(1024 * 1024, 0x20)
  // An endless answer at full speed: `{"ok":true,"x":"` then spaces for ever; counts what was written.
  const written: number[] = []
  const endless: Handler = (rel, req, res, body) => {
    if (rel !== 'api/tools/register') { defaultHandler(rel, req, res, body); return }
    res.writeHead(200, { 'content-type': 'application/json' })
    res.write('{"ok":true,"x":"')
    let bytes = 0
    const pump = (): void => {
      // 2 × the cap is plenty to see whether the client stopped reading.
      while (!res.destroyed && bytes < 2 * MAX_ANSWER_BYTES) {
        bytes += chunk.length
        if (!res.write(chunk)) { res.once('drain', pump); return }
      }
      if (!res.destroyed) res.end('"}')
    }
    res.on('close', () => written.push(bytes))
    pump()
  }
  const big = await bothStart(t, fake, py, endless, { requestTimeoutSeconds: 60 })
  for (const [sdk, o] of [['TS', big.ts], ['PY', big.py]] as const) {
    assert.equal(o.ok, false, `${sdk} took an endless answer`)
    assert.equal(o.type, 'PluginError', `${sdk}: ${o.message}`)
  }
  for (const bytes of written) {
    assert.ok(bytes <= MAX_ANSWER_BYTES + 16 * 1024 * 1024, `an SDK read ${bytes} bytes of one answer (cap ${MAX_ANSWER_BYTES})`)
  }
  assert.deepEqual([big.ts.code, big.py.code], [PLUGIN_ERROR_CODES.refused, PLUGIN_ERROR_CODES.refused],
    `an answer over the cap is an answer, not a failure to reach Toolport: TS ${big.ts.message} / PY ${big.py.message}`)

  // A slow drip that never ends: a failure to answer within requestTimeout.
  const drip: Handler = (rel, req, res, body) => {
    if (rel !== 'api/tools/register') { defaultHandler(rel, req, res, body); return }
    res.writeHead(200, { 'content-type': 'application/json' })
    res.write('{"ok":true,')
    const timer = setInterval(() => { if (!res.destroyed) res.write(' ') }, 100)
    res.on('close', () => clearInterval(timer))
  }
  const slow = await bothStart(t, fake, py, drip, { requestTimeoutSeconds: 1 })
  assert.deepEqual([slow.ts.code, slow.py.code], [PLUGIN_ERROR_CODES.unreachable, PLUGIN_ERROR_CODES.unreachable],
    `an answer still dripping at the request timeout: TS ${slow.ts.message} / PY ${slow.py.message}`)
  checkProcess()
})

// ---- the event stream ------------------------------------------------------------------------

/** The plugin's running state in each SDK, for the event-stream tests. */
interface Running { prefix: string, stop: () => Promise<unknown>, errors: () => unknown[] }

async function startBoth (t: TestContext, fake: FakeToolport, py: PyDriver, handler: (sdk: 'TS' | 'PY') => Handler,
  o: SdkOptions): Promise<Running[]> {
  const ts = fake.scenario(handler('TS'))
  const p = fake.scenario(handler('PY'))
  const plugin = tsPlugin(ts.base, o)
  const tsErrors: unknown[] = []
  plugin.on('error', (err) => tsErrors.push(err.code))
  t.after(() => plugin.stop({ graceMs: 0 }))
  const [tsOut, pyRun] = await within(Promise.all([tsStart(plugin), py.start(p.base, o)]), 'start()', 60_000)
  assert.ok(tsOut.ok && pyRun.outcome.ok, `both start: TS ${JSON.stringify(tsOut)} PY ${JSON.stringify(pyRun.outcome)}`)
  return [
    { prefix: ts.prefix, stop: async () => await plugin.stop({ graceMs: 0 }), errors: () => tsErrors },
    { prefix: p.prefix, stop: async () => await py.stop(pyRun.id), errors: () => py.errors(pyRun.id) }
  ]
}

function sse (res: ServerResponse): void {
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' })
}
const HELLO = 'id: fake-0\nevent: hello\ndata: {"instance_id":"fake","version":"0.1.0","replay":"complete"}\n\n'

test('README "Plugin SDK" / "Python plugin SDK" → Keeping registrations alive: a stream that never comes up (ends before any hello) is retried with backoff, not every 250 ms', WITH_PYTHON, async (t) => {
  const { checkProcess, fake, py } = await hostileSetup(t)
  const WINDOW_MS = 3000
  /** Exponential backoff from 250–500 ms reaches at most ~5 attempts in 3 s; a fixed 250 ms, 12. */
  const MAX_CONNECTIONS = 6
  const streams: Array<[string, (res: ServerResponse) => void]> = [
    ['an empty 200 event stream', (res) => { sse(res); res.end() }],
    ['comments only', (res) => { sse(res); res.end(': hi\n\n: there\n\n') }],
    ['retry: 0 and an unknown event', (res) => { sse(res); res.end('retry: 0\n\nevent: bogus\ndata: {}\n\n') }],
    ['non-JSON data', (res) => { sse(res); res.end('data: not json\n\nevent: hello\ndata: [1,2\n\n') }],
    ['an HTML page with status 200', (res) => { res.writeHead(200, { 'content-type': 'text/html' }); res.end('<html></html>') }],
    ['503', (res) => { json(res, 503, { ok: false, code: 'TP_ERR_CLOSING' }) }],
    ['429 Retry-After: 0', (res) => { res.writeHead(429, { 'retry-after': '0' }); res.end() }],
    ['a reset', (res) => { res.socket?.resetAndDestroy() }]
  ]
  const running: Array<{ what: string, sdk: string, r: Running }> = []
  for (const [what, answer] of streams) {
    const pair = await startBoth(t, fake, py, () => (rel, req, res, body) => {
      if (rel === 'api/events') answer(res)
      else defaultHandler(rel, req, res, body)
    }, { useEvents: true, maxBackoffSeconds: 30 })
    running.push({ what, sdk: 'TS', r: pair[0] as Running }, { what, sdk: 'PY', r: pair[1] as Running })
  }
  const since = Date.now()
  await sleep(WINDOW_MS)
  const counts = running.map(({ what, sdk, r }) => ({ what, sdk, n: fake.count(r.prefix, 'api/events', since) }))
  await within(Promise.all(running.map(async ({ r }) => await r.stop())), 'stop()', 60_000)
  const storms = counts.filter((c) => c.n > MAX_CONNECTIONS)
  assert.deepEqual(storms, [], `event-stream connections in ${WINDOW_MS} ms (at most ${MAX_CONNECTIONS}): ${JSON.stringify(counts)}`)
  checkProcess()
})

test('README "Plugin SDK" / "Python plugin SDK": one endless event (a line without end, or data lines without the blank line) is not buffered without bound: the SDK hangs up', WITH_PYTHON, async (t) => {
  const { checkProcess, fake, py } = await hostileSetup(t)
  /** Far past anything Toolport sends in one event (the Python SDK's own line cap is 1 MiB). */
  const LIMIT = 12 * 1024 * 1024
  const kinds = {
    'one endless data line': { head: 'event: unregistered\ndata: "', unit: 'a'.repeat(64 * 1024) },
    'endless data lines, no blank line': { head: 'event: unregistered\n', unit: `data: ${'a'.repeat(1000)}\n`.repeat(64) },
    'one endless comment line': { head: ': ', unit: 'c'.repeat(64 * 1024) }
  }
  const results: Array<{ kind: string, sdk: string, written: number, hungUp: boolean }> = []
  const done: Array<Promise<void>> = []
  const running: Running[] = []
  for (const [kind, { head, unit }] of Object.entries(kinds)) {
    const pair = await startBoth(t, fake, py, (sdk) => {
      let first = true
      return (rel, req, res, body) => {
        if (rel !== 'api/events') { defaultHandler(rel, req, res, body); return }
        sse(res)
        res.write(HELLO)
        if (!first) return // a reconnection after the SDK hung up: leave it open and quiet
        first = false
        res.write(head)
        const chunk = Buffer.from(unit)
        let written = 0
        done.push(new Promise<void>((resolve) => {
          const finish = (hungUp: boolean): void => { results.push({ kind, sdk, written, hungUp }); resolve() }
          res.once('close', () => { if (written < LIMIT) finish(true) })
          const pump = (): void => {
            while (!res.destroyed && written < LIMIT) {
              written += chunk.length
              if (!res.write(chunk)) { res.once('drain', pump); return }
            }
            if (written >= LIMIT) { finish(false); res.destroy() }
          }
          setTimeout(pump, 50)
        }))
      }
    }, { useEvents: true })
    running.push(...pair)
  }
  await within(waitFor('every stream was hung up or reached the limit', () => results.length === 6, 60_000), 'the endless events', 70_000)
  // Stopped here, not in a t.after hook: the hooks run in the order registered, and the
  // PyDriver's own hook (registered first) closes the driver before a later hook could stop them.
  await within(Promise.all(running.map(async (r) => await r.stop())), 'stop()', 60_000)
  const unbounded = results.filter((r) => !r.hungUp)
  assert.deepEqual(unbounded, [], `kept reading one event past ${LIMIT} bytes: ${JSON.stringify(results)}`)
  checkProcess()
})

/** Hostile events: wrong types, unhashable names, `__proto__`, unknown types, odd fields. */
const hostileEvent = fc.oneof(
  fc.record({
    event: fc.constantFrom('hello', 'evicted', 'unregistered', 'cleared', 'role-added', 'bogus', '__proto__'),
    data: fc.oneof(oddJson, fc.constantFrom<unknown>({ tools: [{ name: [1] }] }, { tools: [{ name: {} }], origin: [] },
      { instance_id: 5 }, { __proto__: { origin: 'x' } }, { source: ['plugin:x'] }))
  }).map(({ event, data }) => `event: ${event}\ndata: ${JSON.stringify(data)}\n\n`),
  fc.constantFrom('retry: 0\n\n', 'retry: 99999999999999999999\n\n', 'id: \n\n', 'data: not json\n\n', 'event: hello\ndata: [\n\n')
)

test('README "Plugin SDK" / "Python plugin SDK" → Keeping registrations alive: malformed events neither kill the stream follower nor stop it from reacting to the next `unregistered`', WITH_PYTHON, async (t) => {
  const { checkProcess, fake, py } = await hostileSetup(t)
  const eventsArb = fc.limitShrink(fc.array(hostileEvent, { minLength: 1, maxLength: 4 }), MAX_SHRINKS)
  await fc.assert(fc.asyncProperty(eventsArb, async (events) => {
    const streams = new Map<string, ServerResponse>()
    const pair = await startBoth(t, fake, py, (sdk) => (rel, req, res, body) => {
      if (rel !== 'api/events') { defaultHandler(rel, req, res, body); return }
      sse(res)
      res.write(HELLO)
      streams.set(sdk, res)
    }, { useEvents: true })
    const sdks = [['TS', pair[0] as Running], ['PY', pair[1] as Running]] as const
    try {
      // The first check (on connect) is done.
      await within(waitFor('both connected and checked', () => sdks.every(([sdk, r]) =>
        streams.has(sdk) && fake.count(r.prefix, 'api/tools') >= 1), 20_000), 'connect', 25_000)
      for (const [sdk] of sdks) for (const e of events) streams.get(sdk)?.write(e)
      await sleep(400)
      const before = sdks.map(([, r]) => fake.count(r.prefix, 'api/tools'))
      for (const [sdk] of sdks) {
        const source = sdk === 'TS' ? 'plugin:sdkclient-ts' : 'plugin:sdkclient-py'
        streams.get(sdk)?.write(`event: unregistered\ndata: ${JSON.stringify({ source, tools: [{ role: 'default', name: 'probe' }] })}\n\n`)
      }
      const reacted = (): boolean[] => sdks.map(([, r], i) => fake.count(r.prefix, 'api/tools') > (before[i] ?? 0))
      // A hang guard: a live follower checks at once; a dead one only at the 60 s resync.
      await waitFor('', () => reacted().every(Boolean), 4000).catch(() => {})
      assert.deepEqual(reacted(), [true, true],
        `[TS, PY] checked after an \`unregistered\` that followed ${JSON.stringify(events)}`)
    } finally {
      await within(Promise.all(pair.map(async (r) => await r.stop())), 'stop()', 60_000)
    }
    checkProcess()
  }), {
    numRuns: 6 * RUNS,
    includeErrorInReport: true,
    // Regressions: an unhashable tool name in `evicted` (the Python follower's `in self._tools`), a null payload.
    examples: [[['event: evicted\ndata: {"tools":[{"name":[1]}]}\n\n']], [['event: unregistered\ndata: null\n\n']]]
  })
})

test('README "Python plugin SDK" / "Plugin SDK" → Keeping registrations alive: a list answer of the wrong shape is a failed check (a documented code), and the checks go on', WITH_PYTHON, async (t) => {
  const { checkProcess, fake, py } = await hostileSetup(t)
  const shapes = ['{"ok":true,"tools_by_role":{"default":[{"name":[1]}]}}', '{"ok":true,"tools_by_role":{"default":[null]}}',
    '{"ok":true,"tools_by_role":[]}', '{"ok":true,"tools_by_role":{"__proto__":[{"name":"probe"}],"default":7}}']
  const problems: string[] = []
  for (const shape of shapes) {
    const pair = await startBoth(t, fake, py, () => {
      let lists = 0
      return (rel, req, res, body) => {
        if (rel === 'api/tools' && lists++ < 2) {
          res.writeHead(200, { 'content-type': 'application/json' })
          res.end(shape)
        } else defaultHandler(rel, req, res, body)
      }
    }, { pollSeconds: 0.1, maxBackoffSeconds: 0.2 })
    const alive = (): boolean[] => pair.map((r) => fake.count(r.prefix, 'api/tools') >= 4)
    await waitFor('', () => alive().every(Boolean), 3000).catch(() => {})
    const [tsAlive, pyAlive] = alive()
    if (tsAlive !== true) problems.push(`TS stopped checking after ${shape}`)
    if (pyAlive !== true) problems.push(`PY stopped checking after ${shape}`)
    for (const [sdk, r] of [['TS', pair[0]], ['PY', pair[1]]] as const) {
      for (const code of r?.errors() ?? []) {
        if (code !== PLUGIN_ERROR_CODES.refused) problems.push(`${sdk} reported ${String(code)} for the 200 answer ${shape}`)
      }
    }
    await within(Promise.all(pair.map(async (r) => await r.stop())), 'stop()', 60_000)
  }
  assert.deepEqual(problems, [])
  checkProcess()
})
