// RoleSync and Role (docs/protocol.md "Sync"): one role's syncs never overlap, never regress, coalesce,
// time out and fail without rolling anything back.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { EventEmitter } from 'node:events'
import { setImmediate as turn } from 'node:timers/promises'
import { RoleSync, type ModelSession, type SyncOutcome } from '../../src/main/roles/sync.js'
import { Role } from '../../src/main/roles/role.js'
import { ToolEntry, type ToolDefinition } from '../../src/main/roles/tool-registry.js'
import type { ToolportEvents } from '../../src/main/events.js'
import { session, type FakeSession } from '../helpers.js'

/** A registry stand-in whose snapshot is named after its revision: `rev0`, `rev1`, … */
class Revisions {
  revision = 0
  definitions (): readonly ToolDefinition[] {
    return [{ name: `rev${this.revision}`, description: '', parameters: { type: 'object', properties: {} } }]
  }
}

/**
 * 200 changes, each followed by a sync request, yielding to the event loop after a change with
 * probability `yieldChance`, so requests land both during and between running syncs.
 */
async function interleavedRequests (sync: RoleSync, revisions: Revisions, yieldChance: number): Promise<SyncOutcome[]> {
  const pending: Array<Promise<SyncOutcome>> = []
  for (let i = 0; i < 200; i++) {
    revisions.revision++
    pending.push(sync.request())
    if (Math.random() < yieldChance) await turn()
  }
  return await Promise.all(pending)
}

function syncFor (sessions: ModelSession[], timeoutMs = 10_000, revisions = new Revisions()): RoleSync {
  return new RoleSync({ definitions: () => revisions.definitions(), sessions: () => sessions }, timeoutMs)
}

function revisionOf (names: string[]): number {
  return Number((names[0] as string).slice(3))
}

test('sync: a role with no session syncs trivially and counts as accepted', async () => {
  const sync = syncFor([])
  assert.deepEqual(await sync.request(), { ok: true, error: '' })
  assert.equal(sync.count, 0)
})

test('sync: a sync pushes the current snapshot to every attached session', async () => {
  const a = session('a', 'instant')
  const b = session('b', 'random')
  const sync = syncFor([a, b])
  assert.deepEqual(await sync.request(), { ok: true, error: '' })
  assert.deepEqual(a.currentNames, ['rev0'])
  assert.deepEqual(b.currentNames, ['rev0'])
  assert.equal(sync.count, 1)
})

test('sync: requests that arrive while a sync runs share one next sync (N requests, at most 2 syncs)', async () => {
  const s = session('s', 'gated')
  const sync = syncFor([s])
  const first = sync.request()
  await s.waitForCalls(1)
  const waiting = Array.from({ length: 25 }, () => sync.request())
  s.release()
  await first
  await s.waitForCalls(2)
  s.release()
  const outcomes = await Promise.all(waiting)
  for (const outcome of outcomes) assert.equal(outcome.ok, true)
  assert.equal(sync.count, 2)
  assert.equal(s.calls, 2)
})

test('sync: a request made during a running sync is answered only by a sync that includes its change', async () => {
  const revisions = new Revisions()
  const s = session('s', 'gated')
  const sync = syncFor([s], 10_000, revisions)
  const first = sync.request()
  await s.waitForCalls(1)
  revisions.revision = 1
  let answered = false
  const second = sync.request().then((outcome) => { answered = true; return outcome })
  s.release()
  await first
  assert.equal(answered, false, 'the running sync (rev0) must not answer a request for rev1')
  await s.waitForCalls(2)
  s.release()
  assert.equal((await second).ok, true)
  assert.deepEqual(s.received, [['rev0'], ['rev1']])
  assert.deepEqual(s.currentNames, ['rev1'])
})

test('sync: syncs of one role never overlap, even under many interleaved requests with random delays', async () => {
  const revisions = new Revisions()
  const s = session('s', 'random', { maxDelayMs: 3 })
  const sync = syncFor([s], 10_000, revisions)
  const outcomes = await interleavedRequests(sync, revisions, 0.3)
  assert.ok(outcomes.every((o) => o.ok))
  assert.equal(s.maxActive, 1)
})

test('sync: a later push never carries an older snapshot, and the last push is the newest one', async () => {
  const revisions = new Revisions()
  const s = session('s', 'random', { maxDelayMs: 3 })
  const sync = syncFor([s], 10_000, revisions)
  await interleavedRequests(sync, revisions, 0.5)
  const pushed = s.received.map(revisionOf)
  for (let i = 1; i < pushed.length; i++) {
    assert.ok((pushed[i] as number) >= (pushed[i - 1] as number), `push ${i} regressed: ${pushed.join(',')}`)
  }
  assert.equal(pushed.at(-1), revisions.revision)
  assert.deepEqual(s.currentNames, [`rev${revisions.revision}`])
  assert.ok(sync.count <= 200)
})

test('sync: a session that throws fails the sync with its message, and request() does not reject', async () => {
  const s = session('s', 'throw', { message: 'model-socket-closed' })
  const sync = syncFor([s])
  const outcome = await sync.request()
  assert.equal(outcome.ok, false)
  assert.ok(outcome.error.includes('model-socket-closed'), outcome.error)
})

test('sync: a session whose syncTools throws synchronously also fails the sync without rejecting', async () => {
  const thrower: ModelSession = {
    id: 'sync-thrower',
    syncTools () { throw new Error('sync-throw') }
  }
  const outcome = await syncFor([thrower]).request()
  assert.equal(outcome.ok, false)
  assert.ok(outcome.error.includes('sync-throw'), outcome.error)
})

test('sync: a session that never answers fails the sync at the timeout, and its signal is aborted', async () => {
  const s = session('stuck', 'hang')
  const sync = syncFor([s], 30)
  const outcome = await sync.request()
  assert.equal(outcome.ok, false)
  assert.equal(typeof outcome.error, 'string')
  assert.notEqual(outcome.error, '')
  assert.equal(s.aborted, 1)
})

test('sync: one failing session fails the role\'s sync while the other sessions still get the tools', async () => {
  const good = session('good', 'instant')
  const bad = session('bad', 'throw')
  const outcome = await syncFor([good, bad]).request()
  assert.equal(outcome.ok, false)
  assert.deepEqual(good.currentNames, ['rev0'])
})

test('sync: a failed sync is not rolled back and the next successful sync carries the newest snapshot', async () => {
  const revisions = new Revisions()
  const s = session('s', 'throw')
  const sync = syncFor([s], 10_000, revisions)
  revisions.revision = 1
  assert.equal((await sync.request()).ok, false)
  assert.deepEqual(s.currentNames, [])
  s.behaviour = 'instant'
  revisions.revision = 2
  assert.equal((await sync.request()).ok, true)
  assert.deepEqual(s.currentNames, ['rev2'])
})

test('sync: a timed-out sync does not block the role: the next request runs a new sync', async () => {
  const s = session('s', 'hang')
  const sync = syncFor([s], 20)
  assert.equal((await sync.request()).ok, false)
  s.behaviour = 'instant'
  assert.equal((await sync.request()).ok, true)
  assert.equal(sync.count, 2)
})

function newRole (name = 'Lanlan', syncTimeoutMs = 10_000): Role {
  return new Role(name, { syncTimeoutMs, events: new EventEmitter<ToolportEvents>() })
}

function remoteEntry (name: string): ToolEntry {
  return new ToolEntry({
    name,
    description: '',
    parameters: { type: 'object', properties: {} },
    source: 'external',
    timeoutMs: 30_000,
    callback: { href: 'http://127.0.0.1:9/x', origin: 'http://127.0.0.1:9', path: '/x' },
    validator: () => ''
  })
}

test('sync: attaching a session sends it the role\'s current tools at once', async () => {
  const role = newRole()
  role.registry.set(remoteEntry('a'))
  const s = session('s', 'instant')
  role.attachSession(s)
  await s.waitForCalls(1)
  await s.waitIdle()
  assert.deepEqual(s.currentNames, ['a'])
})

test('sync: a detached session receives no further syncs', async () => {
  const role = newRole()
  const kept = session('kept', 'instant')
  const gone = session('gone', 'instant')
  role.attachSession(kept)
  const detach = role.attachSession(gone)
  await role.sync()
  detach()
  const before = gone.calls
  role.registry.set(remoteEntry('b'))
  assert.equal((await role.sync()).ok, true)
  assert.equal(gone.calls, before)
  assert.deepEqual(kept.currentNames, ['b'])
  assert.deepEqual(role.sessions(), [kept])
})

test('sync: attaching the same session twice keeps one attachment', async () => {
  const role = newRole()
  const s = session('s', 'instant')
  role.attachSession(s)
  role.attachSession(s)
  assert.equal(role.sessions().length, 1)
  await role.sync()
  assert.equal(s.maxActive, 1)
})

test('sync: a failed role sync emits sync-failed with the role name', async () => {
  const events = new EventEmitter<ToolportEvents>()
  const role = new Role('Mochi', { syncTimeoutMs: 10_000, events })
  role.attachSession(session('bad', 'throw') as FakeSession)
  const seen: Array<{ role: string, error: string }> = []
  events.on('sync-failed', (event) => seen.push(event))
  const outcome = await role.sync()
  assert.equal(outcome.ok, false)
  assert.ok(seen.some((e) => e.role === 'Mochi' && e.error !== ''))
})
