// Hostile and broken plugins against the dispatcher's capacity, with real worker threads and real
// sockets on 127.0.0.1: a plugin that never answers must not delay another plugin's calls, its
// own extra callers get "busy", and replies held at once stay within the reply-byte budget.
import assert from 'node:assert/strict'
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { setMaxListeners } from 'node:events'
import { setTimeout as sleep } from 'node:timers/promises'
import { test, type TestContext } from 'node:test'
import type { Toolport } from '../../src/main/index.js'
import type { ToolResult } from '../../src/main/dispatch/result.js'
import { startCallbackServer } from '../fixtures/callback-server.js'
import { createTestToolport, inject, waitFor } from '../helpers.js'
import { kPendingCalls } from '../../src/main/symbols.js'

async function metricsText (tp: Toolport): Promise<string> {
  const res = await tp.app.inject({ method: 'GET', url: '/metrics' })
  assert.equal(res.statusCode, 200)
  return res.body
}

interface HeldServer {
  origin: string
  /** Requests received so far. */
  readonly received: number
  /** Ends every held reply: `finish(response)` for each, then close() works at once. */
  release: () => void
}

/**
 * A loopback server that holds every request. `start(response)` runs when a request arrives
 * (e.g. sends headers and part of a body); `finish(response)` runs on release().
 */
async function startHeldServer (t: TestContext, start: (response: ServerResponse) => void,
  finish: (response: ServerResponse) => void): Promise<HeldServer> {
  const held: ServerResponse[] = []
  let received = 0
  let isReleased = false
  const server: Server = createServer((request: IncomingMessage, response: ServerResponse) => {
    received++
    request.resume()
    start(response)
    if (isReleased) finish(response)
    else held.push(response)
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const release = (): void => {
    isReleased = true
    for (const response of held.splice(0)) if (!response.destroyed) finish(response)
  }
  t.after(() => new Promise<void>((resolve) => {
    release()
    server.close(() => resolve())
    server.closeAllConnections()
  }))
  return {
    origin: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    get received () { return received },
    release
  }
}

async function register (tp: Toolport, name: string, url: string, timeoutSeconds = 60): Promise<void> {
  const result = await tp.register({
    name,
    callback_url: url,
    timeout_seconds: timeoutSeconds,
    parameters: { type: 'object' }
  })
  assert.equal(result.ok, true, result.error)
}

function call (tp: Toolport, name: string): Promise<ToolResult> {
  return tp.callTool('r', { name, arguments: {} })
}

test('a plugin that never answers, with more calls than the old task slots, never delays another plugin', { timeout: 30_000 }, async (t) => {
  const stuck = await startHeldServer(t, () => {}, (response) => { response.destroy() })
  const healthy = await startCallbackServer()
  t.after(() => healthy.close())
  const tp = await createTestToolport(t, { roles: ['r'], dispatch: { mode: 'pool' } })
  await register(tp, 'stuck', `${stuck.origin}/never`)
  await register(tp, 'fast', `${healthy.url}/echo`)
  // 300 calls: more than the 256 piscina task slots that the stuck plugin used to fill.
  const stuckCalls = Array.from({ length: 300 }, () => call(tp, 'stuck'))
  // The worker has sent as many as the connection cap allows; the rest wait in its queue.
  await waitFor('the stuck plugin to hold 64 requests', () => stuck.received >= 64)
  for (let i = 0; i < 20; i++) {
    const result = await call(tp, 'fast')
    assert.equal(result.is_error, false, result.error)
  }
  assert.equal(tp[kPendingCalls] >= 300, true)
  stuck.release()
  for (const result of await Promise.all(stuckCalls)) assert.equal(result.is_error, true)
})

test('at its per-origin bounds a stuck plugin\'s extra callers get "busy" at once while another plugin keeps answering', async (t) => {
  const stuck = await startHeldServer(t, () => {}, (response) => { response.destroy() })
  const healthy = await startCallbackServer()
  t.after(() => healthy.close())
  const tp = await createTestToolport(t, {
    roles: ['r'],
    dispatch: {
      mode: 'pool',
      maxInFlightPerOrigin: 4,
      maxQueuedPerOrigin: 3
    }
  })
  await register(tp, 'stuck', `${stuck.origin}/never`)
  await register(tp, 'fast', `${healthy.url}/echo`)
  const held = Array.from({ length: 7 }, () => call(tp, 'stuck'))
  await waitFor('4 calls in flight at the stuck plugin', () => stuck.received === 4)
  const extra = await Promise.all(Array.from({ length: 5 }, () => call(tp, 'stuck')))
  for (const result of extra) {
    assert.equal(result.is_error, true)
    assert.match(result.error ?? '', /busy/)
    assert.match(result.error ?? '', /4 calls in flight and 3 waiting/)
  }
  // The queued calls were not sent: the plugin got exactly its in-flight bound.
  assert.equal(stuck.received, 4)
  // The healthy plugin has the same bounds of its own: 10 rounds of 5 concurrent calls fit them.
  for (let round = 0; round < 10; round++) {
    const fast = await Promise.all(Array.from({ length: 5 }, () => call(tp, 'fast')))
    for (const result of fast) assert.equal(result.is_error, false, result.error)
  }
  const health = await inject(tp, 'GET', '/api/health')
  assert.equal(health.body.dispatch.queued, 3)
  stuck.release()
  const ended = await Promise.all(held)
  for (const result of ended) assert.equal(result.is_error, true)
  // Released in order: the queued calls reached the plugin once the first four ended.
  assert.equal(stuck.received, 7)
})

test('replies held at once stay within maxBufferedReplyBytes: calls beyond it fail with a clear tool error', async (t) => {
  const CHUNK = 200 * 1024
  const budget = 1024 * 1024
  const part = 'a'.repeat(CHUNK)
  const start = (response: ServerResponse): void => {
    response.writeHead(200, { 'content-type': 'application/json' })
    response.write(`{"output":"${part}`)
  }
  const finish = (response: ServerResponse): void => { response.end('","is_error":false}') }
  // Several ports, as an attacker would use to get past the per-origin connection cap.
  const servers = await Promise.all([0, 1, 2].map(() => startHeldServer(t, start, finish)))
  const tp = await createTestToolport(t, { roles: ['r'], dispatch: { mode: 'pool', maxBufferedReplyBytes: budget } })
  for (const [i, server] of servers.entries()) await register(tp, `big_${i}`, `${server.origin}/big`)
  const calls = Array.from({ length: 24 }, (_, i) => call(tp, `big_${i % 3}`))
  await waitFor('every request to arrive', () => servers.reduce((n, s) => n + s.received, 0) === 24)
  // Let the first chunks arrive and be counted (or refused) on the worker.
  await new Promise((resolve) => setTimeout(resolve, 300))
  const metrics = await metricsText(tp)
  const held = Number(/^toolport_reply_buffer_bytes (\d+)$/m.exec(metrics)?.[1])
  assert.ok(held > 0, 'the gauge counts the bytes being held')
  assert.ok(held <= budget, `${held} bytes held, over the ${budget} budget`)
  assert.match(metrics, new RegExp(`^toolport_reply_buffer_limit_bytes ${budget}$`, 'm'))
  for (const server of servers) server.release()
  const results = await Promise.all(calls)
  const ok = results.filter((r) => !r.is_error)
  const refused = results.filter((r) => r.is_error)
  assert.ok(ok.length >= 1 && ok.length <= Math.floor(budget / CHUNK), `${ok.length} replies read in full`)
  for (const result of ok) assert.equal(result.text.length, CHUNK)
  assert.ok(refused.length >= 24 - Math.floor(budget / CHUNK))
  for (const result of refused) assert.match(result.error ?? '', /budget of 1048576 bytes \(dispatch\.maxBufferedReplyBytes\)/)
  const after = await metricsText(tp)
  assert.match(after, /^toolport_reply_buffer_bytes 0$/m)
  const counted = [...after.matchAll(/^toolport_calls_total\{[^}]*outcome="memory"\} (\d+)$/gm)]
  assert.equal(counted.reduce((n, m) => n + Number(m[1]), 0), refused.length)
})

for (const mode of ['inline', 'pool'] as const) {
  test(`${mode}: a plugin stalled in the middle of many large replies holds at most its origin's share of the reply budget; another plugin's replies still fit`, async (t) => {
    const CAP = 64 * 1024
    const budget = 16 * CAP
    // Each reply declares 64 KiB and sends all of it but the last byte, then waits.
    const staller = await startHeldServer(t, (response) => {
      response.writeHead(200, { 'content-type': 'text/plain', 'content-length': CAP })
      response.write('x'.repeat(CAP - 1))
    }, (response) => { response.end('x') })
    const innocent = await startCallbackServer()
    t.after(() => innocent.close())
    const tp = await createTestToolport(t, {
      roles: ['r'],
      dispatch: { mode, maxResponseBytes: CAP, connectionsPerOrigin: 16, maxBufferedReplyBytes: budget }
    })
    await register(tp, 'staller', `${staller.origin}/stall`)
    await register(tp, 'innocent', `${innocent.url}/echo`)
    const stalled = Array.from({ length: 16 }, () => call(tp, 'staller'))
    await waitFor('every request at the stalled plugin', () => staller.received === 16)
    // Half the budget is the stalled origin's share: 8 replies fit it; the others are dropped as
    // their first bytes arrive.
    const settled: ToolResult[] = []
    for (const p of stalled) p.then((r) => { settled.push(r) }, () => {})
    await waitFor('the replies past the share to be dropped', () => settled.length === 8)
    for (const result of settled) {
      assert.match(result.error ?? '', /from this callback's origin already hold its share \(524288 bytes\) of Toolport's budget of 1048576 bytes/)
    }
    assert.equal(Number(/^toolport_reply_buffer_bytes (\d+)$/m.exec(await metricsText(tp))?.[1]), 8 * (CAP - 1))
    const other = await call(tp, 'innocent')
    assert.equal(other.is_error, false, other.error)
    staller.release()
    const finished = (await Promise.all(stalled)).filter((r) => !r.is_error)
    assert.deepEqual(finished.map((r) => r.text.length), Array.from({ length: 8 }, () => CAP))
    assert.match(await metricsText(tp), /^toolport_reply_buffer_bytes 0$/m)
  })

  test(`${mode}: one abort of 4 000 calls queued behind their origin's bound answers every one of them as cancelled`, { timeout: 30_000 }, async (t) => {
    // Inline, a queued call sent after the abort is answered on the spot, and each answer sends
    // the next queued call: that chain must not nest once per call (it overflowed the stack and
    // left callers without an answer, docs/architecture.md "Per-origin bounds").
    const held = await startHeldServer(t, () => {}, (response) => { response.destroy() })
    const tp = await createTestToolport(t, {
      roles: ['r'],
      dispatch: { mode, maxInFlightPerOrigin: 4, maxQueuedPerOrigin: 4_000, maxPending: 8_000 }
    })
    await register(tp, 'held', `${held.origin}/never`)
    const controller = new AbortController()
    setMaxListeners(0, controller.signal)
    const calls = Array.from({ length: 4_004 }, () => tp.callTool('r', { name: 'held', arguments: {} },
      { signal: controller.signal }))
    await waitFor('4 calls at the plugin', () => held.received === 4)
    assert.equal(tp[kPendingCalls], 4_004)
    controller.abort()
    const results = await Promise.all(calls)
    assert.equal(results.length, 4_004)
    for (const result of results) {
      assert.equal(result.is_error, true)
      assert.match(result.error ?? '', /cancel/i)
    }
    assert.equal(tp[kPendingCalls], 0)
    // The queued calls were answered, never sent.
    assert.equal(held.received, 4)
  })

  test(`${mode}: close() after its grace answers calls still queued behind their origin's bound without sending them`, async (t) => {
    const held = await startHeldServer(t, () => {}, (response) => { response.destroy() })
    const tp = await createTestToolport(t, {
      roles: ['r'],
      dispatch: { mode, maxInFlightPerOrigin: 2, maxQueuedPerOrigin: 10, closeGraceMs: 50 }
    })
    await register(tp, 'held', `${held.origin}/never`)
    const calls = Array.from({ length: 8 }, () => call(tp, 'held'))
    await waitFor('2 calls at the plugin', () => held.received === 2)
    await tp.close()
    const results = await Promise.all(calls)
    for (const result of results) assert.equal(result.is_error, true)
    // Give a call sent during close() the time to reach the plugin before counting.
    await sleep(200)
    assert.equal(held.received, 2)
  })
}
