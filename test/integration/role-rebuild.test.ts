// A host that rebuilds a role's model sessions (N.E.K.O rebuilds a character's session manager
// when its settings are saved) keeps the plugins' tools: `replaceSessions` swaps the sessions
// while the role and its registry stay. Removing the role still drops its tools.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { httpJson, names, session, startToolport, tool } from '../helpers.js'

test('replaceSessions swaps a role\'s model sessions; the new one gets the plugin tools, the old one nothing more', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['Lanlan'] })
  const role = tp.roles.get('Lanlan')
  const before = session('realtime-1', 'instant')
  role.attachSession(before)
  const registered = await httpJson(`${url}/api/tools/register`, 'POST', tool('get_weather',
    { source: 'plugin:weather' }))
  assert.equal(registered.statusCode, 200)
  assert.deepEqual(before.received.at(-1), ['get_weather'])

  const after = session('realtime-2', 'instant')
  const outcome = await role.replaceSessions([before], [after])
  assert.deepEqual(outcome, { ok: true, error: '' })
  assert.deepEqual(after.current?.map((d) => d.name), ['get_weather'],
    'the rebuilt session has the plugin tool at once')
  assert.deepEqual(role.sessions(), [after])
  assert.deepEqual(names(tp, 'Lanlan'), ['get_weather'], 'the registry stayed')

  const pushesToOld = before.received.length
  await httpJson(`${url}/api/tools/register`, 'POST', tool('get_time', { source: 'plugin:clock' }))
  assert.equal(before.received.length, pushesToOld, 'the replaced session is detached')
  assert.deepEqual(after.received.at(-1), ['get_weather', 'get_time'])
})

test('replaceSessions reports a new session that refuses the tools, and leaves sessions it was not given attached', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['Lanlan'] })
  const role = tp.roles.get('Lanlan')
  await httpJson(`${url}/api/tools/register`, 'POST', tool('get_weather', { source: 'plugin:weather' }))
  // An MCP client of the role is a session the host did not attach: a rebuild leaves it alone.
  const client = new Client({ name: 'rebuild-test', version: '1.0.0' })
  await client.connect(new StreamableHTTPClientTransport(new URL(`${url}/mcp/Lanlan`)))
  t.after(() => client.close())
  const old = session('realtime-1', 'instant')
  role.attachSession(old)
  assert.equal(role.sessions().length, 2)

  const broken = session('realtime-2', 'throw', { message: 'model refused' })
  const outcome = await role.replaceSessions([old], [broken])
  assert.equal(outcome.ok, false)
  assert.match(outcome.error, /model refused/)
  assert.equal(role.sessions().length, 2)
  assert.ok(role.sessions().includes(broken))
  assert.ok(!role.sessions().includes(old))
  assert.deepEqual((await client.listTools()).tools.map((d) => d.name), ['get_weather'])
  assert.equal(role.detachSession(broken), true)
  assert.equal(role.detachSession(broken), false)
})

test('removing a role still drops its tools: adding it again starts empty (R4)', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['Lanlan'] })
  await httpJson(`${url}/api/tools/register`, 'POST', tool('get_weather', { source: 'plugin:weather' }))
  assert.deepEqual(names(tp, 'Lanlan'), ['get_weather'])
  tp.roles.remove('Lanlan')
  tp.roles.add('Lanlan')
  assert.deepEqual(names(tp, 'Lanlan'), [])
})
