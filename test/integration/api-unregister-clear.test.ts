// POST /api/tools/unregister and /api/tools/clear (docs/protocol.md R15–R17) through the real app (inject).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { assertError, createTestToolport, inject, names, session, tool } from '../helpers.js'

test('R15: unregister with role null removes the name from every role', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A', 'B'] })
  await inject(tp, 'POST', '/api/tools/register', tool('x'))
  await inject(tp, 'POST', '/api/tools/register', tool('y'))
  const res = await inject(tp, 'POST', '/api/tools/unregister', { name: 'x', role: null })
  assert.equal(res.statusCode, 200)
  assert.deepEqual(res.body, {
    ok: true,
    removed: true,
    affected_roles: ['A', 'B'],
    failed_roles: [],
    refused_roles: []
  })
  assert.deepEqual(names(tp, 'A'), ['y'])
  assert.deepEqual(names(tp, 'B'), ['y'])
})

test('R15: unregister without a role field means every role', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A', 'B'] })
  await inject(tp, 'POST', '/api/tools/register', tool('x'))
  const res = await inject(tp, 'POST', '/api/tools/unregister', { name: 'x' })
  assert.deepEqual(res.body.affected_roles, ['A', 'B'])
  assert.deepEqual(names(tp, 'A'), [])
})

test('R15: unregister with a role removes the name from that role only', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A', 'B'] })
  await inject(tp, 'POST', '/api/tools/register', tool('x'))
  const res = await inject(tp, 'POST', '/api/tools/unregister', { name: 'x', role: 'A' })
  assert.deepEqual(res.body, { ok: true, removed: true, affected_roles: ['A'], failed_roles: [], refused_roles: [] })
  assert.deepEqual(names(tp, 'A'), [])
  assert.deepEqual(names(tp, 'B'), ['x'])
})

test('R17: unregister of a name no role has answers removed false, ok true and no affected roles', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  const res = await inject(tp, 'POST', '/api/tools/unregister', { name: 'ghost' })
  assert.equal(res.statusCode, 200)
  assert.deepEqual(res.body, { ok: true, removed: false, affected_roles: [], failed_roles: [], refused_roles: [] })
})

test('R17: affected_roles of unregister lists only the roles whose registry changed', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A', 'B', 'C'] })
  await inject(tp, 'POST', '/api/tools/register', tool('x', { role: 'B' }))
  const res = await inject(tp, 'POST', '/api/tools/unregister', { name: 'x' })
  assert.deepEqual(res.body.affected_roles, ['B'])
})

test('R17: unregister with an unknown role is 404 TP_ERR_ROLE_NOT_FOUND and removes nothing', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  await inject(tp, 'POST', '/api/tools/register', tool('x'))
  const res = await inject(tp, 'POST', '/api/tools/unregister', { name: 'x', role: 'Nobody' })
  assertError(res, 404, 'TP_ERR_ROLE_NOT_FOUND')
  assert.deepEqual(names(tp, 'A'), ['x'])
})

test('R15: unregister without a valid name is 422 TP_ERR_VALIDATION', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  assertError(await inject(tp, 'POST', '/api/tools/unregister', {}), 422, 'TP_ERR_VALIDATION')
  assertError(await inject(tp, 'POST', '/api/tools/unregister', { name: '' }), 422, 'TP_ERR_VALIDATION')
  assertError(await inject(tp, 'POST', '/api/tools/unregister', { name: 'x', role: 5 }), 422, 'TP_ERR_VALIDATION')
})

test('R15: unregister with expected_source skips roles whose tool belongs to another source and lists them in refused_roles', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A', 'B'] })
  await inject(tp, 'POST', '/api/tools/register', tool('x', { role: 'A', source: 'plugin:one' }))
  await inject(tp, 'POST', '/api/tools/register', tool('x', { role: 'B', source: 'plugin:two' }))
  const res = await inject(tp, 'POST', '/api/tools/unregister', { name: 'x', expected_source: 'plugin:one' })
  assert.deepEqual(res.body, {
    ok: true,
    removed: true,
    affected_roles: ['A'],
    failed_roles: [],
    refused_roles: [{
      role: 'B',
      owned_by: 'plugin:two'
    }]
  })
  assert.deepEqual(names(tp, 'A'), [])
  assert.deepEqual(names(tp, 'B'), ['x'])
})

test('R15: unregister with an expected_source no role matches removes nothing', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  await inject(tp, 'POST', '/api/tools/register', tool('x', { source: 'plugin:one' }))
  const res = await inject(tp, 'POST', '/api/tools/unregister', { name: 'x', expected_source: 'plugin:other' })
  assert.equal(res.body.removed, false)
  assert.deepEqual(res.body.refused_roles, [{ role: 'A', owned_by: 'plugin:one' }])
  assert.deepEqual(names(tp, 'A'), ['x'])
})

test('R15: the session no longer sees an unregistered tool when the route returns', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  const s = session('s', 'random')
  tp.roles.get('A').attachSession(s)
  await inject(tp, 'POST', '/api/tools/register', tool('x'))
  await inject(tp, 'POST', '/api/tools/register', tool('y'))
  await inject(tp, 'POST', '/api/tools/unregister', { name: 'x' })
  assert.deepEqual(s.currentNames, ['y'])
})

test('R16: clear removes every tool of the source from every role and answers the count', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A', 'B'] })
  await inject(tp, 'POST', '/api/tools/register', tool('w1', { source: 'plugin:weather' }))
  await inject(tp, 'POST', '/api/tools/register', tool('w2', { source: 'plugin:weather' }))
  await inject(tp, 'POST', '/api/tools/register', tool('other', { source: 'plugin:news' }))
  const res = await inject(tp, 'POST', '/api/tools/clear', { source: 'plugin:weather', role: null })
  assert.equal(res.statusCode, 200)
  assert.deepEqual(res.body, { ok: true, removed: 4, affected_roles: ['A', 'B'], failed_roles: [] })
  assert.deepEqual(names(tp, 'A'), ['other'])
  assert.deepEqual(names(tp, 'B'), ['other'])
})

test('R16: clear with a role removes that source from that role only', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A', 'B'] })
  await inject(tp, 'POST', '/api/tools/register', tool('w1', { source: 'plugin:weather' }))
  const res = await inject(tp, 'POST', '/api/tools/clear', { source: 'plugin:weather', role: 'B' })
  assert.deepEqual(res.body, { ok: true, removed: 1, affected_roles: ['B'], failed_roles: [] })
  assert.deepEqual(names(tp, 'A'), ['w1'])
  assert.deepEqual(names(tp, 'B'), [])
})

test('R16: clear of the default source "external" removes tools registered without a source', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  await inject(tp, 'POST', '/api/tools/register', tool('plain'))
  await inject(tp, 'POST', '/api/tools/register', tool('tagged', { source: 'plugin:x' }))
  const res = await inject(tp, 'POST', '/api/tools/clear', { source: 'external' })
  assert.equal(res.body.removed, 1)
  assert.deepEqual(names(tp, 'A'), ['tagged'])
})

test('R17: clear of a source nobody used answers removed 0, ok true and no affected roles', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  await inject(tp, 'POST', '/api/tools/register', tool('x', { source: 'plugin:x' }))
  const res = await inject(tp, 'POST', '/api/tools/clear', { source: 'plugin:none' })
  assert.deepEqual(res.body, { ok: true, removed: 0, affected_roles: [], failed_roles: [] })
  assert.deepEqual(names(tp, 'A'), ['x'])
})

test('R17: affected_roles of clear lists only the roles that had tools of the source', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A', 'B', 'C'] })
  await inject(tp, 'POST', '/api/tools/register', tool('x', { role: 'C', source: 'plugin:x' }))
  const res = await inject(tp, 'POST', '/api/tools/clear', { source: 'plugin:x' })
  assert.deepEqual(res.body.affected_roles, ['C'])
  assert.equal(res.body.removed, 1)
})

test('R17: clear with an unknown role is 404 TP_ERR_ROLE_NOT_FOUND and removes nothing', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  await inject(tp, 'POST', '/api/tools/register', tool('x', { source: 'plugin:x' }))
  const res = await inject(tp, 'POST', '/api/tools/clear', { source: 'plugin:x', role: 'Nobody' })
  assertError(res, 404, 'TP_ERR_ROLE_NOT_FOUND')
  assert.deepEqual(names(tp, 'A'), ['x'])
})

test('R16: clear without a valid source is 422 TP_ERR_VALIDATION', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  assertError(await inject(tp, 'POST', '/api/tools/clear', {}), 422, 'TP_ERR_VALIDATION')
  assertError(await inject(tp, 'POST', '/api/tools/clear', { source: '' }), 422, 'TP_ERR_VALIDATION')
  assertError(await inject(tp, 'POST', '/api/tools/clear', { source: 3 }), 422, 'TP_ERR_VALIDATION')
})

test('R16: the session no longer sees cleared tools when the route returns', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  const s = session('s', 'random')
  tp.roles.get('A').attachSession(s)
  await inject(tp, 'POST', '/api/tools/register', tool('a', { source: 'plugin:p' }))
  await inject(tp, 'POST', '/api/tools/register', tool('b', { source: 'plugin:q' }))
  await inject(tp, 'POST', '/api/tools/register', tool('c', { source: 'plugin:p' }))
  await inject(tp, 'POST', '/api/tools/clear', { source: 'plugin:p' })
  assert.deepEqual(s.currentNames, ['b'])
})
