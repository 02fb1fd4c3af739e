// GET /api/tools (docs/protocol.md R18) through the real app (inject).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import type { Toolport } from '../../src/main/index.js'
import { assertError, CALLBACK, createTestToolport, inject, tool } from '../helpers.js'

test('R18: GET /api/tools lists every current role, including roles with no tools', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lanlan', 'Mochi'] })
  await inject(tp, 'POST', '/api/tools/register', tool('get_weather', {
    role: 'Lanlan',
    source: 'plugin:weather',
    description: 'Get weather.'
  }))
  const res = await inject(tp, 'GET', '/api/tools')
  assert.equal(res.statusCode, 200)
  assert.deepEqual(res.body, {
    ok: true,
    tools_by_role: {
      Lanlan: [{
        name: 'get_weather',
        description: 'Get weather.',
        source: 'plugin:weather',
        callback_url: CALLBACK,
        is_remote: true
      }],
      Mochi: []
    }
  })
})

test('R18: GET /api/tools with no roles answers an empty tools_by_role', async (t) => {
  const tp = await createTestToolport(t, { roles: [] })
  const res = await inject(tp, 'GET', '/api/tools')
  assert.deepEqual(res.body, { ok: true, tools_by_role: {} })
})

test('R18: GET /api/tools?role= selects one role', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lanlan', 'Mochi'] })
  await inject(tp, 'POST', '/api/tools/register', tool('x'))
  const res = await inject(tp, 'GET', '/api/tools?role=Mochi')
  assert.equal(res.statusCode, 200)
  assert.deepEqual(Object.keys(res.body.tools_by_role), ['Mochi'])
  assert.deepEqual(res.body.tools_by_role.Mochi.map((r: { name: string }) => r.name), ['x'])
})

test('R18: a role name that needs URL encoding is selected by its decoded name', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lan lan', 'Mō&chi'] })
  const res = await inject(tp, 'GET', `/api/tools?role=${encodeURIComponent('Mō&chi')}`)
  assert.equal(res.statusCode, 200)
  assert.deepEqual(Object.keys(res.body.tools_by_role), ['Mō&chi'])
})

test('R18: an unknown role is 404 TP_ERR_ROLE_NOT_FOUND', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lanlan'] })
  assertError(await inject(tp, 'GET', '/api/tools?role=Nobody'), 404, 'TP_ERR_ROLE_NOT_FOUND')
})

test('R18: a role named like an Object.prototype property is an unknown role, not a crash', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lanlan'] })
  for (const name of ['__proto__', 'constructor', 'toString', 'hasOwnProperty']) {
    assertError(await inject(tp, 'GET', `/api/tools?role=${name}`), 404, 'TP_ERR_ROLE_NOT_FOUND')
  }
})

test('R18: list() answers a plain object keyed by role, also for roles named like Object.prototype properties (README "Embedding: the library")', async (t) => {
  const roles = ['__proto__', 'constructor', 'toString', 'Lanlan']
  const tp = await createTestToolport(t, { roles })
  await tp.register(tool('x', { role: '__proto__' }) as never)
  const listed = tp.list().tools_by_role
  const PROTO = '__proto__'
  assert.equal(Object.getPrototypeOf(listed), Object.prototype)
  assert.deepEqual(Object.keys(listed), roles)
  assert.equal(Object.hasOwn(listed, '__proto__'), true)
  assert.deepEqual(listed[PROTO]?.map((row) => row.name), ['x'])
  // eslint-disable-next-line no-prototype-builtins -- what a host writes, and what a null prototype broke
  assert.equal(listed.hasOwnProperty('Lanlan'), true)
  const expected: Record<string, unknown> = {}
  for (const role of roles) {
    Object.defineProperty(expected, role, { value: role === '__proto__' ? listed[PROTO] : [], enumerable: true })
  }
  assert.deepStrictEqual(listed, expected)
  const served = (await inject(tp, 'GET', '/api/tools')).body.tools_by_role
  assert.deepEqual(Object.keys(served), roles)
  assert.equal(Object.hasOwn(served, '__proto__') && served[PROTO].length, 1)
})

test('R18: tools are listed in registration order', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  const order = ['zeta', 'alpha', 'mid', 'beta', 'omega']
  for (const name of order) await inject(tp, 'POST', '/api/tools/register', tool(name))
  const res = await inject(tp, 'GET', '/api/tools?role=A')
  assert.deepEqual(res.body.tools_by_role.A.map((r: { name: string }) => r.name), order)
})

test('R18: every row has exactly name, description, source, callback_url and is_remote', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  await inject(tp, 'POST', '/api/tools/register', tool('x', { parameters: { type: 'object' }, timeout_seconds: 5 }))
  const res = await inject(tp, 'GET', '/api/tools')
  assert.deepEqual(Object.keys(res.body.tools_by_role.A[0]).sort(), ['callback_url', 'description', 'is_remote', 'name',
    'source'])
})

test('R18: local tools are listed with is_remote false and callback_url null, in registration order', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  await inject(tp, 'POST', '/api/tools/register', tool('remote_first'))
  await tp.roles.get('A').registerLocalTool({
    name: 'clock',
    description: 'Local time.',
    handler: () => new Date().toISOString()
  })
  await inject(tp, 'POST', '/api/tools/register', tool('remote_last'))
  const res = await inject(tp, 'GET', '/api/tools?role=A')
  assert.deepEqual(res.body.tools_by_role.A, [
    { name: 'remote_first', description: '', source: 'external', callback_url: CALLBACK, is_remote: true },
    { name: 'clock', description: 'Local time.', source: 'local', callback_url: null, is_remote: false },
    { name: 'remote_last', description: '', source: 'external', callback_url: CALLBACK, is_remote: true }
  ])
})

test('R18: a role removed from the runtime is no longer listed', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A', 'B'] })
  tp.roles.remove('B')
  const res = await inject(tp, 'GET', '/api/tools')
  assert.deepEqual(Object.keys(res.body.tools_by_role), ['A'])
  assertError(await inject(tp, 'GET', '/api/tools?role=B'), 404, 'TP_ERR_ROLE_NOT_FOUND')
})

/** Registers `name` of `source` in `role` (null: every role). */
async function registerAs (tp: Toolport, name: string, source: string, role: string | null = null): Promise<void> {
  const res = await inject(tp, 'POST', '/api/tools/register', tool(name, { source, role }))
  assert.equal(res.statusCode, 200)
}

/** `tools_by_role` as names per role. */
function namesByRole (body: { tools_by_role: Record<string, Array<{ name: string }>> }): Record<string, string[]> {
  return Object.fromEntries(Object.entries(body.tools_by_role).map(([role, rows]) => [role, rows.map((r) => r.name)]))
}

test('R18: ?source= lists only that source\'s tools, in registration order, and every role (empty where it has none)', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A', 'B'] })
  await registerAs(tp, 'w1', 'plugin:weather')
  await registerAs(tp, 'n1', 'plugin:news')
  await registerAs(tp, 'w2', 'plugin:weather', 'A')
  await registerAs(tp, 'w1', 'plugin:weather') // moves to the end (R5)
  const res = await inject(tp, 'GET', `/api/tools?source=${encodeURIComponent('plugin:weather')}`)
  assert.equal(res.statusCode, 200)
  assert.deepEqual(namesByRole(res.body), { A: ['w2', 'w1'], B: ['w1'] })
  assert.deepEqual(res.body.tools_by_role.B[0], {
    name: 'w1', description: '', source: 'plugin:weather', callback_url: CALLBACK, is_remote: true
  })
  assert.deepEqual(namesByRole((await inject(tp, 'GET', '/api/tools?source=nobody')).body), { A: [], B: [] })
})

test('R18: ?name= (repeatable) lists only those names, whatever their source, in registration order; unknown names are left out', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A', 'B'] })
  for (const name of ['zeta', 'alpha', 'mid', 'beta']) await registerAs(tp, name, `plugin:${name}`)
  await registerAs(tp, 'only_b', 'plugin:b', 'B')
  await registerAs(tp, 'zeta', 'plugin:other', 'A') // replaced in A: now last there
  const res = await inject(tp, 'GET', '/api/tools?name=only_b&name=zeta&name=mid&name=missing&name=zeta')
  assert.equal(res.statusCode, 200)
  assert.deepEqual(namesByRole(res.body), { A: ['mid', 'zeta'], B: ['zeta', 'mid', 'only_b'] })
  assert.equal(res.body.tools_by_role.A[1].source, 'plugin:other')
  // One name is a string in the query, not an array: the same filter.
  assert.deepEqual(namesByRole((await inject(tp, 'GET', '/api/tools?name=beta')).body), { A: ['beta'], B: ['beta'] })
  // A local tool is listed by name too.
  await tp.roles.get('A').registerLocalTool({ name: 'clock', handler: () => 'now' })
  assert.deepEqual((await inject(tp, 'GET', '/api/tools?role=A&name=clock')).body.tools_by_role.A, [
    { name: 'clock', description: '', source: 'local', callback_url: null, is_remote: false }
  ])
})

test('R18: ?source= with ?name= lists the tools matching both, and ?role= narrows them to one role', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A', 'B'] })
  await registerAs(tp, 'x', 'plugin:one')
  await registerAs(tp, 'y', 'plugin:one')
  await registerAs(tp, 'z', 'plugin:two')
  const both = await inject(tp, 'GET', '/api/tools?source=plugin:one&name=y&name=z')
  assert.deepEqual(namesByRole(both.body), { A: ['y'], B: ['y'] })
  const oneRole = await inject(tp, 'GET', '/api/tools?role=B&source=plugin:two&name=z')
  assert.deepEqual(namesByRole(oneRole.body), { B: ['z'] })
  assertError(await inject(tp, 'GET', '/api/tools?role=Nobody&name=x'), 404, 'TP_ERR_ROLE_NOT_FOUND')
})

test('R18: a filtered list is the library\'s tp.list(role, filter), and follows every change (never cached stale)', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A', 'B'] })
  await registerAs(tp, 'x', 'plugin:one')
  const route = async (query: string): Promise<unknown> => (await inject(tp, 'GET', `/api/tools?${query}`)).body
  const plain = (value: unknown): unknown => JSON.parse(JSON.stringify(value))
  assert.deepEqual(await route('source=plugin:one'), plain(tp.list(null, { source: 'plugin:one' })))
  await registerAs(tp, 'y', 'plugin:one', 'B')
  assert.deepEqual(await route('source=plugin:one'), plain(tp.list(null, { source: 'plugin:one' })))
  assert.deepEqual(namesByRole(await route('source=plugin:one') as never), { A: ['x'], B: ['x', 'y'] })
  assert.deepEqual(await route('name=y&name=x'), plain(tp.list(undefined, { names: ['y', 'x'] })))
  assert.deepEqual(await route('role=B&name=y'), plain(tp.list('B', { names: ['y'] })))
})

test('R18: an empty or too long name or source in the filter is 422 TP_ERR_VALIDATION naming it', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  for (const [query, path] of [['name=', 'name'], [`name=${'n'.repeat(65)}`, 'name'], ['name=a&name=', 'name.1'],
    ['source=', 'source'], [`source=${'s'.repeat(257)}`, 'source']]) {
    const reply = await inject(tp, 'GET', `/api/tools?${query}`)
    assertError(reply, 422, 'TP_ERR_VALIDATION')
    assert.ok(reply.body.details.some((d: { path: string }) => d.path === path),
      `${query}: ${JSON.stringify(reply.body.details)}`)
  }
})
