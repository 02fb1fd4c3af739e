// Session sync seen through the API (docs/protocol.md R4, R5, R8, R15–R17 and "Sync"; "ok"
// of R17): partial and total failures, concurrency over real HTTP, R4, and local tools.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import type { Toolport } from '../../src/main/index.js'
import {
  createTestToolport, httpJson, inject, names, session, startToolport, tool,
  type FakeSession
} from '../helpers.js'
import { kSyncCount } from '../../src/main/symbols.js'

/**
 * `failed_roles` names exactly these roles, each as an object `{ role, error }` (docs/protocol.md R8); a role that
 * refused the change because another owner holds the tool also says `owned_by`.
 */
function assertFailedRoles (failed: unknown, roles: string[], ownedBy?: string): void {
  assert.ok(Array.isArray(failed))
  assert.deepEqual(failed.map((f: { role: string }) => f.role), roles)
  for (const entry of failed as Array<Record<string, unknown>>) {
    assert.deepEqual(Object.keys(entry).sort(), ownedBy === undefined
      ? ['error', 'role']
      : ['error', 'owned_by',
          'role'])
    assert.equal(typeof entry.error, 'string')
    assert.notEqual(entry.error, '')
    if (ownedBy !== undefined) assert.equal(entry.owned_by, ownedBy)
  }
}

/** Every session of every role holds exactly its role's registry, in order. */
function assertSessionsHoldRegistry (tp: Toolport, sessionsByRole: Record<string, FakeSession[]>): void {
  for (const [role, sessions] of Object.entries(sessionsByRole)) {
    const expected = tp.roles.get(role).registry.definitions()
    for (const s of sessions) {
      assert.deepEqual(s.current ?? [], expected, `session ${s.id} of ${role}`)
      assert.equal(s.maxActive, 1, `pushes to session ${s.id} overlapped`)
    }
  }
}

test('R8: partial success: a role whose session throws is in failed_roles as {role, error} and ok stays true', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A', 'B'] })
  tp.roles.get('A').attachSession(session('a', 'instant'))
  tp.roles.get('B').attachSession(session('b', 'throw'))
  const res = await inject(tp, 'POST', '/api/tools/register', tool('x'))
  assert.equal(res.statusCode, 200)
  assert.equal(res.body.ok, true)
  assert.equal(res.body.registered, 'x')
  assert.deepEqual(res.body.affected_roles, ['A'])
  assertFailedRoles(res.body.failed_roles, ['B'])
  assert.ok(res.body.failed_roles[0].error.includes('session b refused the tools'))
})

test('R8: total failure: sessions that throw or hang put every role in failed_roles and ok is false (HTTP 200)', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A', 'B'], syncTimeoutMs: 50 })
  tp.roles.get('A').attachSession(session('a', 'throw'))
  tp.roles.get('B').attachSession(session('b', 'hang'))
  const res = await inject(tp, 'POST', '/api/tools/register', tool('x'))
  assert.equal(res.statusCode, 200)
  assert.equal(res.body.ok, false)
  assert.deepEqual(res.body.affected_roles, [])
  assertFailedRoles(res.body.failed_roles, ['A', 'B'])
  assert.equal(typeof res.body.error, 'string')
})

test('R8: a role with a hanging session fails at syncTimeoutMs while the other roles succeed', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A', 'B', 'C'], syncTimeoutMs: 50 })
  tp.roles.get('A').attachSession(session('a', 'random'))
  const stuck = session('b', 'hang')
  tp.roles.get('B').attachSession(stuck)
  const res = await inject(tp, 'POST', '/api/tools/register', tool('x'))
  assert.equal(res.body.ok, true)
  assert.deepEqual(res.body.affected_roles, ['A', 'C'])
  assertFailedRoles(res.body.failed_roles, ['B'])
  assert.ok(stuck.aborted >= 1, 'the hanging session was told to stop through its signal')
})

test('sync: one failing session among several fails its role, and the other sessions still get the tools', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  const good = session('good', 'instant')
  tp.roles.get('A').attachSession(good)
  tp.roles.get('A').attachSession(session('bad', 'throw'))
  const res = await inject(tp, 'POST', '/api/tools/register', tool('x'))
  assert.equal(res.body.ok, false)
  assertFailedRoles(res.body.failed_roles, ['A'])
  assert.deepEqual(good.currentNames, ['x'])
})

test('sync: a failed sync is not rolled back; the registry keeps the tool and the next sync carries it', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  const s = session('s', 'throw')
  tp.roles.get('A').attachSession(s)
  const failed = await inject(tp, 'POST', '/api/tools/register', tool('first'))
  assert.equal(failed.body.ok, false)
  assert.deepEqual(names(tp, 'A'), ['first'])
  s.behaviour = 'instant'
  const ok = await inject(tp, 'POST', '/api/tools/register', tool('second'))
  assert.equal(ok.body.ok, true)
  assert.deepEqual(s.currentNames, ['first', 'second'])
})

test('sync: a role with no session counts as affected', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A', 'B'] })
  tp.roles.get('A').attachSession(session('a', 'instant'))
  const res = await inject(tp, 'POST', '/api/tools/register', tool('x'))
  assert.deepEqual(res.body.affected_roles, ['A', 'B'])
})

test('sync: target roles sync in parallel (each role\'s session is called before any answers)', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A', 'B', 'C'] })
  const gated = ['A', 'B', 'C'].map((role) => {
    const s = session(role.toLowerCase(), 'gated')
    tp.roles.get(role).attachSession(s)
    return s
  })
  // Let the attach-time syncs through.
  await Promise.all(gated.map((s) => s.waitForCalls(1)))
  for (const s of gated) s.release()
  await Promise.all(gated.map((s) => s.waitIdle()))
  const reply = inject(tp, 'POST', '/api/tools/register', tool('x'))
  await Promise.all(gated.map((s) => s.waitForCalls(2)))
  for (const s of gated) s.release()
  const res = await reply
  assert.deepEqual(res.body.affected_roles, ['A', 'B', 'C'])
})

test('sync: registrations that arrive while a role\'s sync runs share one next sync', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  const role = tp.roles.get('A')
  const s = session('a', 'gated')
  role.attachSession(s)
  await s.waitForCalls(1)
  const before = role[kSyncCount]
  // The attach-time sync is still running (gated): every registration below arrives during it.
  let registered = 0
  const allRegistered = new Promise<void>((resolve) => {
    tp.on('tool-registered', () => { if (++registered === 20) resolve() })
  })
  const replies = Array.from({ length: 20 }, (_, i) => inject(tp, 'POST', '/api/tools/register', tool(`t${i}`)))
  await allRegistered
  s.release()
  await s.waitForCalls(2)
  s.release()
  for (const reply of await Promise.all(replies)) assert.equal(reply.body.ok, true)
  assert.equal(role[kSyncCount] - before, 1)
  assert.equal(s.calls, 2)
  assert.deepEqual(s.currentNames, Array.from({ length: 20 }, (_, i) => `t${i}`))
})

test('R17: unregister with one failing role: removed true, ok true, the failure in failed_roles', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A', 'B'] })
  await inject(tp, 'POST', '/api/tools/register', tool('x'))
  tp.roles.get('A').attachSession(session('a', 'instant'))
  tp.roles.get('B').attachSession(session('b', 'throw'))
  const res = await inject(tp, 'POST', '/api/tools/unregister', { name: 'x' })
  assert.equal(res.body.ok, true)
  assert.equal(res.body.removed, true)
  assert.deepEqual(res.body.affected_roles, ['A'])
  assertFailedRoles(res.body.failed_roles, ['B'])
  assert.deepEqual(names(tp, 'B'), [], 'not rolled back')
})

test('R17: unregister whose only changed role fails to sync reports it in failed_roles and keeps the removal', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A', 'B'] })
  await inject(tp, 'POST', '/api/tools/register', tool('x', { role: 'B' }))
  tp.roles.get('B').attachSession(session('b', 'throw'))
  const res = await inject(tp, 'POST', '/api/tools/unregister', { name: 'x' })
  assert.equal(res.statusCode, 200)
  assert.equal(res.body.removed, true)
  assert.deepEqual(res.body.affected_roles, [])
  assertFailedRoles(res.body.failed_roles, ['B'])
  assert.deepEqual(names(tp, 'B'), [])
})

test('R17: clear with one failing role: the count includes it, ok true, the failure in failed_roles', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A', 'B'] })
  await inject(tp, 'POST', '/api/tools/register', tool('x', { source: 'plugin:p' }))
  tp.roles.get('A').attachSession(session('a', 'instant'))
  tp.roles.get('B').attachSession(session('b', 'throw'))
  const res = await inject(tp, 'POST', '/api/tools/clear', { source: 'plugin:p' })
  assert.equal(res.body.ok, true)
  assert.equal(res.body.removed, 2)
  assert.deepEqual(res.body.affected_roles, ['A'])
  assertFailedRoles(res.body.failed_roles, ['B'])
})

test('sync: 50 concurrent registrations over real HTTP leave every random-delay session holding exactly its role\'s final tool list', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['A', 'B'] })
  const sessionsByRole = {
    A: [session('a1', 'random', { maxDelayMs: 4 }), session('a2', 'random', { maxDelayMs: 4 })],
    B: [session('b1', 'random', { maxDelayMs: 4 })]
  }
  for (const [role, sessions] of Object.entries(sessionsByRole)) {
    for (const s of sessions) tp.roles.get(role).attachSession(s)
  }
  const bodies = Array.from({ length: 50 }, (_, i) => tool(`tool_${i % 40}`, {
    description: `registration ${i}`,
    role: i % 5 === 0 ? 'B' : i % 7 === 0 ? 'A' : null
  }))
  const replies = await Promise.all(bodies.map((body) => httpJson(`${url}/api/tools/register`, 'POST', body)))
  for (const reply of replies) {
    assert.equal(reply.statusCode, 200)
    assert.equal(reply.body.ok, true)
    assert.deepEqual(reply.body.failed_roles, [])
  }
  assertSessionsHoldRegistry(tp, sessionsByRole)
  assert.equal(tp.roles.get('A').registry.size + tp.roles.get('B').registry.size > 0, true)
  // Coalescing: 50 mutations never need more than one sync each (plus the attach-time sync).
  assert.ok(tp.roles.get('A')[kSyncCount] <= 51)
})

test('sync: concurrent register, unregister and clear over real HTTP end with sessions holding the final registry', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['A', 'B', 'C'] })
  const sessionsByRole: Record<string, FakeSession[]> = {}
  for (const role of ['A', 'B', 'C']) {
    const s = session(role.toLowerCase(), 'random', { maxDelayMs: 3 })
    tp.roles.get(role).attachSession(s)
    sessionsByRole[role] = [s]
  }
  const ops: Array<Promise<unknown>> = []
  for (let i = 0; i < 60; i++) {
    const name = `t${i % 12}`
    if (i % 6 === 5) ops.push(httpJson(`${url}/api/tools/unregister`, 'POST', { name }))
    else if (i % 15 === 14) ops.push(httpJson(`${url}/api/tools/clear`, 'POST', { source: 'plugin:odd' }))
    else {
      ops.push(httpJson(`${url}/api/tools/register`, 'POST', tool(name,
        { source: i % 2 === 0 ? 'plugin:even' : 'plugin:odd', role: i % 4 === 0 ? 'C' : null })))
    }
  }
  const replies = await Promise.all(ops) as Array<{ statusCode: number, body: { ok: boolean } }>
  for (const reply of replies) assert.equal(reply.statusCode, 200)
  assertSessionsHoldRegistry(tp, sessionsByRole)
})

test('R4: a role added after a global registration does not get it, and its new session is given no tools', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  await inject(tp, 'POST', '/api/tools/register', tool('early'))
  const late = tp.roles.add('Late')
  const s = session('late', 'instant')
  late.attachSession(s)
  await late.sync()
  assert.deepEqual(names(tp, 'Late'), [])
  assert.deepEqual(s.currentNames, [])
  const res = await inject(tp, 'POST', '/api/tools/register', tool('after'))
  assert.deepEqual(res.body.affected_roles, ['A', 'Late'])
  assert.deepEqual(names(tp, 'A'), ['early', 'after'])
  assert.deepEqual(names(tp, 'Late'), ['after'])
  assert.deepEqual(s.currentNames, ['after'])
})

test('R4: a role added while a global registration is waiting for its syncs does not get that registration', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  const s = session('a', 'gated')
  tp.roles.get('A').attachSession(s)
  await s.waitForCalls(1)
  s.release()
  await s.waitIdle()
  const reply = inject(tp, 'POST', '/api/tools/register', tool('x'))
  await s.waitForCalls(2)
  tp.roles.add('Late')
  s.release()
  const res = await reply
  assert.deepEqual(res.body.affected_roles, ['A'])
  assert.deepEqual(names(tp, 'Late'), [])
})

test('R18: local tools are listed with is_remote false and callback_url null, and sessions get them', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  const s = session('s', 'instant')
  tp.roles.get('A').attachSession(s)
  const outcome = await tp.roles.get('A').registerLocalTool({
    name: 'clock', description: 'Local time.', parameters: { type: 'object', properties: {} }, handler: () => 'noon'
  })
  assert.deepEqual(outcome, { ok: true, error: '' })
  const res = await inject(tp, 'GET', '/api/tools?role=A')
  assert.deepEqual(res.body.tools_by_role.A, [
    { name: 'clock', description: 'Local time.', source: 'local', callback_url: null, is_remote: false }
  ])
  assert.deepEqual(s.current, [{
    name: 'clock',
    description: 'Local time.',
    parameters: {
      type: 'object',
      properties: {}
    }
  }])
})

test('R5: a local tool cannot be replaced over the API: that role is in failed_roles and keeps its local tool', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A', 'B'] })
  await tp.roles.get('A').registerLocalTool({ name: 'clock', handler: () => 'noon' })
  const res = await inject(tp, 'POST', '/api/tools/register', tool('clock'))
  assert.equal(res.body.ok, true)
  assert.deepEqual(res.body.affected_roles, ['B'])
  assertFailedRoles(res.body.failed_roles, ['A'], 'local')
  assert.equal(tp.list('A').tools_by_role.A?.[0]?.is_remote, false)
  assert.equal(tp.list('B').tools_by_role.B?.[0]?.is_remote, true)
})

test('R8: replacing a local tool in its only target role is ok false with that role in failed_roles', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  await tp.roles.get('A').registerLocalTool({ name: 'clock', handler: () => 'noon' })
  const res = await inject(tp, 'POST', '/api/tools/register', tool('clock', { role: 'A' }))
  assert.equal(res.statusCode, 200)
  assert.equal(res.body.ok, false)
  assert.deepEqual(res.body.affected_roles, [])
  assertFailedRoles(res.body.failed_roles, ['A'], 'local')
  assert.equal(tp.list('A').tools_by_role.A?.[0]?.is_remote, false)
})

test('R15: a local tool cannot be removed over the API: unregister lists the role in refused_roles', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A', 'B'] })
  await tp.roles.get('A').registerLocalTool({ name: 'clock', source: 'host:clock', handler: () => 'noon' })
  await inject(tp, 'POST', '/api/tools/register', tool('clock', { role: 'B' }))
  const res = await inject(tp, 'POST', '/api/tools/unregister', { name: 'clock' })
  assert.deepEqual(res.body, {
    ok: true,
    removed: true,
    affected_roles: ['B'],
    failed_roles: [],
    refused_roles: [{
      role: 'A',
      owned_by: 'host:clock'
    }]
  })
  assert.deepEqual(names(tp, 'A'), ['clock'])
})

test('R15: unregister of a name that is only a local tool removes nothing', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  await tp.roles.get('A').registerLocalTool({ name: 'clock', handler: () => 'noon' })
  const res = await inject(tp, 'POST', '/api/tools/unregister', { name: 'clock', role: 'A' })
  assert.equal(res.body.removed, false)
  assert.deepEqual(res.body.refused_roles, [{ role: 'A', owned_by: 'local' }])
  assert.deepEqual(names(tp, 'A'), ['clock'])
})

test('R16: clear never removes local tools, even with the same source tag', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  await tp.roles.get('A').registerLocalTool({ name: 'clock', source: 'plugin:p', handler: () => 'noon' })
  await inject(tp, 'POST', '/api/tools/register', tool('remote', { source: 'plugin:p' }))
  const res = await inject(tp, 'POST', '/api/tools/clear', { source: 'plugin:p' })
  assert.equal(res.body.removed, 1)
  assert.deepEqual(names(tp, 'A'), ['clock'])
  const local = await inject(tp, 'POST', '/api/tools/clear', { source: 'local' })
  assert.equal(local.body.removed, 0)
})
