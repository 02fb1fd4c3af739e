// The embeddable library API: createToolport, listen, roles, sessions, local tools,
// register/unregister/clear/list with the same results as the routes, typed errors, the plugin.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import fastify from 'fastify'
import { createToolport, isToolportError, toolportPlugin, type Toolport } from '../../src/main/index.js'
import { assertError, callbackServer, createTestToolport, httpJson, inject, isCode, names, session, tool } from '../helpers.js'
import { kDispatchMode } from '../../src/main/symbols.js'

/** The JSON value of a result. */
function plain (value: unknown): unknown {
  return JSON.parse(JSON.stringify(value))
}

test('library: createToolport returns a runtime that is not listening yet', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lanlan', 'Mochi'], syncTimeoutMs: 10_000 })
  assert.equal(tp.app.server.listening, false)
  assert.deepEqual(tp.roles.names(), ['Lanlan', 'Mochi'])
})

test('library: listen({ host: "127.0.0.1", port: 0 }) answers the URL with the real port, and it serves the API', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lanlan'] })
  const { url, port, host } = await tp.listen({ host: '127.0.0.1', port: 0 })
  assert.equal(host, '127.0.0.1')
  assert.ok(port > 0)
  assert.equal(url, `http://127.0.0.1:${port}`)
  const res = await httpJson(`${url}/api/tools`, 'GET')
  assert.deepEqual(res.body, { ok: true, tools_by_role: { Lanlan: [] } })
})

test('library: a second listen() is TP_ERR_CONFIG naming the address served, also while the first is under way; after one that failed (a port in use) another may be tried', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lanlan'] })
  const first = tp.listen({ port: 0 })
  await assert.rejects(tp.listen({ port: 0 }), (err: unknown) => isToolportError(err) && err.code === 'TP_ERR_CONFIG' &&
    /already listening/.test(err.message))
  const { url } = await first
  await assert.rejects(tp.listen({ port: 0 }), (err: unknown) => isToolportError(err) && err.code === 'TP_ERR_CONFIG' &&
    err.message.includes(`already listening on ${url}`))
  assert.equal((await httpJson(`${url}/api/tools`, 'GET')).statusCode, 200)

  const other = await createTestToolport(t, { roles: ['Lanlan'] })
  const taken = Number(new URL(url).port)
  await assert.rejects(other.listen({ port: taken }), { code: 'EADDRINUSE' })
  const retried = await other.listen({ port: 0 })
  assert.notEqual(retried.port, taken)
})

test('library: listen() binds 127.0.0.1 by default', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'], port: 0 })
  const { url, host } = await tp.listen()
  assert.equal(host, '127.0.0.1')
  assert.match(url, /^http:\/\/127\.0\.0\.1:\d+$/)
})

test('library: listen() on a non-loopback address without security.allowNonLoopbackBind is refused before binding', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  await assert.rejects(tp.listen({ host: '0.0.0.0', port: 0 }), isCode('TP_ERR_CONFIG', 500))
  assert.equal(tp.app.server.listening, false)
})

test('library: a host that is no address (a port, a scheme, a space) is TP_ERR_CONFIG as the host option and in listen(), allowNonLoopbackBind or not, never a failed lookup (README "Embedding: the library")', async (t) => {
  for (const host of ['127.0.0.1:8080', 'http://127.0.0.1', ' 127.0.0.1', '[localhost]']) {
    await assert.rejects(createToolport({ host, logger: false }), isCode('TP_ERR_CONFIG', 500), host)
    const tp = await createTestToolport(t, { roles: ['A'], security: { allowNonLoopbackBind: true } })
    await assert.rejects(tp.listen({ host, port: 0 }), (err: unknown) =>
      isCode('TP_ERR_CONFIG', 500)(err) && /is not an address/.test((err as Error).message), host)
    assert.equal(tp.app.server.listening, false)
  }
})

test('library: invalid options are refused with a typed TP_ERR_CONFIG error', async () => {
  await assert.rejects(createToolport({ syncTimeoutMs: -1 }), isCode('TP_ERR_CONFIG', 500))
  await assert.rejects(createToolport({ unknownOption: true } as never), isCode('TP_ERR_CONFIG', 500))
})

test('library: roles.add, roles.remove, roles.names and roles.get manage the current roles', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lanlan'] })
  const nova = tp.roles.add('Nova')
  assert.equal(nova.name, 'Nova')
  assert.equal(tp.roles.get('Nova'), nova)
  assert.deepEqual(tp.roles.names(), ['Lanlan', 'Nova'])
  assert.equal(tp.roles.remove('Nova'), true)
  assert.equal(tp.roles.remove('Nova'), false)
  assert.deepEqual(tp.roles.names(), ['Lanlan'])
})

test('R6: roles.get of an unknown role throws a typed error with code TP_ERR_ROLE_NOT_FOUND', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lanlan'] })
  assert.throws(() => tp.roles.get('Nobody'), isCode('TP_ERR_ROLE_NOT_FOUND', 404))
  assert.throws(() => tp.roles.get('Nobody'), (err: unknown) => isToolportError(err))
})

test('library: adding a role that exists throws TP_ERR_ROLE_EXISTS', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lanlan'] })
  assert.throws(() => tp.roles.add('Lanlan'), isCode('TP_ERR_ROLE_EXISTS', 409))
})

test('library: attachSession returns a detach function; after it the session gets no more syncs', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lanlan'] })
  const s = session('realtime-1', 'instant')
  const detach = tp.roles.get('Lanlan').attachSession(s)
  assert.equal(typeof detach, 'function')
  await tp.register(tool('a'))
  assert.deepEqual(s.currentNames, ['a'])
  detach()
  const calls = s.calls
  await tp.register(tool('b'))
  assert.equal(s.calls, calls)
  assert.deepEqual(tp.roles.get('Lanlan').sessions(), [])
})

test('library: registerLocalTool adds an in-process tool, listed with is_remote false and callback_url null', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lanlan'] })
  const outcome = await tp.roles.get('Lanlan').registerLocalTool({
    name: 'get_time',
    description: 'Current time',
    parameters: { type: 'object', properties: {} },
    source: 'host:clock',
    handler: async () => new Date().toISOString()
  })
  assert.equal(outcome.ok, true)
  assert.deepEqual(tp.list('Lanlan').tools_by_role.Lanlan, [
    { name: 'get_time', description: 'Current time', source: 'host:clock', callback_url: null, is_remote: false }
  ])
})

test('library: registerLocalTool with an invalid name or handler, or a key it does not take, throws a typed error and registers nothing', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lanlan'] })
  const role = tp.roles.get('Lanlan')
  await assert.rejects(role.registerLocalTool({ name: '', handler: () => 1 }), (err: unknown) => isToolportError(err))
  await assert.rejects(role.registerLocalTool({ name: 'x'.repeat(65), handler: () => 1 }),
    (err: unknown) => isToolportError(err))
  await assert.rejects(role.registerLocalTool({ name: 'x', handler: 'nope' as never }),
    (err: unknown) => isToolportError(err))
  // A key it does not take (the HTTP API's snake_case spelling) is refused, never ignored: the tool
  // would get the default 30 s deadline.
  await assert.rejects(role.registerLocalTool({ name: 'x', timeout_seconds: 120, handler: () => 1 } as never),
    (err: unknown) => isToolportError(err) && err.code === 'TP_ERR_VALIDATION' &&
      /timeout_seconds/.test(`${err.message} ${JSON.stringify(err.details)}`))
  assert.deepEqual(names(tp, 'Lanlan'), [])
})

test('library: registerLocalTool holds a tool to the registration size limits (README "Options": limits.maxDescriptionChars, maxParametersBytes, maxParametersDepth)', async (t) => {
  const tp = await createTestToolport(t, {
    roles: ['Lanlan'],
    limits: { maxDescriptionChars: 10, maxParametersBytes: 256, maxParametersDepth: 4 }
  })
  const role = tp.roles.get('Lanlan')
  const handler = (): number => 1
  const refusedAt = async (options: Parameters<typeof role.registerLocalTool>[0], path: string): Promise<void> => {
    await assert.rejects(role.registerLocalTool(options), (err: unknown) => {
      isCode('TP_ERR_VALIDATION', 422)(err)
      assert.deepEqual((err as { details: Array<{ path: string }> }).details.map((d) => d.path), [path])
      return true
    })
  }
  await refusedAt({ name: 'long', description: 'x'.repeat(11), handler }, 'description')
  await refusedAt({ name: 'big', parameters: { type: 'object', description: 'y'.repeat(256) }, handler }, 'parameters')
  await refusedAt({ name: 'deep', parameters: { type: 'object', properties: { a: { type: 'object', properties: { b: {} } } } }, handler }, 'parameters')
  assert.deepEqual(names(tp, 'Lanlan'), [])
  // At the limits, it is registered.
  await role.registerLocalTool({ name: 'fits', description: 'x'.repeat(10), handler })
  assert.deepEqual(names(tp, 'Lanlan'), ['fits'])
})

test('library: a local tool\'s signal aborts with a TimeoutError at its deadline and an AbortError when the call is cancelled', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lanlan'] })
  const reasons: unknown[] = []
  await tp.roles.get('Lanlan').registerLocalTool({
    name: 'wait',
    timeoutSeconds: 0.2,
    handler: (_args, ctx) => new Promise((resolve) => {
      ctx.signal.addEventListener('abort', () => { reasons.push(ctx.signal.reason); resolve(null) })
    })
  })
  const timedOut = await tp.callTool('Lanlan', { name: 'wait' })
  assert.match(timedOut.error ?? '', /timed out/)
  const caller = new AbortController()
  const cancelled = tp.callTool('Lanlan', { name: 'wait' }, { signal: caller.signal })
  caller.abort()
  assert.match((await cancelled).error ?? '', /cancelled/)
  assert.deepEqual(reasons.map((r) => [r instanceof DOMException, (r as DOMException).name]),
    [[true, 'TimeoutError'], [true, 'AbortError']])
})

/** Runs the same steps through the library on one Toolport and through the routes on another. */
test('library: register, unregister, clear and list give the same result objects as the routes', async (t) => {
  const viaLibrary = await createTestToolport(t, { roles: ['Lanlan', 'Mochi'] })
  const viaRoutes = await createTestToolport(t, { roles: ['Lanlan', 'Mochi'] })
  const steps: Array<['register' | 'unregister' | 'clear', Record<string, unknown>]> = [
    ['register', tool('get_weather', { source: 'plugin:weather', description: 'Weather.' })],
    ['register', tool('get_news', { source: 'plugin:news', role: 'Mochi' })],
    ['register', tool('get_weather', { source: 'plugin:weather', description: 'Weather v2.' })],
    ['unregister', { name: 'get_news', role: 'Lanlan' }],
    ['unregister', { name: 'get_news' }],
    ['register', tool('x', { source: 'plugin:weather', role: 'Lanlan' })],
    ['unregister', { name: 'x', expected_source: 'plugin:other' }],
    ['clear', { source: 'plugin:weather', role: 'Mochi' }],
    ['clear', { source: 'plugin:weather' }],
    ['clear', { source: 'plugin:none' }]
  ]
  for (const [action, body] of steps) {
    const fromLibrary = await viaLibrary[action](body)
    const fromRoute = await inject(viaRoutes, 'POST', `/api/tools/${action}`, body)
    assert.equal(fromRoute.statusCode, 200)
    assert.deepEqual(fromLibrary, fromRoute.body, `${action} ${JSON.stringify(body)}`)
    assert.deepEqual(plain(viaLibrary.list()), (await inject(viaRoutes, 'GET', '/api/tools')).body)
    assert.deepEqual(plain(viaLibrary.list('Mochi')), (await inject(viaRoutes, 'GET', '/api/tools?role=Mochi')).body)
  }
})

test('library: with no roles, register gives the same ok false result as the route', async (t) => {
  const viaLibrary = await createTestToolport(t, { roles: [] })
  const viaRoutes = await createTestToolport(t, { roles: [] })
  assert.deepEqual(await viaLibrary.register(tool('x')), (await inject(viaRoutes, 'POST', '/api/tools/register',
    tool('x'))).body)
})

test('library: list is synchronous', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lanlan'] })
  await tp.register(tool('x'))
  const result = tp.list()
  assert.equal(typeof (result as unknown as { then?: unknown }).then, 'undefined')
  assert.deepEqual(result.tools_by_role.Lanlan?.map((r) => r.name), ['x'])
})

test('R6: library register, unregister and clear with an unknown role reject with TP_ERR_ROLE_NOT_FOUND', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lanlan'] })
  await assert.rejects(tp.register(tool('x', { role: 'Nobody' })), isCode('TP_ERR_ROLE_NOT_FOUND', 404))
  await assert.rejects(tp.unregister({ name: 'x', role: 'Nobody' }), isCode('TP_ERR_ROLE_NOT_FOUND', 404))
  await assert.rejects(tp.clear({ source: 'x', role: 'Nobody' }), isCode('TP_ERR_ROLE_NOT_FOUND', 404))
})

test('R18: library list of an unknown role throws TP_ERR_ROLE_NOT_FOUND synchronously', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lanlan'] })
  assert.throws(() => tp.list('Nobody'), isCode('TP_ERR_ROLE_NOT_FOUND', 404))
})

test('R7: library register with an invalid body rejects with TP_ERR_VALIDATION and details', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lanlan'] })
  await assert.rejects(tp.register({ name: '', callback_url: 'http://10.0.0.1/' }), (err: unknown) => {
    isCode('TP_ERR_VALIDATION', 422)(err)
    const details = (err as { details: Array<{ path: string }> }).details
    assert.deepEqual(details.map((d) => d.path).sort(), ['callback_url', 'name'])
    return true
  })
  await assert.rejects(tp.register(null), isCode('TP_ERR_VALIDATION', 422))
  await assert.rejects(tp.unregister({}), isCode('TP_ERR_VALIDATION', 422))
  await assert.rejects(tp.clear({}), isCode('TP_ERR_VALIDATION', 422))
})

test('library: close() stops the server, can be called twice, and later mutations reject with TP_ERR_CLOSED', async () => {
  const tp: Toolport = await createToolport({ roles: ['Lanlan'], dispatch: { mode: 'inline' } })
  await tp.listen({ host: '127.0.0.1', port: 0 })
  await tp.close()
  await tp.close()
  assert.equal(tp.app.server.listening, false)
  await assert.rejects(tp.register(tool('x')), isCode('TP_ERR_CLOSED', 503))
})

test('library: the default dispatch pool starts and closes cleanly', async () => {
  const tp = await createToolport({ roles: ['Lanlan'] })
  assert.equal(tp[kDispatchMode], 'pool')
  await tp.register(tool('x'))
  await tp.close()
})

test('library: toolportPlugin mounts the routes in a host app, guarded, without guarding the host\'s own routes', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lanlan'] })
  const host = fastify()
  t.after(() => host.close())
  host.get('/health', async () => ({ up: true }))
  await host.register(toolportPlugin, { runtime: tp })
  await host.ready()

  const registered = await host.inject({ method: 'POST', url: '/api/tools/register', payload: tool('x') })
  assert.equal(registered.statusCode, 200)
  assert.equal(registered.json().ok, true)
  assert.deepEqual(names(tp, 'Lanlan'), ['x'])

  const listed = await host.inject({ method: 'GET', url: '/api/tools' })
  assert.deepEqual(listed.json(), plain(tp.list()))

  const remote = await host.inject({ method: 'GET', url: '/api/tools', remoteAddress: '10.1.2.3' })
  assertError({ statusCode: remote.statusCode, headers: remote.headers, body: remote.json() }, 403,
    'TP_ERR_NOT_LOOPBACK')
  const remoteHealth = await host.inject({ method: 'GET', url: '/health', remoteAddress: '10.1.2.3' })
  assert.equal(remoteHealth.statusCode, 200)

  const unknownRole = await host.inject({ method: 'GET', url: '/api/tools?role=Nobody' })
  assertError({ statusCode: unknownRole.statusCode, headers: unknownRole.headers, body: unknownRole.json() }, 404,
    'TP_ERR_ROLE_NOT_FOUND')
  const form = await host.inject({
    method: 'POST',
    url: '/api/tools/clear',
    payload: 'source=x',
    headers: { 'content-type': 'application/x-www-form-urlencoded' }
  })
  assertError({ statusCode: form.statusCode, headers: form.headers, body: form.json() }, 415,
    'TP_ERR_UNSUPPORTED_MEDIA_TYPE')
})

test('library: in a host\'s app, errors the host\'s own hooks throw (401, 403, 429) reach the host\'s error handler unchanged; Toolport\'s own errors stay Toolport\'s (README "Embedding: the library")', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lanlan'] })
  const host = fastify()
  t.after(() => host.close())
  type HostError = Error & { statusCode?: number, status?: number, code?: unknown }
  host.setErrorHandler(async (err: HostError, _request, reply) => {
    return await reply.code(err.statusCode ?? err.status ?? 500).send({ host: err.code, message: err.message })
  })
  host.addHook('onRequest', async (request) => {
    const user = request.headers['x-user']
    if (user === undefined) throw Object.assign(new Error('login required'), { statusCode: 401, code: 'HOST_AUTH' })
    if (user === 'bob') throw Object.assign(new Error('admins only'), { statusCode: 403, code: 'HOST_FORBIDDEN' })
    if (user === 'flood') throw Object.assign(new Error('slow down'), { statusCode: 429, code: 'HOST_RATE' })
    // A numeric code, and `status` instead of `statusCode` (fastify answers either).
    if (user === 'legacy') throw Object.assign(new Error('numbered'), { statusCode: 403, code: 4031 })
    if (user === 'koa') throw Object.assign(new Error('gone'), { status: 410, code: 'HOST_GONE' })
  })
  await host.register(toolportPlugin, { runtime: tp, prefix: '/tp' })
  const cases = [[undefined, 401, 'HOST_AUTH'], ['bob', 403, 'HOST_FORBIDDEN'], ['flood', 429, 'HOST_RATE'],
    ['legacy', 403, 4031], ['koa', 410, 'HOST_GONE']] as const
  for (const url of ['/tp/api/tools', '/tp/mcp/Lanlan']) {
    for (const [user, status, code] of cases) {
      const res = await host.inject({ method: 'GET', url, headers: user === undefined ? {} : { 'x-user': user } })
      assert.equal(res.statusCode, status, `${url} ${user ?? '(none)'}`)
      assert.equal(res.json().host, code, `${url} ${user ?? '(none)'}`)
    }
  }
  // Toolport's own refusals, and a body it cannot read, are still answered in its own shape.
  const admin = { 'x-user': 'admin' }
  const unknownRole = await host.inject({ method: 'GET', url: '/tp/api/tools?role=Nobody', headers: admin })
  assertError({ statusCode: unknownRole.statusCode, headers: unknownRole.headers, body: unknownRole.json() }, 404,
    'TP_ERR_ROLE_NOT_FOUND')
  const badJson = await host.inject({
    method: 'POST', url: '/tp/api/tools/register', payload: '{', headers: { ...admin, 'content-type': 'application/json' }
  })
  assertError({ statusCode: badJson.statusCode, headers: badJson.headers, body: badJson.json() }, 400, 'TP_ERR_BAD_JSON')
  const remote = await host.inject({ method: 'GET', url: '/tp/api/tools', headers: admin, remoteAddress: '10.1.2.3' })
  assertError({ statusCode: remote.statusCode, headers: remote.headers, body: remote.json() }, 403,
    'TP_ERR_NOT_LOOPBACK')
})

test('library: in a host\'s app, the routes answer in their own shape whatever the host\'s root reply serializer, and enforce and name limits.maxBodyBytes whatever the host\'s bodyLimit (README "Embedding: the library")', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lanlan'], limits: { maxBodyBytes: 2048 } })
  const host = fastify({ bodyLimit: 100 })
  t.after(() => host.close())
  host.setReplySerializer((payload) => JSON.stringify({ data: payload }))
  host.get('/mine', async () => ({ up: true }))
  // The host's own answer on a Toolport route, before Toolport's hooks: in the host's envelope.
  host.addHook('onRequest', async (request, reply) => {
    if (request.headers['x-login'] === 'no') return await reply.code(401).send({ login: 'required' })
  })
  await host.register(toolportPlugin, { runtime: tp })
  assert.deepEqual((await host.inject({ method: 'GET', url: '/mine' })).json(), { data: { up: true } })
  const login = await host.inject({ method: 'GET', url: '/api/health', headers: { 'x-login': 'no' } })
  assert.deepEqual([login.statusCode, login.json()], [401, { data: { login: 'required' } }])
  // Toolport's own answers are byte for byte the standalone server's.
  const standalone = await tp.app.inject({ method: 'GET', url: '/api/health' })
  const hosted = await host.inject({ method: 'GET', url: '/api/health' })
  assert.deepEqual(Object.keys(hosted.json()), Object.keys(standalone.json()))

  const registered = await host.inject({ method: 'POST', url: '/api/tools/register', payload: tool('x') })
  assert.equal(registered.statusCode, 200, registered.body)
  assert.deepEqual(registered.json(), { ok: true, registered: 'x', affected_roles: ['Lanlan'], failed_roles: [] })
  const health = await host.inject({ method: 'GET', url: '/api/health' })
  assert.equal(health.json().ok, true)
  const unknownRole = await host.inject({ method: 'GET', url: '/api/tools?role=Nobody' })
  assertError({ statusCode: unknownRole.statusCode, headers: unknownRole.headers, body: unknownRole.json() }, 404,
    'TP_ERR_ROLE_NOT_FOUND')

  // 500 bytes: over the host's 100, under Toolport's 2048: accepted.
  const medium = await host.inject({ method: 'POST', url: '/api/tools/register', payload: tool('y', { description: 'd'.repeat(400) }) })
  assert.equal(medium.statusCode, 200, medium.body)
  const large = await host.inject({ method: 'POST', url: '/api/tools/register', payload: tool('z', { description: 'd'.repeat(5000) }) })
  assertError({ statusCode: large.statusCode, headers: large.headers, body: large.json() }, 413, 'TP_ERR_BODY_TOO_LARGE')
  assert.match(large.json().message, /\b2048 bytes/)
})

test('library: toolportPlugin also mounts under a prefix', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lanlan'] })
  const host = fastify()
  t.after(() => host.close())
  await host.register(toolportPlugin, { runtime: tp, prefix: '/toolport' })
  const res = await host.inject({ method: 'GET', url: '/toolport/api/tools' })
  assert.equal(res.statusCode, 200)
  assert.deepEqual(res.json(), { ok: true, tools_by_role: { Lanlan: [] } })
})

test('library: a local tool\'s deadline and cancellation end its call-finished event as `timeout` and `cancelled`, as for a callback; a non-Error it throws is the error as its JSON, as the plugin SDKs answer it', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  const role = tp.roles.get('A')
  await role.registerLocalTool({ name: 'stuck', timeoutSeconds: 0.05, handler: async () => await new Promise(() => {}) })
  const thrown: unknown = { code: 7 }
  await role.registerLocalTool({ name: 'odd', handler: () => { throw thrown } })
  const outcomes: string[] = []
  tp.on('call-finished', (event) => { outcomes.push(`${event.name}:${event.outcome}`) })
  assert.match((await tp.callTool('A', { name: 'stuck' })).error ?? '', /timed out after 0\.05 s/)
  const controller = new AbortController()
  const cancelled = tp.callTool('A', { name: 'stuck' }, { signal: controller.signal })
  controller.abort()
  assert.match((await cancelled).error ?? '', /call was cancelled/)
  assert.equal((await tp.callTool('A', { name: 'odd' })).error, '{"code":7}')
  assert.deepEqual(outcomes, ['stuck:timeout', 'stuck:cancelled', 'odd:local_error'])
})

test('library: a schema that refers to its own root (`$ref: "#"`, what zod writes for a recursive object) registers and checks its arguments, local or remote', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  const callback = await callbackServer(t)
  const tree = {
    type: 'object',
    properties: { name: { type: 'string' }, children: { type: 'array', items: { $ref: '#' } } },
    required: ['name', 'children']
  }
  await tp.roles.get('A').registerLocalTool({ name: 'local_tree', parameters: tree, handler: (args) => (args as { name: string }).name })
  assert.equal((await tp.register({ name: 'remote_tree', role: 'A', callback_url: `${callback.url}/echo`, parameters: tree })).ok, true)
  for (const name of ['local_tree', 'remote_tree']) {
    const ok = await tp.callTool('A', { name, arguments: { name: 'a', children: [{ name: 'b', children: [] }] } })
    assert.equal(ok.is_error, false, `${name}: ${ok.text}`)
    const bad = await tp.callTool('A', { name, arguments: { name: 'a', children: [{ name: 'b' }] } })
    assert.equal(bad.is_error, true)
    assert.match(bad.error ?? '', /\/children\/0 must have required property 'children'/)
  }
})

test('library: `arguments` are checked in the JSON form the callback receives: NaN, a toJSON() and a Map are checked as what they encode to (README "Embedding: the library")', async (t) => {
  const server = await callbackServer(t)
  const tp = await createTestToolport(t, { roles: ['Lanlan'] })
  const parameters = {
    type: 'object',
    properties: { when: { type: 'object' }, n: { type: 'number' }, m: { type: 'object', maxProperties: 0 } },
    additionalProperties: false
  }
  await tp.register(tool('remote', { callback_url: `${server.url}/echo`, parameters }) as never)
  const received: unknown[] = []
  await tp.roles.get('Lanlan').registerLocalTool({
    name: 'local', parameters, handler: async (args) => { received.push(args); return 'ok' }
  })
  const refused = [
    { n: Number.NaN },
    { n: Number.POSITIVE_INFINITY },
    { when: { year: 2024, toJSON: () => 'not-an-object' } }
  ]
  for (const name of ['remote', 'local']) {
    for (const args of refused) {
      const result = await tp.callTool('Lanlan', { name, arguments: args })
      assert.equal(result.is_error, true, `${name} ${JSON.stringify(args)}`)
      assert.match(result.error ?? '', /must be (number|object)/)
    }
  }
  assert.equal(server.requests.length, 0, 'no refused call reached the callback')
  assert.deepEqual(received, [])
  // A Map encodes to {} and is checked (and handed to a local handler) as {}.
  const local = await tp.callTool('Lanlan', { name: 'local', arguments: { m: new Map([['k', 1]]) } })
  assert.equal(local.is_error, false)
  assert.deepEqual(received, [{ m: {} }])
  const remote = await tp.callTool('Lanlan', { name: 'remote', arguments: { m: new Map([['k', 1]]) } })
  assert.equal(remote.is_error, false)
  assert.deepEqual(JSON.parse(server.requests[0]?.body ?? '').arguments, { m: {} })
})
