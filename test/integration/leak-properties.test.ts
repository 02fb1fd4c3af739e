// Resources of a long-running Toolport that must stay bounded under churn: roles added and removed
// (agents named per conversation), sessions opened and closed, plugins coming and going. Each test
// churns one thing a few hundred to a few thousand times against real components (a listening
// Toolport on 127.0.0.1, real sockets, the official MCP SDK client, real worker threads) and then
// reads what is left through public surfaces (HTTP routes, getters, listener counts, the process's
// active resources) or, where nothing public shows it, through the heap after a full GC. No timing
// decides a result; waits are bounded only so that what never comes fails instead of hanging.
import assert from 'node:assert/strict'
import { test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import v8 from 'node:v8'
import vm from 'node:vm'
import fastify from 'fastify'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { createPlugin } from '../../src/plugin/index.js'
import { createRealtimeSession, type RealtimeSession } from '../../src/main/index.js'
import { registerMcpRoutes } from '../../src/main/http/mcp-routes.js'
import { observerOf } from '../../src/main/observe/observer.js'
import { request as undiciRequest } from 'undici'
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http'
import type { Worker } from 'node:worker_threads'
import { kWorkerThreads } from '../../src/main/symbols.js'
import type { McpCloseReason } from '../../src/main/sessions/mcp.js'
import { createTestToolport, httpJson, listenOnLoopback, session, startToolport, waitFor, within } from '../helpers.js'

v8.setFlagsFromString('--expose-gc')
const gc = vm.runInNewContext('gc') as () => void

/** Bytes of heap in use after full collections (turns between them let weak callbacks run). */
async function heapAfterGc (): Promise<number> {
  for (let i = 0; i < 4; i++) {
    gc()
    await sleep(20)
  }
  return process.memoryUsage().heapUsed
}

const MiB = 1024 * 1024

/** Objects of each of `names` (constructor names) on the heap, from a heap snapshot (which collects first). */
async function heapObjects (names: readonly string[]): Promise<Record<string, number>> {
  const chunks: Buffer[] = []
  for await (const chunk of v8.getHeapSnapshot()) chunks.push(chunk as Buffer)
  const snapshot = JSON.parse(Buffer.concat(chunks).toString('utf8')) as {
    snapshot: { meta: { node_fields: string[], node_types: [string[]] } }, nodes: number[], strings: string[]
  }
  const fields = snapshot.snapshot.meta.node_fields
  const types = snapshot.snapshot.meta.node_types[0]
  const stride = fields.length
  const nameAt = fields.indexOf('name')
  const typeAt = fields.indexOf('type')
  const counts: Record<string, number> = Object.fromEntries(names.map((name) => [name, 0]))
  for (let i = 0; i < snapshot.nodes.length; i += stride) {
    if (types[snapshot.nodes[i + typeAt] as number] !== 'object') continue
    const name = snapshot.strings[snapshot.nodes[i + nameAt] as number] as string
    if (Object.hasOwn(counts, name)) counts[name] = (counts[name] as number) + 1
  }
  return counts
}

test('the console\'s last syncs stay bounded by the roles that exist: a role removed while its sync runs leaves ' +
  'no entry behind (docs/architecture.md: observer.ts "one per runtime, bounded")', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['base'] })
  // The console's observer exists once the app serves its routes.
  assert.equal((await httpJson(`${url}/api/console/state`, 'GET')).statusCode, 200)
  const ROLES = 300
  for (let i = 0; i < ROLES; i++) {
    const name = `conversation-${i}`
    const role = tp.roles.add(name)
    // A session slow to take the tools (a realtime socket waiting for its ack): the role's sync is
    // still running when the conversation ends and its role is removed.
    const slow = session(`s-${i}`, 'gated')
    role.attachSession(slow)
    await slow.waitForCalls(1)
    assert.equal(tp.roles.remove(name), true)
    // The removal ends the role's sync: its push is aborted, and the sync settles after it.
    await waitFor(`the sync of ${name} to end`, () => slow.aborted === 1, 5_000)
    slow.release()
    await within(slow.waitIdle(), `the push of ${name} to settle`, 5_000)
    await new Promise((resolve) => setImmediate(resolve))
  }
  // Every name comes back as a new role that never synced (no session): a last sync shown for
  // one is the entry its removed namesake left behind; there is one per removed role if the
  // observer keeps them.
  for (let i = 0; i < ROLES; i++) tp.roles.add(`conversation-${i}`)
  const state = await httpJson(`${url}/api/console/state`, 'GET')
  assert.equal(state.statusCode, 200)
  const left = (state.body.roles as Array<{ name: string, last_sync: unknown }>)
    .filter((role) => role.name.startsWith('conversation-') && role.last_sync !== null)
  assert.equal(left.length, 0, `${left.length} of ${ROLES} removed roles left their last sync behind, e.g. ` +
    JSON.stringify(left[0]))
})

test('a plugin for every role remembers only the takeovers it still sees: roles made and removed per ' +
  'conversation, each with its name taken by another source, leave no memory behind (README "Plugin SDK": ' +
  '"A name another source … has taken over is left alone, with one warning")', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['base'] })
  const warnings: string[] = []
  const plugin = createPlugin({
    toolportUrl: url,
    source: 'plugin:weather',
    role: null,
    pollIntervalMs: 10,
    maxBackoffMs: 200,
    logger: { warn: (message) => { warnings.push(message) } },
    tools: { get_weather: { description: 'Weather.', handler: () => ({ temperature_c: 28 }) } }
  })
  plugin.on('error', () => {})
  t.after(() => plugin.stop({ graceMs: 0 }))
  await plugin.start()
  // Another plugin holds the name in each conversation's role. Its callback URL is long (32 KiB of
  // path, well within a registration body), so that what the plugin keeps per takeover shows on
  // the heap: the remembered takeover names that URL.
  const otherUrl = `http://127.0.0.1:9/${'x'.repeat(32 * 1024)}/get_weather`
  let conversation = 0
  const converse = async (): Promise<void> => {
    const name = `conversation-${conversation++}`
    tp.roles.add(name)
    await tp.register({ role: name, source: 'plugin:other', name: 'get_weather', callback_url: otherUrl })
    // The plugin's checks (the role-added event, then every poll) see the takeover and warn once.
    await waitFor(`the plugin's warning about ${name}`, () => warnings.some((w) => w.includes(`"${name}"`)), 10_000)
    assert.equal(tp.roles.remove(name), true)
  }
  for (let i = 0; i < 20; i++) await converse()
  const before = await heapAfterGc()
  const CONVERSATIONS = 150
  for (let i = 0; i < CONVERSATIONS; i++) await converse()
  // Let a check run on the listing without the last role, as it would in a long-running plugin.
  const checked = warnings.length
  tp.roles.add('after')
  await tp.register({ role: 'after', source: 'plugin:other', name: 'get_weather', callback_url: otherUrl })
  await waitFor('a check after the conversations', () => warnings.length > checked, 10_000)
  const grown = (await heapAfterGc()) - before
  t.diagnostic(`heap growth over ${CONVERSATIONS} conversations: ${(grown / MiB).toFixed(2)} MiB`)
  // Kept, each takeover holds its 32 KiB URL: ~4.8 MiB for 150 conversations.
  assert.ok(grown < 1.5 * MiB, `the heap grew by ${(grown / MiB).toFixed(2)} MiB over ${CONVERSATIONS} conversations ` +
    `(${Math.round(grown / CONVERSATIONS)} bytes each)`)
})

test('MCP sessions ended every way (DELETE, client gone and idle past its grace, evicted, role removed) leave nothing behind: ' +
  'no session object, runtime listener or timer outlives them (src/main/sessions/mcp.ts: "A session attaches ' +
  'to its role once the client has initialized, and detaches when it ends")', async (t) => {
  const tp = await createTestToolport(t, { roles: ['base'] })
  await tp.roles.get('base').registerLocalTool({ name: 'echo', handler: () => ({ ok: true }) })
  const MAX_SESSIONS = 8
  const app = fastify({ forceCloseConnections: true })
  const sessions = registerMcpRoutes(app, tp, { reconnectGraceMs: 0, maxSessions: MAX_SESSIONS })
  await app.listen({ host: '127.0.0.1', port: 0 })
  t.after(() => app.close())
  const address = app.server.address()
  const url = `http://127.0.0.1:${typeof address === 'object' && address !== null ? address.port : 0}`
  const reasons: Record<string, number> = {}
  sessions.on('session-closed', ({ reason }) => { reasons[reason] = (reasons[reason] ?? 0) + 1 })
  const listenersBefore = Object.fromEntries(tp.eventNames().map((name) => [String(name), tp.listenerCount(name)]))
  const timersBefore = process.getActiveResourcesInfo().filter((r) => r === 'Timeout').length

  const ended: Array<WeakRef<object>> = []
  const kept: Client[] = []
  const open = async (role: string): Promise<Client> => {
    const client = new Client({ name: 'leak-test', version: '1.0.0' })
    await client.connect(new StreamableHTTPClientTransport(new URL(`${url}/mcp/${role}`)))
    const known = new Set(ended.map((ref) => ref.deref()))
    for (const s of tp.roles.get(role).sessions()) if (!known.has(s)) ended.push(new WeakRef(s))
    return client
  }
  const ROUNDS = 120
  for (let i = 0; i < ROUNDS; i++) {
    // Ended by DELETE.
    let client = await open('base')
    await client.callTool({ name: 'echo', arguments: {} })
    await (client.transport as StreamableHTTPClientTransport).terminateSession()
    await client.close()
    // The client goes away without a DELETE: its event stream closed, the session ends as idle
    // once the grace period (0 here) passes.
    client = await open('base')
    await client.callTool({ name: 'echo', arguments: {} })
    await client.close()
    // Kept open: evicted to make room once MAX_SESSIONS are open.
    kept.push(await open('base'))
    // A conversation's role, removed with its session open.
    const role = `conversation-${i}`
    tp.roles.add(role)
    await tp.roles.get(role).registerLocalTool({ name: 'echo', handler: () => ({ ok: true }) })
    client = await open(role)
    await client.callTool({ name: 'echo', arguments: {} })
    tp.roles.remove(role)
    await client.close()
  }
  for (const client of kept) await client.close()
  await waitFor('every session to end', () => sessions.size === 0 && tp.roles.get('base').sessions().length === 0)
  for (const reason of ['deleted', 'idle', 'evicted', 'role-removed'] satisfies McpCloseReason[]) {
    assert.ok((reasons[reason] ?? 0) > 0, `some sessions ended as ${reason}: ${JSON.stringify(reasons)}`)
  }
  assert.equal(ended.length, ROUNDS * 4)
  await heapAfterGc()
  const alive = ended.filter((ref) => ref.deref() !== undefined).length
  assert.equal(alive, 0, `${alive} of ${ended.length} ended MCP sessions are still reachable`)
  const listenersAfter = Object.fromEntries(tp.eventNames().map((name) => [String(name), tp.listenerCount(name)]))
  assert.deepEqual(listenersAfter, listenersBefore)
  // A fetch keep-alive socket of the clients' may hold the HTTP client's timer for a few seconds
  // more (undici's keep-alive timeout, 4 s); a session's own timers would hold for its idle
  // timeout (600 s).
  const timers = (): number => process.getActiveResourcesInfo().filter((r) => r === 'Timeout').length
  await waitFor(`timers back to ${timersBefore} (${timers()} now)`, () => timers() <= timersBefore, 10_000)
})

test('event-stream subscribers that come and go leave nothing behind: no subscriber, response or heartbeat ' +
  'timer outlives its connection (src/main/http/events.ts: "Streams opened through this app end when it ' +
  'closes"; src/main/observe/event-hub.ts: "Returns the function that removes it")', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['base'] })
  const hub = observerOf(tp).hub
  const responses: Array<WeakRef<ServerResponse>> = []
  tp.app.server.on('request', (request: IncomingMessage, response: ServerResponse) => {
    if (request.url?.startsWith('/api/events') === true) responses.push(new WeakRef(response))
  })
  const timersBefore = process.getActiveResourcesInfo().filter((r) => r === 'Timeout').length
  const STREAMS = 600
  for (let i = 0; i < STREAMS; i++) {
    const controller = new AbortController()
    const query = i % 2 === 0 ? '' : '?role=base&types=registered,unregistered'
    const res = await undiciRequest(`${url}/api/events${query}`, { signal: controller.signal })
    assert.equal(res.statusCode, 200)
    // Its hello has come: it is subscribed. Then a change is published while it listens.
    const first = await res.body[Symbol.asyncIterator]().next()
    assert.ok(String(first.value).includes('event: hello'))
    await tp.roles.get('base').registerLocalTool({ name: `tool_${i}`, handler: () => null })
    controller.abort()
    await tp.roles.get('base').unregisterLocalTool(`tool_${i}`)
  }
  await waitFor('every subscriber to be gone', () => hub.subscribers === 0)
  assert.equal(responses.length, STREAMS)
  await heapAfterGc()
  const alive = responses.filter((ref) => ref.deref() !== undefined).length
  // The last connection's objects may still be referenced by the socket being torn down.
  assert.ok(alive <= 1, `${alive} of ${STREAMS} event-stream responses are still reachable`)
  const timersAfter = process.getActiveResourcesInfo().filter((r) => r === 'Timeout').length
  assert.ok(timersAfter <= timersBefore, `timers: ${timersBefore} before, ${timersAfter} after`)
})

test('worker threads that exit and are replaced leave nothing behind on the main thread: their lanes (port, ' +
  'reply share) do not pile up (docs/architecture.md "The sweep": "A lane that closes (its worker exited) … ' +
  'piscina replaces the worker, which announces a new lane")', async (t) => {
  const plugin = createServer((request, response) => {
    request.resume()
    request.on('end', () => { response.setHeader('content-type', 'application/json'); response.end('{"ok":true}') })
  })
  const callback = await listenOnLoopback(t, plugin)
  const { tp } = await startToolport(t, { roles: ['base'], dispatch: { mode: 'pool', threads: 1 } })
  await tp.register({ role: 'base', source: 'plugin:echo', name: 'echo', callback_url: `${callback}/echo` })
  const answered = async (): Promise<void> => {
    // The first call after a replacement may meet the old lane's end (`internal`): call again.
    for (let attempt = 0; attempt < 200; attempt++) {
      const result = await tp.callTool('base', { name: 'echo', arguments: {} })
      if (!result.is_error) return
      await sleep(20)
    }
    assert.fail('no call was answered after the worker was replaced')
  }
  const replaceWorker = async (): Promise<void> => {
    const worker = tp[kWorkerThreads][0] as Worker
    await worker.terminate()
    await waitFor('a new worker thread', () => tp[kWorkerThreads].length === 1 && tp[kWorkerThreads][0] !== worker)
    await answered()
  }
  await answered()
  await replaceWorker()
  const NAMES = ['SharedArrayBuffer', 'MessagePort'] as const
  const before = await heapObjects(NAMES)
  const EXITS = 12
  for (let i = 0; i < EXITS; i++) await replaceWorker()
  const after = await heapObjects(NAMES)
  t.diagnostic(`after ${EXITS} worker exits: ${JSON.stringify(before)} → ${JSON.stringify(after)}`)
  // Kept, each exited worker's lane holds its reply share and its port: one more of each per exit.
  for (const name of NAMES) {
    assert.ok((after[name] as number) - (before[name] as number) <= 1,
      `${name}: ${before[name]} before, ${after[name]} after ${EXITS} worker exits`)
  }
})

test('realtime adapters created and closed (by the host, or by their role\'s removal) leave nothing behind: ' +
  'none stays attached or reachable (src/main/sessions/realtime.ts: close() "Detaches from the role, aborts ' +
  'running calls, fails a pending update"; "Its role was removed: the session is dropped")', async (t) => {
  const tp = await createTestToolport(t, { roles: ['base'] })
  await tp.roles.get('base').registerLocalTool({ name: 'echo', handler: () => ({ ok: true }) })
  const adapters: Array<WeakRef<RealtimeSession>> = []
  const ADAPTERS = 400
  for (let i = 0; i < ADAPTERS; i++) {
    const isConversation = i % 2 === 1
    const role = isConversation ? `conversation-${i}` : 'base'
    if (isConversation) {
      tp.roles.add(role)
      await tp.roles.get(role).registerLocalTool({ name: 'echo', handler: () => ({ ok: true }) })
    }
    let outputs = 0
    // The provider's side: each session.update is acknowledged, each output counted.
    const adapter: RealtimeSession = createRealtimeSession({
      toolport: tp,
      role,
      rateLimit: false,
      send: (event) => {
        if (event.type === 'session.update') {
          const tools = (event.session as { tools: unknown[] }).tools
          queueMicrotask(() => { adapter.handleServerEvent({ type: 'session.updated', session: { tools } }) })
        }
        if (event.type === 'conversation.item.create') outputs++
      }
    })
    adapters.push(new WeakRef(adapter))
    adapter.handleServerEvent({
      type: 'response.function_call_arguments.done', response_id: `resp-${i}`, call_id: `call-${i}`, name: 'echo', arguments: '{}'
    })
    adapter.handleServerEvent({ type: 'response.done', response: { id: `resp-${i}`, status: 'completed' } })
    await waitFor(`the output of call-${i}`, () => outputs === 1)
    if (isConversation) {
      tp.roles.remove(role)
      // Its next event finds the role gone and drops the session.
      adapter.handleServerEvent({ type: 'response.done', response: { id: `late-${i}`, status: 'completed' } })
    } else {
      adapter.close()
    }
  }
  assert.equal(tp.roles.get('base').sessions().length, 0)
  await heapAfterGc()
  const alive = adapters.filter((ref) => ref.deref() !== undefined).length
  assert.equal(alive, 0, `${alive} of ${ADAPTERS} closed realtime adapters are still reachable`)
})
