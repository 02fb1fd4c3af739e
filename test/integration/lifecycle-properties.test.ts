// Property tests of close(), restarts and leftovers across every surface at once.
//
// What the docs promise (README "Embedding: the library", "The command", "Configuration"
// dispatch.closeGraceMs, "Model sessions" MCP; docs/architecture.md "close()"):
// - close() stops admitting ("busy"), lets in-flight calls finish for dispatch.closeGraceMs,
//   cancels the rest, closes the lanes and destroys the pool; "No handle stays open afterwards";
// - `Toolport.close()` closes both the HTTP server and the runtime;
// - a call still running when Toolport ends an MCP session (the server closing) is answered at
//   once with the JSON-RPC error -32603;
// - event streams end when the app closes;
// - `callTool` never throws; after close a call is refused ("shutting down");
// - `toolport serve`: SIGINT/SIGTERM close cleanly (exit 0).
//
// The property runs each scenario in a child process (test/fixtures/lifecycle-child.ts) that must
// exit on its own after close(): that is the check that nothing (timer, socket, worker) is left.
import { test, type TestContext } from 'node:test'
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { createServer, request as httpRequest, type IncomingMessage, type ServerResponse } from 'node:http'
import { connect, type AddressInfo, type Socket } from 'node:net'
import { createInterface } from 'node:readline'
import { fileURLToPath } from 'node:url'
import fastify from 'fastify'
import fc from 'fast-check'
import { createToolport, toolportPlugin, type Toolport } from '../../src/main/index.js'
import { kWorkerThreads } from '../../src/main/symbols.js'
import { createTestToolport, toolportCliArgs, within } from '../helpers.js'
import type { CallerReport, LifecycleReport, LifecycleScenario, PluginKind } from '../fixtures/lifecycle-child.js'

const FAILING_TIMEOUT_MS = 120_000
const RUNS = Math.max(1, Number(process.env.TP_PROPERTY_RUNS ?? '1'))
const ROOT = fileURLToPath(new URL('../..', import.meta.url))
const CHILD = fileURLToPath(new URL('../fixtures/lifecycle-child.ts', import.meta.url))
/** Hang guard on one child run: start-up, the scenario, close(), and its exit on its own. */
const CHILD_GUARD_MS = 30_000

interface ChildRun {
  report: LifecycleReport | null
  left: string | null
  code: number | null
  signal: NodeJS.Signals | null
  stderr: string
  /** True when the child did not exit on its own within the guard (it was killed). */
  hung: boolean
}

/** Runs one scenario in a child process; kills it (and says what it still held) after the guard. */
async function runChild (scenario: LifecycleScenario): Promise<ChildRun> {
  const child = spawn(process.execPath, ['--import', 'tsx', CHILD, JSON.stringify(scenario)], {
    cwd: ROOT,
    stdio: ['ignore', 'pipe', 'pipe']
  })
  let report: LifecycleReport | null = null
  let left: string | null = null
  createInterface({ input: child.stdout }).on('line', (line) => {
    if (line.startsWith('REPORT ')) report = JSON.parse(line.slice(7)) as LifecycleReport
    else if (line.startsWith('LEFT ')) left = line.slice(5)
  })
  let stderr = ''
  child.stderr.setEncoding('utf8')
  child.stderr.on('data', (d: string) => { stderr += d })
  const exited = once(child, 'exit') as Promise<[number | null, NodeJS.Signals | null]>
  let hung = false
  const timer = setTimeout(() => { hung = true; child.kill('SIGKILL') }, CHILD_GUARD_MS)
  const [code, signal] = await exited
  clearTimeout(timer)
  return { report, left, code, signal, stderr, hung }
}

const kindArb = fc.constantFrom<PluginKind>('fast', 'slow', 'never', 'huge', 'local')
const scenarioArb: fc.Arbitrary<LifecycleScenario> = fc.record({
  mode: fc.constantFrom<'pool' | 'inline'>('pool', 'inline'),
  closeGraceMs: fc.constantFrom<number | undefined>(0, 40, 400, undefined),
  closeAfterMs: fc.integer({ min: 0, max: 60 }),
  concurrentCloses: fc.constantFrom<1 | 2>(1, 2),
  libCalls: fc.array(kindArb, { maxLength: 4 }),
  httpCalls: fc.array(kindArb, { maxLength: 3 }),
  mcpCalls: fc.array(fc.constantFrom<PluginKind>('fast', 'slow', 'never', 'local'), { maxLength: 3 }),
  events: fc.array(fc.constantFrom<'reading' | 'paused'>('reading', 'paused'), { maxLength: 2 }),
  consoleReads: fc.integer({ min: 0, max: 2 }),
  definitions: fc.boolean(),
  idleSockets: fc.integer({ min: 0, max: 2 }),
  halfBodies: fc.integer({ min: 0, max: 2 }),
  realtime: fc.constantFrom<'none' | 'late' | 'never'>('none', 'late', 'never')
})

/**
 * The documented answers, per surface. Every caller was in flight (its call reached its tool, its
 * stream had its headers) before close() began, except `console-during-close`, sent with it.
 */
function checkCaller (c: CallerReport, scenario: LifecycleScenario): void {
  const what = `${c.surface}/${c.kind}: ${JSON.stringify(c.answers)}`
  assert.equal(c.answers.length, 1, `exactly one answer per caller (none is a hang): ${what}`)
  const answer = c.answers[0] as string
  switch (c.surface) {
    case 'lib':
      // callTool never throws; a call cut by close() is a cancelled tool error.
      assert.match(answer, /^result (ok|error) /, what)
      if (c.kind === 'never') assert.match(answer, /cancelled/, what)
      // Local handlers run on the main thread and are answered at once by close() (they take
      // longer than any close moment here, so they cannot have finished before it).
      if (c.kind === 'local') assert.match(answer, /^result error .*cancelled/, what)
      if (c.kind === 'fast') assert.match(answer, /^result ok fast-ok/, what)
      break
    case 'http-call':
      // POST /api/tools/call answers a ToolResult (200) like callTool: the call gets its grace,
      // then is cancelled; the HTTP caller is not cut off without an answer.
      assert.match(answer, /^200 end \{"is_error":/, what)
      break
    case 'mcp':
      // A result, or -32603 for a call still running when the server closed the session.
      assert.match(answer, /^(result (ok|error)|rejected -32603 )/, what)
      break
    case 'events':
      // The stream ends (cut or ended) once: it never hangs.
      assert.match(answer, /^200 (end|cut)/, what)
      break
    case 'console':
      assert.match(answer, /^200 end \{/, what)
      break
    case 'console-during-close':
      // Sent while close() runs: answered (200, or 503 TP_ERR_CLOSED), or no connection at all.
      if (/^(200|503) /.test(answer)) {
        if (answer.startsWith('503')) assert.match(answer, /TP_ERR_CLOSED/, what)
      } else {
        assert.match(answer, /^request error (ECONNREFUSED|ECONNRESET|EPIPE)/, what)
      }
      break
    case 'definitions':
      // Its body either arrives whole or is cut; once.
      assert.match(answer, /^200 (end|cut)/, what)
      break
    case 'idle':
      assert.equal(answer, 'socket closed', what)
      break
    case 'half-body':
      // The server closes it; if it says anything first, it is an HTTP answer.
      assert.match(answer, /^closed (HTTP\/1\.1 \d{3} .*)?$/, what)
      break
    case 'register':
      // A registration whose sync is in progress resolves (its sync then fails or succeeds) or
      // is refused with a coded error; it never hangs.
      assert.match(answer, /^(resolved \{"ok":true|threw TP_ERR_)/, what)
      break
    default:
      assert.fail(`unknown surface ${c.surface} (${scenario.mode})`)
  }
}

test('property: close() at a random moment with work in flight on every surface answers every caller once, leaves nothing open, and frees the port', { timeout: FAILING_TIMEOUT_MS }, async () => {
  await fc.assert(fc.asyncProperty(scenarioArb, async (scenario) => {
    const run = await runChild(scenario)
    assert.ok(!run.hung, `the child did not exit on its own after close() (hang guard); still open: ${run.left ?? '(nothing printed)'}\n${run.stderr.slice(-2000)}`)
    assert.equal(run.left, null, `the child was still alive 4 s after its report; still open: ${String(run.left)}`)
    assert.deepEqual({ code: run.code, signal: run.signal }, { code: 0, signal: null }, run.stderr.slice(-2000))
    const report = run.report
    assert.ok(report !== null, `no report: ${run.stderr.slice(-2000)}`)
    assert.deepEqual(report.closeErrors, [], 'close() never rejects')
    // Every close() (the concurrent ones and the one after) resolves only once everything is closed.
    assert.equal(report.atResolve.length, scenario.concurrentCloses + 1)
    for (const at of report.atResolve) {
      assert.deepEqual(at, { listening: false, workersAlive: 0 }, `state when a close() resolved: ${JSON.stringify(report.atResolve)}`)
    }
    assert.equal(report.pluginSocketsAfter, 0, 'no client socket to the plugin is left open')
    assert.equal(typeof report.lateCall, 'object')
    const late = report.lateCall as { is_error: boolean, text: string }
    assert.equal(late.is_error, true)
    assert.match(late.text, /shutting down/)
    assert.equal(report.relisten, '200', 'a new Toolport listens on the same port right after close()')
    for (const c of report.callers) checkCaller(c, scenario)
  }), { numRuns: 2 * RUNS, endOnFailure: true, includeErrorInReport: true })
})

// ---- Regressions -------------------------------------------------------------------------------

/** A plugin on 127.0.0.1 whose `/slow` answers after `delayMs` and `/never` never answers. */
async function slowPlugin (t: TestContext, delayMs: number): Promise<{ url: string, received: () => number }> {
  let received = 0
  const parked: ServerResponse[] = []
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    req.resume()
    req.on('end', () => {
      received++
      if (req.url === '/never') { parked.push(res); return }
      setTimeout(() => {
        res.writeHead(200, { 'content-type': 'application/json' })
        res.end('{"output":"slow-ok"}')
      }, delayMs)
    })
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  t.after(() => new Promise<void>((resolve) => {
    for (const res of parked) res.destroy()
    server.close(() => resolve())
    server.closeAllConnections()
  }))
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, received: () => received }
}

async function waitUntil (what: string, predicate: () => boolean): Promise<void> {
  for (let i = 0; i < 500 && !predicate(); i++) await new Promise((resolve) => setTimeout(resolve, 10))
  assert.ok(predicate(), `timed out waiting for ${what}`)
}

/** POST /api/tools/call over a real socket: the status and body, or the socket error's code. */
function postCall (url: string, body: unknown): Promise<string> {
  return new Promise((resolve) => {
    const text = JSON.stringify(body)
    const req = httpRequest(`${url}/api/tools/call`, {
      method: 'POST',
      agent: false,
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) }
    }, (res) => {
      let got = ''
      res.setEncoding('utf8')
      res.on('data', (d: string) => { got += d })
      res.once('end', () => { resolve(`${res.statusCode ?? 0} ${got}`) })
      res.once('aborted', () => { resolve(`${res.statusCode ?? 0} cut`) })
    })
    req.once('error', (e: NodeJS.ErrnoException) => { resolve(`error ${e.code ?? e.message}`) })
    req.end(text)
  })
}

test('an HTTP tool call in flight when close() begins gets its answer within dispatch.closeGraceMs (README "Configuration"; docs/architecture.md close())', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const plugin = await slowPlugin(t, 200)
  const tp = await createTestToolport(t, { roles: ['R'], dispatch: { mode: 'inline', closeGraceMs: 3_000 } })
  const { url } = await tp.listen({ host: '127.0.0.1', port: 0 })
  await tp.register({ name: 'slow', callback_url: `${plugin.url}/slow` })
  const answer = postCall(url, { role: 'R', name: 'slow', arguments: {} })
  await waitUntil('the plugin to receive the call', () => plugin.received() === 1)
  await within(tp.close(), 'close()', 10_000)
  // The library's callTool gets "slow-ok" in the same situation; the HTTP caller must too.
  const got = await within(answer, 'the HTTP answer', 10_000)
  assert.match(got, /^200 \{"is_error":false,"output":"slow-ok"/, `HTTP caller got: ${got}`)
})

test('an HTTP tool call that never finishes is answered as cancelled when close() ends it, not cut off (docs/architecture.md close())', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const plugin = await slowPlugin(t, 0)
  const tp = await createTestToolport(t, { roles: ['R'], dispatch: { mode: 'inline', closeGraceMs: 50 } })
  const { url } = await tp.listen({ host: '127.0.0.1', port: 0 })
  await tp.register({ name: 'never', callback_url: `${plugin.url}/never` })
  const answer = postCall(url, { role: 'R', name: 'never', arguments: {} })
  await waitUntil('the plugin to receive the call', () => plugin.received() === 1)
  await within(tp.close(), 'close()', 10_000)
  const got = await within(answer, 'the HTTP answer', 10_000)
  assert.match(got, /^200 \{"is_error":true,.*cancelled/, `HTTP caller got: ${got}`)
})

for (const mode of ['inline', 'pool'] as const) {
  test(`${mode}: two concurrent close() calls both resolve only once the runtime is closed (calls answered, pool destroyed) (docs/architecture.md close(): "No handle stays open afterwards")`, { timeout: FAILING_TIMEOUT_MS }, async (t) => {
    const plugin = await slowPlugin(t, 0)
    const tp: Toolport = await createTestToolport(t, { roles: ['R'], dispatch: { mode, closeGraceMs: 300 } })
    await tp.listen({ host: '127.0.0.1', port: 0 })
    await tp.register({ name: 'never', callback_url: `${plugin.url}/never` })
    const workers = [...tp[kWorkerThreads]]
    let alive = workers.length
    for (const w of workers) w.once('exit', () => { alive-- })
    let answered = false
    const call = tp.callTool('R', { name: 'never', raw_arguments: '{}' }).then((r) => { answered = true; return r })
    await waitUntil('the plugin to receive the call', () => plugin.received() === 1)
    const states: Array<{ answered: boolean, alive: number }> = []
    const record = (): void => { states.push({ answered, alive }) }
    await within(Promise.all([tp.close().then(record), tp.close().then(record)]), 'both close() calls', 10_000)
    await within(tp.close().then(record), 'close() once more', 10_000)
    const result = await within(call, 'the call', 10_000)
    assert.equal(result.is_error, true)
    assert.deepEqual(states, [
      { answered: true, alive: 0 },
      { answered: true, alive: 0 },
      { answered: true, alive: 0 }
    ], 'every close() resolves after the in-flight call was answered and the workers exited')
  })
}

test('toolport serve: SIGTERM with work in flight exits 0 on its own, ends event streams and closes its callback sockets (README "The command")', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const pluginSockets = new Set<Socket>()
  const parked: ServerResponse[] = []
  const pluginServer = createServer((req, res) => { req.resume(); parked.push(res) })
  pluginServer.on('connection', (s: Socket) => { pluginSockets.add(s); s.once('close', () => pluginSockets.delete(s)) })
  await new Promise<void>((resolve) => pluginServer.listen(0, '127.0.0.1', resolve))
  t.after(() => new Promise<void>((resolve) => {
    for (const res of parked) res.destroy()
    pluginServer.close(() => resolve())
    pluginServer.closeAllConnections()
  }))
  const pluginUrl = `http://127.0.0.1:${(pluginServer.address() as AddressInfo).port}`
  const child = spawn(process.execPath, [...toolportCliArgs(), 'serve', '--port', '0', '--role', 'R', '--log-level', 'silent'], {
    cwd: ROOT,
    stdio: ['ignore', 'pipe', 'pipe']
  })
  const exited = once(child, 'exit') as Promise<[number | null, NodeJS.Signals | null]>
  t.after(() => { if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL') })
  let stderr = ''
  child.stderr.setEncoding('utf8')
  child.stderr.on('data', (d: string) => { stderr += d })
  const url = await within(new Promise<string>((resolve) => {
    createInterface({ input: child.stdout }).on('line', (line) => {
      const m = /http:\/\/127\.0\.0\.1:\d+/.exec(line)
      if (m !== null) resolve(m[0])
    })
  }), () => `the serve URL (stderr: ${stderr})`, 20_000)
  const reg = await fetch(`${url}/api/tools/register`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ name: 'never', callback_url: `${pluginUrl}/never` })
  })
  assert.equal(reg.status, 200, await reg.clone().text())
  // In flight: a call the plugin never answers, an event stream, a half-sent body.
  const call = postCall(url, { role: 'R', name: 'never', arguments: {} })
  const stream = new Promise<string>((resolve) => {
    httpRequest(`${url}/api/events`, { agent: false }, (res) => {
      res.resume()
      res.once('end', () => { resolve('end') })
      res.once('close', () => { resolve('closed') })
    }).once('error', (e: NodeJS.ErrnoException) => { resolve(`error ${e.code ?? ''}`) }).end()
  })
  const half = new Promise<string>((resolve) => {
    const port = new URL(url).port
    const s = connect(Number(port), '127.0.0.1', () => {
      s.write(`POST /api/tools/register HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"na`)
    })
    s.once('error', () => {})
    s.once('close', () => { resolve('closed') })
  })
  await waitUntil('the plugin to receive the call', () => parked.length === 1)
  child.kill('SIGTERM')
  const [code, signal] = await within(exited, () => `toolport serve to exit after SIGTERM (stderr: ${stderr})`, 20_000)
  assert.deepEqual({ code, signal }, { code: 0, signal: null }, stderr)
  assert.match(await within(stream, 'the event stream to end', 5_000), /^(end|closed|error)/)
  assert.equal(await within(half, 'the half-sent request to be closed', 5_000), 'closed')
  assert.notEqual(await within(call, 'the in-flight HTTP call', 5_000), '', 'the in-flight caller is not left hanging')
  await waitUntil('the callback socket to the plugin to close', () => pluginSockets.size === 0)
})

/** Closes what a test left listening (the bugs below leave a server open). */
async function stopListening (tp: Toolport): Promise<void> {
  if (tp.app.server.listening) await new Promise<void>((resolve) => tp.app.server.close(() => resolve()))
}

/** Whether something accepts TCP connections on 127.0.0.1:`port`. */
function accepts (port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = connect(port, '127.0.0.1')
    s.once('connect', () => { s.destroy(); resolve(true) })
    s.once('error', () => { resolve(false) })
  })
}

test('listen() started just before close() leaves no listening socket once both settled (README "Embedding: the library": close() closes both)', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const tp = await createToolport({ logger: false, roles: ['R'], dispatch: { mode: 'inline' } })
  t.after(() => stopListening(tp))
  const listening = tp.listen({ host: '127.0.0.1', port: 0 }).then((r) => r.port, () => null)
  await within(tp.close(), 'close()', 10_000)
  const port = await within(listening, 'listen()', 10_000)
  // listen() may fail (closed) or win the race; either way close() has resolved, so nothing may
  // be listening now.
  assert.equal(tp.app.server.listening, false, `still listening on ${String(port)} after close() resolved`)
  if (port !== null) assert.equal(await accepts(port), false, `port ${port} still accepts connections`)
})

test('listen() on a closed Toolport is refused (TP_ERR_CLOSED) and opens no port (README "Errors": TP_ERR_CLOSED)', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const tp = await createToolport({ logger: false, roles: ['R'], dispatch: { mode: 'inline' } })
  t.after(() => stopListening(tp))
  await tp.close()
  const outcome = await within(tp.listen({ host: '127.0.0.1', port: 0 }).then((r) => `listening on ${r.port}`,
    (e: { code?: string }) => `threw ${String(e.code)}`), 'listen()', 10_000)
  assert.equal(outcome, 'threw TP_ERR_CLOSED')
  assert.equal(tp.app.server.listening, false)
})

test('toolportPlugin in a host app: after the runtime closed, every route but health and metrics answers 503 TP_ERR_CLOSED, GET /api/events too instead of an endless stream (README "Errors": TP_ERR_CLOSED)', { timeout: FAILING_TIMEOUT_MS }, async (t) => {
  const tp = await createToolport({ logger: false, roles: ['R'], dispatch: { mode: 'inline' } })
  const app = fastify()
  await app.register(toolportPlugin, { runtime: tp })
  await app.listen({ host: '127.0.0.1', port: 0 })
  t.after(async () => { await app.close(); await tp.close() })
  const base = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`
  // An MCP session with its event stream open before the close: the stream ends with the runtime.
  const init = await fetch(`${base}/mcp/R`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
    body: JSON.stringify(MCP_INITIALIZE)
  })
  const sessionId = init.headers.get('mcp-session-id') ?? ''
  await init.arrayBuffer()
  assert.notEqual(sessionId, '')
  let streamHeaders: () => void = () => {}
  const streamOpen = new Promise<void>((resolve) => { streamHeaders = resolve })
  const mcpStream = new Promise<string>((resolve) => {
    const req = httpRequest(`${base}/mcp/R`, {
      agent: false, headers: { accept: 'text/event-stream', 'mcp-session-id': sessionId, 'mcp-protocol-version': '2025-06-18' }
    }, (res) => {
      streamHeaders()
      res.resume()
      res.once('end', () => { resolve(`${res.statusCode ?? 0} ended`) })
      res.once('close', () => { resolve(`${res.statusCode ?? 0} closed`) })
    })
    req.once('error', (e: NodeJS.ErrnoException) => { streamHeaders(); resolve(`error ${e.code ?? ''}`) })
    // Hang guard: a stream still open 5 s after the close is the failure.
    streamOpen.then(() => setTimeout(() => { req.destroy(); resolve('still open 5 s after close()') }, 5_000).unref(), () => {})
    req.end()
  })
  await streamOpen
  await tp.close()
  assert.match(await mcpStream, /^200 (ended|closed|cut)/, 'the MCP event stream of a closed runtime ends')
  // Other routes of the closed runtime answer 503 TP_ERR_CLOSED.
  const reg = await fetch(`${base}/api/tools/register`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ name: 'x', callback_url: 'http://127.0.0.1:9/x' })
  })
  assert.equal(reg.status, 503)
  assert.equal(((await reg.json()) as { code: string }).code, 'TP_ERR_CLOSED')
  // Reads and new MCP sessions too: nothing is served from a closed runtime as if it were live.
  const list = await fetch(`${base}/api/tools`)
  assert.deepEqual([list.status, ((await list.json()) as { code: string }).code], [503, 'TP_ERR_CLOSED'])
  const late = await fetch(`${base}/mcp/R`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
    body: JSON.stringify(MCP_INITIALIZE)
  })
  assert.equal(late.status, 503, 'an MCP initialize on a closed runtime opens no session')
  assert.equal(late.headers.get('mcp-session-id'), null)
  await late.arrayBuffer()
  // The health report still answers, and says so.
  const health = await fetch(`${base}/api/health`)
  assert.equal(health.status, 503)
  assert.equal(((await health.json()) as { status: string }).status, 'closed')
  const got = await new Promise<string>((resolve) => {
    const req = httpRequest(`${base}/api/events`, { agent: false }, (res) => {
      let body = ''
      res.setEncoding('utf8')
      res.on('data', (d: string) => { body += d })
      res.once('end', () => { resolve(`${res.statusCode ?? 0} end ${body.slice(0, 200)}`) })
    })
    req.once('error', (e: NodeJS.ErrnoException) => { resolve(`error ${e.code ?? ''}`) })
    // Hang guard: a stream that neither answers 503 nor ends within 3 s is the failure.
    setTimeout(() => { req.destroy(); resolve('still open after 3 s') }, 3_000).unref()
    req.end()
  })
  assert.match(got, /^503 end .*TP_ERR_CLOSED/, `GET /api/events on a closed runtime: ${got}`)
})

const MCP_INITIALIZE = {
  jsonrpc: '2.0',
  id: 1,
  method: 'initialize',
  params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'lifecycle', version: '1' } }
}
