// Toolport as a host program embeds it: createToolport and the Toolport/Runtime object, its typed
// events and the host's listeners on them, local tools, toolportPlugin in the host's own fastify
// app, and closing. Real sockets on 127.0.0.1, real fastify apps, the official MCP client; no mocks.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { inspect } from 'node:util'
import fastify from 'fastify'
import fc from 'fast-check'
import { z } from 'zod'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import {
  createRealtimeSession, createToolport, toolportPlugin, type RealtimeClientEvent, type Role, type SyncOutcome,
  type ToolportEvents
} from '../../src/main/index.js'
import { checkProperty, createTestToolport, startToolport, subscribeEvents, tool, waitFor, within } from '../helpers.js'

const HANG_GUARD_MS = 20_000

type EventName = keyof ToolportEvents

test('property: a host event listener that throws is ignored, and every other listener of that event still gets it, in order (README "Embedding: the library" → Events; Runtime.emit\'s TSDoc: "a listener that throws is logged and otherwise ignored")', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  const events: EventName[] = ['tool-registered', 'tool-removed', 'call-finished', 'role-added', 'role-removed']
  await checkProperty(fc.asyncProperty(
    // For each of the five events, a row of listeners: true throws, false records.
    fc.array(fc.array(fc.boolean(), { minLength: 1, maxLength: 5 }),
      { minLength: events.length, maxLength: events.length }),
    fc.integer({ min: 0, max: 1_000_000 }),
    async (rows, seed) => {
      const role = `R${seed}`
      const heard: string[] = []
      const expected: string[] = []
      const installed: Array<[EventName, (...args: unknown[]) => void]> = []
      rows.forEach((row, e) => {
        const event = events[e] as EventName
        row.forEach((throws, i) => {
          const listener = (): void => {
            if (throws) throw new Error(`host listener ${event}#${i}`)
            heard.push(`${event}#${i}`)
          }
          tp.on(event, listener)
          installed.push([event, listener])
        })
      })
      try {
        tp.roles.add(role)
        await tp.roles.get(role).registerLocalTool({ name: 'echo', handler: (args) => args })
        const result = await tp.callTool(role, { name: 'echo', arguments: { n: seed } })
        assert.deepEqual(result.output, { n: seed }, 'the call is answered despite the listeners')
        await tp.roles.get(role).unregisterLocalTool('echo')
        tp.roles.remove(role)
      } finally {
        for (const [event, listener] of installed) tp.off(event, listener)
      }
      // Every event fired once: role-added, tool-registered, call-finished, tool-removed, role-removed.
      for (const event of ['role-added', 'tool-registered', 'call-finished', 'tool-removed', 'role-removed'] as const) {
        const row = rows[events.indexOf(event)] as boolean[]
        row.forEach((throws, i) => { if (!throws) expected.push(`${event}#${i}`) })
      }
      assert.deepEqual(heard, expected)
    }), { numRuns: 40 })
})

test('a host tool-registered listener that throws does not take the registration out of GET /api/events (README "Live events": registered; "Embedding: the library" → Events)', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['A'] })
  // Added before the event stream's own subscriber exists: the stream's listener comes after it.
  const fresh = await createTestToolport(t, { roles: ['A'] })
  fresh.on('tool-registered', () => { throw new Error('host bug') })
  const { url: freshUrl } = await fresh.listen({ host: '127.0.0.1', port: 0 })
  for (const [runtime, base] of [[tp, url], [fresh, freshUrl]] as const) {
    const stream = subscribeEvents(base, '?types=registered,role-added')
    t.after(stream.close)
    await waitFor('the hello event', () => stream.items.length > 0, HANG_GUARD_MS)
    await runtime.register(tool('get_weather'))
    // A marker after it, in the same stream: once it is there, the registration would be too.
    runtime.roles.add('Marker')
    await waitFor('the role-added marker', () => stream.items.some((i) => i.event === 'role-added'), HANG_GUARD_MS)
    assert.deepEqual(stream.items.map((i) => i.event), ['hello', 'registered', 'role-added'],
      `the stream of ${runtime === tp ? 'a runtime without' : 'a runtime with'} a throwing host listener`)
  }
})

test('a host role-removed listener that throws does not keep a removed role\'s MCP session alive (README "Embedding: the library": removing a role "ends its MCP sessions"; "MCP: one endpoint per role")', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lanlan'] })
  tp.on('role-removed', () => { throw new Error('host bug') })
  const { url } = await tp.listen({ host: '127.0.0.1', port: 0 })
  await tp.roles.get('Lanlan').registerLocalTool({ name: 'old_tool', handler: () => 'old' })
  const client = new Client({ name: 'embedding-test', version: '1.0.0' })
  await within(client.connect(new StreamableHTTPClientTransport(new URL(`${url}/mcp/Lanlan`))), 'MCP connect', HANG_GUARD_MS)
  t.after(() => client.close())
  assert.deepEqual((await client.listTools()).tools.map((x) => x.name), ['old_tool'])
  tp.roles.remove('Lanlan')
  // A new role of the same name, with other tools: the old session is not one of its sessions.
  await tp.roles.add('Lanlan').registerLocalTool({ name: 'new_tool', handler: () => 'new' })
  await assert.rejects(within(client.listTools(), 'tools/list on the ended session', HANG_GUARD_MS),
    (err: unknown) => /session not found|404/i.test(String((err as Error).message)),
    'the session ended with its role, so its next request is refused')
})

/**
 * A well-behaved session whose model never acknowledges (its socket went away: it waits, and stops
 * when told to) attached to `role`, and a registration (by default a local tool's) waiting on the
 * sync after the one in flight to it. The signals are those of the session's pushes.
 */
async function registrationWaitingOnSilentSession<R = SyncOutcome> (role: Role, register?: () => Promise<R>):
Promise<{ signals: AbortSignal[], registration: Promise<R> }> {
  const signals: AbortSignal[] = []
  role.attachSession({
    id: 'silent-model',
    syncTools: async (_tools, signal) => {
      signals.push(signal)
      await new Promise<void>((_resolve, reject) => {
        signal.addEventListener('abort', () => { reject(signal.reason) }, { once: true })
      })
    }
  })
  await waitFor('the first sync to reach the session', () => signals.length === 1, HANG_GUARD_MS)
  const registration = register?.() ?? role.registerLocalTool({ name: 'waiting', handler: () => 1 }) as Promise<R>
  // In the registry, its registration now waits for the sync after the one in flight.
  await waitFor('the tool to enter the registry', () => role.tools().length === 1, HANG_GUARD_MS)
  return { signals, registration }
}

test('close() ends a role\'s sync that is still waiting on a live session: the session\'s signal aborts and the pending registration settles, so no sync timer outlives the runtime (docs/architecture.md "close()": "No handle stays open afterwards"; ModelSession.syncTools\' signal)', async (t) => {
  // A sync timeout three times the hang guard: only close() can end the sync in time.
  const tp = await createTestToolport(t, { roles: ['A'], syncTimeoutMs: 60_000 })
  const { signals, registration } = await registrationWaitingOnSilentSession(tp.roles.get('A'))
  await within(tp.close(), 'close()', HANG_GUARD_MS)
  assert.equal(signals[0]?.aborted, true, 'the sync in flight was aborted by close()')
  const outcome = await within(registration, 'the registration waiting on the sync', HANG_GUARD_MS)
  assert.equal(outcome.ok, false, 'the sessions never took the tool')
  assert.ok(signals.every((s) => s.aborted), 'no push to the session is left waiting')
})

test('property: createRealtimeSession refuses a bad `toolport`, `role`, `attach`, `dialect`, `ackTimeoutMs`, `autoRespond` or `rateLimit` (null too) with TP_ERR_CONFIG naming it, and attaches nothing and sends nothing (README "The OpenAI-Realtime adapter": "A bad option … throws TP_ERR_CONFIG when the adapter is made"; Options: attach, default true)', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  const notBoolean = fc.oneof(fc.string(), fc.integer(), fc.constant(null), fc.constant('false'), fc.constant(0),
    fc.object(), fc.array(fc.anything(), { maxLength: 2 }))
  const notRuntime = fc.oneof(fc.constant(undefined), fc.constant(null), fc.string(), fc.integer(), fc.object(),
    fc.constant({ roles: {} }))
  const notRoleName = fc.oneof(fc.constant(undefined), fc.constant(null), fc.integer(), fc.object(), fc.constant(['A']))
  // null is a value, not a missing key: refused like any other wrong one (a config file writes it).
  const notDialect = fc.oneof(fc.constant(null), fc.string().filter((s) => s !== 'flat' && s !== 'nested'),
    fc.integer(), fc.object())
  const notAckTimeout = fc.oneof(fc.constant(null), fc.constant(Number.NaN), fc.integer({ max: 0 }), fc.string(),
    fc.object())
  const notRateLimit = fc.oneof(fc.constant(null), fc.constant(true), fc.string(), fc.integer(),
    fc.constant({ maxCalls: null }), fc.constant({ windowMs: null }), fc.constant({ maxCalls: 0 }))
  const badOptions = fc.oneof(
    notBoolean.map((attach) => ({ field: 'attach', options: { attach } })),
    notRuntime.map((toolport) => ({ field: 'toolport', options: { toolport } })),
    notRoleName.map((role) => ({ field: 'role', options: { role } })),
    notDialect.map((dialect) => ({ field: 'dialect', options: { dialect } })),
    notAckTimeout.map((ackTimeoutMs) => ({ field: 'ackTimeoutMs', options: { ackTimeoutMs } })),
    notBoolean.map((autoRespond) => ({ field: 'autoRespond', options: { autoRespond } })),
    notRateLimit.map((rateLimit) => ({ field: 'rateLimit', options: { rateLimit } }))
  )
  await checkProperty(fc.asyncProperty(badOptions, async ({ field, options }) => {
    const sent: RealtimeClientEvent[] = []
    const given = { toolport: tp, role: 'A', send: (e: RealtimeClientEvent) => { sent.push(e) }, ...options }
    assert.throws(() => createRealtimeSession(given as never), (err: unknown) => {
      const e = err as { code?: string, message?: string }
      return e.code === 'TP_ERR_CONFIG' && (e.message ?? '').includes(field)
    }, `${field}: ${inspect((options as Record<string, unknown>)[field])}`)
    assert.equal(tp.roles.get('A').sessions().length, 0, 'no session was attached')
    await new Promise((resolve) => setImmediate(resolve))
    assert.deepEqual(sent, [], 'nothing was sent')
  }), { numRuns: 100 })
})

test('property: a bad `logger` option is refused with a TP_ERR_CONFIG that says what the option takes (false, true or a pino level), as other options\' messages do (README "Configuration": logger "`false`, `true` or a pino level")', async () => {
  const levels = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']
  const bad = fc.oneof(fc.string().filter((s) => !levels.includes(s)), fc.integer(), fc.constant(null), fc.object(),
    fc.constantFrom('verbose', 'INFO', 'warning', ''))
  await checkProperty(fc.asyncProperty(bad, async (logger) => {
    await assert.rejects(createToolport({ logger: logger as never, dispatch: { mode: 'inline' } }), (err: unknown) => {
      const message = String((err as Error).message)
      assert.equal((err as { code?: string }).code, 'TP_ERR_CONFIG')
      assert.match(message, /logger/, 'names the option')
      for (const word of ['true', 'false', ...levels]) assert.ok(message.includes(word), `says ${word} is what it takes: ${message}`)
      return true
    })
  }), { numRuns: 50 })
})

/**
 * Thrown values a host's handler (or a library it uses) may throw, beyond plain Errors: each made
 * when thrown (a revoked Proxy cannot even be shown by fast-check), with a label for the report.
 */
const oddThrown: fc.Arbitrary<{ label: string, make: () => unknown }> = fc.oneof(
  fc.anything().map((value) => ({ label: `the value ${fc.stringify(value)}`, make: () => value })),
  fc.string().map((m) => ({ label: `new Error(${JSON.stringify(m)})`, make: () => new Error(m) })),
  fc.anything().map((message) => ({
    label: `an Error whose message is ${fc.stringify(message)}`,
    make: () => Object.assign(new Error('x'), { message })
  })),
  fc.anything().map((name) => ({
    label: `an Error with no message whose name is ${fc.stringify(name)}`,
    make: () => Object.assign(new Error(''), { name })
  })),
  fc.constant({
    label: 'an Error whose message getter throws',
    make: () => Object.defineProperty(new Error('x'), 'message', { get () { throw new Error('getter') } })
  }),
  fc.constant({
    label: 'a revoked Proxy',
    make: () => { const { proxy, revoke } = Proxy.revocable({}, {}); revoke(); return proxy }
  })
)

test('property: whatever a local tool\'s handler throws (or rejects with), callTool answers a tool error whose `error` is a string, and POST /api/tools/call answers it with 200, never TP_ERR_INTERNAL (README "Embedding: the library": "a throw [is a] tool error"; "callTool never throws"; docs/protocol.md "Model-visible result")', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['A'] })
  let next: () => unknown = () => undefined
  await tp.roles.get('A').registerLocalTool({ name: 'fails', handler: () => { throw next() } })
  await tp.roles.get('A').registerLocalTool({ name: 'rejects', handler: async () => { throw next() } })
  await checkProperty(fc.asyncProperty(oddThrown, fc.constantFrom('fails', 'rejects'), async ({ label, make }, name) => {
    next = make
    const result = await tp.callTool('A', { name }).catch((err: unknown) => {
      assert.fail(`callTool threw for ${label}: ${String((err as Error).message)}`)
    })
    assert.equal(result.is_error, true)
    assert.equal(typeof result.error, 'string', `error is a string for ${label}: got ${typeof result.error}`)
    assert.deepEqual(JSON.parse(result.text), { error: result.error })
    const res = await fetch(`${url}/api/tools/call`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ role: 'A', name })
    })
    const body = await res.json() as { is_error: boolean, error: unknown }
    assert.equal(res.status, 200, `${label}: ${JSON.stringify(body)}`)
    assert.equal(body.is_error, true)
    assert.equal(typeof body.error, 'string')
  }), { numRuns: 150 })
})

test('property: toolportPlugin mounted under any prefix keeps the health report and the metrics answering after tp.close(), as without a prefix: health 503 with status "closed", metrics 200, the rest 503 TP_ERR_CLOSED (docs/architecture.md "close()": "every route but /api/health and /metrics"; README "Public exports": toolportPlugin)', async () => {
  const segment = fc.stringMatching(/^[a-z0-9_-]{1,12}$/)
  // As the host spells it: with or without a trailing slash, with or without the leading one.
  const spelling = fc.constantFrom('', 'trailing', 'bare')
  const segments = fc.array(segment, { minLength: 0, maxLength: 3 })
  await checkProperty(fc.asyncProperty(segments, spelling, async (segments, spelt) => {
    const prefix = segments.map((x) => `/${x}`).join('')
    const given = prefix === '' ? '' : spelt === 'trailing' ? `${prefix}/` : spelt === 'bare' ? prefix.slice(1) : prefix
    const tp = await createToolport({ roles: ['A'], logger: false, dispatch: { mode: 'inline' } })
    const host = fastify()
    try {
      host.get('/host-route', async () => ({ host: true }))
      await host.register(toolportPlugin, { runtime: tp, ...(given === '' ? {} : { prefix: given }) })
      await host.ready()
      await tp.close()
      const health = await host.inject({ method: 'GET', url: `${prefix}/api/health` })
      assert.equal(health.statusCode, 503, `${prefix}/api/health: ${health.body}`)
      assert.equal(health.json().status, 'closed', `${prefix}/api/health answers the report: ${health.body}`)
      const metrics = await host.inject({ method: 'GET', url: `${prefix}/metrics` })
      assert.equal(metrics.statusCode, 200, `${prefix}/metrics: ${metrics.body.slice(0, 200)}`)
      assert.match(metrics.body, /toolport_/)
      const tools = await host.inject({ method: 'GET', url: `${prefix}/api/tools` })
      assert.equal(tools.statusCode, 503)
      assert.equal(tools.json().code, 'TP_ERR_CLOSED')
      assert.equal((await host.inject({ method: 'GET', url: '/host-route' })).statusCode, 200, 'the host\'s own route is untouched')
    } finally {
      await tp.close()
      await host.close()
    }
  }), { numRuns: 12 })
})

test('property: toolportPlugin given no Toolport as `runtime` (left out, `{ toolport: tp }` as createRealtimeSession spells it, null, another object) or a non-boolean `guard` fails the host app\'s ready() with TP_ERR_CONFIG naming the option, and the host process goes on (README "Errors": TP_ERR_CONFIG "library: invalid options"; "Public exports": app.register(toolportPlugin, { runtime: tp }))', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  const bad = fc.oneof(
    fc.constant({ field: 'runtime', options: { toolport: tp } }),
    fc.constantFrom(undefined, null, 0, 'tp', {}, { roles: {} }, { options: {} }, []).map((runtime) => ({ field: 'runtime', options: { runtime } })),
    fc.constantFrom('false', 0, 1, null, 'no', {}).map((guard) => ({ field: 'guard', options: { runtime: tp, guard } }))
  )
  await checkProperty(fc.asyncProperty(bad, async ({ field, options }) => {
    const host = fastify()
    host.get('/host-route', async () => ({ host: true }))
    try {
      host.register(toolportPlugin, options as never)
      const ready = (async () => { await host.ready() })()
      await assert.rejects(within(ready, 'the host app\'s ready()', HANG_GUARD_MS), (err: unknown) => {
        const e = err as { code?: string, message?: string }
        assert.equal(e.code, 'TP_ERR_CONFIG', String(e.message))
        assert.ok((e.message ?? '').includes(field), `names ${field}: ${String(e.message)}`)
        return true
      })
    } finally {
      await host.close().catch(() => {})
    }
  }), { numRuns: 30 })
  // The same host app with the option right works.
  const host = fastify()
  t.after(() => host.close())
  await host.register(toolportPlugin, { runtime: tp, guard: true })
  assert.equal((await host.inject({ method: 'GET', url: '/api/tools' })).statusCode, 200)
})

test('an async host listener that rejects (on call-finished, tool-registered, role-added) is ignored like one that throws: no unhandled rejection to end the host\'s process, and the call is answered (Runtime.emit\'s TSDoc: "host code can never break a sync, a registration or a tool call"; README "Embedding: the library" → Events)', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  const unhandled: unknown[] = []
  const onUnhandled = (reason: unknown): void => { unhandled.push(reason) }
  process.on('unhandledRejection', onUnhandled)
  t.after(() => { process.off('unhandledRejection', onUnhandled) })
  const later: string[] = []
  for (const event of ['call-finished', 'tool-registered', 'role-added'] as const) {
    tp.on(event, async () => { throw new Error(`async host listener of ${event}`) })
    tp.on(event, () => { later.push(event) })
  }
  tp.roles.add('B')
  await tp.roles.get('B').registerLocalTool({ name: 'echo', handler: (args) => args })
  const result = await tp.callTool('B', { name: 'echo', arguments: { ok: 1 } })
  assert.deepEqual(result.output, { ok: 1 })
  // Unhandled rejections are reported once the microtasks of a turn have run: give it two turns.
  for (let i = 0; i < 2; i++) await new Promise((resolve) => setImmediate(resolve))
  assert.deepEqual(unhandled.map((r) => String((r as Error).message)), [])
  assert.deepEqual(later, ['role-added', 'tool-registered', 'call-finished'])
})

test('after close() the roles take nothing more: roles.add and registerLocalTool answer TP_ERR_CLOSED, as register does, and a session attached or swapped in then is neither attached nor synced (README "Public exports": close())', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  const role = tp.roles.get('A')
  await tp.close()
  assert.throws(() => tp.roles.add('B'), { code: 'TP_ERR_CLOSED' })
  await assert.rejects(role.registerLocalTool({ name: 'late', handler: () => 1 }), { code: 'TP_ERR_CLOSED' })
  await assert.rejects(tp.register(tool('x')), { code: 'TP_ERR_CLOSED' })
  assert.deepEqual(tp.roles.names(), ['A'])
  assert.deepEqual(role.tools(), [])
  // A session that opens as the runtime shuts down (a socket's 'open' racing close()) is no error
  // of the host's: it is not attached and nothing is pushed to it; nor to one swapped in.
  let pushed = 0
  const late = { id: 'late', syncTools: async () => { pushed++ } }
  const detach = role.attachSession(late)
  detach()
  assert.deepEqual(role.sessions(), [])
  assert.equal((await role.replaceSessions([], [late])).ok, false)
  assert.deepEqual(role.sessions(), [], 'replaceSessions attached a session after close()')
  const adapter = createRealtimeSession({ toolport: tp, role: 'A', send: () => { pushed++ } })
  await new Promise((resolve) => setImmediate(resolve))
  assert.equal(pushed, 0, 'a session attached after close() was pushed the tools')
  adapter.close()
})

test('a reference kept to a removed role takes no tool and no session (TP_ERR_ROLE_NOT_FOUND), and announces nothing; a role of the same name added again is a new one (docs/protocol.md R4)', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  const stale = tp.roles.get('A')
  const registered: string[] = []
  tp.on('tool-registered', (e) => { registered.push(`${e.role}/${e.name}`) })
  assert.equal(tp.roles.remove('A'), true)
  await assert.rejects(stale.registerLocalTool({ name: 'ghost', handler: () => 1 }), { code: 'TP_ERR_ROLE_NOT_FOUND' })
  let pushed = 0
  assert.throws(() => stale.attachSession({ id: 's', syncTools: async () => { pushed++ } }), { code: 'TP_ERR_ROLE_NOT_FOUND' })
  await assert.rejects(stale.unregisterLocalTool('anything'), { code: 'TP_ERR_ROLE_NOT_FOUND' })
  const fresh = tp.roles.add('A')
  await fresh.registerLocalTool({ name: 'real', handler: () => 1 })
  assert.deepEqual(registered, ['A/real'])
  assert.deepEqual(fresh.tools().map((row) => row.name), ['real'])
  assert.equal(pushed, 0)
})

/**
 * A local tool's registration still compiling its schema: one the compile cache has not seen, so
 * the compile is asynchronous (a compiler thread).
 */
function registrationStillCompiling (role: Role, name: string): Promise<SyncOutcome> {
  return role.registerLocalTool({
    name,
    parameters: { type: 'object', properties: { [`${name}_${Date.now()}`]: { type: 'string', pattern: '^[a-z0-9]+$' } } },
    handler: () => 1
  })
}

test('a local tool whose schema still compiles when the runtime closes is refused (TP_ERR_CLOSED), as a register after close() is', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  const role = tp.roles.get('A')
  const pending = registrationStillCompiling(role, 'compiling')
  await tp.close()
  await assert.rejects(pending, { code: 'TP_ERR_CLOSED' })
  assert.deepEqual(role.tools(), [])
})

test('a role removed while its local tool\'s schema compiles does not take the tool (the check runs again after the compile)', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  const role = tp.roles.get('A')
  const pending = registrationStillCompiling(role, 'slow_schema')
  tp.roles.remove('A')
  await assert.rejects(pending, { code: 'TP_ERR_ROLE_NOT_FOUND' })
  assert.deepEqual(role.tools(), [])
})

test('attachSession, replaceSessions and callTool refuse what is not a session or a call with a ToolportError naming what they take, never a TypeError later (README "Embedding: the library")', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  const role = tp.roles.get('A')
  for (const bad of [null, undefined, 'session', {}, { id: 's' }, { id: 1, syncTools: async () => {} }, { id: 's', syncTools: 'no' }]) {
    assert.throws(() => role.attachSession(bad as never), { code: 'TP_ERR_CONFIG' }, JSON.stringify(bad))
    await assert.rejects(role.replaceSessions([], [bad as never]), { code: 'TP_ERR_CONFIG' }, JSON.stringify(bad))
  }
  assert.deepEqual(role.sessions(), [])
  // The role still syncs: nothing half-attached.
  assert.equal((await role.sync()).ok, true)
  for (const bad of [null, undefined, 'get_time', { arguments: {} }, { name: 7 }]) {
    await assert.rejects(tp.callTool('A', bad as never), { code: 'TP_ERR_VALIDATION' }, JSON.stringify(bad))
  }
  await role.registerLocalTool({ name: 'ok', handler: () => 'fine' })
  assert.equal((await tp.callTool('A', { name: 'ok' })).is_error, false)
})

test('a register whose syncs close() ended is TP_ERR_CLOSED (503), as a register after close() is, not an ok: false a plugin takes for a refusal (README "Public exports": close())', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'], syncTimeoutMs: 60_000 })
  const { registration } = await registrationWaitingOnSilentSession(tp.roles.get('A'),
    () => tp.register({ name: 'late', callback_url: 'http://127.0.0.1:9/late', source: 'plugin:late' }))
  await within(tp.close(), 'close()', HANG_GUARD_MS)
  await assert.rejects(within(registration, 'the registration', HANG_GUARD_MS),
    (err: unknown) => (err as { code?: string, statusCode?: number }).code === 'TP_ERR_CLOSED' &&
      (err as { statusCode?: number }).statusCode === 503)
})

test('removing a role drops its sessions and ends its sync still waiting on one: the session\'s signal aborts and the registration waiting on it settles, done as a role without sessions syncs, not at syncTimeoutMs (docs/protocol.md "Sync")', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'], syncTimeoutMs: 60_000 })
  const { signals, registration } = await registrationWaitingOnSilentSession(tp.roles.get('A'))
  tp.roles.remove('A')
  const outcome = await within(registration, 'the registration waiting on the removed role\'s sync', HANG_GUARD_MS)
  // The role is gone with its sessions: nothing failed to take the tool (a role removed during a
  // registration is no failed role of it).
  assert.deepEqual(outcome, { ok: true, error: '' })
  assert.ok(signals.every((s) => s.aborted), 'no push to the session is left waiting')
})

test('a Realtime adapter made with attach: false and attached after its role was removed and added again does not join the new role (README "The OpenAI-Realtime adapter": never a role of the same name added again)', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  const sent: RealtimeClientEvent[] = []
  const adapter = createRealtimeSession({ toolport: tp, role: 'A', attach: false, send: (e) => { sent.push(e) } })
  tp.roles.remove('A')
  const fresh = tp.roles.add('A')
  assert.throws(() => adapter.attach(), { code: 'TP_ERR_ROLE_NOT_FOUND' })
  assert.deepEqual(fresh.sessions(), [])
  await new Promise((resolve) => setImmediate(resolve))
  assert.deepEqual(sent, [])
  adapter.close()
})

test('a host\'s own hook answering 401, 403, 404 or 503 with its own body on Toolport\'s routes keeps its answer, not a 500 from Toolport\'s error schemas (README "Public exports": toolportPlugin)', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  for (const status of [401, 403, 404, 503]) {
    const host = fastify()
    t.after(() => host.close())
    host.addHook('onRequest', async (request, reply) => {
      if (request.headers.authorization !== 'Bearer host-secret') return await reply.code(status).send({ error: 'login required' })
    })
    host.get('/host/me', async () => ({ me: 1 }))
    await host.register(toolportPlugin, { runtime: tp })
    for (const url of ['/host/me', '/api/health', '/api/tools', '/api/tools/definitions?role=A', '/metrics']) {
      const reply = await host.inject({ url })
      assert.equal(reply.statusCode, status, `${status} ${url}: ${reply.body}`)
      assert.deepEqual(JSON.parse(reply.body), { error: 'login required' }, `${status} ${url}`)
    }
    // With the host's credential, Toolport's own answers, its errors in their documented shape.
    const authorized = { authorization: 'Bearer host-secret' }
    assert.equal((await host.inject({ url: '/api/health', headers: authorized })).statusCode, 200)
    const missing = await host.inject({ url: '/api/tools?role=Nobody', headers: authorized })
    assert.equal(missing.statusCode, 404)
    assert.equal(JSON.parse(missing.body).code, 'TP_ERR_ROLE_NOT_FOUND')
  }
})

test('a host app whose root serializer compiler takes only its own schemas (a zod type provider) leaves Toolport\'s answers as documented (README "Public exports": toolportPlugin)', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  const host = fastify()
  t.after(() => host.close())
  // As fastify-type-provider-zod's serializerCompiler: anything but a zod schema is an error.
  host.setSerializerCompiler(({ schema }) => {
    const zod = schema as { safeParse?: unknown, parse?: (data: unknown) => unknown }
    if (typeof zod.safeParse !== 'function' || zod.parse === undefined) throw new Error('Invalid schema passed: expected a zod schema')
    const parse = zod.parse.bind(zod)
    return (data) => JSON.stringify(parse(data))
  })
  host.get('/host/z', { schema: { response: { 200: z.object({ a: z.number() }) } } }, async () => ({ a: 1, b: 2 }))
  await host.register(toolportPlugin, { runtime: tp })
  assert.equal((await host.inject({ url: '/host/z' })).body, '{"a":1}')
  const health = await host.inject({ url: '/api/health' })
  assert.equal(health.statusCode, 200, health.body)
  assert.equal(JSON.parse(health.body).status, 'ready')
  const missing = await host.inject({ url: '/api/tools?role=Nobody' })
  assert.equal(missing.statusCode, 404, missing.body)
  assert.equal(JSON.parse(missing.body).code, 'TP_ERR_ROLE_NOT_FOUND')
  const listed = await host.inject({ url: '/api/tools' })
  assert.deepEqual(JSON.parse(listed.body).tools_by_role, { A: [] })
})
