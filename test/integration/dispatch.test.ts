// Tool dispatch end to end (docs/protocol.md R9–R13), in both dispatch modes, against real callback servers
// on 127.0.0.1 and (in pool mode) real worker threads.
import { after, describe, test, type TestContext } from 'node:test'
import assert from 'node:assert/strict'
import { once } from 'node:events'
import { createToolport, type Toolport } from '../../src/main/index.js'
import type { ToolportOptions } from '../../src/main/config.js'
import { closedPort, LARGE_KINDS, largeReply, startCallbackServer, type CallbackServer } from '../fixtures/callback-server.js'
import { replyToResult } from '../../src/main/dispatch/result.js'
import { createTestToolport, startToolport, waitFor } from '../helpers.js'
import { request as httpRequest } from 'node:http'
import { kOriginFailures, kPendingCalls, kWorkerThreads } from '../../src/main/symbols.js'

const MODES = ['pool', 'inline'] as const

const ROLES = ['Lanlan', 'Mochi']

/**
 * Pool-mode tests without options of their own share one Toolport: a new pool pays a worker start
 * (~850 ms, the task loading through tsx) that these tests do not exercise. Each test still starts
 * from empty roles (new Lanlan and Mochi, no tools, no sessions), uses its own callback server, and
 * registers before it calls (which resets its origin's failure count); every call a test makes is
 * answered before the test ends. Tests that configure the pool, or close it, get their own.
 */
let sharedPool: Promise<Toolport> | null = null
after(async () => {
  if (sharedPool !== null) await (await sharedPool).close()
})

async function setup (t: TestContext, mode: 'pool' | 'inline', options?: ToolportOptions): Promise<Toolport> {
  if (mode === 'inline' || options !== undefined) {
    return createTestToolport(t, { roles: ROLES, ...options, dispatch: { mode, ...options?.dispatch } })
  }
  sharedPool ??= createToolport({ logger: false, roles: ROLES, dispatch: { mode } })
  const tp = await sharedPool
  for (const name of ROLES) {
    tp.roles.remove(name)
    tp.roles.add(name)
  }
  return tp
}

async function server (t: TestContext, options?: Parameters<typeof startCallbackServer>[0]): Promise<CallbackServer> {
  const s = await startCallbackServer(options)
  t.after(() => s.close())
  return s
}

async function register (tp: Toolport, body: Record<string, unknown>): Promise<void> {
  const result = await tp.register(body)
  assert.equal(result.ok, true)
}

for (const mode of MODES) {
  describe(`dispatch (${mode} mode)`, () => {
    test('R9: the callback receives name, arguments, call_id and raw_arguments, plus the call headers', async (t) => {
      const tp = await setup(t, mode)
      const s = await server(t)
      await register(tp, { name: 'get_weather', callback_url: `${s.url}/echo` })
      const result = await tp.callTool('Lanlan', {
        name: 'get_weather',
        call_id: 'call_123',
        raw_arguments: '{"location":"Shanghai"}'
      })
      assert.equal(result.is_error, false)
      assert.equal(s.requests.length, 1)
      const received = s.requests[0]!
      assert.equal(received.method, 'POST')
      assert.equal(received.path, '/echo')
      assert.match(String(received.headers['content-type']), /^application\/json/)
      assert.equal(received.headers['x-toolport-call-id'], 'call_123')
      const budget = Number(received.headers['x-toolport-deadline-ms'])
      assert.ok(budget > 0 && budget <= 30_000)
      assert.deepEqual(JSON.parse(received.body), {
        name: 'get_weather',
        arguments: { location: 'Shanghai' },
        call_id: 'call_123',
        raw_arguments: '{"location":"Shanghai"}'
      })
      // /echo answers {output: <the body it got>}, so the output is the request itself.
      assert.deepEqual((result.output as { arguments: unknown }).arguments, { location: 'Shanghai' })
    })

    test('R9: any call_id reaches the plugin: as it is in the body, percent-encoded in x-toolport-call-id', async (t) => {
      const tp = await setup(t, mode)
      const s = await server(t)
      await register(tp, { name: 'get_weather', callback_url: `${s.url}/echo` })
      const ids = ['call_A-1.b~c', 'a\nb', '日本', 'a\u0000b', 'a\u007fb', ' lead', 'é', '50%', 'a b']
      for (const id of ids) {
        const result = await tp.callTool('Lanlan', { name: 'get_weather', call_id: id, arguments: {} })
        assert.equal(result.is_error, false, `call_id ${JSON.stringify(id)}: ${result.text}`)
      }
      assert.deepEqual(s.requests.map((r) => JSON.parse(r.body).call_id), ids)
      assert.deepEqual(s.requests.map((r) => r.headers['x-toolport-call-id']), ids.map((id) => encodeURIComponent(id)))
      // An id that is not well-formed UTF-16 still makes a header (its lone surrogate as U+FFFD).
      await tp.callTool('Lanlan', { name: 'get_weather', call_id: 'x\ud800', arguments: {} })
      assert.equal(s.requests.at(-1)!.headers['x-toolport-call-id'], 'x%EF%BF%BD')
    })

    test('R9: parsed arguments are sent with raw_arguments as their JSON text, and a call_id is generated', async (t) => {
      const tp = await setup(t, mode)
      const s = await server(t)
      await register(tp, { name: 'get_weather', callback_url: `${s.url}/echo` })
      await tp.callTool('Lanlan', { name: 'get_weather', arguments: { location: 'Paris' } })
      const body = JSON.parse(s.requests[0]!.body)
      assert.deepEqual(body.arguments, { location: 'Paris' })
      assert.deepEqual(JSON.parse(body.raw_arguments), { location: 'Paris' })
      assert.equal(typeof body.call_id, 'string')
      assert.ok(body.call_id.length > 0)
    })

    test('R10: a success envelope gives its output; text is the JSON of a non-string output', async (t) => {
      const tp = await setup(t, mode)
      const s = await server(t)
      await register(tp, { name: 'echo', callback_url: `${s.url}/echo` })
      const result = await tp.callTool('Lanlan', { name: 'echo', arguments: { a: 1 } })
      assert.equal(result.is_error, false)
      assert.equal(result.error, undefined)
      assert.equal(result.text, JSON.stringify(result.output))
    })

    test('R11: a tool-level error envelope is an is_error result with the error text', async (t) => {
      const tp = await setup(t, mode)
      const s = await server(t)
      await register(tp, { name: 'get_weather', callback_url: `${s.url}/tool-error` })
      const result = await tp.callTool('Lanlan', { name: 'get_weather', arguments: {} })
      assert.equal(result.is_error, true)
      assert.equal(result.error, 'location not found')
      assert.deepEqual(JSON.parse(result.text), { error: 'location not found' })
    })

    test('R12: an HTTP 500 reply is a tool error naming the status', async (t) => {
      const tp = await setup(t, mode)
      const s = await server(t)
      await register(tp, { name: 'broken', callback_url: `${s.url}/status/500` })
      const result = await tp.callTool('Lanlan', { name: 'broken' })
      assert.equal(result.is_error, true)
      assert.match(result.error ?? '', /HTTP 500/)
      assert.ok((result.error ?? '').length < 260)
    })

    test('R12: an HTTP 404 reply is a tool error too', async (t) => {
      const tp = await setup(t, mode)
      const s = await server(t)
      await register(tp, { name: 'missing', callback_url: `${s.url}/status/404` })
      const result = await tp.callTool('Lanlan', { name: 'missing' })
      assert.equal(result.is_error, true)
      assert.match(result.error ?? '', /HTTP 404/)
    })

    test('R10–R12: large replies (sent whole or in pieces) read exactly as small ones: text, output, BOM', async (t) => {
      const tp = await setup(t, mode)
      const s = await server(t)
      for (const kind of LARGE_KINDS) {
        await register(tp, { name: `large_${kind}`, callback_url: `${s.url}/large/${kind}` })
      }
      for (const kind of LARGE_KINDS) {
        const { body, contentType } = largeReply(kind)
        const expected = replyToResult(body, contentType)
        for (const pieces of [1, 4]) {
          s.requests.length = 0
          await register(tp, { name: `large_${kind}`, callback_url: `${s.url}/large/${kind}?pieces=${pieces}` })
          const result = await tp.callTool('Lanlan', { name: `large_${kind}`, arguments: {} })
          const what = `${kind} in ${pieces} piece(s)`
          assert.equal(result.is_error, false, what)
          assert.ok(result.text.length > 16 * 1024, what)
          assert.equal(result.text, expected.text, what)
          assert.equal(result.text, result.text, what) // read twice: the same text
          assert.deepEqual(result.output, expected.output, what)
          assert.equal(JSON.stringify(result), JSON.stringify(expected), what)
        }
      }
      // A string output keeps its leading U+FEFF (content); a whole body drops its BOM.
      const stringResult = await tp.callTool('Lanlan', { name: 'large_string', arguments: {} })
      assert.equal(stringResult.text.charCodeAt(0), 0xfeff)
      const textResult = await tp.callTool('Lanlan', { name: 'large_text', arguments: {} })
      assert.ok(textResult.text.startsWith('plain text, not JSON: ünïcode 🦊'))
      const rootResult = await tp.callTool('Lanlan', { name: 'large_root', arguments: {} })
      assert.ok(Array.isArray(rootResult.output) && rootResult.output.length === 600)
    })

    test('R10–R12: POST /api/tools/call answers large replies with the same output and text as callTool', async (t) => {
      const { tp, url } = await startToolport(t, { roles: ROLES, dispatch: { mode } })
      const s = await server(t)
      for (const kind of LARGE_KINDS) {
        await register(tp, { name: `large_${kind}`, callback_url: `${s.url}/large/${kind}` })
        const { body, contentType } = largeReply(kind)
        const expected = replyToResult(body, contentType)
        const reply = await fetch(`${url}/api/tools/call`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ role: 'Lanlan', name: `large_${kind}`, arguments: {} })
        })
        assert.equal(reply.status, 200, kind)
        assert.deepEqual(await reply.json(), { is_error: false, output: expected.output, text: expected.text }, kind)
      }
    })

    test('R12: a non-JSON reply becomes text output', async (t) => {
      const tp = await setup(t, mode)
      const s = await server(t)
      await register(tp, { name: 'texty', callback_url: `${s.url}/text` })
      const result = await tp.callTool('Lanlan', { name: 'texty' })
      assert.equal(result.is_error, false)
      assert.equal(result.output, 'plain text reply, not JSON')
      assert.equal(result.text, 'plain text reply, not JSON')
    })

    test('model-visible result: an empty reply is the empty string; a JSON value without the envelope is the output itself', async (t) => {
      const tp = await setup(t, mode)
      const s = await server(t)
      await register(tp, { name: 'empty', callback_url: `${s.url}/empty` })
      await register(tp, { name: 'raw', callback_url: `${s.url}/raw-output` })
      const empty = await tp.callTool('Lanlan', { name: 'empty' })
      assert.deepEqual([empty.is_error, empty.output, empty.text], [false, '', ''])
      const raw = await tp.callTool('Lanlan', { name: 'raw' })
      assert.equal(raw.is_error, false)
      assert.deepEqual(raw.output, { temperature_c: 28 })
      assert.deepEqual(JSON.parse(raw.text), { temperature_c: 28 })
    })

    test('R12: a redirect is a tool error and is never followed (the target receives nothing)', async (t) => {
      const tp = await setup(t, mode)
      const s = await server(t)
      await register(tp, { name: 'moved', callback_url: `${s.url}/redirect` })
      const result = await tp.callTool('Lanlan', { name: 'moved' })
      assert.equal(result.is_error, true)
      assert.match(result.error ?? '', /HTTP 302/)
      assert.deepEqual(s.requests.map((r) => r.path), ['/redirect'])
    })

    test('R12: a callback slower than timeout_seconds is a timeout tool error', async (t) => {
      const tp = await setup(t, mode)
      const s = await server(t)
      await register(tp, { name: 'slow', callback_url: `${s.url}/sleep/5000`, timeout_seconds: 0.3 })
      const result = await tp.callTool('Lanlan', { name: 'slow' })
      assert.equal(result.is_error, true)
      assert.match(result.error ?? '', /timed out after 0\.3 s/)
    })

    test('R12: a trickling reply is cut at the deadline', async (t) => {
      const tp = await setup(t, mode)
      const s = await server(t)
      await register(tp, { name: 'drip', callback_url: `${s.url}/trickle`, timeout_seconds: 0.5 })
      const result = await tp.callTool('Lanlan', { name: 'drip' })
      assert.equal(result.is_error, true)
      assert.match(result.error ?? '', /timed out/)
    })

    test('R12: a refused connection is a tool error the model sees', async (t) => {
      const tp = await setup(t, mode)
      const port = await closedPort()
      await register(tp, { name: 'gone', callback_url: `http://127.0.0.1:${port}/x` })
      const result = await tp.callTool('Lanlan', { name: 'gone' })
      assert.equal(result.is_error, true)
      assert.match(result.error ?? '', /unreachable/)
    })

    test('R12: a reply over maxResponseBytes is a tool error and does not crash (20 MiB)', async (t) => {
      const tp = await setup(t, mode)
      const s = await server(t)
      await register(tp, { name: 'huge', callback_url: `${s.url}/big/${20 * 1024 * 1024}` })
      const result = await tp.callTool('Lanlan', { name: 'huge' })
      assert.equal(result.is_error, true)
      assert.match(result.error ?? '', /more than 4194304 bytes/)
      // The worker still serves.
      await register(tp, { name: 'echo', callback_url: `${s.url}/echo` })
      assert.equal((await tp.callTool('Lanlan', { name: 'echo' })).is_error, false)
    })

    test('R12: a 100 000-deep JSON reply neither crashes nor hangs', async (t) => {
      const tp = await setup(t, mode)
      const s = await server(t)
      await register(tp, { name: 'deep', callback_url: `${s.url}/deep/100000` })
      const result = await tp.callTool('Lanlan', { name: 'deep' })
      assert.equal(typeof result.text, 'string')
      assert.ok(result.text.length >= 200_000)
    })

    test('arguments: invalid JSON arguments are answered to the model without calling the plugin', async (t) => {
      const tp = await setup(t, mode)
      const s = await server(t)
      await register(tp, { name: 'echo', callback_url: `${s.url}/echo` })
      const result = await tp.callTool('Lanlan', { name: 'echo', raw_arguments: '{"location": ' })
      assert.equal(result.is_error, true)
      assert.match(result.error ?? '', /not valid JSON/)
      assert.equal(s.requests.length, 0)
    })

    test('arguments: arguments that fail the parameters schema are answered without calling the plugin', async (t) => {
      const tp = await setup(t, mode)
      const s = await server(t)
      await register(tp, {
        name: 'get_weather',
        callback_url: `${s.url}/echo`,
        parameters: { type: 'object', properties: { location: { type: 'string' } }, required: ['location'] }
      })
      const missing = await tp.callTool('Lanlan', { name: 'get_weather', arguments: {} })
      assert.equal(missing.is_error, true)
      assert.match(missing.error ?? '', /location/)
      const wrongType = await tp.callTool('Lanlan', { name: 'get_weather', arguments: { location: 3 } })
      assert.equal(wrongType.is_error, true)
      assert.equal(s.requests.length, 0)
      const ok = await tp.callTool('Lanlan', { name: 'get_weather', arguments: { location: 'Oslo' } })
      assert.equal(ok.is_error, false)
      assert.equal(s.requests.length, 1)
    })

    test('R7: a parameters schema that does not compile is a 422 at registration, never a tool left unvalidated', async (t) => {
      const tp = await setup(t, mode)
      const s = await server(t)
      await assert.rejects(tp.register({
        name: 'odd',
        callback_url: `${s.url}/echo`,
        parameters: { type: 'no-such-type' }
      }),
      { code: 'TP_ERR_VALIDATION', statusCode: 422 })
      const result = await tp.callTool('Lanlan', { name: 'odd', arguments: { x: 1 } })
      assert.equal(result.is_error, true)
      assert.equal(s.requests.length, 0)
    })

    test('an unknown tool is an is_error result listing the available names; an unknown role throws 404', async (t) => {
      const tp = await setup(t, mode)
      const s = await server(t)
      await register(tp, { name: 'get_weather', callback_url: `${s.url}/echo` })
      const result = await tp.callTool('Lanlan', { name: 'get_wether' })
      assert.equal(result.is_error, true)
      assert.match(result.error ?? '', /get_weather/)
      await assert.rejects(tp.callTool('Nobody', { name: 'get_weather' }), {
        code: 'TP_ERR_ROLE_NOT_FOUND',
        statusCode: 404
      })
    })

    test('POST /api/tools/call answers the ToolResult; an unknown role is 404', async (t) => {
      const tp = await setup(t, mode)
      const s = await server(t)
      await register(tp, { name: 'get_weather', callback_url: `${s.url}/raw-output` })
      const ok = await tp.app.inject({
        method: 'POST',
        url: '/api/tools/call',
        payload: {
          role: 'Mochi',
          name: 'get_weather',
          arguments: {}
        }
      })
      assert.equal(ok.statusCode, 200)
      assert.deepEqual(ok.json(), { is_error: false, output: { temperature_c: 28 }, text: '{"temperature_c":28}' })
      const missing = await tp.app.inject({
        method: 'POST',
        url: '/api/tools/call',
        payload: {
          role: 'Nobody',
          name: 'get_weather'
        }
      })
      assert.equal(missing.statusCode, 404)
      assert.equal(missing.json().code, 'TP_ERR_ROLE_NOT_FOUND')
    })

    test('POST /api/tools/call answers valid JSON for every kind of output, a 100 000-deep reply included', async (t) => {
      const tp = await setup(t, mode)
      const s = await server(t)
      await register(tp, { name: 'deep', callback_url: `${s.url}/deep/100000` })
      await register(tp, { name: 'texty', callback_url: `${s.url}/text` })
      await register(tp, { name: 'empty', callback_url: `${s.url}/empty` })
      await register(tp, { name: 'broken', callback_url: `${s.url}/status/500` })
      await tp.roles.get('Lanlan').registerLocalTool({ name: 'nothing', handler: () => undefined })
      const answers: Record<string, unknown> = {}
      for (const name of ['deep', 'texty', 'empty', 'broken', 'nothing']) {
        const res = await tp.app.inject({ method: 'POST', url: '/api/tools/call', payload: { role: 'Lanlan', name } })
        assert.equal(res.statusCode, 200, name)
        if (name !== 'deep') answers[name] = res.json()
        else assert.equal(res.body.length > 200_000, true)
      }
      assert.deepEqual(answers.texty, {
        is_error: false,
        output: 'plain text reply, not JSON',
        text: 'plain text reply, not JSON'
      })
      assert.deepEqual(answers.empty, { is_error: false, output: '', text: '' })
      assert.equal((answers.broken as { is_error: boolean }).is_error, true)
      assert.equal((answers.broken as { output: unknown }).output, null)
      // A success's text is its output's JSON (docs/protocol.md "Model-visible result").
      assert.deepEqual(answers.nothing, { is_error: false, output: null, text: 'null' })
    })

    test('keep-alive: 50 sequential calls reuse a few connections', async (t) => {
      const tp = await setup(t, mode)
      const s = await server(t)
      await register(tp, { name: 'echo', callback_url: `${s.url}/echo` })
      for (let i = 0; i < 50; i++) {
        assert.equal((await tp.callTool('Lanlan', {
          name: 'echo',
          arguments: { i }
        })).is_error, false)
      }
      assert.ok(s.connections <= 2, `${s.connections} connections for 50 sequential calls`)
    })

    test('a call after the plugin closed the idle keep-alive socket succeeds', async (t) => {
      const tp = await setup(t, mode)
      // Like uvicorn: closes idle sockets after 1 s without a Keep-Alive hint.
      const s = await server(t, { keepAliveTimeoutMs: 1000, sendKeepAliveHint: false })
      await register(tp, { name: 'echo', callback_url: `${s.url}/echo` })
      assert.equal((await tp.callTool('Lanlan', { name: 'echo' })).is_error, false)
      await once(s.events, 'disconnect')
      const results = []
      for (let i = 0; i < 5; i++) results.push(await tp.callTool('Lanlan', { name: 'echo', arguments: { i } }))
      assert.deepEqual(results.map((r) => r.is_error), [false, false, false, false, false])
    })

    test('1000 concurrent calls all succeed', async (t) => {
      const tp = await setup(t, mode)
      const s = await server(t)
      await register(tp, { name: 'echo', callback_url: `${s.url}/echo` })
      const results = await Promise.all(Array.from({ length: 1000 }, (_, i) => tp.callTool('Lanlan', {
        name: 'echo',
        arguments: { i }
      })))
      assert.equal(results.filter((r) => r.is_error).length, 0)
      assert.deepEqual(results.map((r) => (r.output as { arguments: { i: number } }).arguments.i),
        Array.from({ length: 1000 }, (_, i) => i))
    })

    test('beyond maxPending a call is answered busy at once, without calling the plugin', async (t) => {
      const tp = await setup(t, mode, { dispatch: { maxPending: 2 } })
      const s = await server(t)
      await register(tp, { name: 'slow', callback_url: `${s.url}/sleep/300` })
      const results = await Promise.all([1, 2, 3].map(() => tp.callTool('Lanlan', { name: 'slow' })))
      assert.deepEqual(results.map((r) => r.is_error), [false, false, true])
      assert.match(results[2]!.error ?? '', /busy/)
      assert.equal(s.requests.length, 2)
    })

    test('aborting a call answers it as cancelled at once, and the dispatcher keeps serving', async (t) => {
      const tp = await setup(t, mode)
      const s = await server(t)
      await register(tp, { name: 'slow', callback_url: `${s.url}/sleep/20000` })
      await register(tp, { name: 'echo', callback_url: `${s.url}/echo` })
      const controller = new AbortController()
      const pending = tp.callTool('Lanlan', { name: 'slow' }, { signal: controller.signal })
      await once(s.events, 'request')
      controller.abort()
      const result = await pending
      assert.equal(result.is_error, true)
      assert.match(result.error ?? '', /cancelled/)
      assert.equal((await tp.callTool('Lanlan', { name: 'echo' })).is_error, false)
      assert.equal(tp[kPendingCalls], 0)
    })

    test('a client that hangs up on POST /api/tools/call cancels its callback request', { timeout: 10_000 }, async (t) => {
      const { tp, url } = await startToolport(t, { roles: ROLES, dispatch: { mode } })
      const s = await server(t)
      await register(tp, { name: 'slow', callback_url: `${s.url}/sleep/20000` })
      await register(tp, { name: 'echo', callback_url: `${s.url}/echo` })
      const client = httpRequest(`${url}/api/tools/call`, { method: 'POST', headers: { 'content-type': 'application/json' } })
      client.on('error', () => {}) // the hang-up below
      client.end(JSON.stringify({ role: 'Lanlan', name: 'slow', arguments: {} }))
      await once(s.events, 'request')
      assert.equal(tp[kPendingCalls], 1)
      const disconnected = once(s.events, 'disconnect')
      client.destroy()
      // Toolport stops the callback request: the plugin sees its connection close long before its 20 s.
      await disconnected
      await waitFor('the call to settle', () => tp[kPendingCalls] === 0)
      assert.equal((await tp.callTool('Lanlan', { name: 'echo' })).is_error, false)
    })

    test('a fast call is not held back by a slow call dispatched in the same turn', async (t) => {
      const tp = await setup(t, mode)
      const s = await server(t)
      await register(tp, { name: 'slow', callback_url: `${s.url}/sleep/1500` })
      await register(tp, { name: 'fast', callback_url: `${s.url}/echo` })
      const order: string[] = []
      const slow = tp.callTool('Lanlan', { name: 'slow' }).then(() => order.push('slow'))
      const fast = tp.callTool('Lanlan', { name: 'fast' }).then(() => order.push('fast'))
      await Promise.all([slow, fast])
      assert.deepEqual(order, ['fast', 'slow'])
    })

    test('close() lets an in-flight call finish within the grace period, then refuses new calls', async (t) => {
      const tp = await createToolport({ roles: ['Lanlan'], dispatch: { mode, closeGraceMs: 10_000 } })
      const s = await server(t)
      await register(tp, { name: 'slow', callback_url: `${s.url}/sleep/300` })
      const pending = tp.callTool('Lanlan', { name: 'slow' })
      await once(s.events, 'request')
      await tp.close()
      assert.equal((await pending).is_error, false)
      const after = await tp.callTool('Lanlan', { name: 'slow' })
      assert.equal(after.is_error, true)
      assert.equal(s.requests.length, 1)
    })

    test('close() cancels calls still running after the grace period', async (t) => {
      const tp = await createToolport({ roles: ['Lanlan'], dispatch: { mode, closeGraceMs: 100 } })
      const s = await server(t)
      await register(tp, { name: 'stuck', callback_url: `${s.url}/sleep/30000` })
      const pending = tp.callTool('Lanlan', { name: 'stuck' })
      await once(s.events, 'request')
      await tp.close()
      const result = await pending
      assert.equal(result.is_error, true)
      assert.match(result.error ?? '', /cancelled/)
    })

    test('R13: a call in flight when its origin is evicted still finishes normally', async (t) => {
      const tp = await setup(t, mode)
      // A plugin that stops accepting connections while one call is still being answered on an
      // open socket: new calls are refused (and evict the origin), the running one completes.
      const { createServer } = await import('node:http')
      let answer: () => void = () => {}
      const srv = createServer((req, res) => {
        req.resume()
        answer = () => {
          res.writeHead(200, { 'content-type': 'application/json' })
          res.end('{"output":"finished","is_error":false}')
        }
        srv.close()
        srv.emit('first-request')
      })
      await new Promise<void>((resolve) => srv.listen(0, '127.0.0.1', resolve))
      t.after(() => srv.closeAllConnections())
      const port = (srv.address() as { port: number }).port
      await register(tp, { name: 'slow', callback_url: `http://127.0.0.1:${port}/slow`, source: 'plugin:p' })
      await register(tp, { name: 'other', callback_url: `http://127.0.0.1:${port}/other`, source: 'plugin:p' })
      const running = tp.callTool('Lanlan', { name: 'slow' })
      await once(srv, 'first-request')
      const evicted = once(tp, 'origin-evicted')
      for (let i = 0; i < 3; i++) assert.equal((await tp.callTool('Lanlan', { name: 'other' })).is_error, true)
      await evicted
      assert.deepEqual(tp.list('Lanlan').tools_by_role.Lanlan, [])
      answer()
      const result = await running
      assert.equal(result.is_error, false)
      assert.equal(result.output, 'finished')
    })

    test('local tools run in-process with the same deadline and error capture', async (t) => {
      const tp = await setup(t, mode)
      const role = tp.roles.get('Lanlan')
      await role.registerLocalTool({
        name: 'add',
        parameters: {
          type: 'object',
          properties: {
            a: { type: 'number' },
            b: { type: 'number' }
          }
        },
        handler: (args) => (args as { a: number, b: number }).a + (args as {
          a: number,
          b: number
        }).b
      })
      await role.registerLocalTool({ name: 'boom', handler: () => { throw new Error('kaput') } })
      await role.registerLocalTool({
        name: 'stuck',
        timeoutSeconds: 0.2,
        handler: (_args,
          ctx) => new Promise((resolve) => ctx.signal.addEventListener('abort', resolve))
      })
      assert.deepEqual(await tp.callTool('Lanlan', { name: 'add', arguments: { a: 2, b: 3 } }), {
        is_error: false,
        output: 5,
        text: '5'
      })
      const boom = await tp.callTool('Lanlan', { name: 'boom' })
      assert.equal(boom.is_error, true)
      assert.equal(boom.error, 'kaput')
      const stuck = await tp.callTool('Lanlan', { name: 'stuck' })
      assert.equal(stuck.is_error, true)
      assert.match(stuck.error ?? '', /timed out/)
      const bad = await tp.callTool('Lanlan', { name: 'add', arguments: { a: 'x' } })
      assert.equal(bad.is_error, true)
    })
  })

  describe(`origin eviction (${mode} mode)`, () => {
    test('R13: three refused connections evict the origin\'s plugin tools from every role; the plugin\'s other origin survives', async (t) => {
      const tp = await setup(t, mode)
      const alive = await server(t)
      const port = await closedPort()
      const dead = `http://127.0.0.1:${port}`
      await register(tp, { name: 'w1', callback_url: `${dead}/a`, source: 'plugin:weather' })
      await register(tp, { name: 'w2', callback_url: `${dead}/b`, source: 'plugin:weather', role: 'Mochi' })
      await register(tp, { name: 'w3', callback_url: `${alive.url}/echo`, source: 'plugin:weather' })
      await register(tp, { name: 'ext', callback_url: `${dead}/c`, source: 'external' })
      const evicted = once(tp, 'origin-evicted')
      for (let i = 0; i < 3; i++) assert.equal((await tp.callTool('Lanlan', { name: 'w1' })).is_error, true)
      const [event] = await evicted
      assert.equal(event.origin, `http://127.0.0.1:${port}`)
      assert.deepEqual([...event.tools].sort(), ['w1', 'w2'])
      assert.deepEqual([...event.roles].sort(), ['Lanlan', 'Mochi'])
      const list = tp.list()
      assert.deepEqual(list.tools_by_role.Lanlan!.map((x) => x.name), ['w3', 'ext'])
      assert.deepEqual(list.tools_by_role.Mochi!.map((x) => x.name), ['w3', 'ext'])
    })

    test('R13: timeouts, HTTP 5xx and is_error replies never evict', async (t) => {
      const tp = await setup(t, mode)
      const s = await server(t)
      await register(tp, {
        name: 'slow',
        callback_url: `${s.url}/sleep/2000`,
        source: 'plugin:p',
        timeout_seconds: 0.1
      })
      await register(tp, { name: 'err', callback_url: `${s.url}/status/503`, source: 'plugin:p' })
      await register(tp, { name: 'toolerr', callback_url: `${s.url}/tool-error`, source: 'plugin:p' })
      for (let i = 0; i < 4; i++) {
        for (const name of ['slow', 'err', 'toolerr']) {
          assert.equal((await tp.callTool('Lanlan', { name })).is_error,
            true)
        }
      }
      assert.deepEqual(tp.list('Lanlan').tools_by_role.Lanlan!.map((x) => x.name), ['slow', 'err', 'toolerr'])
    })

    test('R13: fail, fail, ok, fail, fail keeps the tool (an HTTP reply resets the count)', async (t) => {
      const tp = await setup(t, mode)
      const port = await closedPort()
      const origin = `http://127.0.0.1:${port}`
      await register(tp, { name: 'flaky', callback_url: `${origin}/x`, source: 'plugin:flaky' })
      await tp.callTool('Lanlan', { name: 'flaky' })
      await tp.callTool('Lanlan', { name: 'flaky' })
      assert.equal(tp[kOriginFailures](origin), 2)
      const revived = await startCallbackServerOnPort(port)
      if (revived === null) {
        t.skip('the freed port was taken by another process')
        return
      }
      assert.equal((await tp.callTool('Lanlan', { name: 'flaky' })).is_error, false)
      assert.equal(tp[kOriginFailures](origin), 0)
      await revived.close()
      assert.equal((await tp.callTool('Lanlan', { name: 'flaky' })).is_error, true)
      assert.equal((await tp.callTool('Lanlan', { name: 'flaky' })).is_error, true)
      assert.equal(tp[kOriginFailures](origin), 2)
      assert.deepEqual(tp.list('Lanlan').tools_by_role.Lanlan!.map((x) => x.name), ['flaky'])
    })

    test('R13: a new registration at the origin resets its failure count', async (t) => {
      const tp = await setup(t, mode)
      const port = await closedPort()
      const origin = `http://127.0.0.1:${port}`
      await register(tp, { name: 'p', callback_url: `${origin}/a`, source: 'plugin:p' })
      await tp.callTool('Lanlan', { name: 'p' })
      await tp.callTool('Lanlan', { name: 'p' })
      await register(tp, { name: 'q', callback_url: `${origin}/b`, source: 'plugin:p' })
      assert.equal(tp[kOriginFailures](origin), 0)
      await tp.callTool('Lanlan', { name: 'p' })
      assert.deepEqual(tp.list('Lanlan').tools_by_role.Lanlan!.map((x) => x.name), ['p', 'q'])
    })

    test('R13: connection failures of non-plugin tools never evict', async (t) => {
      const tp = await setup(t, mode)
      const port = await closedPort()
      await register(tp, { name: 'ext', callback_url: `http://127.0.0.1:${port}/x` })
      for (let i = 0; i < 4; i++) assert.equal((await tp.callTool('Lanlan', { name: 'ext' })).is_error, true)
      assert.deepEqual(tp.list('Lanlan').tools_by_role.Lanlan!.map((x) => x.name), ['ext'])
    })
  })
}

describe('pool mode workers', () => {
  test('a worker that dies mid-call answers its calls with an error, is replaced, and the registry is untouched', async (t) => {
    const tp = await setup(t, 'pool')
    const s = await server(t)
    await register(tp, { name: 'slow', callback_url: `${s.url}/sleep/20000`, source: 'plugin:p' })
    await register(tp, { name: 'echo', callback_url: `${s.url}/echo`, source: 'plugin:p' })
    const pending = tp.callTool('Lanlan', { name: 'slow' })
    await once(s.events, 'request')
    const threads = tp[kWorkerThreads]
    assert.equal(threads.length, 1)
    await threads[0]!.terminate()
    const result = await pending
    assert.equal(result.is_error, true)
    assert.match(result.error ?? '', /internal error/)
    assert.equal((await tp.callTool('Lanlan', { name: 'echo' })).is_error, false)
    assert.deepEqual(tp.list('Lanlan').tools_by_role.Lanlan!.map((x) => x.name), ['slow', 'echo'])
  })
})

/** Starts a callback server on a given port; null when the port is taken. */
async function startCallbackServerOnPort (port: number): Promise<{ close: () => Promise<void> } | null> {
  const { createServer } = await import('node:http')
  const srv = createServer((req, res) => {
    req.resume()
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'application/json' })
      res.end('{"output":"back","is_error":false}')
    })
  })
  try {
    await new Promise<void>((resolve, reject) => {
      srv.once('error', reject)
      srv.listen(port, '127.0.0.1', () => resolve())
    })
  } catch {
    return null
  }
  return {
    close: () => new Promise<void>((resolve) => {
      srv.close(() => resolve())
      srv.closeAllConnections()
    })
  }
}
