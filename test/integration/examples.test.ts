// The README's plugin example (examples/weather_plugin.py) works as written against a real server.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { spawn, spawnSync } from 'node:child_process'
import { once } from 'node:events'
import { createInterface } from 'node:readline'
import { createToolport } from '../../src/main/index.js'

const hasPython = spawnSync('python3', ['--version']).status === 0

test('the Python plugin example registers, answers calls (R10, R11) and clears its source on exit', { skip: hasPython ? false : 'python3 is not installed' }, async (t) => {
  const tp = await createToolport({ roles: ['Lanlan'] })
  t.after(() => tp.close())
  const { url } = await tp.listen({ port: 0 })
  const plugin = spawn('python3', ['examples/weather_plugin.py', '--toolport', url], {
    stdio: ['ignore', 'pipe',
      'inherit']
  })
  t.after(() => { if (plugin.exitCode === null) plugin.kill('SIGKILL') })
  const lines = createInterface({ input: plugin.stdout })
  const [first] = await once(lines, 'line') as [string]
  assert.match(first, /registered get_weather/)
  assert.deepEqual(tp.list('Lanlan').tools_by_role.Lanlan!.map((x) => [x.name, x.source]), [['get_weather',
    'plugin:weather']])

  const ok = await tp.callTool('Lanlan', { name: 'get_weather', raw_arguments: '{"location": "Shanghai"}' })
  assert.deepEqual(ok.output, { location: 'Shanghai', temperature_c: 28 })
  const unknown = await tp.callTool('Lanlan', { name: 'get_weather', arguments: { location: 'Atlantis' } })
  assert.equal(unknown.is_error, true)
  assert.equal(unknown.error, 'no forecast for Atlantis')
  const invalid = await tp.callTool('Lanlan', { name: 'get_weather', arguments: {} })
  assert.equal(invalid.is_error, true)

  plugin.kill('SIGTERM')
  await once(plugin, 'exit')
  assert.deepEqual(tp.list('Lanlan').tools_by_role.Lanlan, [])
})
