// The plugin SDK's client of Toolport's API (src/plugin/toolport-client.ts): its per-request
// deadline, the caller's abort signal, and what a long-running plugin's checks leave behind on
// that signal. Real Toolport and real loopback sockets.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { createServer, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { getEventListeners } from 'node:events'
import { nameQueries, ToolportClient } from '../../src/plugin/toolport-client.js'
import { PluginError } from '../../src/plugin/index.js'
import { startToolport, waitFor } from '../helpers.js'

function client (baseUrl: string, requestTimeoutMs = 10_000): ToolportClient {
  return new ToolportClient({ baseUrl: new URL(baseUrl.endsWith('/') ? baseUrl : `${baseUrl}/`), token: null, pluginKey: 'k'.repeat(32), requestTimeoutMs })
}

/** A loopback server that reads each request and never answers. */
async function silentServer (t: import('node:test').TestContext): Promise<{ url: string, held: ServerResponse[] }> {
  const held: ServerResponse[] = []
  const server = createServer((req, res) => { req.resume(); held.push(res) })
  await new Promise<void>((resolve) => { server.listen(0, '127.0.0.1', resolve) })
  t.after(async () => {
    server.closeAllConnections()
    await new Promise((resolve) => { server.close(resolve) })
  })
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, held }
}

test('a plugin\'s checks leave nothing on its long-lived stop signal: no listener and no dependant signal per request (README "Plugin SDK": a plugin runs for weeks)', async (t) => {
  const { url } = await startToolport(t, { roles: ['A'] })
  const api = client(url)
  t.after(() => api.close())
  const stop = new AbortController()
  const REQUESTS = 300
  for (let i = 0; i < REQUESTS; i++) {
    const listed = await api.list(null, ['x'], stop.signal)
    assert.deepEqual([...listed.keys()], ['A'])
  }
  assert.equal(getEventListeners(stop.signal, 'abort').length, 0, 'abort listeners left on the caller\'s signal')
  // Node keeps the signals AbortSignal.any() made from a signal in a set it never prunes.
  const dependants = Object.getOwnPropertySymbols(stop.signal).find((s) => s.description === 'kDependantSignals')
  if (dependants !== undefined) {
    const set = (stop.signal as unknown as Record<symbol, Set<unknown> | undefined>)[dependants]
    assert.ok((set?.size ?? 0) < REQUESTS / 10, `${set?.size} dependant signals after ${REQUESTS} requests`)
  }
})

test('a request Toolport never answers fails at the request timeout, naming it, as TP_ERR_PLUGIN_UNREACHABLE (README "Plugin SDK": requestTimeoutMs)', async (t) => {
  const { url, held } = await silentServer(t)
  const api = client(url, 200)
  t.after(() => api.close())
  const stop = new AbortController()
  await assert.rejects(api.list(null, ['x'], stop.signal), (err: unknown) => {
    assert.ok(err instanceof PluginError)
    assert.equal(err.code, 'TP_ERR_PLUGIN_UNREACHABLE')
    assert.match(err.message, /no answer within 200 ms/)
    return true
  })
  assert.equal(held.length, 1)
  assert.equal(getEventListeners(stop.signal, 'abort').length, 0)
})

test('aborting the caller\'s signal ends a request in flight at once, before its timeout, and one already aborted is never sent', async (t) => {
  const { url, held } = await silentServer(t)
  const api = client(url, 60_000)
  t.after(() => api.close())
  const stop = new AbortController()
  const pending = api.list(null, ['x'], stop.signal)
  await waitFor('the request reaches the server', () => held.length === 1)
  stop.abort(new Error('plugin stopping'))
  await assert.rejects(pending, (err: unknown) => {
    assert.ok(err instanceof PluginError)
    assert.equal(err.code, 'TP_ERR_PLUGIN_UNREACHABLE')
    assert.doesNotMatch(err.message, /no answer within/)
    return true
  })
  await assert.rejects(api.list(null, ['x'], stop.signal), { code: 'TP_ERR_PLUGIN_UNREACHABLE' })
  assert.equal(held.length, 1, 'a request with an aborted signal reached the server')
})

test('R18: the client asks for its names in queries of at most 4096 characters, each name once, in order', () => {
  const names = Array.from({ length: 300 }, (_, i) => `名前_${i}&=?`.padEnd(64, '€'))
  const queries = nameQueries(names)
  assert.ok(queries.length > 1)
  for (const query of queries) assert.ok(query.length <= 4096, `${query.length} characters`)
  assert.deepEqual(queries.flatMap((query) => new URLSearchParams(query).getAll('name')), names)
  assert.deepEqual(nameQueries(['a b']), ['name=a%20b'])
})

test('R18: list() over several requests answers what one would: the rows of its names in every role, any source', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['A', 'B'] })
  const names = Array.from({ length: 200 }, (_, i) => `n${i}_`.padEnd(64, 'x'))
  for (const [i, name] of names.entries()) {
    if (i % 3 === 0) continue // some names are registered nowhere
    await tp.register({ name, callback_url: 'http://127.0.0.1:9/t', source: `plugin:s${i % 2}`, role: i % 5 === 0 ? 'B' : null })
  }
  await tp.register({ name: 'other', callback_url: 'http://127.0.0.1:9/o', source: 'plugin:other' })
  const api = client(url)
  t.after(() => api.close())
  const listed = await api.list(null, names)
  assert.deepEqual([...listed.keys()], ['A', 'B'])
  const byName = (a: { name: string }, b: { name: string }): number => a.name < b.name ? -1 : 1
  for (const role of ['A', 'B']) {
    const expected = (tp.list(role, { names }).tools_by_role[role] ?? []).map((row) => ({
      name: row.name, source: row.source, callback_url: row.callback_url, is_remote: row.is_remote
    }))
    assert.ok(expected.length > 60)
    assert.deepEqual([...listed.get(role) ?? []].sort(byName), expected.sort(byName))
  }
})
