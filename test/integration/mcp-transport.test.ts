// The MCP endpoint at the HTTP level, as real clients and the conformance runner drive it: raw
// requests (undici) and the official SDK client against a real Toolport on 127.0.0.1, with real
// plugin callbacks. Covers resumable streams, the same-origin rule, JSON-RPC errors, the bounds
// on sessions and calls, paged tool lists and outputs too deep to encode.
import { test, type TestContext } from 'node:test'
import assert from 'node:assert/strict'
import { once } from 'node:events'
import { Session as InspectorSession } from 'node:inspector/promises'
import { connect } from 'node:net'
import fastify from 'fastify'
import { Client as UndiciClient, request as httpRequest } from 'undici'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { WebStandardStreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/webStandardStreamableHttp.js'
import { ErrorCode, McpError, type CallToolResult } from '@modelcontextprotocol/sdk/types.js'
import { z } from 'zod'
import type { Toolport } from '../../src/main/index.js'
import { registerMcpRoutes } from '../../src/main/http/mcp-routes.js'
import type { McpSessions, McpSessionsOptions } from '../../src/main/sessions/mcp.js'
import { startCallbackServer, type CallbackServer } from '../fixtures/callback-server.js'
import { createTestToolport, httpJson, startHttp2Host, startToolport, waitFor, type Http2Reply } from '../helpers.js'

const LATEST = '2025-11-25'

function initialize (protocolVersion = LATEST): Record<string, unknown> {
  return {
    jsonrpc: '2.0',
    id: 1,
    method: 'initialize',
    params: { protocolVersion, capabilities: {}, clientInfo: { name: 'raw', version: '1' } }
  }
}

interface SseEvent { id?: string, event?: string, data: string, retry?: number }

/** A streaming request: the status, headers, and an iterator over its SSE events. */
async function openStream (url: string, method: 'GET' | 'POST', headers: Record<string, string>, body?: unknown,
  dispatcher?: UndiciClient) {
  const controller = new AbortController()
  const res = await httpRequest(url, {
    method,
    signal: controller.signal,
    ...(dispatcher === undefined ? {} : { dispatcher }),
    headers: {
      accept: 'application/json, text/event-stream',
      ...(body === undefined ? {} : { 'content-type': 'application/json' }),
      ...headers
    },
    ...(body === undefined ? {} : { body: JSON.stringify(body) })
  })
  async function * events (): AsyncGenerator<SseEvent> {
    let buffer = ''
    for await (const chunk of res.body) {
      buffer += String(chunk)
      let end
      while ((end = buffer.indexOf('\n\n')) !== -1) {
        const block = buffer.slice(0, end)
        buffer = buffer.slice(end + 2)
        const event: SseEvent = { data: '' }
        let hasField = false
        for (const line of block.split('\n')) {
          if (line.startsWith(':')) continue
          const colon = line.indexOf(':')
          const field = colon === -1 ? line : line.slice(0, colon)
          const value = colon === -1 ? '' : line.slice(colon + 1).replace(/^ /, '')
          hasField = true
          if (field === 'id') event.id = value
          else if (field === 'event') event.event = value
          else if (field === 'retry') event.retry = Number(value)
          else if (field === 'data') event.data = event.data === '' ? value : `${event.data}\n${value}`
        }
        if (hasField) yield event
      }
    }
  }
  return {
    statusCode: res.statusCode,
    headers: res.headers,
    events: events(),
    abort: () => controller.abort(),
    body: res.body
  }
}

/** The next event whose data is a JSON-RPC message, skipping priming events. */
async function nextMessage (events: AsyncGenerator<SseEvent>): Promise<{ event: SseEvent, message: any }> {
  for (;;) {
    const { value, done } = await events.next()
    if (done === true) throw new Error('the stream ended')
    if (value.data.trim() !== '') return { event: value, message: JSON.parse(value.data) }
  }
}

/** Initializes a session over raw HTTP; returns its id (the `initialized` notification is sent too). */
async function rawSession (endpoint: string, protocolVersion = LATEST, dispatcher?: UndiciClient): Promise<string> {
  const init = await openStream(endpoint, 'POST', {}, initialize(protocolVersion), dispatcher)
  assert.equal(init.statusCode, 200)
  const sessionId = init.headers['mcp-session-id'] as string
  const { message } = await nextMessage(init.events)
  assert.equal(message.result.protocolVersion, protocolVersion)
  await init.body.dump().catch(() => {})
  const notified = await httpRequest(endpoint, {
    method: 'POST',
    ...(dispatcher === undefined ? {} : { dispatcher }),
    headers: {
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      'mcp-session-id': sessionId,
      'mcp-protocol-version': protocolVersion
    },
    body: JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' })
  })
  await notified.body.dump()
  assert.equal(notified.statusCode, 202)
  return sessionId
}

/** One JSON-RPC request on a session; resolves with its response message. */
async function rpc (endpoint: string, sessionId: string, body: unknown, headers: Record<string,
  string> = {}): Promise<any> {
  const stream = await openStream(endpoint, 'POST', {
    'mcp-session-id': sessionId,
    'mcp-protocol-version': LATEST,
    ...headers
  }, body)
  assert.equal(stream.statusCode, 200)
  const { message } = await nextMessage(stream.events)
  await stream.body.dump().catch(() => {})
  return message
}

async function callbacks (t: TestContext): Promise<CallbackServer> {
  const server = await startCallbackServer()
  t.after(() => server.close())
  return server
}

async function sdkClient (t: TestContext, endpoint: string): Promise<Client> {
  const client = new Client({ name: 'transport-test', version: '1.0.0' })
  await client.connect(new StreamableHTTPClientTransport(new URL(endpoint)))
  t.after(() => client.close())
  return client
}

/** A fastify app with only the MCP routes, with session options a test chooses. */
async function mcpOnlyApp (t: TestContext, tp: Toolport,
  options: McpSessionsOptions): Promise<{ endpoint: (role: string) => string, sessions: McpSessions }> {
  const app = fastify({ forceCloseConnections: true })
  const sessions = registerMcpRoutes(app, tp, options)
  await app.listen({ host: '127.0.0.1', port: 0 })
  t.after(() => app.close())
  const address = app.server.address()
  const port = typeof address === 'object' && address !== null ? address.port : 0
  return { endpoint: (role) => `http://127.0.0.1:${port}/mcp/${role}`, sessions }
}

test("Toolport's own origin is allowed on /mcp and the API (127.0.0.1, localhost, [::1] with its port); others stay refused", async (t) => {
  const { url, port } = await startToolport(t, { roles: ['Lanlan'] })
  for (const origin of [`http://127.0.0.1:${port}`, `http://localhost:${port}`, `http://[::1]:${port}`]) {
    const init = await openStream(`${url}/mcp/Lanlan`, 'POST', { origin }, initialize())
    assert.equal(init.statusCode, 200, origin)
    await init.body.dump()
    const health = await httpRequest(`${url}/api/health`, { headers: { origin, 'sec-fetch-site': 'same-origin' } })
    assert.equal(health.statusCode, 200, origin)
    await health.body.dump()
  }
  for (const origin of [`http://127.0.0.1:${port + 1}`, `https://127.0.0.1:${port}`, `http://evil.example:${port}`,
    `http://127.0.0.1:${port}.evil.example`, 'null', `http://localhost:0${port}`]) {
    const refused = await openStream(`${url}/mcp/Lanlan`, 'POST', { origin }, initialize())
    assert.equal(refused.statusCode, 403, origin)
    await refused.body.dump()
  }
})

test('DELETE with Content-Type application/json and an empty body ends the session (the Python SDK close); so does an empty GET', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['Lanlan'] })
  const endpoint = `${url}/mcp/Lanlan`
  const sessionId = await rawSession(endpoint)
  assert.equal(tp.roles.get('Lanlan').sessions().length, 1)

  // A GET labelled JSON with an empty body opens the event stream like any GET.
  const stream = await openStream(endpoint, 'GET', {
    'mcp-session-id': sessionId,
    'content-type': 'application/json',
    'mcp-protocol-version': LATEST
  })
  assert.equal(stream.statusCode, 200)
  assert.match(String(stream.headers['content-type']), /text\/event-stream/)
  stream.abort()

  const deleted = await httpRequest(endpoint, {
    method: 'DELETE',
    headers: { 'content-type': 'application/json', 'mcp-session-id': sessionId, 'mcp-protocol-version': LATEST },
    body: ''
  })
  await deleted.body.dump()
  assert.equal(deleted.statusCode, 200)
  assert.deepEqual(tp.roles.get('Lanlan').sessions(), [])
  const after = await rpc(endpoint, sessionId, {
    jsonrpc: '2.0',
    id: 2,
    method: 'tools/list'
  }).catch((err: Error) => err)
  assert.ok(after instanceof Error, 'the session is gone')
})

test('a body that is not JSON on /mcp answers a JSON-RPC -32700 error object; one too deep answers -32600', async (t) => {
  const { url } = await startToolport(t, { roles: ['Lanlan'] })
  const endpoint = `${url}/mcp/Lanlan`
  for (const [body, status, code, tpCode] of [
    ['{"jsonrpc": "2.0", "id": 1, "method": ', 400, -32700, 'TP_ERR_BAD_JSON'],
    ['', 400, -32700, 'TP_ERR_BAD_JSON'],
    ['['.repeat(100) + ']'.repeat(100), 413, -32600, 'TP_ERR_JSON_TOO_DEEP']
  ] as const) {
    const reply = await httpRequest(endpoint, {
      method: 'POST',
      headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
      body
    })
    assert.equal(reply.statusCode, status)
    const json = await reply.body.json() as {
      jsonrpc: string,
      id: null,
      error: {
        code: number,
        message: string,
        data: { code: string }
      }
    }
    assert.equal(json.jsonrpc, '2.0')
    assert.equal(json.id, null)
    assert.equal(json.error.code, code)
    assert.equal(json.error.data.code, tpCode)
  }
})

test('a body that is JSON but no JSON-RPC on /mcp answers 400 with -32600 Invalid Request and id null, as the bridge answers such a line (JSON-RPC 2.0 §5.1)', async (t) => {
  const { url } = await startToolport(t, { roles: ['Lanlan'] })
  const client = new Client({ name: 'probe', version: '1.0.0' })
  const transport = new StreamableHTTPClientTransport(new URL(`${url}/mcp/Lanlan`))
  await client.connect(transport)
  t.after(() => client.close())
  const headers = {
    'content-type': 'application/json',
    accept: 'application/json, text/event-stream',
    'mcp-session-id': transport.sessionId!,
    'mcp-protocol-version': transport.protocolVersion!
  }
  const ping = { jsonrpc: '2.0', id: 'p', method: 'ping' }
  for (const [body, message] of [
    [{ jsonrpc: '2.0', id: 5 }, 'not a JSON-RPC 2.0 message'],
    [{ jsonrpc: '2.0', id: 5, method: 'ping', params: [] }, 'not a JSON-RPC 2.0 message'],
    [{ jsonrpc: '1.0', id: 5, method: 'ping' }, 'not a JSON-RPC 2.0 message'],
    [42, 'not a JSON-RPC 2.0 message'],
    [[], 'an empty batch'],
    [[ping, { id: 6 }], 'a batch member is not a JSON-RPC 2.0 message']
  ] as const) {
    const reply = await httpRequest(`${url}/mcp/Lanlan`, { method: 'POST', headers, body: JSON.stringify(body) })
    assert.equal(reply.statusCode, 400, JSON.stringify(body))
    assert.deepEqual(await reply.body.json(), { jsonrpc: '2.0', error: { code: -32600, message: `Invalid Request: ${message}` }, id: null })
  }
  // The session is unharmed.
  assert.deepEqual(await client.ping(), {})
})

test('a request whose id a request in flight of the session holds is refused (-32600), and the first one keeps its own answer (JSON-RPC 2.0 §4: ids of requests in flight differ)', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['Lanlan'] })
  const plugin = await startCallbackServer()
  t.after(() => plugin.close())
  assert.equal((await tp.register({ name: 'slow', callback_url: `${plugin.url}/sleep/400` })).ok, true)
  assert.equal((await tp.register({ name: 'fast', callback_url: `${plugin.url}/echo` })).ok, true)
  const client = new Client({ name: 'probe', version: '1.0.0' })
  const transport = new StreamableHTTPClientTransport(new URL(`${url}/mcp/Lanlan`))
  await client.connect(transport)
  t.after(() => client.close())
  const headers = { 'mcp-session-id': transport.sessionId!, 'mcp-protocol-version': transport.protocolVersion! }
  const call = (name: string, text: string): object =>
    ({ jsonrpc: '2.0', id: 'dup', method: 'tools/call', params: { name, arguments: { text } } })
  const first = await openStream(`${url}/mcp/Lanlan`, 'POST', headers, call('slow', 'first'))
  assert.equal(first.statusCode, 200)
  await waitFor('the first call at its plugin', () => plugin.requests.length === 1)
  for (const body of [call('fast', 'second'), [{ jsonrpc: '2.0', id: 'other', method: 'ping' }, call('fast', 'third')]]) {
    const refused = await httpRequest(`${url}/mcp/Lanlan`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', ...headers },
      body: JSON.stringify(body)
    })
    assert.equal(refused.statusCode, 400)
    const answer = await refused.body.json() as { error: { code: number, message: string }, id: null }
    assert.equal(answer.error.code, -32600)
    assert.match(answer.error.message, /"dup" is in use by a request in flight/)
    assert.equal(answer.id, null)
  }
  // The first request's stream gets its own answer, then ends.
  let result: { id: string, result: CallToolResult } | undefined
  for await (const event of first.events) {
    if (event.data === '') continue
    result = JSON.parse(event.data)
  }
  assert.equal(result?.id, 'dup')
  assert.match(String((result?.result.content[0] as { text: string }).text), /first/)
  assert.equal(plugin.requests.length, 1, 'the refused calls never reached a plugin')
  // The id is free again once answered.
  const again = await openStream(`${url}/mcp/Lanlan`, 'POST', headers, call('fast', 'fourth'))
  assert.equal(again.statusCode, 200)
  for await (const event of again.events) if (event.data !== '') assert.equal(JSON.parse(event.data).id, 'dup')
  // Nor may two requests of one batch share an id: one of the two answers would be lost.
  const twins = await httpRequest(`${url}/mcp/Lanlan`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', ...headers },
    body: JSON.stringify([call('fast', 'fifth'), call('fast', 'sixth')])
  })
  assert.equal(twins.statusCode, 400)
  assert.match((await twins.body.json() as { error: { message: string } }).error.message, /"dup" is in use/)
  assert.equal(plugin.requests.length, 2, 'neither twin reached a plugin')
})

test('tools/call and tools/list with params their schema refuses are -32602 Invalid params naming the field, not -32603 (JSON-RPC 2.0 §5.1)', async (t) => {
  const { url } = await startToolport(t, { roles: ['Lanlan'] })
  const client = new Client({ name: 'probe', version: '1.0.0' })
  await client.connect(new StreamableHTTPClientTransport(new URL(`${url}/mcp/Lanlan`)))
  t.after(() => client.close())
  for (const [method, params, field] of [
    ['tools/call', { name: 'x', arguments: [1] }, 'params.arguments'],
    ['tools/call', { name: 'x', arguments: null }, 'params.arguments'],
    ['tools/call', { name: 7 }, 'params.name'],
    ['tools/call', {}, 'params.name'],
    ['tools/list', { cursor: 4 }, 'params.cursor']
  ] as const) {
    const error = await client.request({ method, params } as never, z.object({}).loose()).catch((err: unknown) => err)
    assert.ok(error instanceof McpError, `${method} ${JSON.stringify(params)}: ${String(error)}`)
    assert.equal(error.code, ErrorCode.InvalidParams, `${method} ${JSON.stringify(params)}: ${error.message}`)
    assert.match(error.message, new RegExp(`Invalid params: ${field.replace('.', '\\.')}: `))
    assert.doesNotMatch(error.message, /\n/, 'one line, not zod\'s issue dump')
  }
})

test('POST streams are resumable: a priming event (id, empty data, retry) comes first, even on a request labelled an older version', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['Lanlan'] })
  await tp.roles.get('Lanlan').registerLocalTool({ name: 'now', handler: async () => 'noon' })
  const endpoint = `${url}/mcp/Lanlan`
  const sessionId = await rawSession(endpoint)
  for (const version of [LATEST, '2025-03-26']) {
    const stream = await openStream(endpoint, 'POST', { 'mcp-session-id': sessionId, 'mcp-protocol-version': version },
      { jsonrpc: '2.0', id: 5, method: 'tools/call', params: { name: 'now', arguments: {} } })
    const first = await stream.events.next()
    assert.equal(first.done, false)
    assert.ok(first.value.id !== undefined && first.value.id !== '', 'the priming event has an id')
    assert.equal(first.value.data, '')
    assert.equal(first.value.retry, 2000)
    const { message } = await nextMessage(stream.events)
    assert.equal(message.id, 5)
    assert.equal(message.result.content[0].text, 'noon')
  }
  // A session that negotiated an older version gets no priming event: its clients cannot read one.
  const old = await rawSession(endpoint, '2025-03-26')
  const stream = await openStream(endpoint, 'POST', { 'mcp-session-id': old, 'mcp-protocol-version': '2025-03-26' },
    { jsonrpc: '2.0', id: 6, method: 'tools/call', params: { name: 'now', arguments: {} } })
  const first = await stream.events.next()
  assert.equal(first.done, false)
  assert.notEqual(first.value.data, '')
})

/**
 * The stream ids every live MCP SDK server transport in this process still marks resumable, read
 * through the inspector (the SDK keeps them in a private set).
 */
async function resumableStreamIds (): Promise<number> {
  const session = new InspectorSession()
  session.connect()
  try {
    const g = globalThis as { toolportTransportPrototype?: unknown }
    g.toolportTransportPrototype = WebStandardStreamableHTTPServerTransport.prototype
    const { result: proto } = await session.post('Runtime.evaluate', { expression: 'globalThis.toolportTransportPrototype' })
    const { objects } = await session.post('Runtime.queryObjects', { prototypeObjectId: proto.objectId as string })
    const { result } = await session.post('Runtime.callFunctionOn', {
      objectId: objects.objectId as string,
      functionDeclaration: 'function () { return this.reduce((n, t) => n + (t._resumableStreams?.size ?? 0), 0) }',
      returnByValue: true
    })
    delete g.toolportTransportPrototype
    return result.value as number
  } finally {
    session.disconnect()
  }
}

test('a finished request stream that is resumed for its stored answer is let go: a long session keeps no id of each such stream', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['Lanlan'] })
  await tp.roles.get('Lanlan').registerLocalTool({
    name: 'later', handler: async () => { await new Promise((resolve) => setTimeout(resolve, 20)); return 'done' }
  })
  const endpoint = `${url}/mcp/Lanlan`
  const sessionId = await rawSession(endpoint)
  const headers = { 'mcp-session-id': sessionId, 'mcp-protocol-version': LATEST }
  const before = await resumableStreamIds()
  const rounds = 12
  for (let id = 1; id <= rounds; id++) {
    const stream = await openStream(endpoint, 'POST', headers,
      { jsonrpc: '2.0', id, method: 'tools/call', params: { name: 'later', arguments: {} } })
    const priming = await stream.events.next()
    assert.ok(priming.value?.id, 'a priming event with an id')
    stream.abort()
    // The answer is stored meanwhile; the client resumes for it.
    await new Promise((resolve) => setTimeout(resolve, 60))
    const resumed = await openStream(endpoint, 'GET', { ...headers, 'last-event-id': priming.value.id as string })
    assert.equal(resumed.statusCode, 200)
    const { message } = await nextMessage(resumed.events)
    assert.equal(message.id, id)
    assert.equal(message.result.content[0].text, 'done')
    await resumed.body.dump().catch(() => {})
  }
  // At most as many as before: another test's transport collected meanwhile takes its own away.
  const added = await resumableStreamIds() - before
  assert.ok(added <= 0, `${added} stream ids still marked resumable after ${rounds} resumed calls`)
})

test('an event stream goes out as it is written: no read-ahead holds a tools/call answer back on a zero-delay timer', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['Lanlan'] })
  // Answers one event-loop turn later, as a dispatched call does: the answer is not ready at the
  // moment the stream starts.
  await tp.roles.get('Lanlan').registerLocalTool({
    name: 'soon',
    handler: async () => {
      await new Promise((resolve) => { setImmediate(resolve) })
      return 'answered'
    }
  })
  const endpoint = `${url}/mcp/Lanlan`
  const sessionId = await rawSession(endpoint)
  // Every event stream starts with its priming event. A server that reads ahead into the body
  // before writing the headers then finds a first chunk and waits a timer for a second one: a
  // millisecond or more added to every call. Watch for such timers while one call is answered.
  const waits: string[] = []
  const realSetTimeout = globalThis.setTimeout
  globalThis.setTimeout = function watchedSetTimeout (this: unknown, ...args: Parameters<typeof setTimeout>) {
    const ms = args[1]
    if (ms === undefined || ms <= 1) waits.push(new Error('zero-delay timer').stack ?? '')
    return realSetTimeout.apply(this, args)
  } as typeof setTimeout
  let message
  try {
    message = await rpc(endpoint, sessionId, { jsonrpc: '2.0', id: 9, method: 'tools/call', params: { name: 'soon', arguments: {} } })
  } finally {
    globalThis.setTimeout = realSetTimeout
  }
  assert.equal(message.result.content[0].text, 'answered')
  assert.deepEqual(waits, [], 'no zero-delay timer on the way of the answer')
})

test('an HTTP/1.0 client gets its event stream without chunked framing, which it could not read', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['Lanlan'] })
  await tp.roles.get('Lanlan').registerLocalTool({ name: 'now', handler: async () => 'noon' })
  const endpoint = `${url}/mcp/Lanlan`
  const sessionId = await rawSession(endpoint)
  const { host, port } = new URL(url)
  const body = JSON.stringify({ jsonrpc: '2.0', id: 3, method: 'tools/call', params: { name: 'now', arguments: {} } })
  const socket = connect(Number(port), '127.0.0.1')
  t.after(() => socket.destroy())
  // Written, not ended: the server closes the connection when the answer is complete.
  socket.write([
    'POST /mcp/Lanlan HTTP/1.0',
    `Host: ${host}`,
    'Content-Type: application/json',
    'Accept: application/json, text/event-stream',
    `Mcp-Session-Id: ${sessionId}`,
    `Mcp-Protocol-Version: ${LATEST}`,
    `Content-Length: ${Buffer.byteLength(body)}`,
    '',
    body
  ].join('\r\n'))
  let raw = ''
  socket.setEncoding('utf8')
  for await (const chunk of socket) raw += String(chunk)
  const [head = '', rest = ''] = raw.split('\r\n\r\n', 2)
  assert.match(head, /^HTTP\/1\.1 200/)
  assert.doesNotMatch(head, /transfer-encoding/i)
  // The body is the events themselves, delimited by the connection's end.
  assert.match(rest, /^id: /)
  assert.match(rest, /"text":"noon"/)
})

test('an MCP client over HTTP/2 (h2c, the plugin mounted on a host app) gets its event streams', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lanlan'] })
  await tp.roles.get('Lanlan').registerLocalTool({ name: 'now', handler: async () => 'noon' })
  const { request } = await startHttp2Host(t, tp)
  async function post (body: unknown, headers: Record<string, string> = {}): Promise<Http2Reply> {
    return await request({
      ':method': 'POST',
      ':path': '/mcp/Lanlan',
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      ...headers
    }, JSON.stringify(body))
  }
  const init = await post(initialize())
  assert.equal(init.statusCode, 200)
  assert.equal(init.headers['transfer-encoding'], undefined)
  assert.match(init.text, new RegExp(`"protocolVersion":"${LATEST}"`))
  const sessionId = String(init.headers['mcp-session-id'])
  const call = await post({ jsonrpc: '2.0', id: 2, method: 'tools/call', params: { name: 'now', arguments: {} } },
    { 'mcp-session-id': sessionId, 'mcp-protocol-version': LATEST })
  assert.equal(call.statusCode, 200)
  assert.match(call.text, /"text":"noon"/)
})

test('a client whose event stream dropped misses no tool change: Last-Event-ID replays the list_changed it missed', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['Lanlan'] })
  const role = tp.roles.get('Lanlan')
  const endpoint = `${url}/mcp/Lanlan`
  const sessionId = await rawSession(endpoint)
  const headers = { 'mcp-session-id': sessionId, 'mcp-protocol-version': LATEST }
  await rpc(endpoint, sessionId, { jsonrpc: '2.0', id: 2, method: 'tools/list' })

  const stream = await openStream(endpoint, 'GET', headers)
  assert.equal(stream.statusCode, 200)
  const first = nextMessage(stream.events)
  await role.registerLocalTool({ name: 'a', handler: async () => 'a' })
  const { event, message } = await first
  assert.equal(message.method, 'notifications/tools/list_changed')
  assert.ok(event.id !== undefined)

  // The stream drops; a tool changes meanwhile (the sync still completes).
  stream.abort()
  await new Promise((resolve) => setTimeout(resolve, 50))
  const outcome = await role.registerLocalTool({ name: 'b', handler: async () => 'b' })
  assert.equal(outcome.ok, true)

  const resumed = await openStream(endpoint, 'GET', { ...headers, 'last-event-id': event.id as string })
  assert.equal(resumed.statusCode, 200)
  const replayed = await nextMessage(resumed.events)
  assert.equal(replayed.message.method, 'notifications/tools/list_changed')
  assert.notEqual(replayed.event.id, event.id)
  resumed.abort()
  const listed = await rpc(endpoint, sessionId, { jsonrpc: '2.0', id: 3, method: 'tools/list' })
  assert.deepEqual(listed.result.tools.map((tool: { name: string }) => tool.name), ['a', 'b'])
})

/** A Toolport whose MCP routes take two sessions, with a tool `slow` whose calls never end. */
async function twoSessionServer (t: TestContext): Promise<{
  server: CallbackServer,
  sessions: McpSessions,
  endpoint: string
}> {
  const { tp } = await startToolport(t, { roles: ['Lanlan'], dispatch: { closeGraceMs: 0 } })
  const server = await callbacks(t)
  await tp.register({ name: 'slow', callback_url: `${server.url}/sleep/60000` })
  const mcp = await mcpOnlyApp(t, tp, { maxSessions: 2 })
  return { server, sessions: mcp.sessions, endpoint: mcp.endpoint('Lanlan') }
}

/** Opens a `tools/call` of `slow` in session `sessionId`, its answer streamed. */
async function callSlow (endpoint: string, sessionId: string): ReturnType<typeof openStream> {
  return await openStream(endpoint, 'POST', { 'mcp-session-id': sessionId, 'mcp-protocol-version': LATEST },
    { jsonrpc: '2.0', id: 9, method: 'tools/call', params: { name: 'slow', arguments: {} } })
}

/** A new client's session, whose `initialize` evicted session `victim`; resolves with its id. */
async function initializeEvicting (sessions: McpSessions, endpoint: string, victim: string): Promise<string> {
  const evicted = once(sessions, 'session-closed')
  const id = await rawSession(endpoint)
  const [event] = await evicted
  assert.deepEqual({ id: event.sessionId, reason: event.reason }, { id: victim, reason: 'evicted' })
  return id
}

/** The HTTP status a new client's `initialize` gets. */
async function initializeStatus (endpoint: string): Promise<number> {
  const answer = await httpRequest(endpoint, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
    body: JSON.stringify(initialize())
  })
  await answer.body.dump()
  return answer.statusCode
}

test('sessions full: an initialize evicts the least recently active idle session; with every session busy it is 503', async (t) => {
  const { server, sessions, endpoint } = await twoSessionServer(t)
  const oldest = await rawSession(endpoint)
  const newer = await rawSession(endpoint)
  const third = await initializeEvicting(sessions, endpoint, oldest)
  assert.deepEqual(sessions.list().map((s) => s.sessionId).sort(), [newer, third].sort())

  // Both sessions now have a call in flight: nothing may be evicted, so a new client waits (503).
  const streams = await Promise.all([newer, third].map(async (id) => await callSlow(endpoint, id)))
  while (server.requests.length < 2) await once(server.events, 'request')
  assert.equal(await initializeStatus(endpoint), 503)
  for (const s of streams) s.abort()
})

test('sessions full: a session whose call still runs after its stream dropped is not evicted (its client may resume for the answer); an idle one goes instead, and with none idle it is 503', async (t) => {
  const { server, sessions, endpoint } = await twoSessionServer(t)
  const calling = await rawSession(endpoint)
  const stream = await callSlow(endpoint, calling)
  while (server.requests.length < 1) await once(server.events, 'request')
  stream.abort()
  const session = (): { requestsInFlight: number, callsInFlight: number } | undefined =>
    sessions.list().find((s) => s.sessionId === calling)
  await waitFor('the dropped stream to end its request', () => session()?.requestsInFlight === 0)
  assert.equal(session()?.callsInFlight, 1)
  // Newer than the calling session, so least-recently-active alone would spare it.
  const idle = await rawSession(endpoint)
  const third = await initializeEvicting(sessions, endpoint, idle)
  assert.deepEqual(sessions.list().map((s) => s.sessionId).sort(), [calling, third].sort())
  assert.equal(session()?.callsInFlight, 1, 'the call still runs')

  const busy = await callSlow(endpoint, third)
  while (server.requests.length < 2) await once(server.events, 'request')
  busy.abort()
  await waitFor('the second dropped stream to end its request',
    () => sessions.list().find((s) => s.sessionId === third)?.requestsInFlight === 0)
  assert.equal(await initializeStatus(endpoint), 503)
})

test('one client holds at most maxSessionsPerClient sessions: its next initialize evicts its own oldest, not another client\'s', async (t) => {
  const { tp } = await startToolport(t, { roles: ['Lanlan'] })
  const mcp = await mcpOnlyApp(t, tp, { maxSessionsPerClient: 2 })
  const endpoint = mcp.endpoint('Lanlan')
  // One connection each: a client is the connection that initializes.
  const origin = new URL(endpoint).origin
  const a = new UndiciClient(origin)
  const b = new UndiciClient(origin)
  t.after(async () => { await a.close(); await b.close() })
  const other = await rawSession(endpoint, LATEST, b)
  const first = await rawSession(endpoint, LATEST, a)
  const second = await rawSession(endpoint, LATEST, a)
  const evicted = once(mcp.sessions, 'session-closed')
  const third = await rawSession(endpoint, LATEST, a)
  const [event] = await evicted
  assert.equal(event.sessionId, first)
  assert.deepEqual(mcp.sessions.list().map((s) => s.sessionId).sort(), [other, second, third].sort())
})

test('sessions full: clients connecting at once each get a session; older idle sessions make room, not those still in their handshake', async (t) => {
  const { tp } = await startToolport(t, { roles: ['Lanlan'] })
  await tp.roles.get('Lanlan').registerLocalTool({ name: 'now', handler: async () => 'noon' })
  const mcp = await mcpOnlyApp(t, tp, { maxSessions: 3 })
  const endpoint = mcp.endpoint('Lanlan')
  const older = [await sdkClient(t, endpoint), await sdkClient(t, endpoint), await sdkClient(t, endpoint)]
  const olderIds = new Set(mcp.sessions.list().map((s) => s.sessionId))
  // Each SDK client opens its event stream once initialized.
  while (!mcp.sessions.list().every((s) => s.hasStream)) await new Promise((resolve) => setTimeout(resolve, 10))

  const connecting = await Promise.allSettled([0, 1, 2].map(async () => {
    const client = await sdkClient(t, endpoint)
    const { tools } = await client.listTools()
    return tools.map((tool) => tool.name)
  }))
  assert.deepEqual(connecting.map((c) => c.status === 'fulfilled' ? c.value : String(c.reason)),
    [['now'], ['now'], ['now']], 'every client connecting at once got a session that answers')
  const open = mcp.sessions.list()
  assert.equal(open.length, 3, 'never more than maxSessions')
  assert.ok(open.every((s) => !olderIds.has(s.sessionId)), 'the older sessions made room')
  for (const client of older) await assert.rejects(client.listTools(), /Session not found|404/)
})

test('calls in flight are bounded per session and for all MCP sessions: batches of 100 calls cannot take the dispatcher\'s whole budget', async (t) => {
  // maxPending 256: every MCP session together may hold a quarter (64) of it, one session 32.
  const { tp, url } = await startToolport(t, { roles: ['Lanlan'], dispatch: { maxPending: 256, closeGraceMs: 0 } })
  const server = await callbacks(t)
  const otherPlugin = await callbacks(t)
  await tp.register({ name: 'stuck', callback_url: `${server.url}/sleep/60000` })
  await tp.register({ name: 'weather', callback_url: `${otherPlugin.url}/raw-output` })
  const endpoint = `${url}/mcp/Lanlan`

  const refusals: string[][] = []
  const streams = []
  for (let post = 0; post < 3; post++) {
    const sessionId = await rawSession(endpoint)
    const batch = Array.from({ length: 100 }, (_, i) => ({
      jsonrpc: '2.0',
      id: 100 + i,
      method: 'tools/call',
      params: { name: 'stuck', arguments: {} }
    }))
    const stream = await openStream(endpoint, 'POST', { 'mcp-session-id': sessionId, 'mcp-protocol-version': LATEST },
      batch)
    streams.push(stream)
    // The calls beyond a bound answer at once, as tool errors; the others wait on the plugin.
    const expected = post < 2 ? 100 - 32 : 100
    const texts: string[] = []
    for (let i = 0; i < expected; i++) {
      const { message } = await nextMessage(stream.events)
      assert.equal(message.result.isError, true)
      texts.push(message.result.content[0].text)
    }
    refusals.push(texts)
  }
  assert.ok(refusals[0]?.every((text) => /too many calls in flight on this MCP session \(32\)/.test(text)))
  assert.ok(refusals[2]?.every((text) => /too many MCP calls in flight/.test(text)))
  while (server.requests.length < 64) await once(server.events, 'request')
  await new Promise((resolve) => setTimeout(resolve, 100))
  assert.equal(server.requests.length, 64, 'MCP sessions together hold at most a quarter of maxPending')

  // Everyone else still has the rest of the budget.
  const rest = await httpJson(`${url}/api/tools/call`, 'POST', { role: 'Lanlan', name: 'weather', arguments: {} })
  assert.equal(rest.statusCode, 200)
  assert.equal(rest.body.is_error, false, JSON.stringify(rest.body))
  for (const stream of streams) stream.abort()
})

test('a huge tools/list is sent in pages the client follows with nextCursor; a bad cursor is -32602', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['Lanlan'] })
  const filler = 'x'.repeat(60 * 1024)
  const names: string[] = []
  for (let i = 0; i < 90; i++) {
    const name = `tool_${String(i).padStart(2, '0')}`
    names.push(name)
    await tp.register({
      name,
      callback_url: 'http://127.0.0.1:9333/x',
      parameters: {
        type: 'object',
        properties: { q: { type: 'string', description: filler } }
      }
    })
  }
  const client = await sdkClient(t, `${url}/mcp/Lanlan`)
  const first = await client.listTools()
  assert.ok(first.nextCursor !== undefined, 'about 5.5 MB of tools do not fit one page')
  assert.ok(first.tools.length < 90)
  const seen = first.tools.map((tool) => tool.name)
  let cursor: string | undefined = first.nextCursor
  while (cursor !== undefined) {
    const page = await client.listTools({ cursor })
    seen.push(...page.tools.map((tool) => tool.name))
    cursor = page.nextCursor
  }
  assert.deepEqual(seen, names)
  await assert.rejects(client.listTools({ cursor: 'bogus' }), (err: unknown) => err instanceof McpError &&
    err.code === ErrorCode.InvalidParams)
})

test('a reply nested deeper than 4096 levels (200 000: 1.4 MB; 5 000: 35 KB) answers that MCP call with its text, without structuredContent, instead of vanishing', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['Lanlan'] })
  const nested = (depth: number): string => '{"a":'.repeat(depth) + '1' + '}'.repeat(depth)
  const { createServer } = await import('node:http')
  const plugin = createServer((req, res) => {
    req.resume()
    req.on('end', () => res.writeHead(200, { 'content-type': 'application/json' }).end(nested(Number((req.url ?? '').slice(1)))))
  })
  await new Promise<void>((resolve) => plugin.listen(0, '127.0.0.1', resolve))
  t.after(() => new Promise<void>((resolve) => { plugin.closeAllConnections(); plugin.close(() => resolve()) }))
  const address = plugin.address()
  const port = typeof address === 'object' && address !== null ? address.port : 0
  await tp.roles.get('Lanlan').registerLocalTool({ name: 'ok', handler: async () => 'fine' })
  const client = await sdkClient(t, `${url}/mcp/Lanlan`)
  for (const depth of [200_000, 5_000]) {
    await tp.register({ name: `deep_${depth}`, callback_url: `http://127.0.0.1:${port}/${depth}` })
    const result = await client.callTool({ name: `deep_${depth}`, arguments: {} }, undefined,
      { timeout: 20_000 }) as CallToolResult
    // Its text carries it, as POST /api/tools/call answers it; never as structuredContent.
    assert.equal(result.isError, false, String(depth))
    assert.equal(result.structuredContent, undefined, String(depth))
    assert.equal((result.content[0] as { text: string }).text, nested(depth))
  }
  // The session goes on.
  const next = await client.callTool({ name: 'ok', arguments: {} }) as CallToolResult
  assert.deepEqual(next.content, [{ type: 'text', text: 'fine' }])
})

test('the mcp.* options of createToolport set the endpoint\'s bounds', async (t) => {
  const { url } = await startToolport(t, { roles: ['Lanlan'], mcp: { maxSessions: 1 } })
  const endpoint = `${url}/mcp/Lanlan`
  const first = await rawSession(endpoint)
  const second = await rawSession(endpoint)
  assert.notEqual(first, second)
  const gone = await httpRequest(endpoint, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      'mcp-session-id': first,
      'mcp-protocol-version': LATEST
    },
    body: JSON.stringify({ jsonrpc: '2.0', id: 2, method: 'tools/list' })
  })
  await gone.body.dump()
  assert.equal(gone.statusCode, 404, 'the first session was evicted for the second (maxSessions 1)')
})

test('GET /api/tools/definitions answers a huge list in full; the JSON is the same as toolDefinitions gives', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['Lanlan', 'Mochi'] })
  const filler = 'y'.repeat(60 * 1024)
  for (let i = 0; i < 150; i++) {
    await tp.register({
      name: `tool_${i}`,
      role: 'Lanlan',
      callback_url: 'http://127.0.0.1:9333/x',
      parameters: { type: 'object', properties: { q: { type: 'string', description: filler } } }
    })
  }
  const { toolDefinitions } = await import('../../src/main/index.js')
  for (const format of ['openai-chat', 'gemini'] as const) {
    const res = await httpRequest(`${url}/api/tools/definitions?role=Lanlan&format=${format}`)
    assert.equal(res.statusCode, 200)
    assert.match(String(res.headers['content-type']), /application\/json/)
    const bytes = Buffer.from(await res.body.arrayBuffer())
    // Streamed tool by tool (test/integration/definitions-size.test.ts), with its exact length.
    assert.equal(Number(res.headers['content-length']), bytes.length)
    assert.ok(bytes.length > 9_000_000)
    const body = JSON.parse(bytes.toString('utf8')) as { ok: boolean, role: string, format: string, tools: unknown }
    assert.deepEqual(body, {
      ok: true,
      role: 'Lanlan',
      format,
      tools: JSON.parse(JSON.stringify(toolDefinitions(tp.roles.get('Lanlan'), format)))
    })
  }
  // A small list is answered as before, in one piece.
  await tp.register({ name: 'small', role: 'Mochi', callback_url: 'http://127.0.0.1:9333/x' })
  const small = await httpRequest(`${url}/api/tools/definitions?role=Mochi&format=mcp`)
  assert.equal(small.statusCode, 200)
  assert.ok(small.headers['content-length'] !== undefined)
  assert.deepEqual((await small.body.json() as { tools: Array<{ name: string }> }).tools.map((d) => d.name), ['small'])
})

test('calls in flight are bounded per client: the sessions a connection initialized share one budget', async (t) => {
  const { tp } = await startToolport(t, { roles: ['Lanlan'], dispatch: { closeGraceMs: 0 } })
  const server = await callbacks(t)
  await tp.register({ name: 'stuck', callback_url: `${server.url}/sleep/60000` })
  const mcp = await mcpOnlyApp(t, tp, { maxCallsPerSession: 3, maxCallsPerClient: 4 })
  const endpoint = mcp.endpoint('Lanlan')
  const connection = new UndiciClient(new URL(endpoint).origin)
  t.after(() => connection.close())
  const first = await rawSession(endpoint, LATEST, connection)
  const second = await rawSession(endpoint, LATEST, connection)
  const batch = (ids: number[]): unknown[] => ids.map((id) => ({
    jsonrpc: '2.0',
    id,
    method: 'tools/call',
    params: { name: 'stuck', arguments: {} }
  }))

  const one = await openStream(endpoint, 'POST', { 'mcp-session-id': first, 'mcp-protocol-version': LATEST }, batch([1,
    2, 3]))
  while (server.requests.length < 3) await once(server.events, 'request')
  const two = await openStream(endpoint, 'POST', { 'mcp-session-id': second, 'mcp-protocol-version': LATEST }, batch([4,
    5, 6]))
  const refused = [await nextMessage(two.events), await nextMessage(two.events)].map(({ message }) => message)
  for (const message of refused) {
    assert.equal(message.result.isError, true)
    assert.match(message.result.content[0].text, /too many calls in flight from this MCP client \(4\)/)
  }
  while (server.requests.length < 4) await once(server.events, 'request')
  await new Promise((resolve) => setTimeout(resolve, 100))
  assert.equal(server.requests.length, 4)
  one.abort()
  two.abort()
})
