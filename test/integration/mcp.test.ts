// The per-role MCP endpoint with the official SDK's Client over Streamable HTTP,
// against a real listening Toolport on 127.0.0.1 and real plugin callbacks (node:http).
import { test, type TestContext } from 'node:test'
import assert from 'node:assert/strict'
import { EventEmitter, once } from 'node:events'
import { connect, type Socket } from 'node:net'
import fastify from 'fastify'
import { request as httpRequest } from 'undici'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport, StreamableHTTPError } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import {
  ErrorCode, McpError, ToolListChangedNotificationSchema,
  type CallToolResult
} from '@modelcontextprotocol/sdk/types.js'
import { createToolport, type Toolport } from '../../src/main/index.js'
import { registerMcpRoutes } from '../../src/main/http/mcp-routes.js'
import type { McpSessions, McpSessionsOptions } from '../../src/main/sessions/mcp.js'
import { assertError, callbackServer as callbacks, httpJson, waitFor, within } from '../helpers.js'
import { kPendingCalls, kSyncCount } from '../../src/main/symbols.js'

const WEATHER_PARAMS = {
  type: 'object',
  properties: { location: { type: 'string' } },
  required: ['location']
}

interface Connected {
  client: Client
  transport: StreamableHTTPClientTransport
  /** Emits 'list-changed' for every notifications/tools/list_changed the client receives. */
  notices: EventEmitter
  /** How many list_changed notifications arrived so far. */
  readonly noticeCount: number
}

interface Setup {
  tp: Toolport
  url: string
  connect: (role: string, base?: string) => Promise<Connected>
}

/** A Toolport on 127.0.0.1:0 with roles Lanlan and Mochi; clients close before it does. */
async function setup (t: TestContext): Promise<Setup> {
  const tp = await createToolport({ roles: ['Lanlan', 'Mochi'], logger: false, dispatch: { mode: 'inline' } })
  const { url } = await tp.listen({ host: '127.0.0.1', port: 0 })
  const clients: Client[] = []
  t.after(async () => {
    for (const client of clients) await client.close()
    await tp.close()
  })
  async function connect (role: string, base = url): Promise<Connected> {
    const client = new Client({ name: 'toolport-test', version: '1.0.0' })
    const notices = new EventEmitter()
    let noticeCount = 0
    client.setNotificationHandler(ToolListChangedNotificationSchema, () => {
      noticeCount++
      notices.emit('list-changed')
    })
    const transport = new StreamableHTTPClientTransport(new URL(`${base}/mcp/${encodeURIComponent(role)}`))
    clients.push(client)
    await client.connect(transport)
    return { client, transport, notices, get noticeCount () { return noticeCount } }
  }
  return { tp, url, connect }
}

async function register (url: string, body: Record<string, unknown>): Promise<void> {
  const reply = await httpJson(`${url}/api/tools/register`, 'POST', body)
  assert.equal(reply.statusCode, 200)
  assert.equal(reply.body.ok, true, JSON.stringify(reply.body))
  assert.deepEqual(reply.body.failed_roles, [])
}

function textOf (result: CallToolResult): string {
  const first = result.content[0]
  assert.ok(first !== undefined && first.type === 'text')
  return first.text
}

const INITIALIZE = {
  jsonrpc: '2.0',
  id: 1,
  method: 'initialize',
  params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'raw', version: '1' } }
}

async function rawMcp (url: string, method: 'POST' | 'GET' | 'DELETE', body?: unknown, headers: Record<string,
  string> = {}) {
  const res = await httpRequest(url, {
    method,
    headers: {
      accept: 'application/json, text/event-stream',
      ...(body === undefined ? {} : { 'content-type': 'application/json' }),
      ...headers
    },
    ...(body === undefined ? {} : { body: JSON.stringify(body) })
  })
  const text = await res.body.text()
  return { statusCode: res.statusCode, headers: res.headers, body: text === '' ? undefined : JSON.parse(text) }
}

test('MCP: tools/list, then a registration over HTTP sends list_changed, and the next tools/list has the tool', async (t) => {
  const { url, connect } = await setup(t)
  const { client, notices } = await connect('Lanlan')
  assert.deepEqual((await client.listTools()).tools, [])

  const changed = once(notices, 'list-changed')
  await register(url, {
    name: 'get_weather',
    description: 'Get weather for a location.',
    parameters: WEATHER_PARAMS,
    callback_url: 'http://127.0.0.1:9333/tools/get_weather',
    role: 'Lanlan'
  })
  await changed
  const { tools } = await client.listTools()
  assert.deepEqual(tools, [{
    name: 'get_weather',
    description: 'Get weather for a location.',
    inputSchema: WEATHER_PARAMS
  }])
})

test('MCP: a registration, unregister and clear answer only once list_changed has left for the client\'s event stream socket, not merely been queued (docs/protocol.md R8)', async (t) => {
  const { tp, connect } = await setup(t)
  const serverSockets: Socket[] = []
  tp.app.server.on('connection', (socket: Socket) => { serverSockets.push(socket) })
  const { client, notices } = await connect('Lanlan')
  await client.listTools()
  // Every change below is announced on the event stream (opened by connect(), on a socket of its
  // own); the client lists again after each, so that the next change is announced too.
  const changes: Array<() => Promise<unknown>> = [
    () => tp.register({ name: 'a', callback_url: 'http://127.0.0.1:9333/a', source: 'plugin:x' }),
    () => tp.unregister({ name: 'a' }),
    () => tp.register({ name: 'b', callback_url: 'http://127.0.0.1:9333/b', source: 'plugin:x' }),
    () => tp.clear({ source: 'plugin:x' })
  ]
  for (const change of changes) {
    const changed = once(notices, 'list-changed')
    const before = serverSockets.map((socket) => socket.bytesWritten)
    await change()
    // Right as the change resolves: the notice was written (bytesWritten counts what is still
    // buffered too) and nothing is left in any socket's buffer, i.e. it was handed to the kernel.
    assert.ok(serverSockets.some((socket, i) => socket.bytesWritten > (before[i] ?? 0)), 'no notice written')
    assert.deepEqual(serverSockets.map((socket) => socket.writableLength), serverSockets.map(() => 0))
    await changed
    await client.listTools()
  }
})

test('MCP: a client that stopped reading its event stream does not hold changes to its role: the notice is queued for it, the API call answers', async (t) => {
  const tp = await createToolport({ roles: ['Lanlan'], logger: false, dispatch: { mode: 'inline' }, syncTimeoutMs: 120_000 })
  t.after(() => tp.close())
  const { url, port } = await tp.listen({ host: '127.0.0.1', port: 0 })
  const serverSockets: Socket[] = []
  tp.app.server.on('connection', (socket: Socket) => { serverSockets.push(socket) })
  const endpoint = `${url}/mcp/Lanlan`
  const post = async (body: unknown, headers: Record<string, string> = {}) => await httpRequest(endpoint, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', ...headers },
    body: JSON.stringify(body)
  })
  const init = await post(INITIALIZE)
  const sessionId = String(init.headers['mcp-session-id'])
  await init.body.dump()
  const session = { 'mcp-session-id': sessionId, 'mcp-protocol-version': '2025-06-18' }
  await (await post({ jsonrpc: '2.0', method: 'notifications/initialized' }, session)).body.dump()
  await (await post({ jsonrpc: '2.0', id: 2, method: 'tools/list' }, session)).body.dump()
  // The event stream on a raw socket that reads nothing after its headers.
  const stream = connect(port, '127.0.0.1')
  t.after(() => stream.destroy())
  await once(stream, 'connect')
  stream.write(`GET /mcp/Lanlan HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\naccept: text/event-stream\r\n` +
    `mcp-session-id: ${sessionId}\r\nmcp-protocol-version: 2025-06-18\r\n\r\n`)
  await once(stream, 'data')
  stream.pause()
  const server = serverSockets.find((socket) => socket.remotePort === stream.localPort)
  assert.ok(server !== undefined)
  // Its socket backs up as unread notices leave it: the kernel's buffers full, a little left in
  // Node's, short of its high-water mark (SSE comments of 1 KiB: nothing a client reads as an
  // event). Bounded: the kernel takes a few MB.
  const comment = `:${' '.repeat(1021)}\n\n`
  for (let written = 0; server.writableLength === 0 && written < 256 * 1024 * 1024; written += comment.length) {
    server.write(comment)
  }
  assert.ok(server.writableLength > 0 && !server.writableNeedDrain, String(server.writableLength))
  for (const name of ['a', 'b', 'c']) {
    const result = await within(tp.register({ name, callback_url: `http://127.0.0.1:9333/${name}` }),
      'the registration, held by the event stream nobody reads', 20_000)
    assert.deepEqual(result, { ok: true, registered: name, affected_roles: ['Lanlan'], failed_roles: [] })
  }
})

test('MCP: tools/list keeps registration order, and a replaced tool moves to the end (R5)', async (t) => {
  const { url, connect } = await setup(t)
  const { client, notices } = await connect('Lanlan')
  await client.listTools()
  for (const name of ['alpha', 'beta', 'gamma']) {
    const changed = once(notices, 'list-changed')
    await register(url, { name, callback_url: `http://127.0.0.1:9333/${name}` })
    await changed
    await client.listTools()
  }
  const changed = once(notices, 'list-changed')
  await register(url, { name: 'alpha', description: 'new', callback_url: 'http://127.0.0.1:9333/alpha' })
  await changed
  assert.deepEqual((await client.listTools()).tools.map((tool) => tool.name), ['beta', 'gamma', 'alpha'])
})

test('MCP: unregister and clear over HTTP send list_changed too (docs/protocol.md R15, R16)', async (t) => {
  const { url, connect } = await setup(t)
  const { client, notices } = await connect('Lanlan')
  await register(url, { name: 'a', source: 'plugin:x', callback_url: 'http://127.0.0.1:9333/a' })
  await register(url, { name: 'b', source: 'plugin:x', callback_url: 'http://127.0.0.1:9333/b' })
  await register(url, { name: 'c', callback_url: 'http://127.0.0.1:9333/c' })
  assert.deepEqual((await client.listTools()).tools.map((tool) => tool.name), ['a', 'b', 'c'])

  let changed = once(notices, 'list-changed')
  assert.equal((await httpJson(`${url}/api/tools/unregister`, 'POST', { name: 'c' })).body.removed, true)
  await changed
  assert.deepEqual((await client.listTools()).tools.map((tool) => tool.name), ['a', 'b'])

  changed = once(notices, 'list-changed')
  // Two tools in each of the two roles (registered with role: null).
  assert.equal((await httpJson(`${url}/api/tools/clear`, 'POST', { source: 'plugin:x' })).body.removed, 4)
  await changed
  assert.deepEqual((await client.listTools()).tools, [])
})

test('MCP: a parameters schema without type "object" is listed with one, so the client accepts the whole list', async (t) => {
  const { url, connect } = await setup(t)
  const { client } = await connect('Lanlan')
  await register(url, {
    name: 'loose',
    parameters: { properties: { q: { type: 'string' } } },
    callback_url: 'http://127.0.0.1:9333/l'
  })
  await register(url, { name: 'plain', callback_url: 'http://127.0.0.1:9333/p' })
  const { tools } = await client.listTools()
  assert.deepEqual(tools.map((tool) => [tool.name, tool.inputSchema]), [
    ['loose', { type: 'object', properties: { q: { type: 'string' } } }],
    ['plain', { type: 'object', properties: {} }]
  ])
})

test('MCP, R9-R10: tools/call POSTs to the plugin callback and answers text, isError false and structuredContent', async (t) => {
  const { url, connect } = await setup(t)
  const server = await callbacks(t)
  const { client } = await connect('Lanlan')
  await register(url, { name: 'get_weather', parameters: WEATHER_PARAMS, callback_url: `${server.url}/raw-output` })

  const result = await client.callTool({ name: 'get_weather', arguments: { location: 'Shanghai' } }) as CallToolResult
  assert.equal(result.isError, false)
  assert.equal(textOf(result), '{"temperature_c":28}')
  assert.deepEqual(result.structuredContent, { temperature_c: 28 })
  assert.equal(server.requests.length, 1)
  const sent = JSON.parse(server.requests[0]!.body)
  assert.equal(sent.name, 'get_weather')
  assert.deepEqual(sent.arguments, { location: 'Shanghai' })
  assert.deepEqual(JSON.parse(sent.raw_arguments), { location: 'Shanghai' })
})

test('MCP, R11: a tool-level error is isError true with the error as text, and no structuredContent', async (t) => {
  const { url, connect } = await setup(t)
  const server = await callbacks(t)
  const { client } = await connect('Lanlan')
  await register(url, { name: 'get_weather', callback_url: `${server.url}/tool-error` })
  const result = await client.callTool({ name: 'get_weather', arguments: {} }) as CallToolResult
  assert.equal(result.isError, true)
  assert.deepEqual(JSON.parse(textOf(result)), { error: 'location not found' })
  assert.equal(result.structuredContent, undefined)
})

test('MCP, R12: a text reply is text content without structuredContent; arguments failing the schema are an isError result', async (t) => {
  const { url, connect } = await setup(t)
  const server = await callbacks(t)
  const { client } = await connect('Lanlan')
  await register(url, { name: 'texty', callback_url: `${server.url}/text` })
  await register(url, { name: 'strict', parameters: WEATHER_PARAMS, callback_url: `${server.url}/echo` })

  const text = await client.callTool({ name: 'texty', arguments: {} }) as CallToolResult
  assert.equal(text.isError, false)
  assert.equal(textOf(text), 'plain text reply, not JSON')
  assert.equal(text.structuredContent, undefined)

  const invalid = await client.callTool({ name: 'strict', arguments: { location: 42 } }) as CallToolResult
  assert.equal(invalid.isError, true)
  assert.deepEqual(server.requests.map((r) => r.path), ['/text'], 'the plugin is not called with invalid arguments')
})

test('MCP: an unknown tool is the JSON-RPC error -32602 (MCP "unknown tool") naming the available tools, and is still counted', async (t) => {
  const { tp, url, connect } = await setup(t)
  const { client } = await connect('Lanlan')
  await register(url, { name: 'get_weather', callback_url: 'http://127.0.0.1:9333/x' })
  const finished = once(tp, 'call-finished')
  await assert.rejects(client.callTool({ name: 'nope', arguments: {} }), (err: unknown) => {
    assert.ok(err instanceof McpError)
    assert.equal(err.code, ErrorCode.InvalidParams)
    assert.match(err.message, /unknown tool 'nope'.*get_weather/)
    return true
  })
  const [event] = await finished
  assert.equal(event.outcome, 'unknown_tool')
})

test('MCP: notifications/cancelled aborts the running call, and the session keeps working', async (t) => {
  const { tp, url, connect } = await setup(t)
  const server = await callbacks(t)
  const { client } = await connect('Lanlan')
  await register(url, { name: 'slow', callback_url: `${server.url}/sleep/60000` })
  await register(url, { name: 'fast', callback_url: `${server.url}/raw-output` })

  const controller = new AbortController()
  const arrived = once(server.events, 'request')
  const finished = once(tp, 'call-finished')
  const call = client.callTool({ name: 'slow', arguments: {} }, undefined, { signal: controller.signal })
  await arrived
  controller.abort(new Error('the user changed their mind'))
  await assert.rejects(call)
  const [event] = await finished
  assert.equal(event.name, 'slow')
  assert.equal(event.outcome, 'cancelled')

  const next = await client.callTool({ name: 'fast', arguments: {} }) as CallToolResult
  assert.equal(next.isError, false)
  assert.deepEqual(next.structuredContent, { temperature_c: 28 })
})

test('MCP: sessions of two roles are isolated: each lists, calls and is notified for its own role only', async (t) => {
  const { tp, url, connect } = await setup(t)
  const server = await callbacks(t)
  const lanlan = await connect('Lanlan')
  const mochi = await connect('Mochi')
  await lanlan.client.listTools()
  await mochi.client.listTools()

  const lanlanChanged = once(lanlan.notices, 'list-changed')
  await register(url, { name: 'lanlan_tool', role: 'Lanlan', callback_url: `${server.url}/raw-output` })
  await lanlanChanged
  const lanlanSyncs = tp.roles.get('Lanlan')[kSyncCount]
  const mochiChanged = once(mochi.notices, 'list-changed')
  await register(url, { name: 'mochi_tool', role: 'Mochi', callback_url: `${server.url}/raw-output` })
  await mochiChanged

  assert.equal(tp.roles.get('Lanlan')[kSyncCount], lanlanSyncs, "Mochi's registration does not sync Lanlan's sessions")
  assert.deepEqual((await lanlan.client.listTools()).tools.map((tool) => tool.name), ['lanlan_tool'])
  assert.deepEqual((await mochi.client.listTools()).tools.map((tool) => tool.name), ['mochi_tool'])
  await assert.rejects(mochi.client.callTool({ name: 'lanlan_tool', arguments: {} }),
    (err: unknown) => err instanceof McpError && err.code === ErrorCode.InvalidParams)
  assert.equal(server.requests.length, 0)
  assert.equal(lanlan.noticeCount, 1)
})

test('MCP: a role with the longest name (128 characters of 3 bytes of UTF-8 each) is reachable at /mcp/{role} (README "Options": roles)', async (t) => {
  const { tp, connect } = await setup(t)
  // Percent-encoded, its path segment is 9 characters per character: 1152 in all.
  const role = 'ロ'.repeat(128)
  tp.roles.add(role)
  const connected = await connect(role)
  assert.deepEqual((await connected.client.listTools()).tools, [])
  assert.equal(tp.roles.get(role).sessions().length, 1)
})

test('MCP: each MCP session is a ModelSession of its role from initialize on', async (t) => {
  const { tp, connect } = await setup(t)
  const role = tp.roles.get('Lanlan')
  assert.equal(role.sessions().length, 0)
  const first = await connect('Lanlan')
  const second = await connect('Lanlan')
  const ids = role.sessions().map((s) => s.id)
  assert.deepEqual(role.sessions().map((s) => (s as { sessionId?: string }).sessionId).sort(),
    [first.transport.sessionId, second.transport.sessionId].sort())
  // The ModelSession id (what sync errors print) is not the session's handle.
  for (const id of ids) assert.match(id, /^mcp-[0-9a-f-]{36}$/)
  const handles = [String(first.transport.sessionId), String(second.transport.sessionId)]
  assert.ok(!ids.some((id) => handles.some((handle) => id.includes(handle))))
  assert.equal(tp.roles.get('Mochi').sessions().length, 0)
})

test('MCP: every listing session of the role is notified of one registration', async (t) => {
  const { url, connect } = await setup(t)
  const first = await connect('Lanlan')
  const second = await connect('Lanlan')
  await first.client.listTools()
  await second.client.listTools()
  const both = Promise.all([once(first.notices, 'list-changed'), once(second.notices, 'list-changed')])
  await register(url, { name: 'shared', callback_url: 'http://127.0.0.1:9333/s' })
  await both
})

test('MCP: DELETE ends the session and detaches it from its role; its id is then unknown (404)', async (t) => {
  const { tp, url, connect } = await setup(t)
  const { transport } = await connect('Lanlan')
  const sessionId = transport.sessionId as string
  assert.equal(tp.roles.get('Lanlan').sessions().length, 1)
  await transport.terminateSession()
  assert.equal(tp.roles.get('Lanlan').sessions().length, 0)
  const again = await rawMcp(`${url}/mcp/Lanlan`, 'POST', { jsonrpc: '2.0', id: 2, method: 'tools/list' },
    { 'mcp-session-id': sessionId, 'mcp-protocol-version': '2025-06-18' })
  assert.equal(again.statusCode, 404)
  assert.equal(again.body.error.code, -32001)
})

test('MCP: a DELETE with a call in flight answers that call at once with -32603 naming the client\'s end, and cancels its callback call', async (t) => {
  const { tp, url, connect } = await setup(t)
  const server = await callbacks(t)
  await register(url, { name: 'slow', role: 'Lanlan', callback_url: `${server.url}/sleep/30000` })
  const { client, transport } = await connect('Lanlan')
  const started = Date.now()
  // The client's own timeout is far away: only Toolport's answer can end the call in time.
  const call = client.callTool({ name: 'slow', arguments: {} }, undefined, { timeout: 60_000 })
  const outcome = call.then(() => null, (err: unknown) => err)
  await waitFor('the call reaches the plugin', () => server.requests.length === 1)
  await transport.terminateSession()
  const err = await outcome
  assert.ok(err instanceof McpError, String(err))
  assert.equal(err.code, ErrorCode.InternalError)
  assert.match(err.message, /session ended before the call finished \(the client ended it\)/)
  assert.ok(Date.now() - started < 30_000)
  await waitFor('the callback call is cancelled', () => tp[kPendingCalls] === 0)
})

test('MCP, R6: an unknown role is 404 TP_ERR_ROLE_NOT_FOUND, for raw requests and for the SDK client', async (t) => {
  const { url, connect } = await setup(t)
  assertError(await rawMcp(`${url}/mcp/Nobody`, 'POST', INITIALIZE), 404, 'TP_ERR_ROLE_NOT_FOUND')
  assertError(await rawMcp(`${url}/mcp/Nobody`, 'GET', undefined, { accept: 'text/event-stream' }), 404,
    'TP_ERR_ROLE_NOT_FOUND')
  await assert.rejects(connect('Nobody'), (err: unknown) => err instanceof StreamableHTTPError && err.code === 404)
})

test('MCP: a request without a session that is not initialize is 400; a session of another role is 404', async (t) => {
  const { url, connect } = await setup(t)
  const list = await rawMcp(`${url}/mcp/Lanlan`, 'POST', { jsonrpc: '2.0', id: 1, method: 'tools/list' })
  assert.equal(list.statusCode, 400)
  assert.equal(list.body.jsonrpc, '2.0')
  const { transport } = await connect('Lanlan')
  const crossed = await rawMcp(`${url}/mcp/Mochi`, 'POST', { jsonrpc: '2.0', id: 1, method: 'tools/list' },
    { 'mcp-session-id': transport.sessionId as string, 'mcp-protocol-version': '2025-06-18' })
  assert.equal(crossed.statusCode, 404)
})

test('MCP, R1: the guard covers /mcp: a foreign Origin, a rebinding Host and a non-JSON body are refused', async (t) => {
  const { url } = await setup(t)
  const endpoint = `${url}/mcp/Lanlan`
  assertError(await rawMcp(endpoint, 'POST', INITIALIZE, { origin: 'https://evil.example' }), 403,
    'TP_ERR_ORIGIN_FORBIDDEN')
  assertError(await rawMcp(endpoint, 'POST', INITIALIZE, { host: 'evil.example' }), 403, 'TP_ERR_HOST_FORBIDDEN')
  assertError(await rawMcp(endpoint, 'POST', INITIALIZE, { 'content-type': 'text/plain' }), 415,
    'TP_ERR_UNSUPPORTED_MEDIA_TYPE')
})

/** A fastify app with only the MCP routes, with session options a test can shorten. */
async function mcpOnlyApp (t: TestContext, tp: Toolport, options: McpSessionsOptions): Promise<{
  url: string,
  sessions: McpSessions,
  close: () => Promise<void>
}> {
  const app = fastify({ forceCloseConnections: true })
  const sessions = registerMcpRoutes(app, tp, options)
  await app.listen({ host: '127.0.0.1', port: 0 })
  const address = app.server.address()
  const port = typeof address === 'object' && address !== null ? address.port : 0
  let isClosed = false
  const close = async (): Promise<void> => {
    if (isClosed) return
    isClosed = true
    await app.close()
  }
  t.after(close)
  return { url: `http://127.0.0.1:${port}`, sessions, close }
}

test('MCP: a client that disconnects (event stream closed, not reopened) is detached after the grace period', async (t) => {
  const { tp, url, connect } = await setup(t)
  const mcpOnly = await mcpOnlyApp(t, tp, { reconnectGraceMs: 0 })
  const { client, notices } = await connect('Lanlan', mcpOnly.url)
  await client.listTools()
  // A list_changed can only travel on the event stream: once one arrives, the stream is open.
  const changed = once(notices, 'list-changed')
  await register(url, { name: 'x', callback_url: 'http://127.0.0.1:9333/x' })
  await changed
  assert.equal(tp.roles.get('Lanlan').sessions().length, 1)

  const closed = once(mcpOnly.sessions, 'session-closed')
  await client.close()
  const [event] = await closed
  assert.equal(event.role, 'Lanlan')
  assert.equal(event.reason, 'idle')
  assert.equal(tp.roles.get('Lanlan').sessions().length, 0)
})

test('MCP: a session with a call still running is not ended as idle when the call\'s own stream drops', async (t) => {
  const { tp, url } = await setup(t)
  const server = await callbacks(t)
  // No grace: a session whose event stream went away, with nothing else open, is ended at once.
  const mcpOnly = await mcpOnlyApp(t, tp, { reconnectGraceMs: 0 })
  await register(url, { name: 'slowish', callback_url: `${server.url}/sleep/300` })
  const endpoint = `${mcpOnly.url}/mcp/Lanlan`
  const post = async (body: unknown, headers: Record<string, string> = {}) => await httpRequest(endpoint, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', ...headers },
    body: JSON.stringify(body)
  })
  const init = await post(INITIALIZE)
  const session = { 'mcp-session-id': String(init.headers['mcp-session-id']), 'mcp-protocol-version': '2025-06-18' }
  await init.body.dump()
  await (await post({ jsonrpc: '2.0', method: 'notifications/initialized' }, session)).body.dump()
  const events = await httpRequest(endpoint, { method: 'GET', headers: { ...session, accept: 'text/event-stream' } })
  assert.equal(events.statusCode, 200)
  const order: string[] = []
  const finished = once(tp, 'call-finished').then(([event]) => { order.push(`call ${String(event.outcome)}`) })
  const closed = once(mcpOnly.sessions, 'session-closed').then(([event]) => { order.push(`session ${String(event.reason)}`) })
  const arrived = once(server.events, 'request')
  const call = await post({ jsonrpc: '2.0', id: 2, method: 'tools/call', params: { name: 'slowish', arguments: {} } }, session)
  await arrived
  // The client goes quiet: its event stream and then the call's stream drop (a network blip).
  events.body.destroy()
  await new Promise((resolve) => setTimeout(resolve, 20))
  call.body.destroy()
  await Promise.all([finished, closed])
  assert.deepEqual(order, ['call ok', 'session idle'], 'the call ran to its end, and only then did the idle session end')
})

test('MCP: closing the server ends every session, aborts its running calls and detaches it', async (t) => {
  const { tp, url, connect } = await setup(t)
  const server = await callbacks(t)
  const mcpOnly = await mcpOnlyApp(t, tp, {})
  const { client } = await connect('Lanlan', mcpOnly.url)
  await register(url, { name: 'slow', callback_url: `${server.url}/sleep/60000` })
  const arrived = once(server.events, 'request')
  const finished = once(tp, 'call-finished')
  const call = client.callTool({ name: 'slow', arguments: {} })
  call.catch(() => {})
  await arrived

  const closed = once(mcpOnly.sessions, 'session-closed')
  await mcpOnly.close()
  const [event] = await closed
  assert.equal(event.reason, 'closed')
  assert.equal((await finished)[0].outcome, 'cancelled')
  assert.equal(tp.roles.get('Lanlan').sessions().length, 0)
  assert.equal(mcpOnly.sessions.size, 0)
})

test('MCP, R6: after its role is removed, a session answers 404 TP_ERR_ROLE_NOT_FOUND and ends', async (t) => {
  const { tp, connect } = await setup(t)
  const mcpOnly = await mcpOnlyApp(t, tp, {})
  const { client } = await connect('Mochi', mcpOnly.url)
  const closed = once(mcpOnly.sessions, 'session-closed')
  tp.roles.remove('Mochi')
  await assert.rejects(client.listTools(), (err: unknown) => err instanceof StreamableHTTPError && err.code === 404)
  const [event] = await closed
  assert.equal(event.role, 'Mochi')
  assert.equal(event.reason, 'role-removed')
  assert.equal(mcpOnly.sessions.size, 0)
})
