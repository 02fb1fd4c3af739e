// POST /api/tools/register (docs/protocol.md R2–R8) through the real fastify app (inject).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { assertError, CALLBACK, createTestToolport, inject, names, session, tool } from '../helpers.js'

test('R8: a registration every role accepts answers ok with the registered name and every role affected', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lanlan', 'Mochi'] })
  const res = await inject(tp, 'POST', '/api/tools/register', tool('get_weather', { source: 'plugin:weather' }))
  assert.equal(res.statusCode, 200)
  assert.deepEqual(res.body, {
    ok: true,
    registered: 'get_weather',
    affected_roles: ['Lanlan', 'Mochi'],
    failed_roles: []
  })
})

test('R8: the full protocol example registers and is listed exactly as registered', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lanlan'] })
  const body = {
    name: 'get_weather',
    description: 'Get weather for a location.',
    parameters: { type: 'object', properties: { location: { type: 'string' } }, required: ['location'] },
    callback_url: 'http://127.0.0.1:9333/tools/get_weather',
    role: null,
    source: 'plugin:weather',
    timeout_seconds: 30
  }
  const res = await inject(tp, 'POST', '/api/tools/register', body)
  assert.deepEqual(res.body, { ok: true, registered: 'get_weather', affected_roles: ['Lanlan'], failed_roles: [] })
  const list = await inject(tp, 'GET', '/api/tools')
  assert.deepEqual(list.body, {
    ok: true,
    tools_by_role: {
      Lanlan: [{
        name: 'get_weather',
        description: 'Get weather for a location.',
        source: 'plugin:weather',
        callback_url: 'http://127.0.0.1:9333/tools/get_weather',
        is_remote: true
      }]
    }
  })
})

test('R8: the model session is given the definition (name, description, parameters) before the route returns', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lanlan'] })
  const s = session('s1', 'random', { maxDelayMs: 5 })
  tp.roles.get('Lanlan').attachSession(s)
  const parameters = { type: 'object', properties: { q: { type: 'string' } } }
  const res = await inject(tp, 'POST', '/api/tools/register', tool('search', { description: 'Search.', parameters }))
  assert.equal(res.body.ok, true)
  assert.deepEqual(s.current, [{ name: 'search', description: 'Search.', parameters }])
})

test('R7: defaults are applied: description "", the empty-object schema, source "external", timeout 30 s', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lanlan'] })
  const s = session('s1', 'instant')
  tp.roles.get('Lanlan').attachSession(s)
  await inject(tp, 'POST', '/api/tools/register', tool('bare'))
  const row = tp.list('Lanlan').tools_by_role.Lanlan?.[0]
  assert.deepEqual(row, { name: 'bare', description: '', source: 'external', callback_url: CALLBACK, is_remote: true })
  assert.deepEqual(s.current, [{ name: 'bare', description: '', parameters: { type: 'object', properties: {} } }])
  assert.equal(tp.roles.get('Lanlan').registry.get('bare')?.timeoutMs, 30_000)
})

test('R7: timeout_seconds given as a numeric string is used as a number of seconds', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lanlan'] })
  const res = await inject(tp, 'POST', '/api/tools/register', tool('t', { timeout_seconds: '2.5' }))
  assert.equal(res.body.ok, true)
  assert.equal(tp.roles.get('Lanlan').registry.get('t')?.timeoutMs, 2_500)
})

test('R4: role null registers in every current role', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A', 'B', 'C'] })
  const res = await inject(tp, 'POST', '/api/tools/register', tool('x', { role: null }))
  assert.deepEqual(res.body.affected_roles, ['A', 'B', 'C'])
  for (const role of ['A', 'B', 'C']) assert.deepEqual(names(tp, role), ['x'])
})

test('R4: a named role registers in that role only', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A', 'B'] })
  const res = await inject(tp, 'POST', '/api/tools/register', tool('x', { role: 'B' }))
  assert.deepEqual(res.body, { ok: true, registered: 'x', affected_roles: ['B'], failed_roles: [] })
  assert.deepEqual(names(tp, 'A'), [])
  assert.deepEqual(names(tp, 'B'), ['x'])
})

test('R4: a role created after a global registration does not get the tool', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  await inject(tp, 'POST', '/api/tools/register', tool('x'))
  tp.roles.add('Late')
  const list = await inject(tp, 'GET', '/api/tools')
  assert.deepEqual(list.body.tools_by_role.A.map((r: { name: string }) => r.name), ['x'])
  assert.deepEqual(list.body.tools_by_role.Late, [])
})

test('R4: a role created while a global registration\'s schema compiles does not get the tool; a role removed meanwhile is left out', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A', 'Gone'] })
  const pending = tp.register(tool('x', { parameters: { type: 'object', properties: { q: { type: 'string', pattern: '^late$' } } } }))
  // register() took its target roles before it awaited the compile, which has not ended yet.
  tp.roles.add('Late')
  tp.roles.remove('Gone')
  const result = await pending
  assert.deepEqual(result.affected_roles, ['A'])
  assert.deepEqual(names(tp, 'A'), ['x'])
  assert.deepEqual(names(tp, 'Late'), [])
})

test('R5: registering a name again replaces the tool in every target role', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A', 'B'] })
  await inject(tp, 'POST', '/api/tools/register', tool('x', { description: 'old', source: 'plugin:one' }))
  const res = await inject(tp, 'POST', '/api/tools/register',
    tool('x', { description: 'new', source: 'plugin:two', callback_url: 'http://localhost:9444/x2' }))
  assert.deepEqual(res.body, { ok: true, registered: 'x', affected_roles: ['A', 'B'], failed_roles: [] })
  for (const role of ['A', 'B']) {
    assert.deepEqual(tp.list(role).tools_by_role[role], [
      { name: 'x', description: 'new', source: 'plugin:two', callback_url: 'http://localhost:9444/x2', is_remote: true }
    ])
  }
})

test('R5: replacing in one role leaves the same name in other roles untouched', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A', 'B'] })
  await inject(tp, 'POST', '/api/tools/register', tool('x', { description: 'old' }))
  await inject(tp, 'POST', '/api/tools/register', tool('x', { description: 'new', role: 'A' }))
  assert.equal(tp.list('A').tools_by_role.A?.[0]?.description, 'new')
  assert.equal(tp.list('B').tools_by_role.B?.[0]?.description, 'old')
})

test('R5: the session sees the replacement, not both versions', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  const s = session('s', 'instant')
  tp.roles.get('A').attachSession(s)
  await inject(tp, 'POST', '/api/tools/register', tool('x', { description: 'old' }))
  await inject(tp, 'POST', '/api/tools/register', tool('x', { description: 'new' }))
  assert.deepEqual(s.current?.map((d) => [d.name, d.description]), [['x', 'new']])
})

test('R6: an unknown role is 404 TP_ERR_ROLE_NOT_FOUND and nothing is registered', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  const res = await inject(tp, 'POST', '/api/tools/register', tool('x', { role: 'Nobody' }))
  assertError(res, 404, 'TP_ERR_ROLE_NOT_FOUND')
  assert.deepEqual(names(tp, 'A'), [])
})

test('R7: a body that fails validation is 422 even when its role is also unknown (validation comes first)', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  const res = await inject(tp, 'POST', '/api/tools/register', tool('', { role: 'Nobody' }))
  assertError(res, 422, 'TP_ERR_VALIDATION')
})

test('R2: a non-loopback callback_url is 422 TP_ERR_VALIDATION with details naming callback_url', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  for (const url of ['http://192.168.1.5:9333/x', 'http://example.com/x', 'http://0.0.0.0:9/x', 'http://[::]/x',
    'http://localhost./x', 'http://a.localhost/x', 'http://u:p@127.0.0.1/x', 'ftp://127.0.0.1/x']) {
    const res = await inject(tp, 'POST', '/api/tools/register', tool('x', { callback_url: url }))
    assertError(res, 422, 'TP_ERR_VALIDATION')
    assert.deepEqual(res.body.details.map((d: { path: string }) => d.path), ['callback_url'], url)
  }
  assert.deepEqual(names(tp, 'A'), [])
})

test('R2: an accepted callback_url is stored and listed in its canonical form', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  await inject(tp, 'POST', '/api/tools/register', tool('a', { callback_url: 'HTTP://LOCALHOST:80/Cb?x=1' }))
  await inject(tp, 'POST', '/api/tools/register', tool('b', { callback_url: 'http://127.1:9333/cb' }))
  await inject(tp, 'POST', '/api/tools/register', tool('c', { callback_url: 'http://[::ffff:127.0.0.1]:9333/cb' }))
  assert.deepEqual(tp.list('A').tools_by_role.A?.map((r) => r.callback_url), [
    'http://localhost/Cb?x=1', 'http://127.0.0.1:9333/cb', 'http://[::ffff:7f00:1]:9333/cb'
  ])
})

test('R7: each invalid field is 422 with a details entry for that field', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  const cases: Array<[Record<string, unknown>, string]> = [
    [{ name: '' }, 'name'],
    [{ name: 'n'.repeat(65) }, 'name'],
    [{ parameters: [] }, 'parameters'],
    [{ parameters: 'x' }, 'parameters'],
    [{ timeout_seconds: 0 }, 'timeout_seconds'],
    [{ timeout_seconds: 301 }, 'timeout_seconds'],
    [{ timeout_seconds: true }, 'timeout_seconds'],
    [{ timeout_seconds: 'soon' }, 'timeout_seconds'],
    [{ description: 5 }, 'description'],
    [{ source: '' }, 'source'],
    [{ role: '' }, 'role'],
    [{ callback_url: null }, 'callback_url']
  ]
  for (const [fields, path] of cases) {
    const res = await inject(tp, 'POST', '/api/tools/register', tool('x', fields))
    assertError(res, 422, 'TP_ERR_VALIDATION')
    assert.deepEqual(res.body.details.map((d: { path: string }) => d.path), [path], JSON.stringify(fields))
  }
  const missing = await inject(tp, 'POST', '/api/tools/register', { description: 'no name, no url' })
  assertError(missing, 422, 'TP_ERR_VALIDATION')
  assert.deepEqual(missing.body.details.map((d: { path: string }) => d.path).sort(), ['callback_url', 'name'])
})

test('R8: with no roles at all, a registration is HTTP 200 with ok false and a top-level error', async (t) => {
  const tp = await createTestToolport(t, { roles: [] })
  const res = await inject(tp, 'POST', '/api/tools/register', tool('x'))
  assert.equal(res.statusCode, 200)
  assert.equal(res.body.ok, false)
  assert.equal(res.body.registered, 'x')
  assert.deepEqual(res.body.affected_roles, [])
  assert.deepEqual(res.body.failed_roles, [])
  assert.equal(typeof res.body.error, 'string')
})

test('R3: registrations live in memory only: a new Toolport starts with no tools', async (t) => {
  const first = await createTestToolport(t, { roles: ['A'] })
  await inject(first, 'POST', '/api/tools/register', tool('x'))
  await first.close()
  const second = await createTestToolport(t, { roles: ['A'] })
  const res = await inject(second, 'GET', '/api/tools')
  assert.deepEqual(res.body, { ok: true, tools_by_role: { A: [] } })
})
