// GET /api/tools (docs/protocol.md R18) through the real app (inject).
import { test } from 'node:test'
import assert from 'node:assert/strict'
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
