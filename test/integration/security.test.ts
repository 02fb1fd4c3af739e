// The defences beyond docs/protocol.md R1: token mode, ownership mode, size limits and caps,
// random bodies never 5xx, and private data never reaching the logs.
import { test, type TestContext } from 'node:test'
import assert from 'node:assert/strict'
import { once } from 'node:events'
import { createInterface } from 'node:readline'
import { PassThrough } from 'node:stream'
import fc from 'fast-check'
import { request } from 'undici'
import { createToolport, type Toolport } from '../../src/main/index.js'
import type { ToolportOptions } from '../../src/main/config.js'
import { main } from '../../src/main/cli.js'
import { startCallbackServer } from '../fixtures/callback-server.js'
import { createTestToolport } from '../helpers.js'

const CALLBACK = 'http://127.0.0.1:9/tools/x'

/** Two roles, inline dispatch unless `options.dispatch` says otherwise; closed in t.after. */
function setup (t: TestContext, options: ToolportOptions = {}): Promise<Toolport> {
  return createTestToolport(t, { roles: ['Lanlan', 'Mochi'], ...options })
}

function post (tp: Toolport, url: string, payload: unknown, headers: Record<string, string> = {}) {
  return tp.app.inject({
    method: 'POST',
    url,
    payload: JSON.stringify(payload),
    headers: { 'content-type': 'application/json', ...headers }
  })
}

test('token mode: a request without the bearer token is 401 TP_ERR_UNAUTHORIZED; with it, it passes', async (t) => {
  const token = 'x'.repeat(16) + 'y'.repeat(24)
  const tp = await setup(t, { security: { token } })
  const none = await tp.app.inject({ method: 'GET', url: '/api/tools' })
  assert.equal(none.statusCode, 401)
  assert.equal(none.json().code, 'TP_ERR_UNAUTHORIZED')
  assert.equal(none.headers['www-authenticate'], 'Bearer')
  const wrong = await tp.app.inject({
    method: 'GET',
    url: '/api/tools',
    headers: { authorization: `Bearer ${token}z` }
  })
  assert.equal(wrong.statusCode, 401)
  const right = await tp.app.inject({ method: 'GET', url: '/api/tools', headers: { authorization: `Bearer ${token}` } })
  assert.equal(right.statusCode, 200)
  // The token never appears in an answer.
  assert.ok(!none.body.includes(token) && !wrong.body.includes(token))
})

test('token mode: a token shorter than 32 bytes is refused at start-up', async () => {
  await assert.rejects(createToolport({ security: { token: 'short' } }), { code: 'TP_ERR_CONFIG' })
})

test('ownership mode: a registration cannot replace a tool another source owns (ok: false, owner named)', async (t) => {
  const tp = await setup(t, { security: { enforceOwnership: true } })
  assert.equal((await tp.register({ name: 'get_weather', callback_url: CALLBACK, source: 'plugin:weather' })).ok, true)
  const hijack = await tp.register({ name: 'get_weather', callback_url: CALLBACK, source: 'plugin:evil' })
  assert.equal(hijack.ok, false)
  assert.deepEqual(hijack.failed_roles.map((f) => [f.role, f.owned_by]), [['Lanlan', 'plugin:weather'], ['Mochi',
    'plugin:weather']])
  assert.equal(tp.list('Lanlan').tools_by_role.Lanlan![0]!.source, 'plugin:weather')
  // The owner itself may still replace its tool.
  assert.equal((await tp.register({
    name: 'get_weather',
    callback_url: CALLBACK,
    source: 'plugin:weather',
    description: 'v2'
  })).ok, true)
})

test('without ownership mode a registration replaces any remote tool of that name (docs/protocol.md R5)', async (t) => {
  const tp = await setup(t)
  await tp.register({ name: 'get_weather', callback_url: CALLBACK, source: 'plugin:weather' })
  assert.equal((await tp.register({ name: 'get_weather', callback_url: CALLBACK, source: 'plugin:other' })).ok, true)
  assert.equal(tp.list('Lanlan').tools_by_role.Lanlan![0]!.source, 'plugin:other')
})

const LIMIT_CASES: Array<{
  name: string,
  options: ToolportOptions,
  body: Record<string, unknown>,
  status: number,
  code: string,
  path?: string
}> = [
  {
    name: 'a parameters schema over maxParametersBytes is 422 naming parameters',
    options: { limits: { maxParametersBytes: 1024 } },
    body: { parameters: { type: 'object', description: 'x'.repeat(2000) } },
    status: 422,
    code: 'TP_ERR_VALIDATION',
    path: 'parameters'
  },
  {
    name: 'a parameters schema nested deeper than maxParametersDepth is 422 naming parameters',
    options: { limits: { maxParametersDepth: 4 } },
    body: { parameters: { a: { b: { c: { d: { e: {} } } } } } },
    status: 422,
    code: 'TP_ERR_VALIDATION',
    path: 'parameters'
  },
  {
    name: 'a description over maxDescriptionChars is 422 naming description',
    options: { limits: { maxDescriptionChars: 10 } },
    body: { description: 'eleven char' },
    status: 422,
    code: 'TP_ERR_VALIDATION',
    path: 'description'
  }
]

for (const c of LIMIT_CASES) {
  test(`limits: ${c.name}`, async (t) => {
    const tp = await setup(t, c.options)
    const res = await post(tp, '/api/tools/register', { name: 'x', callback_url: CALLBACK, ...c.body })
    assert.equal(res.statusCode, c.status)
    assert.equal(res.json().code, c.code)
    if (c.path !== undefined) assert.ok(res.json().details.some((d: { path: string }) => d.path === c.path))
    assert.equal(tp.list().tools_by_role.Lanlan!.length, 0)
  })
}

test('limits: a body over maxBodyBytes is 413 TP_ERR_BODY_TOO_LARGE', async (t) => {
  const tp = await setup(t, { limits: { maxBodyBytes: 2048 } })
  const res = await post(tp, '/api/tools/register', {
    name: 'x',
    callback_url: CALLBACK,
    description: 'd'.repeat(4096)
  })
  assert.equal(res.statusCode, 413)
  assert.equal(res.json().code, 'TP_ERR_BODY_TOO_LARGE')
})

test('limits: JSON nested past maxJsonDepth is 413 TP_ERR_JSON_TOO_DEEP before it is parsed', async (t) => {
  const tp = await setup(t)
  const deep = '{"a":'.repeat(100_000) + '1' + '}'.repeat(100_000)
  const res = await tp.app.inject({
    method: 'POST',
    url: '/api/tools/register',
    payload: deep,
    headers: { 'content-type': 'application/json' }
  })
  assert.equal(res.statusCode, 413)
  assert.equal(res.json().code, 'TP_ERR_JSON_TOO_DEEP')
})

test('limits: a role at maxToolsPerRole refuses a new name with 422 TP_ERR_LIMIT_EXCEEDED, but replacing still works', async (t) => {
  const tp = await setup(t, { limits: { maxToolsPerRole: 2 } })
  await tp.register({ name: 'a', callback_url: CALLBACK })
  await tp.register({ name: 'b', callback_url: CALLBACK })
  const res = await post(tp, '/api/tools/register', { name: 'c', callback_url: CALLBACK })
  assert.equal(res.statusCode, 422)
  assert.equal(res.json().code, 'TP_ERR_LIMIT_EXCEEDED')
  // Every 422 carries `details` (docs/protocol.md R7): here the option that was reached.
  assert.deepEqual(res.json().details, [{ path: 'limits.maxToolsPerRole', code: 'too_big', message: "role 'Lanlan' already has 2 tools" }])
  assert.equal((await tp.register({ name: 'b', callback_url: CALLBACK, description: 'new' })).ok, true)
  assert.deepEqual(tp.list('Lanlan').tools_by_role.Lanlan!.map((x) => x.name), ['a', 'b'])
})

test('limits: a source at maxToolsPerSource in a role is refused with 422; other sources are not', async (t) => {
  const tp = await setup(t, { limits: { maxToolsPerSource: 1 } })
  await tp.register({ name: 'a', callback_url: CALLBACK, source: 'plugin:one' })
  const res = await post(tp, '/api/tools/register', { name: 'b', callback_url: CALLBACK, source: 'plugin:one' })
  assert.equal(res.statusCode, 422)
  assert.equal(res.json().code, 'TP_ERR_LIMIT_EXCEEDED')
  assert.match(res.json().message, /^limit exceeded: source 'plugin:one' already has 1 tools in role 'Lanlan' \(limits\.maxToolsPerSource\)$/)
  assert.deepEqual(res.json().details?.map((d: { path: string }) => d.path), ['limits.maxToolsPerSource'])
  assert.equal((await tp.register({ name: 'b', callback_url: CALLBACK, source: 'plugin:two' })).ok, true)
})

test('a listening server caps its connections (limits.maxConnections)', async (t) => {
  const tp = await setup(t, { limits: { maxConnections: 7 } })
  await tp.listen({ port: 0 })
  assert.equal(tp.app.server.maxConnections, 7)
})

test('a non-loopback bind is refused unless allowNonLoopbackBind is set', async (t) => {
  const tp = await setup(t)
  await assert.rejects(tp.listen({ host: '0.0.0.0', port: 0 }), { code: 'TP_ERR_CONFIG' })
})

const ROUTES = [
  ['POST', '/api/tools/register'],
  ['POST', '/api/tools/unregister'],
  ['POST', '/api/tools/clear'],
  ['POST', '/api/tools/call'],
  ['GET', '/api/tools']
] as const

test('property: random JSON bodies never produce a 5xx on any route', async (t) => {
  const tp = await setup(t)
  await tp.register({ name: 'x', callback_url: CALLBACK })
  const field = fc.oneof(fc.constantFrom('name', 'role', 'source', 'callback_url', 'parameters', 'timeout_seconds',
    'description',
    'arguments', 'raw_arguments', 'call_id', 'expected_source', '__proto__', 'constructor'), fc.string())
  const body = fc.oneof(
    fc.jsonValue(),
    fc.dictionary(field, fc.jsonValue(), { maxKeys: 8 }),
    fc.record({
      name: fc.string(),
      callback_url: fc.oneof(fc.webUrl(), fc.string()),
      role: fc.option(fc.constantFrom('Lanlan', 'Nope', ''))
    })
  )
  await fc.assert(fc.asyncProperty(fc.constantFrom(...ROUTES), body, async ([method, url], payload) => {
    const res = method === 'GET'
      ? await tp.app.inject({
        method,
        url: `${url}?role=${encodeURIComponent(String((payload as { role?: unknown })?.role ?? 'Lanlan'))}`
      })
      : await tp.app.inject({
        method,
        url,
        payload: JSON.stringify(payload) ?? 'null',
        headers: { 'content-type': 'application/json' }
      })
    assert.ok(res.statusCode < 500, `${method} ${url} ${JSON.stringify(payload)} → ${res.statusCode} ${res.body}`)
  }), { numRuns: 300 })
})

test('R14: arguments, outputs and callback bodies never reach the logs, at any level', async (t) => {
  const canary = `canary-${process.pid}-${Date.now()}-7f3e`
  const callback = await startCallbackServer()
  t.after(() => callback.close())
  // The `toolport serve` command in-process, with its own stdout and stderr (what its logs reach).
  const stdout = new PassThrough()
  const stderr = new PassThrough()
  const stop = new AbortController()
  const exited = main(['serve', '--port', '0', '--role', 'A', '--log-level', 'trace'],
    { stdin: new PassThrough(), stdout, stderr, env: {}, stop: stop.signal })
  t.after(async () => {
    stop.abort('SIGTERM')
    await exited
  })
  const output: string[] = []
  stderr.on('data', (chunk: Buffer) => output.push(chunk.toString()))
  const lines = createInterface({ input: stdout })
  let base = ''
  for await (const line of lines) {
    output.push(line)
    const match = /listening on (http:\/\/127\.0\.0\.1:\d+)/.exec(line)
    if (match !== null) {
      base = match[1] as string
      break
    }
  }
  lines.on('line', (line) => output.push(line))
  assert.notEqual(base, '')
  async function call (path: string, body: unknown): Promise<unknown> {
    const res = await request(`${base}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(body)
    })
    return await res.body.json()
  }
  await call('/api/tools/register', {
    name: 'echo',
    callback_url: `${callback.url}/echo`,
    source: 'plugin:echo',
    description: 'echoes'
  })
  await call('/api/tools/register', {
    name: 'strict',
    callback_url: `${callback.url}/echo`,
    parameters: { type: 'object', properties: { n: { type: 'number' } } }
  })
  await call('/api/tools/register', { name: 'fails', callback_url: `${callback.url}/status/500` })
  const echoed = await call('/api/tools/call', {
    role: 'A',
    name: 'echo',
    arguments: { secret: canary }
  }) as { text: string }
  assert.ok(echoed.text.includes(canary), 'the canary made the round trip through the callback')
  await call('/api/tools/call', { role: 'A', name: 'echo', raw_arguments: `{"secret": "${canary}"` })
  await call('/api/tools/call', { role: 'A', name: 'strict', arguments: { n: canary } })
  await call('/api/tools/call', { role: 'A', name: 'fails', arguments: { secret: canary } })
  await call('/api/tools/call', { role: 'A', name: `no-such-${canary}`.slice(0, 60), arguments: {} })
  await call('/api/tools/register', { name: 'bad', callback_url: `http://${canary}.example/`, description: canary })
  stop.abort('SIGTERM')
  assert.equal(await exited, 0)
  stdout.end()
  await once(stdout, 'end')
  const log = output.join('\n')
  assert.match(log, /tool call finished/, 'calls were logged (metadata) at debug')
  assert.ok(!log.includes(canary), 'the canary appears in the logs')
})

test('allow-lists in a form the guard never matches are refused at start, saying what to write: an origin with a path, upper case or a default port; a host with a port or a scheme', async (t) => {
  const refusals: Array<[ToolportOptions['security'], RegExp]> = [
    [{ allowedOrigins: ['http://localhost:5173/'] }, /allowedOrigins\.0: "http:\/\/localhost:5173\/" is not an origin as a browser sends it: write "http:\/\/localhost:5173"/],
    [{ allowedOrigins: ['HTTP://App.example:8080'] }, /write "http:\/\/app\.example:8080"/],
    [{ allowedOrigins: ['http://app.example:80'] }, /write "http:\/\/app\.example"/],
    [{ allowedOrigins: ['null'] }, /"null" is not an origin/],
    [{ allowedHosts: ['dev.test:5173'] }, /allowedHosts\.0: "dev\.test:5173" is not a host name/],
    [{ allowedHosts: ['http://dev.test'] }, /is not a host name/],
    [{ allowedHosts: ['bücher.example'] }, /in its xn-- form/]
  ]
  for (const [security, message] of refusals) {
    await assert.rejects(createToolport({ security }), (err: Error & { code?: string }) => {
      assert.equal(err.code, 'TP_ERR_CONFIG')
      assert.match(err.message, message)
      return true
    })
  }
  // The forms the guard matches work, upper-case host names included (Host is compared in lower case).
  const tp = await setup(t, {
    security: { allowedOrigins: ['http://localhost:5173', 'chrome-extension://abcdef'], allowedHosts: ['Dev.Test', '[::2]'] }
  })
  for (const origin of ['http://localhost:5173', 'chrome-extension://abcdef']) {
    const res = await tp.app.inject({ method: 'GET', url: '/api/tools', headers: { host: 'dev.test:3917', origin } })
    assert.equal(res.statusCode, 200, origin)
  }
  // Bracketed as in a URL, an IPv4-mapped address is still refused as a bind address.
  await assert.rejects(tp.listen({ host: '[::ffff:127.0.0.1]', port: 0 }), { code: 'TP_ERR_CONFIG' })
})
