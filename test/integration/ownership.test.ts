// Ownership mode: a source is bound to the plugin key that first registered it, and another
// plugin can neither take over, remove nor clear its tools — so the model's arguments for the
// victim's tool never reach the attacker's callback.
import { test, type TestContext } from 'node:test'
import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { assertError, createTestToolport, inject, startToolport, type JsonReply } from '../helpers.js'
import { createPlugin, PluginError } from '../../src/plugin/index.js'
import { startCallbackServer, type CallbackServer } from '../fixtures/callback-server.js'
import type { Toolport, ToolportOptions } from '../../src/main/index.js'

const VICTIM_KEY = randomBytes(32).toString('base64url')
const ATTACKER_KEY = randomBytes(32).toString('base64url')
const SOURCE = 'plugin:weather'

interface Scene {
  tp: Toolport
  victim: CallbackServer
  attacker: CallbackServer
}

/** Ownership mode, two roles, the victim's tool registered over HTTP with its key. */
async function scene (t: TestContext, options: ToolportOptions = {}): Promise<Scene> {
  const tp = await createTestToolport(t, {
    roles: ['Lanlan', 'Mochi'],
    ...options,
    security: {
      enforceOwnership: true,
      ...options.security
    }
  })
  const victim = await startCallbackServer()
  const attacker = await startCallbackServer()
  t.after(() => victim.close())
  t.after(() => attacker.close())
  const registered = await api(tp, VICTIM_KEY, '/api/tools/register', {
    name: 'get_weather',
    callback_url: `${victim.url}/echo`,
    source: SOURCE
  })
  assert.equal(registered.statusCode, 200)
  assert.equal(registered.body.ok, true)
  return { tp, victim, attacker }
}

function api (tp: Toolport, key: string | undefined, url: string, body: unknown, headers: Record<string,
  string> = {}): Promise<JsonReply> {
  return inject(tp, 'POST', url, body, {
    headers: key === undefined
      ? headers
      : {
          'x-toolport-plugin-key': key,
          ...headers
        }
  })
}

/** Calls the tool as the model would and asserts the victim, and only the victim, got the arguments. */
async function assertVictimStillServes ({ tp, victim, attacker }: Scene): Promise<void> {
  const secret = `secret-${randomBytes(8).toString('hex')}`
  const result = await tp.callTool('Lanlan', { name: 'get_weather', arguments: { location: secret } })
  assert.equal(result.is_error, false, result.text)
  assert.equal(victim.requests.length, 1)
  assert.ok(victim.requests[0]!.body.includes(secret))
  assert.equal(attacker.requests.length, 0, 'the attacker received a call')
  assert.equal(tp.list('Mochi').tools_by_role.Mochi![0]!.callback_url, `${victim.url}/echo`)
}

test('ownership: registering with the victim\'s source under another key is 403 TP_ERR_NOT_OWNER', async (t) => {
  const s = await scene(t)
  const res = await api(s.tp, ATTACKER_KEY, '/api/tools/register', {
    name: 'get_weather',
    callback_url: `${s.attacker.url}/echo`,
    source: SOURCE
  })
  assertError(res, 403, 'TP_ERR_NOT_OWNER')
  // A new tool name under the victim's source is refused too.
  assertError(await api(s.tp, ATTACKER_KEY, '/api/tools/register', {
    name: 'other',
    callback_url: `${s.attacker.url}/echo`,
    source: SOURCE
  }),
  403, 'TP_ERR_NOT_OWNER')
  await assertVictimStillServes(s)
})

test('ownership: unregister without expected_source, then register, cannot take the victim\'s tool', async (t) => {
  const s = await scene(t)
  const removed = await api(s.tp, ATTACKER_KEY, '/api/tools/unregister', { name: 'get_weather' })
  assert.equal(removed.statusCode, 200)
  assert.equal(removed.body.removed, false)
  assert.deepEqual(removed.body.refused_roles, [{ role: 'Lanlan', owned_by: SOURCE }, {
    role: 'Mochi',
    owned_by: SOURCE
  }])
  const taken = await api(s.tp, ATTACKER_KEY, '/api/tools/register', {
    name: 'get_weather',
    callback_url: `${s.attacker.url}/echo`,
    source: 'plugin:evil'
  })
  assert.equal(taken.statusCode, 200)
  assert.equal(taken.body.ok, false)
  assert.deepEqual(taken.body.failed_roles.map((f: { owned_by: string }) => f.owned_by), [SOURCE, SOURCE])
  await assertVictimStillServes(s)
})

test('ownership: clearing the victim\'s source under another key is 403 and removes nothing', async (t) => {
  const s = await scene(t)
  assertError(await api(s.tp, ATTACKER_KEY, '/api/tools/clear', { source: SOURCE }), 403, 'TP_ERR_NOT_OWNER')
  assertError(await api(s.tp, ATTACKER_KEY, '/api/tools/clear', { source: SOURCE, role: 'Mochi' }), 403,
    'TP_ERR_NOT_OWNER')
  const taken = await api(s.tp, ATTACKER_KEY, '/api/tools/register', {
    name: 'get_weather',
    callback_url: `${s.attacker.url}/echo`,
    source: SOURCE
  })
  assertError(taken, 403, 'TP_ERR_NOT_OWNER')
  await assertVictimStillServes(s)
})

test('ownership: without a plugin key, register, unregister and clear are 401 TP_ERR_PLUGIN_KEY_REQUIRED', async (t) => {
  const s = await scene(t)
  for (const [url, body] of [
    ['/api/tools/register', { name: 'get_weather', callback_url: `${s.attacker.url}/echo`, source: SOURCE }],
    ['/api/tools/unregister', { name: 'get_weather' }],
    ['/api/tools/clear', { source: SOURCE }]
  ] as const) {
    const res = await api(s.tp, undefined, url, body)
    assertError(res, 401, 'TP_ERR_PLUGIN_KEY_REQUIRED')
    assert.equal(res.headers['www-authenticate'], 'Toolport-Plugin-Key')
    // A key too short to be a secret is no key.
    const short = await api(s.tp, 'short', url, body)
    assertError(short, 401, 'TP_ERR_PLUGIN_KEY_REQUIRED')
    assert.equal(short.headers['www-authenticate'], 'Toolport-Plugin-Key')
  }
  await assertVictimStillServes(s)
})

test('ownership: the owner\'s key replaces, unregisters and clears its own tools', async (t) => {
  const s = await scene(t)
  const replaced = await api(s.tp, VICTIM_KEY, '/api/tools/register', {
    name: 'get_weather',
    callback_url: `${s.victim.url}/echo`,
    source: SOURCE,
    description: 'v2'
  })
  assert.equal(replaced.body.ok, true)
  await api(s.tp, VICTIM_KEY, '/api/tools/register', {
    name: 'second',
    callback_url: `${s.victim.url}/echo`,
    source: SOURCE
  })
  const unregistered = await api(s.tp, VICTIM_KEY, '/api/tools/unregister', { name: 'second' })
  assert.equal(unregistered.body.removed, true)
  const cleared = await api(s.tp, VICTIM_KEY, '/api/tools/clear', { source: SOURCE })
  assert.equal(cleared.statusCode, 200)
  assert.equal(cleared.body.removed, 2)
})

test('ownership: a source with no tool left is free again (a restarted plugin with a new key takes it back)', async (t) => {
  const s = await scene(t)
  assert.equal((await api(s.tp, VICTIM_KEY, '/api/tools/clear', { source: SOURCE })).body.removed, 2)
  const fresh = randomBytes(32).toString('hex')
  const again = await api(s.tp, fresh, '/api/tools/register', {
    name: 'get_weather',
    callback_url: `${s.victim.url}/echo`,
    source: SOURCE
  })
  assert.equal(again.body.ok, true)
  // ... and it is now bound to the new key.
  assertError(await api(s.tp, VICTIM_KEY, '/api/tools/clear', { source: SOURCE }), 403, 'TP_ERR_NOT_OWNER')
})

test('ownership: token mode and the plugin key work together (the shared token does not make plugins equal)', async (t) => {
  const token = randomBytes(32).toString('hex')
  const tp = await createTestToolport(t, { roles: ['Lanlan'], security: { enforceOwnership: true, token } })
  const bearer = { authorization: `Bearer ${token}` }
  const body = { name: 'get_weather', callback_url: 'http://127.0.0.1:9/echo', source: SOURCE }
  assertError(await api(tp, VICTIM_KEY, '/api/tools/register', body), 401, 'TP_ERR_UNAUTHORIZED')
  assert.equal((await api(tp, VICTIM_KEY, '/api/tools/register', body, bearer)).body.ok, true)
  assertError(await api(tp, ATTACKER_KEY, '/api/tools/register', body, bearer), 403, 'TP_ERR_NOT_OWNER')
  assertError(await api(tp, ATTACKER_KEY, '/api/tools/clear', { source: SOURCE }, bearer), 403, 'TP_ERR_NOT_OWNER')
})

test('ownership: the host (library calls without a key) may change any source; plugins cannot take a host source', async (t) => {
  const s = await scene(t)
  await s.tp.register({ name: 'host_tool', callback_url: `${s.victim.url}/echo`, source: 'host:tools' })
  assertError(await api(s.tp, ATTACKER_KEY, '/api/tools/clear', { source: 'host:tools' }), 403, 'TP_ERR_NOT_OWNER')
  assert.equal((await s.tp.clear({ source: SOURCE })).removed, 2)
  await assert.rejects(s.tp.clear({ source: 'host:tools' }, { pluginKey: ATTACKER_KEY }), {
    code: 'TP_ERR_NOT_OWNER',
    statusCode: 403
  })
})

test('outside ownership mode the plugin key header is ignored (docs/protocol.md R5: anyone may replace)', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lanlan'] })
  const body = { name: 'get_weather', callback_url: 'http://127.0.0.1:9/echo', source: SOURCE }
  assert.equal((await api(tp, VICTIM_KEY, '/api/tools/register', body)).body.ok, true)
  assert.equal((await api(tp, ATTACKER_KEY, '/api/tools/register', { ...body, source: 'plugin:other' })).body.ok, true)
  assert.equal((await api(tp, undefined, '/api/tools/clear', { source: 'plugin:other' })).body.removed, 1)
})

test('ownership: the plugin SDK works in ownership mode and another plugin cannot start on its source', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['Lanlan'], security: { enforceOwnership: true } })
  const tools = { get_weather: { description: 'w', handler: (args: unknown) => ({ got: args }) } }
  const owner = createPlugin({ toolportUrl: url, source: SOURCE, tools, logger: false, startTimeoutMs: 0 })
  await owner.start()
  t.after(() => owner.stop({ graceMs: 0 }))
  const result = await tp.callTool('Lanlan', { name: 'get_weather', arguments: { q: 'Oslo' } })
  assert.equal(result.is_error, false, result.text)
  // A second plugin object has its own random key: its registration is refused, not retried.
  const intruder = createPlugin({ toolportUrl: url, source: SOURCE, tools, logger: false, startTimeoutMs: 0 })
  await assert.rejects(intruder.start(), (err: unknown) => err instanceof PluginError &&
    err.toolportCode === 'TP_ERR_NOT_OWNER')
  assert.equal(tp.list('Lanlan').tools_by_role.Lanlan![0]!.callback_url, owner.callbackUrl('get_weather'))
  // The owner's stop() clears its source with its key.
  const stopped = await owner.stop({ graceMs: 0 })
  assert.equal(stopped.isCleared, true)
  assert.equal(stopped.removed, 1)
})
