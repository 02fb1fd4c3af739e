// Operating Toolport: /metrics, /api/health, /openapi.json, the typed events, and the docs that
// must match the code (README error table and configuration reference).
import { test, type TestContext } from 'node:test'
import assert from 'node:assert/strict'
import { readFileSync } from 'node:fs'
import { ERROR_CODES, type Toolport } from '../../src/main/index.js'
import type { ToolportOptions } from '../../src/main/config.js'
import { optionsSchema, parseOptions } from '../../src/main/config.js'
import { VERSION } from '../../src/main/version.js'
import { startCallbackServer } from '../fixtures/callback-server.js'
import { createTestToolport } from '../helpers.js'

const README = readFileSync(new URL('../../README.md', import.meta.url), 'utf8')

/** Two roles, inline dispatch unless `options.dispatch` says otherwise; closed in t.after. */
function setup (t: TestContext, options: ToolportOptions = {}): Promise<Toolport> {
  return createTestToolport(t, { roles: ['Lanlan', 'Mochi'], ...options })
}

test('GET /metrics counts calls by role, tool and outcome, with bounded labels only', async (t) => {
  const tp = await setup(t)
  const server = await startCallbackServer()
  t.after(() => server.close())
  await tp.register({ name: 'echo', callback_url: `${server.url}/echo` })
  await tp.callTool('Lanlan', { name: 'echo', call_id: 'call_secret_id', arguments: { q: 'private words' } })
  await tp.callTool('Lanlan', { name: 'made_up_by_the_model' })
  const res = await tp.app.inject({ method: 'GET', url: '/metrics' })
  assert.equal(res.statusCode, 200)
  assert.match(String(res.headers['content-type']), /^text\/plain/)
  assert.match(res.body, /toolport_calls_total\{role="Lanlan",tool="echo",outcome="ok"\} 1/)
  assert.match(res.body, /toolport_calls_total\{role="Lanlan",tool="\(unknown\)",outcome="unknown_tool"\} 1/)
  assert.match(res.body, /toolport_dispatch_queue_seconds_count\{outcome="ok"\} 1/)
  assert.match(res.body, /toolport_dispatch_callback_seconds_count\{outcome="ok"\} 1/)
  assert.match(res.body, /toolport_registry_tools\{role="Mochi"\} 1/)
  for (const secret of ['call_secret_id', 'private words',
    'made_up_by_the_model']) assert.ok(!res.body.includes(secret), secret)
})

test('GET /metrics counts sync durations and failures per role', async (t) => {
  const tp = await setup(t, { syncTimeoutMs: 50 })
  tp.roles.get('Mochi').attachSession({ id: 'broken', syncTools: async () => { throw new Error('socket closed') } })
  await tp.register({ name: 'x', callback_url: 'http://127.0.0.1:9/x', source: 'plugin:x' })
  const res = await tp.app.inject({ method: 'GET', url: '/metrics' })
  assert.match(res.body, /toolport_sync_failures_total\{role="Mochi"\} [1-9]/)
  assert.match(res.body, /toolport_sync_duration_seconds_count\{role="Mochi"\} [1-9]/)
})

test('GET /metrics and every operations route are loopback-only (R1)', async (t) => {
  const tp = await setup(t)
  for (const url of ['/metrics', '/api/health', '/openapi.json', '/docs/']) {
    const res = await tp.app.inject({ method: 'GET', url, remoteAddress: '192.0.2.7' })
    assert.equal(res.statusCode, 403, url)
    assert.equal(res.json().code, 'TP_ERR_NOT_LOOPBACK')
  }
})

test('metrics: false removes GET /metrics', async (t) => {
  const tp = await setup(t, { metrics: false })
  assert.equal((await tp.app.inject({ method: 'GET', url: '/metrics' })).statusCode, 404)
})

test('GET /api/health reports readiness with the pool state', async (t) => {
  const tp = await setup(t, { dispatch: { mode: 'pool' } })
  const res = await tp.app.inject({ method: 'GET', url: '/api/health' })
  assert.equal(res.statusCode, 200)
  const body = res.json()
  assert.equal(body.ok, true)
  assert.equal(body.status, 'ready')
  assert.equal(body.version, VERSION)
  assert.equal(body.roles, 2)
  assert.equal(body.dispatch.mode, 'pool')
  assert.equal(body.dispatch.threads, 1)
})

test('sync-finished and sync-failed fire once per sync, however many mutations share it', async (t) => {
  const tp = await setup(t)
  let release: () => void = () => {}
  const gate = new Promise<void>((resolve) => { release = resolve })
  let pushes = 0
  tp.roles.get('Lanlan').attachSession({
    id: 'slow',
    async syncTools () {
      pushes++
      if (pushes === 2) await gate
      throw new Error('model went away')
    }
  })
  // Let the attach-time sync (push 1) settle first.
  await new Promise((resolve) => setImmediate(resolve))
  const failed: string[] = []
  tp.on('sync-failed', (event) => failed.push(event.role))
  const first = tp.register({ name: 'a', callback_url: 'http://127.0.0.1:9/a', role: 'Lanlan' })
  const rest = [tp.register({ name: 'b', callback_url: 'http://127.0.0.1:9/b', role: 'Lanlan' }),
    tp.register({ name: 'c', callback_url: 'http://127.0.0.1:9/c', role: 'Lanlan' })]
  release()
  const results = await Promise.all([first, ...rest])
  assert.deepEqual(results.map((r) => r.ok), [false, false, false])
  // Push 2 served the first registration; push 3 was shared by the other two.
  assert.equal(pushes, 3)
  assert.deepEqual(failed, ['Lanlan', 'Lanlan'])
})

test('GET /openapi.json documents every API route with its success and error statuses', async (t) => {
  const tp = await setup(t)
  const res = await tp.app.inject({ method: 'GET', url: '/openapi.json' })
  assert.equal(res.statusCode, 200)
  const doc = res.json()
  assert.equal(doc.openapi, '3.1.0')
  assert.equal(doc.info.version, VERSION)
  const expected: Record<string, [string, string[]]> = {
    '/api/tools/register': ['post', ['200', '400', '401', '403', '404', '413', '415', '422']],
    '/api/tools/unregister': ['post', ['200', '400', '401', '403', '404', '413', '415', '422']],
    '/api/tools/clear': ['post', ['200', '400', '401', '403', '404', '413', '415', '422']],
    '/api/tools': ['get', ['200', '401', '403', '404', '422']],
    '/api/tools/call': ['post', ['200', '400', '401', '403', '404', '413', '415', '422']],
    '/api/health': ['get', ['200', '401', '403', '503']],
    '/metrics': ['get', ['200', '401', '403']]
  }
  for (const [path, [method, statuses]] of Object.entries(expected)) {
    const operation = doc.paths[path]?.[method]
    assert.ok(operation !== undefined, `${method} ${path} is documented`)
    for (const status of statuses) {
      assert.ok(operation.responses[status] !== undefined,
      `${method} ${path} documents ${status}`)
    }
  }
  // The register body is the zod schema the runtime validates with.
  const body = doc.paths['/api/tools/register'].post.requestBody.content['application/json'].schema
  assert.deepEqual([...body.required].sort(), ['callback_url', 'name'])
  assert.ok(body.properties.timeout_seconds !== undefined)
})

test('every answer of the documented routes matches its response schema (fast serializers drop nothing)', async (t) => {
  const tp = await setup(t, { security: { enforceOwnership: true } })
  await tp.register({ name: 'a', callback_url: 'http://127.0.0.1:9/a', source: 'plugin:one' })
  // Ownership mode: an API client presents its plugin key.
  const pluginKey = 'k'.repeat(43)
  const refused = await tp.app.inject({
    method: 'POST',
    url: '/api/tools/register',
    payload: { name: 'a', callback_url: 'http://127.0.0.1:9/a', source: 'plugin:two' },
    headers: { 'x-toolport-plugin-key': pluginKey }
  })
  assert.deepEqual(refused.json(), await tp.register({
    name: 'a',
    callback_url: 'http://127.0.0.1:9/a',
    source: 'plugin:two'
  }, { pluginKey }))
  assert.equal(refused.json().failed_roles[0].owned_by, 'plugin:one')
  const list = await tp.app.inject({ method: 'GET', url: '/api/tools' })
  assert.deepEqual(list.json(), JSON.parse(JSON.stringify(tp.list())))
  const bad = await tp.app.inject({
    method: 'POST',
    url: '/api/tools/register',
    payload: { name: '' },
    headers: { 'x-toolport-plugin-key': pluginKey }
  })
  assert.equal(bad.statusCode, 422)
  assert.ok(Array.isArray(bad.json().details) && bad.json().details.length >= 2)
})

test('the README error table lists exactly the error catalogue, with its statuses', () => {
  const rows = [...README.matchAll(/^\| `(TP_ERR_[A-Z_]+)` \| (\d{3}) \|/gm)].map((m) => [m[1], Number(m[2])])
  assert.deepEqual(Object.fromEntries(rows), { ...ERROR_CODES })
})

test('the README configuration table lists every option, with its real default, and nothing else', () => {
  const section = README.slice(README.indexOf('## Configuration'), README.indexOf('\n## ',
    README.indexOf('## Configuration') + 5))
  const rows = new Map([...section.matchAll(/^\| `([a-zA-Z.]+)` \| ([^|]+) \|/gm)].map((m) => [m[1] as string, (m[2] as string).trim()]))
  const defaults = parseOptions({}) as unknown as Record<string, unknown>
  const names: string[] = []
  for (const [key, value] of Object.entries(optionsSchema.shape)) {
    // A group is an object schema with defaults, possibly piped through a transform (limits).
    type Shaped = { shape?: Record<string, unknown>, def?: { in?: { shape?: Record<string, unknown> } } }
    const innerType = (value as { def?: { innerType?: Shaped } }).def?.innerType
    const inner = innerType?.shape ?? innerType?.def?.in?.shape
    if (inner !== undefined) {
      for (const sub of Object.keys(inner)) names.push(`${key}.${sub}`)
    } else {
      names.push(key)
    }
  }
  assert.deepEqual([...rows.keys()].sort(), [...names].sort())
  for (const name of names) {
    const cell = rows.get(name) as string
    const [group, sub] = name.split('.') as [string, string | undefined]
    const value = sub === undefined ? defaults[group] : (defaults[group] as Record<string, unknown>)[sub]
    if (value === undefined) assert.match(cell, /unset/, name)
    else {
      assert.ok(cell.startsWith(`\`${JSON.stringify(value).replace(/^"|"$/g, '')}\``),
      `${name}: README says ${cell}, the default is ${JSON.stringify(value)}`)
    }
  }
})

test('VERSION matches package.json', () => {
  const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8'))
  assert.equal(VERSION, pkg.version)
})
