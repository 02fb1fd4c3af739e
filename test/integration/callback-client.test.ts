// CallbackClient used directly (as inline mode does) against a real callback server on loopback.
import assert from 'node:assert/strict'
import dns from 'node:dns'
import { once } from 'node:events'
import { createServer } from 'node:http'
import net from 'node:net'
import { test } from 'node:test'
import { gzipSync } from 'node:zlib'
import type { TestContext } from 'node:test'
import { CallbackClient } from '../../src/shared/callback-client.js'
import { createLocalhostV6Ports } from '../../src/shared/loopback.js'
import { HTTP_ERROR_SNIPPET_CHARS } from '../../src/workers/protocol.js'
import type { CallOutcome } from '../../src/workers/protocol.js'
import {
  buildCallTask, closedPort, GZIP_BOMB_INFLATED_BYTES, startCallbackServer
} from '../fixtures/callback-server.js'
import type { CallbackServer, CallbackServerOptions } from '../fixtures/callback-server.js'

const OUTCOME_FIELDS = ['bytes', 'contentType', 'id', 'kind', 'message', 'status', 'text', 'textIsJson', 'toolError']

interface Harness {
  server: CallbackServer
  client: CallbackClient
}

async function setup (t: TestContext, serverOptions: CallbackServerOptions = {},
  connectionsPerOrigin = 4): Promise<Harness> {
  const server = await startCallbackServer(serverOptions)
  const client = new CallbackClient({ connectionsPerOrigin, keepAliveTimeoutMs: 4000, connectTimeoutMs: 2000 })
  t.after(() => client.close())
  t.after(() => server.close())
  return { server, client }
}

/** One shape for every outcome: all fields present, with the right types. */
function assertShape (outcome: CallOutcome): void {
  assert.deepEqual(Object.keys(outcome).sort(), OUTCOME_FIELDS)
  assert.equal(typeof outcome.status, 'number')
  assert.equal(typeof outcome.text, 'string')
  assert.equal(typeof outcome.contentType, 'string')
  assert.equal(typeof outcome.message, 'string')
  assert.equal(typeof outcome.bytes, 'number')
}

function paths (server: CallbackServer): string[] {
  return server.requests.map((request) => request.path)
}

test('R9: a call POSTs the JSON body with exactly the fixed headers, call id and remaining deadline', async (t) => {
  const { server, client } = await setup(t)
  const task = buildCallTask(server.url, '/echo', { timeoutMs: 5000 })
  const outcome = await client.call(task)
  assert.equal(outcome.kind, 'ok')
  const [received] = server.requests
  assert.ok(received)
  assert.equal(received.method, 'POST')
  assert.equal(received.path, '/echo')
  assert.equal(received.body, task.body)
  assert.deepEqual(Object.keys(received.headers).sort(), [
    'accept', 'connection', 'content-length', 'content-type', 'host', 'user-agent',
    'x-toolport-call-id', 'x-toolport-deadline-ms'
  ])
  assert.equal(received.headers['content-type'], 'application/json')
  assert.equal(received.headers.accept, 'application/json')
  assert.equal(received.headers['user-agent'], 'toolport')
  assert.equal(received.headers['x-toolport-call-id'], task.callId)
  const deadlineMs = Number(received.headers['x-toolport-deadline-ms'])
  assert.ok(Number.isInteger(deadlineMs) && deadlineMs > 0 && deadlineMs <= task.timeoutMs)
  assert.equal(received.headers['accept-encoding'], undefined)
})

test('R10: a 2xx reply is an ok outcome with its text, status, content type and byte count', async (t) => {
  const { server, client } = await setup(t)
  const task = buildCallTask(server.url, '/echo')
  const outcome = await client.call(task)
  assertShape(outcome)
  const reply = JSON.stringify({ output: JSON.parse(task.body), is_error: false })
  const output = JSON.stringify(JSON.parse(task.body))
  assert.deepEqual(outcome, {
    id: task.id,
    kind: 'ok',
    status: 200,
    text: output,
    textIsJson: true,
    toolError: '',
    contentType: 'application/json',
    message: '',
    bytes: Buffer.byteLength(reply)
  })
})

test('R11: a tool-level error reply is an ok outcome, read where it arrived: toolError and the model text', async (t) => {
  const { server, client } = await setup(t)
  const outcome = await client.call(buildCallTask(server.url, '/tool-error'))
  assert.equal(outcome.kind, 'ok')
  assert.equal(outcome.toolError, 'location not found')
  assert.deepEqual(JSON.parse(outcome.text), { error: 'location not found' })
})

test('R10: a JSON reply without output/is_error is returned unchanged', async (t) => {
  const { server, client } = await setup(t)
  const outcome = await client.call(buildCallTask(server.url, '/raw-output'))
  assert.equal(outcome.kind, 'ok')
  assert.equal(outcome.text, '{"temperature_c":28}')
  assert.equal(outcome.textIsJson, true)
})

test('R12: a non-JSON reply is an ok outcome with the text and its lower-cased content type', async (t) => {
  const { server, client } = await setup(t)
  const outcome = await client.call(buildCallTask(server.url, '/text'))
  assert.equal(outcome.kind, 'ok')
  assert.equal(outcome.text, 'plain text reply, not JSON')
  assert.equal(outcome.contentType, 'text/plain; charset=utf-8')
})

test('R12: an empty 200 reply is an ok outcome with empty text and no content type', async (t) => {
  const { server, client } = await setup(t)
  const outcome = await client.call(buildCallTask(server.url, '/empty'))
  assertShape(outcome)
  assert.equal(outcome.kind, 'ok')
  assert.equal(outcome.text, '')
  assert.equal(outcome.contentType, '')
  assert.equal(outcome.bytes, 0)
})

for (const status of [400, 404, 500, 503]) {
  test(`R12: an HTTP ${status} is an http outcome with the first 200 characters of the body`, async (t) => {
    const { server, client } = await setup(t)
    const outcome = await client.call(buildCallTask(server.url, `/status/${status}`))
    assertShape(outcome)
    assert.equal(outcome.kind, 'http')
    assert.equal(outcome.status, status)
    assert.equal(outcome.text.length, HTTP_ERROR_SNIPPET_CHARS)
    assert.ok(outcome.text.startsWith(`status ${status} from the test callback`))
    assert.ok(outcome.bytes > HTTP_ERROR_SNIPPET_CHARS)
  })
}

test('R12: a 302 is an http outcome and the redirect target receives nothing', async (t) => {
  const { server, client } = await setup(t)
  const outcome = await client.call(buildCallTask(server.url, '/redirect'))
  assert.equal(outcome.kind, 'http')
  assert.equal(outcome.status, 302)
  // A later call on the same server proves every earlier request had arrived by then.
  assert.equal((await client.call(buildCallTask(server.url, '/raw-output'))).kind, 'ok')
  assert.deepEqual(paths(server), ['/redirect', '/raw-output'])
})

test('R12: a reply slower than the deadline is a timeout outcome', async (t) => {
  const { server, client } = await setup(t)
  const task = buildCallTask(server.url, '/sleep/30000', { timeoutMs: 300 })
  const outcome = await client.call(task)
  assertShape(outcome)
  assert.equal(outcome.kind, 'timeout')
  assert.equal(outcome.status, 0)
  assert.match(outcome.message, /^TP_DEADLINE: /)
})

test('R12: a trickling reply is cut at the deadline as a timeout', async (t) => {
  const { server, client } = await setup(t)
  const outcome = await client.call(buildCallTask(server.url, '/trickle', { timeoutMs: 1000 }))
  assert.equal(outcome.kind, 'timeout')
  // The headers had arrived: the deadline covers the body too, not only the wait for headers.
  assert.equal(outcome.status, 200)
})

test('R12: a reply that sends headers and never ends is a timeout outcome', async (t) => {
  const { server, client } = await setup(t)
  const outcome = await client.call(buildCallTask(server.url, '/never-ends', { timeoutMs: 300 }))
  assert.equal(outcome.kind, 'timeout')
  assert.equal(outcome.status, 200)
})

test('R12: the deadline covers the wait for a busy connection, and the expired call is never sent', async (t) => {
  const { server, client } = await setup(t, {}, 1)
  const order: string[] = []
  const slow = client.call(buildCallTask(server.url, '/sleep/1500')).then((o) => { order.push(`slow:${o.kind}`) })
  const queued = client.call(buildCallTask(server.url, '/echo', { timeoutMs: 300 }))
    .then((o) => { order.push(`queued:${o.kind}`) })
  await Promise.all([slow, queued])
  assert.deepEqual(order, ['queued:timeout', 'slow:ok'])
  assert.equal((await client.call(buildCallTask(server.url, '/raw-output'))).kind, 'ok')
  assert.deepEqual(paths(server), ['/sleep/1500', '/raw-output'])
  // Dropping the expired request did not cost the keep-alive socket.
  assert.equal(server.connections, 1)
})

test('R12: a deadline that passed before the call is a timeout and nothing is sent', async (t) => {
  const { server, client } = await setup(t)
  const outcome = await client.call(buildCallTask(server.url, '/echo', { deadline: Date.now() - 1 }))
  assertShape(outcome)
  assert.equal(outcome.kind, 'timeout')
  assert.equal((await client.call(buildCallTask(server.url, '/raw-output'))).kind, 'ok')
  assert.deepEqual(paths(server), ['/raw-output'])
})

test('R12: a call aborted through its signal is a cancelled outcome and the client keeps serving', async (t) => {
  const { server, client } = await setup(t)
  const controller = new AbortController()
  const pending = client.call(buildCallTask(server.url, '/sleep/30000'), controller.signal)
  await once(server.events, 'request')
  controller.abort()
  const outcome = await pending
  assertShape(outcome)
  assert.equal(outcome.kind, 'cancelled')
  assert.equal((await client.call(buildCallTask(server.url, '/echo'))).kind, 'ok')
})

test('R12: an already-aborted signal is a cancelled outcome and nothing is sent', async (t) => {
  const { server, client } = await setup(t)
  const outcome = await client.call(buildCallTask(server.url, '/echo'), AbortSignal.abort())
  assert.equal(outcome.kind, 'cancelled')
  assert.equal((await client.call(buildCallTask(server.url, '/raw-output'))).kind, 'ok')
  assert.deepEqual(paths(server), ['/raw-output'])
})

test('R12: a refused connection is a connect outcome', async (t) => {
  const client = new CallbackClient({ connectionsPerOrigin: 4, keepAliveTimeoutMs: 4000, connectTimeoutMs: 2000 })
  t.after(() => client.close())
  const port = await closedPort()
  const outcome = await client.call(buildCallTask(`http://127.0.0.1:${port}`, '/echo'))
  assertShape(outcome)
  assert.equal(outcome.kind, 'connect')
  assert.match(outcome.message, /^ECONNREFUSED: /)
})

test('R12: a refused connection to localhost (both loopback families tried) is a connect outcome', async (t) => {
  const client = new CallbackClient({ connectionsPerOrigin: 4, keepAliveTimeoutMs: 4000, connectTimeoutMs: 2000 })
  t.after(() => client.close())
  const port = await closedPort()
  const outcome = await client.call(buildCallTask(`http://localhost:${port}`, '/echo'))
  assert.equal(outcome.kind, 'connect')
})

test('R12: a TLS certificate failure is a connect outcome and no request reaches the server', async (t) => {
  const { server, client } = await setup(t, { isHttps: true })
  const outcome = await client.call(buildCallTask(server.url, '/echo'))
  assertShape(outcome)
  assert.equal(outcome.kind, 'connect')
  assert.equal(server.requests.length, 0)
})

test('R12: a connection closed after the request was sent is a protocol outcome', async (t) => {
  const { server, client } = await setup(t)
  const outcome = await client.call(buildCallTask(server.url, '/hang-up'))
  assertShape(outcome)
  assert.equal(outcome.kind, 'protocol')
  assert.equal((await client.call(buildCallTask(server.url, '/echo'))).kind, 'ok')
})

test('R12: a reply that is not valid HTTP is a protocol outcome', async (t) => {
  const { server, client } = await setup(t)
  const outcome = await client.call(buildCallTask(server.url, '/bad-http'))
  assert.equal(outcome.kind, 'protocol')
  assert.match(outcome.message, /^HTTPParserError: /)
})

test('R12: a 20 MiB streamed reply is a too_large outcome, read no further than the cap', async (t) => {
  const { server, client } = await setup(t)
  const task = buildCallTask(server.url, `/big/${20 * 1024 * 1024}`)
  const outcome = await client.call(task)
  assertShape(outcome)
  assert.equal(outcome.kind, 'too_large')
  assert.equal(outcome.status, 200)
  assert.equal(outcome.text, '')
  // Reading stops at the first chunk over the cap.
  assert.ok(outcome.bytes > task.maxResponseBytes && outcome.bytes <= task.maxResponseBytes + 256 * 1024)
  assert.equal((await client.call(buildCallTask(server.url, '/echo'))).kind, 'ok')
})

test('R12: a declared content-length over the cap is too_large before any body is read', async (t) => {
  const { server, client } = await setup(t)
  const outcome = await client.call(buildCallTask(server.url, `/big/${20 * 1024 * 1024}?declared=1`))
  assert.equal(outcome.kind, 'too_large')
  assert.equal(outcome.bytes, 0)
})

test('R12: an error reply over the cap is still an http outcome with its snippet', async (t) => {
  const { server, client } = await setup(t)
  const outcome = await client.call(buildCallTask(server.url, '/status/500', { maxResponseBytes: 300 }))
  assert.equal(outcome.kind, 'http')
  assert.equal(outcome.status, 500)
  assert.equal(outcome.text.length, HTTP_ERROR_SNIPPET_CHARS)
})

test('R12: a 100000-deep JSON reply is returned as its own text (never re-encoded)', async (t) => {
  const { server, client } = await setup(t)
  const outcome = await client.call(buildCallTask(server.url, '/deep/100000'))
  assert.equal(outcome.kind, 'ok')
  assert.equal(outcome.text.length, 200_000)
  assert.ok(outcome.text.startsWith('[[[') && outcome.text.endsWith(']]]'))
})

test('R12: a gzip bomb is never decompressed: a compressed reply is a protocol error, read no further', async (t) => {
  const { server, client } = await setup(t)
  const task = buildCallTask(server.url, '/gzip-bomb')
  const outcome = await client.call(task)
  assert.equal(outcome.kind, 'protocol')
  assert.match(outcome.message, /^TP_ENCODED_REPLY/)
  assert.equal(outcome.text, '')
  assert.ok(outcome.bytes < GZIP_BOMB_INFLATED_BYTES / 100)
})

test('R12: every line of Content-Encoding counts: identity on one line and gzip on the next is a compressed reply; identity alone is not', async (t) => {
  const body = gzipSync('{"output":"hidden"}')
  const server = createServer((request, response) => {
    request.resume()
    const lines = JSON.parse(decodeURIComponent((request.url ?? '/').slice(1))) as string[]
    response.setHeader('content-encoding', lines)
    response.setHeader('content-type', 'application/json')
    response.end(lines.some((line) => /gzip/i.test(line)) ? body : '{"output":"plain"}')
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  t.after(() => { server.closeAllConnections(); server.close() })
  const client = new CallbackClient({ connectionsPerOrigin: 2, keepAliveTimeoutMs: 4000, connectTimeoutMs: 2000 })
  t.after(() => client.close())
  const base = `http://127.0.0.1:${(server.address() as net.AddressInfo).port}`
  const kinds: Record<string, string> = {}
  for (const lines of [['identity', 'gzip'], ['', 'GZIP'], ['identity', 'identity, br'], ['identity', 'identity'], [' Identity ', '']]) {
    const outcome = await client.call(buildCallTask(base, `/${encodeURIComponent(JSON.stringify(lines))}`))
    kinds[lines.join(' | ')] = outcome.kind === 'protocol' ? outcome.message.split(':')[0]! : `${outcome.kind} ${outcome.text}`
  }
  assert.deepEqual(kinds, {
    'identity | gzip': 'TP_ENCODED_REPLY',
    ' | GZIP': 'TP_ENCODED_REPLY',
    'identity | identity, br': 'TP_ENCODED_REPLY',
    'identity | identity': 'ok plain',
    ' Identity  | ': 'ok plain'
  })
})

test('R14: a localhost callback connects without consulting DNS', async (t) => {
  const { server, client } = await setup(t)
  const original = dns.lookup
  let lookups = 0
  function countingLookup (this: unknown, ...args: unknown[]): unknown {
    lookups++
    return Reflect.apply(original, this, args)
  }
  dns.lookup = countingLookup as typeof dns.lookup
  t.after(() => { dns.lookup = original })
  // Control: a plain net connection to localhost does go through the spied resolver.
  const control = net.connect({ host: 'localhost', port: server.port })
  await once(control, 'connect')
  control.destroy()
  assert.ok(lookups > 0)
  lookups = 0
  const outcome = await client.call(buildCallTask(`http://localhost:${server.port}`, '/echo'))
  assert.equal(outcome.kind, 'ok')
  assert.equal(lookups, 0)
})

test('R14: a bracketed IPv4-mapped loopback host ([::ffff:7f00:1]) connects', async (t) => {
  const { server, client } = await setup(t)
  const task = buildCallTask(`http://[::ffff:127.0.0.1]:${server.port}`, '/echo')
  assert.equal(task.url, `http://[::ffff:7f00:1]:${server.port}/echo`)
  assert.equal((await client.call(task)).kind, 'ok')
})

test('R14: an IPv6 loopback callback on [::1] connects', async (t) => {
  const { server, client } = await setup(t, { host: '::1' })
  assert.equal((await client.call(buildCallTask(server.url, '/echo'))).kind, 'ok')
})

/**
 * Another process binding a plugin's port on 127.0.0.1 (a separate socket, free to bind while the
 * plugin listens on ::1): it counts the connections it gets, and closes each.
 */
async function bindThief (t: TestContext, port: number): Promise<{ readonly connections: number }> {
  let connections = 0
  const thief = net.createServer((socket) => {
    connections++
    socket.destroy()
  })
  await new Promise<void>((resolve, reject) => {
    thief.once('error', reject)
    thief.listen(port, '127.0.0.1', resolve)
  })
  t.after(() => thief.close())
  return { get connections () { return connections } }
}

test('R2: a `localhost` callback keeps to the loopback address its plugin answered on: a socket another process binds later on the other one gets no call', async (t) => {
  const { server, client } = await setup(t, { host: '::1', keepAliveTimeoutMs: 50 })
  const url = `http://localhost:${server.port}`
  assert.equal((await client.call(buildCallTask(url, '/echo'))).kind, 'ok')
  const thief = await bindThief(t, server.port)
  // The plugin's idle keep-alive connection ends, so the next calls connect afresh.
  await once(server.events, 'disconnect')
  for (let i = 0; i < 3; i++) {
    assert.equal((await client.call(buildCallTask(url, '/echo'))).kind, 'ok')
    if (i < 2) await once(server.events, 'disconnect')
  }
  assert.equal(server.requests.length, 4)
  assert.equal(thief.connections, 0)
})

test('R2: what one thread learnt of a `localhost` port on ::1 holds for every thread (pool mode): another client sharing the table never tried 127.0.0.1 first', async (t) => {
  const server = await startCallbackServer({ host: '::1' })
  t.after(() => server.close())
  const ports = createLocalhostV6Ports()
  const options = { connectionsPerOrigin: 4, keepAliveTimeoutMs: 4000, connectTimeoutMs: 2000, localhostV6Ports: ports }
  const first = new CallbackClient(options)
  t.after(() => first.close())
  const url = `http://localhost:${server.port}`
  assert.equal((await first.call(buildCallTask(url, '/echo'))).kind, 'ok')
  const thief = await bindThief(t, server.port)
  // A thread that never called this plugin (or one started to replace another).
  const second = new CallbackClient(options)
  t.after(() => second.close())
  for (let i = 0; i < 3; i++) assert.equal((await second.call(buildCallTask(url, '/echo'))).kind, 'ok')
  assert.equal(thief.connections, 0)
  assert.equal(server.requests.length, 4)
})

test('R14: a non-loopback callback URL is refused without any network traffic', async (t) => {
  const client = new CallbackClient({ connectionsPerOrigin: 4, keepAliveTimeoutMs: 4000, connectTimeoutMs: 2000 })
  t.after(() => client.close())
  const originalConnect = net.Socket.prototype.connect
  let connects = 0
  function countingConnect (this: net.Socket, ...args: unknown[]): unknown {
    connects++
    return Reflect.apply(originalConnect, this, args)
  }
  net.Socket.prototype.connect = countingConnect as typeof originalConnect
  t.after(() => { net.Socket.prototype.connect = originalConnect })
  for (const url of ['http://10.0.0.1/echo', 'http://example.com/echo', 'http://0.0.0.0:80/echo',
    'file:///etc/passwd']) {
    const outcome = await client.call(buildCallTask('', '', { url }))
    assertShape(outcome)
    assert.equal(outcome.kind, 'refused', url)
    assert.match(outcome.message, /^TP_URL_REFUSED: /)
  }
  // A loopback url paired with a foreign origin (the pool key) is refused too.
  const mismatched = buildCallTask('http://127.0.0.1:9', '/echo', { origin: 'http://10.0.0.1:9' })
  assert.equal((await client.call(mismatched)).kind, 'refused')
  assert.equal(connects, 0)
})

test('R12: a request the HTTP layer rejects (a CR/LF in the path) is an internal outcome, not a rejection', async (t) => {
  const { server, client } = await setup(t)
  // Registered urls never hold one (they are parsed and made canonical): this is the client's
  // last line, should any request reach undici that it refuses to send.
  const outcome = await client.call(buildCallTask(server.url, '/echo', { path: '/echo\r\nx-injected: 1' }))
  assertShape(outcome)
  assert.equal(outcome.kind, 'internal')
  assert.equal((await client.call(buildCallTask(server.url, '/raw-output'))).kind, 'ok')
  assert.deepEqual(paths(server), ['/raw-output'])
})

test('R13: 50 sequential calls reuse a keep-alive connection', async (t) => {
  const { server, client } = await setup(t)
  for (let i = 0; i < 50; i++) {
    assert.equal((await client.call(buildCallTask(server.url, '/echo'))).kind, 'ok')
  }
  assert.ok(server.connections <= 2, `${server.connections} connections`)
})

test('R13: a call after the server closed an idle keep-alive socket succeeds', async (t) => {
  // Like uvicorn: the server drops idle sockets after 1 s without a Keep-Alive hint.
  const { server, client } = await setup(t, { keepAliveTimeoutMs: 1000, sendKeepAliveHint: false })
  assert.equal((await client.call(buildCallTask(server.url, '/echo'))).kind, 'ok')
  await once(server.events, 'disconnect')
  assert.equal((await client.call(buildCallTask(server.url, '/echo'))).kind, 'ok')
  assert.equal(server.connections, 2)
})

test('R12: calls after close() are cancelled outcomes, never rejections', async (t) => {
  const { server, client } = await setup(t)
  await client.close()
  const outcome = await client.call(buildCallTask(server.url, '/echo'))
  assert.equal(outcome.kind, 'cancelled')
  assert.equal(server.requests.length, 0)
})

test('R12: a call in flight when the client closes ends as a cancelled outcome', async (t) => {
  const { server, client } = await setup(t)
  const pending = client.call(buildCallTask(server.url, '/sleep/30000'))
  await once(server.events, 'request')
  await client.close()
  const outcome = await pending
  assertShape(outcome)
  assert.equal(outcome.kind, 'cancelled')
})

test('R13: the pools of origins no longer called are dropped once their keep-alive sockets closed; an origin with a call running keeps its pool (plugins restart on fresh ports)', async (t) => {
  const client = new CallbackClient({ connectionsPerOrigin: 4, keepAliveTimeoutMs: 100, connectTimeoutMs: 2000 })
  t.after(() => client.close())
  const ORIGINS = 10
  const servers: CallbackServer[] = []
  for (let i = 0; i < ORIGINS; i++) {
    const server = await startCallbackServer()
    t.after(() => server.close())
    servers.push(server)
    assert.equal((await client.call(buildCallTask(server.url, '/echo', { timeoutMs: 5000 }))).kind, 'ok')
  }
  assert.equal(client.origins, ORIGINS)
  // One more origin whose call runs through several sweeps: its pool must stay under it.
  const slow = await startCallbackServer()
  t.after(() => slow.close())
  const running = client.call(buildCallTask(slow.url, '/sleep/1500', { timeoutMs: 10_000 }))
  const until = Date.now() + 20_000
  while (client.origins > 1 && Date.now() < until) await new Promise((resolve) => setTimeout(resolve, 20))
  assert.equal(client.origins, 1, 'pools of origins idle past their keep-alive were kept')
  // Through the sweeps while it runs (every 250 ms here), the running call's pool stays.
  const tick = async (): Promise<boolean> => await new Promise((resolve) => setTimeout(resolve, 20, false))
  while (!await Promise.race([running.then(() => true), tick()])) {
    assert.equal(client.origins, 1, 'the pool of an origin with a call running was dropped')
  }
  assert.equal((await running).kind, 'ok')
  // A dropped origin called again gets a new pool and answers.
  assert.equal((await client.call(buildCallTask(servers[0]!.url, '/echo', { timeoutMs: 5000 }))).kind, 'ok')
  assert.equal(client.origins, 2)
})
