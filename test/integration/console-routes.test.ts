// The console's routes and the standalone guard's two exemptions for it, through app.inject.
import assert from 'node:assert/strict'
import { test } from 'node:test'
import { CONSOLE_CSP } from '../../src/main/http/console.js'
import { assertError, createTestToolport, inject } from '../helpers.js'

const TOKEN = 'console-routes-token-that-is-long-enough-0123456789'

async function get (tp: Awaited<ReturnType<typeof createTestToolport>>, url: string, headers: Record<string,
  string> = {}) {
  return await tp.app.inject({ method: 'GET', url, headers: { host: '127.0.0.1:3917', ...headers } })
}

test('the console is served at / and /ui/ with a strict CSP, and its vendored files from their packages', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lanlan'] })
  for (const url of ['/', '/ui/']) {
    const res = await get(tp, url)
    assert.equal(res.statusCode, 200, url)
    assert.match(String(res.headers['content-type']), /^text\/html/)
    assert.equal(res.headers['content-security-policy'], CONSOLE_CSP)
    assert.equal(res.headers['x-frame-options'], 'DENY')
    assert.equal(res.headers['cache-control'], 'no-store')
    assert.match(res.body, /<script type="module" src="\/ui\/console.js"><\/script>/)
    assert.doesNotMatch(res.body, /<script>|<style>|style="/, 'no inline script or style')
  }
  assert.equal((await get(tp, '/ui')).statusCode, 301)
  const uplot = await get(tp, '/ui/vendor/uplot/uPlot.esm.js')
  assert.equal(uplot.statusCode, 200)
  assert.match(String(uplot.headers['content-type']), /javascript/)
  assert.equal((await get(tp, '/ui/vendor/uplot/uPlot.iife.js')).statusCode, 404, 'only the two files the page uses')
  assert.equal((await get(tp, '/ui/vendor/eventsource-parser.js')).statusCode, 200)
  assert.equal((await get(tp, '/ui/../package.json')).statusCode, 404)
})

test('with console: false there is no page at /', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lanlan'], console: false })
  const res = await inject(tp, 'GET', '/')
  assertError(res, 404, 'TP_ERR_ROUTE_NOT_FOUND')
})

test('a same-origin request (the console\'s own page) passes the Origin check; another origin does not', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lanlan'] })
  const same = await get(tp, '/api/console/state', { origin: 'http://127.0.0.1:3917' })
  assert.equal(same.statusCode, 200)
  assert.equal(JSON.parse(same.body).roles[0].name, 'Lanlan')
  const post = await tp.app.inject({
    method: 'POST',
    url: '/api/tools/call',
    headers: { host: 'localhost:3917', origin: 'http://localhost:3917', 'content-type': 'application/json' },
    payload: JSON.stringify({ role: 'Lanlan', name: 'nothing', arguments: {} })
  })
  assert.equal(post.statusCode, 200)
  for (const origin of ['http://127.0.0.1:8080', 'http://localhost:3917', 'https://127.0.0.1:3917', 'null']) {
    const res = await get(tp, '/api/console/state', { origin })
    assert.equal(res.statusCode, 403, origin)
    assert.equal(JSON.parse(res.body).code, 'TP_ERR_ORIGIN_FORBIDDEN')
  }
  // A rebinding page is "same-origin" under its own name, but its Host is refused first.
  const rebinding = await get(tp, '/api/console/state', {
    host: 'attacker.example:3917',
    origin: 'http://attacker.example:3917'
  })
  assert.equal(JSON.parse(rebinding.body).code, 'TP_ERR_HOST_FORBIDDEN')
})

test('without the Host check there is no same-origin exemption', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lanlan'], security: { checkHost: false } })
  const res = await get(tp, '/api/console/state', {
    host: 'attacker.example:3917',
    origin: 'http://attacker.example:3917'
  })
  assert.equal(res.statusCode, 403)
  assert.equal(JSON.parse(res.body).code, 'TP_ERR_ORIGIN_FORBIDDEN')
})

test('token mode: the page\'s files need no token, every API route still does', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lanlan'], security: { token: TOKEN } })
  assert.equal((await get(tp, '/')).statusCode, 200)
  assert.equal((await get(tp, '/ui/console.js')).statusCode, 200)
  assert.equal((await get(tp, '/ui/console.js', { origin: 'http://127.0.0.1:3917' })).statusCode, 200)
  for (const url of ['/api/console/state', '/api/console/stats', '/api/events', '/api/tools', '/api/health']) {
    const res = await get(tp, url, { origin: 'http://127.0.0.1:3917' })
    assert.equal(res.statusCode, 401, url)
  }
  const withToken = await get(tp, '/api/console/state', { authorization: `Bearer ${TOKEN}` })
  assert.equal(withToken.statusCode, 200)
  assert.equal(JSON.parse(withToken.body).token_mode, true)
  // The exemption is for reading the page only.
  const post = await tp.app.inject({
    method: 'POST',
    url: '/ui/console.js',
    headers: {
      host: '127.0.0.1:3917',
      'content-type': 'application/json'
    },
    payload: '{}'
  })
  assert.equal(post.statusCode, 401)
  // The other checks still apply to the page's files.
  const foreign = await get(tp, '/', { host: 'attacker.example' })
  assert.equal(JSON.parse(foreign.body).code, 'TP_ERR_HOST_FORBIDDEN')
  const remote = await tp.app.inject({
    method: 'GET',
    url: '/',
    headers: { host: '127.0.0.1' },
    remoteAddress: '10.0.0.5'
  })
  assert.equal(remote.statusCode, 403)
})

test('the console state lists roles, tools, sessions, last syncs, origins with health, evictions and recent calls', async (t) => {
  const tp = await createTestToolport(t, { roles: ['Lanlan', 'Mochi'] })
  assert.ok(tp.app, 'the app (and with it the event ring and the console numbers) exists from here on')
  await tp.register({
    name: 'gone',
    callback_url: 'http://127.0.0.1:9/gone',
    source: 'plugin:gone',
    role: 'Lanlan',
    timeout_seconds: 2
  })
  await tp.register({ name: 'kept', callback_url: 'http://127.0.0.1:9333/kept', source: 'plugin:kept', role: 'Mochi' })
  await tp.roles.get('Mochi').attachSession({ id: 's1', syncTools: async () => {} })
  await tp.roles.get('Mochi').sync()
  await tp.callTool('Lanlan', { name: 'gone', arguments: { secret: 'never-shown-canary' } })
  let state = JSON.parse((await get(tp, '/api/console/state')).body)
  const lanlan = state.roles.find((r: { name: string }) => r.name === 'Lanlan')
  assert.deepEqual(lanlan.tools[0], {
    name: 'gone',
    description: '',
    source: 'plugin:gone',
    callback_url: 'http://127.0.0.1:9/gone',
    origin: 'http://127.0.0.1:9',
    is_remote: true,
    timeout_seconds: 2
  })
  const mochi = state.roles.find((r: { name: string }) => r.name === 'Mochi')
  assert.equal(mochi.sessions, 1)
  assert.equal(mochi.last_sync.ok, true)
  assert.equal(state.origins.find((o: { origin: string }) => o.origin === 'http://127.0.0.1:9').failures, 1)
  assert.equal(state.calls.length, 1)
  assert.equal(state.calls[0].outcome, 'connect')

  await tp.callTool('Lanlan', { name: 'gone', arguments: {} })
  await tp.callTool('Lanlan', { name: 'gone', arguments: {} })
  const text = (await get(tp, '/api/console/state')).body
  state = JSON.parse(text)
  assert.equal(state.evictions[0].origin, 'http://127.0.0.1:9')
  assert.deepEqual(state.evictions[0].tools, ['gone'])
  assert.ok(!text.includes('never-shown-canary'))

  const stats = JSON.parse((await get(tp, '/api/console/stats')).body)
  assert.equal(stats.stats.window_seconds, 300)
  assert.equal(stats.stats.all.total, 3)
  assert.equal(stats.stats.tools[0].tool, 'gone')
  assert.equal(stats.pool.mode, 'inline')
})
