// The plugin SDK watches Toolport's event stream and registers again at once, instead of at the
// next poll. The poll interval is set to ten minutes here, so only the stream can explain a
// re-registration within the test's bounds.
import assert from 'node:assert/strict'
import { once } from 'node:events'
import { test, type TestContext } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { createPlugin, type Plugin, type RegisteredEvent } from '../../src/plugin/index.js'
import { createToolport } from '../../src/main/index.js'
import { names, startToolport } from '../helpers.js'

const NEVER_MS = 600_000

function weatherPlugin (t: TestContext, toolportUrl: string, extra: { role?: string } = {}): Plugin {
  const plugin = createPlugin({
    toolportUrl,
    source: 'plugin:watch',
    logger: false,
    pollIntervalMs: NEVER_MS,
    maxBackoffMs: 500,
    ...extra,
    tools: { get_weather: { description: 'Weather.', handler: () => ({ temperature_c: 28 }) } }
  })
  plugin.on('error', () => {})
  t.after(() => plugin.stop({ graceMs: 0 }))
  return plugin
}

async function untilWatching (plugin: Plugin): Promise<void> {
  for (let i = 0; i < 250 && !plugin.isWatchingEvents; i++) await sleep(20)
  assert.equal(plugin.isWatchingEvents, true, 'the plugin watches the event stream')
}

/** The next `registered` event with reason `restored`, or a failure after `ms`. */
async function restored (plugin: Plugin, ms = 10_000): Promise<RegisteredEvent> {
  const signal = AbortSignal.timeout(ms)
  for (;;) {
    const [event] = await once(plugin, 'registered', { signal }) as [RegisteredEvent]
    if (event.reason === 'restored') return event
  }
}

test('R15: a tool unregistered by someone else is registered again at once, not at the next poll', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['Lanlan', 'Mochi'] })
  const plugin = weatherPlugin(t, url)
  await plugin.start()
  await untilWatching(plugin)
  const back = restored(plugin)
  await tp.unregister({ name: 'get_weather', role: 'Mochi' })
  const event = await back
  assert.deepEqual(event.names, ['get_weather'])
  assert.deepEqual(names(tp, 'Mochi'), ['get_weather'])
})

test('R4: a plugin for every role reaches a role created after it started, at once', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['Lanlan'] })
  const plugin = weatherPlugin(t, url)
  await plugin.start()
  await untilWatching(plugin)
  const back = restored(plugin)
  tp.roles.add('Nova')
  assert.deepEqual((await back).roles, ['Nova'])
  assert.deepEqual(names(tp, 'Nova'), ['get_weather'])
})

test('a plugin of one role is restored at once when its role is removed and added back', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['Lanlan', 'Mochi'] })
  const plugin = weatherPlugin(t, url, { role: 'Mochi' })
  await plugin.start()
  await untilWatching(plugin)
  const back = restored(plugin)
  tp.roles.remove('Mochi')
  tp.roles.add('Mochi')
  assert.deepEqual((await back).roles, ['Mochi'])
  assert.deepEqual(names(tp, 'Mochi'), ['get_weather'])
})

test('ownership mode: a plugin whose tool name another source held in a role registers it there at once when that source is cleared', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['Lanlan', 'Mochi'], security: { enforceOwnership: true } })
  await tp.register({ name: 'get_weather', callback_url: 'http://127.0.0.1:9/w', source: 'plugin:other', role: 'Lanlan' })
  const plugin = weatherPlugin(t, url)
  assert.deepEqual((await plugin.start()).roles, ['Mochi'])
  await untilWatching(plugin)
  const back = restored(plugin)
  assert.equal((await tp.clear({ source: 'plugin:other' })).removed, 1)
  assert.deepEqual((await back).roles, ['Lanlan'])
  assert.equal(tp.list('Lanlan').tools_by_role.Lanlan?.[0]?.source, 'plugin:watch')
})

test('R3: after a Toolport restart (a new instance_id on the stream) the plugin registers again at once', async (t) => {
  const first = await createToolport({ roles: ['Lanlan'], logger: false, dispatch: { mode: 'inline' } })
  const { url, port } = await first.listen({ host: '127.0.0.1', port: 0 })
  const plugin = weatherPlugin(t, url)
  await plugin.start()
  await untilWatching(plugin)
  await first.close()

  const second = await createToolport({ roles: ['Lanlan'], logger: false, dispatch: { mode: 'inline' } })
  t.after(() => second.close())
  const back = restored(plugin)
  await second.listen({ host: '127.0.0.1', port })
  await back
  assert.deepEqual(names(second, 'Lanlan'), ['get_weather'])
  assert.notEqual(second.instanceId, first.instanceId)
})

test('with watchEvents: false the plugin opens no stream (and still polls)', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['Lanlan'] })
  const plugin = createPlugin({
    toolportUrl: url,
    source: 'plugin:quiet',
    logger: false,
    pollIntervalMs: 50,
    watchEvents: false,
    tools: { quiet: { handler: () => 'ok' } }
  })
  t.after(() => plugin.stop({ graceMs: 0 }))
  await plugin.start()
  const back = restored(plugin)
  await tp.unregister({ name: 'quiet' })
  await back
  const stats = await (await fetch(`${url}/api/console/stats`)).json() as { events: { subscribers: number } }
  assert.equal(stats.events.subscribers, 0)
  assert.equal(plugin.isWatchingEvents, false)
})
