// Failure modes found in review: host listeners that throw, sessions that ignore their abort
// signal, concurrent failures at one origin, and shutdown with local calls still running.
import { test, type TestContext } from 'node:test'
import assert from 'node:assert/strict'
import { execFileSync, spawn, spawnSync } from 'node:child_process'
import { once } from 'node:events'
import net from 'node:net'
import { readdirSync } from 'node:fs'
import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { createInterface } from 'node:readline'
import { Client } from 'undici'
import { createToolport, type Toolport, type ToolDefinition } from '../../src/main/index.js'
import type { ToolportOptions } from '../../src/main/config.js'
import { closedPort, startCallbackServer } from '../fixtures/callback-server.js'
import { createTestToolport, toolportCliArgs } from '../helpers.js'
import { kOriginFailures } from '../../src/main/symbols.js'

const CALLBACK = 'http://127.0.0.1:9/x'

/** Two roles, inline dispatch unless `options.dispatch` says otherwise; closed in t.after. */
function setup (t: TestContext, options: ToolportOptions = {}): Promise<Toolport> {
  return createTestToolport(t, { roles: ['Lanlan', 'Mochi'], ...options })
}

test('a host listener that throws never breaks a sync, a registration or a tool call', async (t) => {
  const tp = await setup(t)
  tp.roles.get('Lanlan').attachSession({ id: 's', syncTools: async () => {} })
  for (const event of ['sync-finished', 'sync-failed', 'tool-registered', 'tool-removed', 'call-finished'] as const) {
    tp.on(event, () => { throw new Error(`listener of ${event} is broken`) })
  }
  for (const name of ['a', 'b', 'c']) {
    const result = await tp.register({ name, callback_url: CALLBACK })
    assert.deepEqual([result.ok, result.affected_roles], [true, ['Lanlan', 'Mochi']])
  }
  assert.equal((await tp.unregister({ name: 'a' })).ok, true)
  const call = await tp.callTool('Lanlan', { name: 'nope' })
  assert.equal(call.is_error, true)
  assert.deepEqual(tp.list('Lanlan').tools_by_role.Lanlan!.map((x) => x.name), ['b', 'c'])
})

test('sync: a session that finishes a push after its timeout never sees two pushes overlap, and ends with the newest list', async (t) => {
  const tp = await setup(t, { syncTimeoutMs: 200 })
  let active = 0
  let maxActive = 0
  const applied: string[][] = []
  let pushes = 0
  tp.roles.get('Lanlan').attachSession({
    id: 'late',
    async syncTools (tools: readonly ToolDefinition[], signal: AbortSignal) {
      active++
      maxActive = Math.max(maxActive, active)
      if (++pushes === 2) {
        // Outlives the timeout and applies its (old) list anyway, just after the abort.
        await new Promise((resolve) => signal.addEventListener('abort', () => setTimeout(resolve, 10)))
      }
      applied.push(tools.map((x) => x.name))
      active--
    }
  })
  await new Promise((resolve) => setImmediate(resolve))
  const first = await tp.register({ name: 'a', callback_url: CALLBACK, role: 'Lanlan' })
  assert.equal(first.ok, false, 'the late push timed out')
  const second = await tp.register({ name: 'b', callback_url: CALLBACK, role: 'Lanlan' })
  assert.equal(second.ok, true)
  assert.equal(maxActive, 1)
  assert.deepEqual(applied, [[], ['a'], ['a', 'b']])
})

test('R13: concurrent refused calls evict an origin once, not once per threshold crossing', async (t) => {
  const tp = await setup(t)
  const port = await closedPort()
  await tp.register({ name: 'p', callback_url: `http://127.0.0.1:${port}/p`, source: 'plugin:p' })
  const events: unknown[] = []
  tp.on('origin-evicted', (event) => events.push(event))
  await Promise.all(Array.from({ length: 9 }, () => tp.callTool('Lanlan', { name: 'p' })))
  assert.equal(events.length, 1)
  assert.deepEqual(tp.list('Lanlan').tools_by_role.Lanlan, [])
})

test('R13: failures of calls sent before a re-registration do not count against it', async (t) => {
  const tp = await setup(t)
  const port = await closedPort()
  const origin = `http://127.0.0.1:${port}`
  await tp.register({ name: 'p', callback_url: `${origin}/p`, source: 'plugin:p' })
  await tp.callTool('Lanlan', { name: 'p' })
  await tp.callTool('Lanlan', { name: 'p' })
  // Three calls in flight, then the plugin registers again before they fail.
  const stale = [1, 2, 3].map(() => tp.callTool('Lanlan', { name: 'p' }))
  await tp.register({ name: 'q', callback_url: `${origin}/q`, source: 'plugin:p' })
  await Promise.all(stale)
  assert.deepEqual(tp.list('Lanlan').tools_by_role.Lanlan!.map((x) => x.name), ['p', 'q'])
  assert.equal(tp[kOriginFailures](origin), 0)
})

test('close() answers a local call that is still running as cancelled instead of waiting for it', async () => {
  const tp = await createToolport({ roles: ['Lanlan'], dispatch: { mode: 'inline' } })
  let started: () => void = () => {}
  const running = new Promise<void>((resolve) => { started = resolve })
  await tp.roles.get('Lanlan').registerLocalTool({
    name: 'forever',
    timeoutSeconds: 300,
    handler: () => { started(); return new Promise(() => {}) }
  })
  const call = tp.callTool('Lanlan', { name: 'forever' })
  await running
  await tp.close()
  const result = await call
  assert.equal(result.is_error, true)
  assert.match(result.error ?? '', /cancelled/)
})

test('an unknown tool names at most 20 of a role\'s tools', async (t) => {
  const tp = await setup(t)
  for (let i = 0; i < 30; i++) await tp.register({ name: `tool_${i}`, callback_url: CALLBACK, role: 'Lanlan' })
  const result = await tp.callTool('Lanlan', { name: 'tool_x' })
  assert.equal(result.is_error, true)
  assert.match(result.error ?? '', /tool_19 and 10 more$/)
  assert.doesNotMatch(result.error ?? '', /tool_20/)
})

test('R13: an eviction event says which origin, tools and roles', async (t) => {
  const tp = await setup(t, { evictionThreshold: 1 })
  const port = await closedPort()
  await tp.register({ name: 'p', callback_url: `http://127.0.0.1:${port}/p`, source: 'plugin:p' })
  const evicted = once(tp, 'origin-evicted')
  await tp.callTool('Mochi', { name: 'p' })
  const [event] = await evicted
  assert.deepEqual(event, { origin: `http://127.0.0.1:${port}`, tools: ['p'], roles: ['Lanlan', 'Mochi'], failures: 1 })
})

test('R18: GET /api/tools is never stale: replaced tools, local tools, and a role removed and added again', async (t) => {
  const tp = await setup(t)
  const names = async (url = '/api/tools?role=Lanlan'): Promise<string[]> =>
    (await tp.app.inject({ method: 'GET', url })).json().tools_by_role.Lanlan.map((x: { name: string }) => x.name)
  for (const name of ['a', 'b', 'c']) await tp.register({ name, callback_url: CALLBACK, role: 'Lanlan' })
  assert.deepEqual(await names(), ['a', 'b', 'c'])
  await tp.roles.get('Lanlan').registerLocalTool({ name: 'local', handler: () => 1 })
  assert.deepEqual(await names(), ['a', 'b', 'c', 'local'])
  tp.roles.remove('Lanlan')
  tp.roles.add('Lanlan')
  for (const name of ['x', 'y', 'z', 'w']) await tp.register({ name, callback_url: CALLBACK, role: 'Lanlan' })
  assert.deepEqual(await names(), ['x', 'y', 'z', 'w'])
  assert.deepEqual(await names('/api/tools'), ['x', 'y', 'z', 'w'])
})

/** The smallest file descriptor number `pid` does not use: the next one the kernel gives it. */
function lowestFreeFd (pid: number): number {
  const used = new Set(readdirSync(`/proc/${pid}/fd`).map(Number))
  let fd = 0
  while (used.has(fd)) fd++
  return fd
}

const prlimitMissing = spawnSync('prlimit', ['--version']).status === 0 ? false : 'prlimit (util-linux) is not installed'

test('R13: a callback connection Toolport cannot open for want of its own file descriptors (EMFILE) is busy, never a connection failure towards eviction', { skip: prlimitMissing }, async (t) => {
  const plugin = await startCallbackServer()
  t.after(() => plugin.close())
  const dir = await mkdtemp(join(tmpdir(), 'toolport-emfile-'))
  t.after(() => rm(dir, { recursive: true, force: true }))
  const config = join(dir, 'config.json')
  await writeFile(config, JSON.stringify({ evictionThreshold: 1 }))
  const child = spawn(process.execPath, [...toolportCliArgs(), 'serve', '--inline', '--port', '0', '--config', config,
    '--log-level', 'silent'], { stdio: ['ignore', 'pipe', 'inherit'] })
  t.after(() => { child.kill('SIGKILL') })
  const [line] = await once(createInterface({ input: child.stdout }), 'line') as [string]
  const url = /listening on (http:\/\/\S+)/.exec(line)?.[1]
  assert.ok(url !== undefined, line)
  // One keep-alive connection, opened now: the API stays reachable once no new fd can be had.
  const api = new Client(url, { pipelining: 1 })
  t.after(() => api.close())
  const post = async (path: string, body: unknown): Promise<any> => {
    const res = await api.request({ method: 'POST', path, headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) })
    return await res.body.json()
  }
  const registered = await post('/api/tools/register', { name: 'p', callback_url: `${plugin.url}/echo`, source: 'plugin:p' })
  assert.equal(registered.ok, true, JSON.stringify(registered))
  const pid = child.pid!
  const hard = /(\d+|unlimited)\s*$/.exec(execFileSync('prlimit', ['--pid', String(pid), '--nofile', '--noheadings', '--output=HARD'], { encoding: 'utf8' }).trim())?.[1] ?? 'unlimited'
  const setSoft = (soft: number | string): void => { execFileSync('prlimit', ['--pid', String(pid), `--nofile=${soft}:${hard}`]) }
  setSoft(lowestFreeFd(pid))
  let results: any[]
  try {
    results = [await post('/api/tools/call', { role: 'default', name: 'p', arguments: {} }), await post('/api/tools/call', { role: 'default', name: 'p', arguments: {} })]
  } finally {
    setSoft(hard)
  }
  for (const result of results) {
    assert.equal(result.is_error, true, JSON.stringify(result))
    assert.match(result.error, /was not called: Toolport is busy \(.*EMFILE/, result.error)
  }
  assert.equal(plugin.requests.length, 0)
  const res = await api.request({ method: 'GET', path: '/api/tools' })
  const listed = await res.body.json() as { tools_by_role: Record<string, Array<{ name: string }>> }
  assert.deepEqual(listed.tools_by_role.default!.map((tool) => tool.name), ['p'], 'not evicted')
  // With descriptors again, the same tool answers.
  assert.equal((await post('/api/tools/call', { role: 'default', name: 'p', arguments: {} })).is_error, false)
})

/** A loopback port whose listener never accepts and whose accept queue is full: a connect there hangs. */
async function unacceptingPort (t: TestContext): Promise<number> {
  // Node accepts every connection itself; a Python listener that never calls accept() does not.
  const listener = spawn('python3', ['-c', [
    'import socket, sys, time',
    's = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(0)',
    'print(s.getsockname()[1], flush=True)',
    'sys.stdin.read()'
  ].join('\n')], { stdio: ['pipe', 'pipe', 'inherit'] })
  t.after(() => { listener.kill() })
  const [line] = await once(createInterface({ input: listener.stdout }), 'line') as [string]
  const port = Number(line)
  // Fill the accept queue: later connects get no answer at all.
  for (let i = 0; i < 4; i++) {
    const filler = net.connect(port, '127.0.0.1')
    filler.on('error', () => {})
    t.after(() => { filler.destroy() })
  }
  await new Promise((resolve) => setTimeout(resolve, 200))
  return port
}

for (const mode of ['inline', 'pool'] as const) {
  test(`${mode}: a plugin whose port never accepts a connection is evicted even when its tool's timeout is shorter than dispatch.connectTimeoutMs (the call ends as a connect failure, not a timeout)`, { timeout: 60_000 }, async (t) => {
    const port = await unacceptingPort(t)
    const tp = await setup(t, { dispatch: { mode, connectTimeoutMs: 10_000 } })
    await tp.register({ name: 'hung', callback_url: `http://127.0.0.1:${port}/x`, source: 'plugin:hung', timeout_seconds: 1 })
    for (let i = 1; i <= 3; i++) {
      const result = await tp.callTool('Lanlan', { name: 'hung', arguments: {} })
      assert.match(result.error ?? '', /is unreachable: .*TP_CONNECT_DEADLINE: the callback's origin accepted no connection within 1000 ms/, `call ${i}`)
    }
    assert.deepEqual(tp.list('Lanlan').tools_by_role.Lanlan, [], 'evicted after three connect failures (evictionThreshold)')
  })
}

test('a healthy plugin busy on every connection its pool may open is a timeout, not a connect failure: it is never evicted for being slow', { timeout: 60_000 }, async (t) => {
  const server = await startCallbackServer()
  t.after(() => server.close())
  const tp = await setup(t, { dispatch: { connectionsPerOrigin: 1 } })
  await tp.register({ name: 'slow', callback_url: `${server.url}/sleep/1500`, source: 'plugin:slow', timeout_seconds: 1 })
  // One call holds the only connection; the others wait for it and pass their deadline queued.
  const results = await Promise.all(Array.from({ length: 4 }, () => tp.callTool('Lanlan', { name: 'slow', arguments: {} })))
  for (const result of results) assert.match(result.error ?? '', /timed out/)
  assert.equal(tp.list('Lanlan').tools_by_role.Lanlan?.length, 1)
})
