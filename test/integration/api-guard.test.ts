// The request guard: docs/protocol.md R1 (loopback peers only, decided by the socket, before the body is
// read), and beyond the contract the Host and Origin checks and the security headers.
import { test, type TestContext } from 'node:test'
import assert from 'node:assert/strict'
import { connect } from 'node:net'
import { once } from 'node:events'
import {
  assertError, createTestToolport, httpJson, inject, names, startHttp2Host, startToolport, tool, type JsonReply
} from '../helpers.js'
import type { Toolport } from '../../src/main/index.js'

const FOREIGN_PEERS = ['10.1.2.3', '192.168.0.5', '::ffff:10.1.2.3', 'fe80::1', '2001:db8::1', '0.0.0.0', '::']
const LOOPBACK_PEERS = ['127.0.0.1', '127.9.8.7', '::1', '::ffff:127.0.0.1']

async function rawInject (tp: Toolport, options: {
  method?: 'GET' | 'POST', url?: string, payload?: string, headers?: Record<string, string>, remoteAddress?: string
}) {
  const res = await tp.app.inject({
    method: options.method ?? 'POST',
    url: options.url ?? '/api/tools/register',
    ...(options.payload === undefined ? {} : { payload: options.payload }),
    headers: options.headers ?? {},
    ...(options.remoteAddress === undefined ? {} : { remoteAddress: options.remoteAddress })
  })
  return { statusCode: res.statusCode, headers: res.headers, body: JSON.parse(res.body) }
}

test('R1: a non-loopback peer is 403 TP_ERR_NOT_LOOPBACK on every route', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  for (const remoteAddress of FOREIGN_PEERS) {
    assertError(await inject(tp, 'GET', '/api/tools', undefined, { remoteAddress }), 403, 'TP_ERR_NOT_LOOPBACK')
    assertError(await inject(tp, 'POST', '/api/tools/register', tool('x'), { remoteAddress }), 403,
      'TP_ERR_NOT_LOOPBACK')
    assertError(await inject(tp, 'POST', '/api/tools/unregister', { name: 'x' }, { remoteAddress }), 403,
      'TP_ERR_NOT_LOOPBACK')
    assertError(await inject(tp, 'POST', '/api/tools/clear', { source: 'x' }, { remoteAddress }), 403,
      'TP_ERR_NOT_LOOPBACK')
  }
  assert.deepEqual(names(tp, 'A'), [])
})

test('R1: a non-loopback peer is 403 even with a malformed body, a wrong content type or an oversized body', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'], limits: { maxBodyBytes: 1024 } })
  const remoteAddress = '10.1.2.3'
  const json = { 'content-type': 'application/json' }
  assertError(await rawInject(tp, { payload: '{bad', headers: json, remoteAddress }), 403, 'TP_ERR_NOT_LOOPBACK')
  assertError(await rawInject(tp, { payload: '', headers: json, remoteAddress }), 403, 'TP_ERR_NOT_LOOPBACK')
  assertError(await rawInject(tp, { payload: '['.repeat(5000), headers: json, remoteAddress }), 403,
    'TP_ERR_NOT_LOOPBACK')
  assertError(await rawInject(tp, { payload: 'x'.repeat(4096), headers: json, remoteAddress }), 403,
    'TP_ERR_NOT_LOOPBACK')
  assertError(await rawInject(tp, { payload: 'a=b', headers: { 'content-type': 'text/plain' }, remoteAddress }), 403,
    'TP_ERR_NOT_LOOPBACK')
  assertError(await rawInject(tp, { payload: 'a=b', remoteAddress }), 403, 'TP_ERR_NOT_LOOPBACK')
})

test('R1: an IPv4-compatible IPv6 peer (::127.0.0.1 = ::7f00:1, outside ::ffff:127.0.0.0/104) is 403 TP_ERR_NOT_LOOPBACK', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  for (const remoteAddress of ['::127.0.0.1', '::7f00:1']) {
    assertError(await inject(tp, 'POST', '/api/tools/register', tool('x'), { remoteAddress }), 403,
      'TP_ERR_NOT_LOOPBACK')
  }
  assert.deepEqual(names(tp, 'A'), [])
})

test('R1: a non-loopback peer is 403 on an unknown route too (the guard runs before routing)', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  assertError(await inject(tp, 'GET', '/nope', undefined, { remoteAddress: '10.1.2.3' }), 403, 'TP_ERR_NOT_LOOPBACK')
  assertError(await inject(tp, 'POST', '/api/tools/nope', {}, { remoteAddress: '10.1.2.3' }), 403,
    'TP_ERR_NOT_LOOPBACK')
})

test('R1: X-Forwarded-For never makes a remote peer local', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  const headers = { 'x-forwarded-for': '127.0.0.1', 'x-real-ip': '127.0.0.1', forwarded: 'for=127.0.0.1' }
  assertError(await inject(tp, 'GET', '/api/tools', undefined, { remoteAddress: '10.1.2.3', headers }), 403,
    'TP_ERR_NOT_LOOPBACK')
})

test('R1: X-Forwarded-For never makes a loopback peer remote', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  const res = await inject(tp, 'GET', '/api/tools', undefined, {
    remoteAddress: '127.0.0.1',
    headers: { 'x-forwarded-for': '10.1.2.3' }
  })
  assert.equal(res.statusCode, 200)
})

test('R1: loopback peers (127/8, ::1, IPv4-mapped 127/8) are served', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  for (const remoteAddress of LOOPBACK_PEERS) {
    const res = await inject(tp, 'POST', '/api/tools/register', tool(`t${remoteAddress.replace(/\W/g, '')}`),
      { remoteAddress })
    assert.equal(res.statusCode, 200, remoteAddress)
    assert.equal(res.body.ok, true)
  }
})

test('R1: a real client on 127.0.0.1 is served', async (t) => {
  const { url } = await startToolport(t, { roles: ['A'] })
  const res = await httpJson(`${url}/api/tools/register`, 'POST', tool('x'))
  assert.equal(res.statusCode, 200)
  assert.equal(res.body.ok, true)
})

test('R1: a real client on ::1 is served when Toolport listens on ::1', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  let url: string
  try {
    url = (await tp.listen({ host: '::1', port: 0 })).url
  } catch (err) {
    t.skip(`cannot listen on ::1 here: ${(err as Error).message}`)
    return
  }
  assert.match(url, /^http:\/\/\[::1\]:\d+$/)
  const res = await httpJson(`${url}/api/tools`, 'GET')
  assert.equal(res.statusCode, 200)
})

test('guard: a Host header that does not name loopback is 403 TP_ERR_HOST_FORBIDDEN (DNS rebinding)', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  for (const host of ['evil.example', 'evil.example:80', 'localhost.evil.example', '127.0.0.1.nip.io', 'localhost.',
    '192.168.0.5', '10.0.0.1:3917', '[::2]', '0.0.0.0', 'a.localhost', 'localhost:port', '[::1', 'local host']) {
    assertError(await inject(tp, 'GET', '/api/tools', undefined, { headers: { host } }), 403, 'TP_ERR_HOST_FORBIDDEN')
  }
  assertError(await inject(tp, 'POST', '/api/tools/register', tool('x'), { headers: { host: 'evil.example' } }), 403,
    'TP_ERR_HOST_FORBIDDEN')
  assert.deepEqual(names(tp, 'A'), [])
})

test('guard: over HTTP/2 (the plugin on a host\'s http2 server) :authority is the Host: loopback passes, another name or a Host that differs is 403', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  const { port, request } = await startHttp2Host(t, tp)
  async function get (headers: Record<string, string>): Promise<JsonReply> {
    const reply = await request({ ':method': 'GET', ':path': '/api/tools', ...headers })
    return { statusCode: reply.statusCode, headers: reply.headers, body: JSON.parse(reply.text) }
  }
  assert.equal((await get({})).statusCode, 200, 'the client\'s own :authority, 127.0.0.1:<port>')
  assert.equal((await get({ ':authority': `localhost:${port}` })).statusCode, 200)
  const refused: Array<Record<string, string>> = [{ ':authority': 'evil.example' },
    { ':authority': `evil.example:${port}` }, { host: 'evil.example' }]
  for (const headers of refused) {
    assertError(await get(headers), 403, 'TP_ERR_HOST_FORBIDDEN')
  }
})

test('guard: loopback Host headers, with or without a port, in any case, are accepted', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  for (const host of ['localhost', 'LOCALHOST:3917', 'localhost:80', '127.0.0.1', '127.0.0.1:3917', '127.1.2.3:9',
    '[::1]', '[::1]:3917']) {
    const res = await inject(tp, 'GET', '/api/tools', undefined, { headers: { host } })
    assert.equal(res.statusCode, 200, host)
  }
})

test('guard: security.allowedHosts adds Host names; security.checkHost false turns the check off', async (t) => {
  const extra = await createTestToolport(t, { roles: ['A'], security: { allowedHosts: ['toolport.test'] } })
  assert.equal((await inject(extra, 'GET', '/api/tools', undefined,
    { headers: { host: 'toolport.test:3917' } })).statusCode, 200)
  assertError(await inject(extra, 'GET', '/api/tools', undefined, { headers: { host: 'other.test' } }), 403,
    'TP_ERR_HOST_FORBIDDEN')
  const off = await createTestToolport(t, { roles: ['A'], security: { checkHost: false } })
  assert.equal((await inject(off, 'GET', '/api/tools', undefined,
    { headers: { host: 'anything.example' } })).statusCode, 200)
})

/**
 * Sends raw HTTP/1.x text to 127.0.0.1:port and resolves with the first response (status and
 * parsed JSON body), read by its Content-Length: the server need not close the connection.
 */
async function rawHttp (t: TestContext, port: number, text: string): Promise<{ status: number, body: any }> {
  const socket = connect(port, '127.0.0.1')
  t.after(() => socket.destroy())
  await once(socket, 'connect')
  const reply = new Promise<{ status: number, body: any }>((resolve, reject) => {
    let received = Buffer.alloc(0)
    socket.on('data', (chunk: Buffer) => {
      received = Buffer.concat([received, chunk])
      const split = received.indexOf('\r\n\r\n')
      if (split === -1) return
      const head = received.subarray(0, split).toString('latin1')
      const length = Number(/\r\ncontent-length: *(\d+)/i.exec(head)?.[1] ?? NaN)
      const body = received.subarray(split + 4)
      if (Number.isNaN(length) || body.length < length) return
      resolve({ status: Number(head.split(' ')[1]), body: JSON.parse(body.subarray(0, length).toString('utf8')) })
    })
    socket.on('error', reject)
    socket.on('end',
      () => reject(new Error(`connection closed before a full response: ${received.toString('latin1')}`)))
  })
  socket.write(text)
  return await reply
}

test('guard: a request with two Host headers is 403 TP_ERR_HOST_FORBIDDEN', async (t) => {
  const { port } = await startToolport(t, { roles: ['A'] })
  const res = await rawHttp(t, port,
    'GET /api/tools HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n')
  assert.equal(res.status, 403)
  assert.equal(res.body.code, 'TP_ERR_HOST_FORBIDDEN')
})

test('guard: a request without a Host header (HTTP/1.0) or with an empty one is 403 TP_ERR_HOST_FORBIDDEN', async (t) => {
  const { port } = await startToolport(t, { roles: ['A'] })
  for (const text of ['GET /api/tools HTTP/1.0\r\n\r\n',
    'GET /api/tools HTTP/1.1\r\nHost:\r\nConnection: close\r\n\r\n']) {
    const res = await rawHttp(t, port, text)
    assert.equal(res.status, 403)
    assert.equal(res.body.code, 'TP_ERR_HOST_FORBIDDEN')
  }
})

test('guard: HTTP/1.1 without Host is the guard\'s 403 too; with checkHost off, the 400 RFC 9112 asks for', async (t) => {
  const { port } = await startToolport(t, { roles: ['A'] })
  const refused = await rawHttp(t, port, 'GET /api/tools HTTP/1.1\r\nConnection: close\r\n\r\n')
  assert.equal(refused.status, 403)
  assert.equal(refused.body.code, 'TP_ERR_HOST_FORBIDDEN')
  const off = await startToolport(t, { roles: ['A'], security: { checkHost: false } })
  const bad = await rawHttp(t, off.port, 'GET /api/tools HTTP/1.1\r\nConnection: close\r\n\r\n')
  assert.equal(bad.status, 400)
  assert.equal(bad.body.code, 'TP_ERR_BAD_REQUEST')
})

test('guard: an absolute-form target is judged as a Host and must name the Host header\'s target', async (t) => {
  const { port } = await startToolport(t, { roles: ['A'] })
  assert.equal((await rawHttp(t, port, `GET http://127.0.0.1:${port}/api/tools HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\n` +
    'Connection: close\r\n\r\n')).status, 200)
  for (const [target, host] of [['http://evil.example/api/tools', `127.0.0.1:${port}`], ['http://localhost/api/tools', `127.0.0.1:${port}`],
    [`http://user@127.0.0.1:${port}/api/tools`, `127.0.0.1:${port}`], ['http://evil.example/api/tools', 'evil.example']]) {
    const res = await rawHttp(t, port, `GET ${target} HTTP/1.1\r\nHost: ${host}\r\nConnection: close\r\n\r\n`)
    assert.equal(res.status, 403, target)
    assert.equal(res.body.code, 'TP_ERR_HOST_FORBIDDEN')
  }
})

test('guard: what the router or Node\'s parser refuses is answered in the documented shape, after the guard when there is a request', async (t) => {
  const { port } = await startToolport(t, { roles: ['A'] })
  const cases: Array<[string, number, string]> = [
    ['GET /api/tools/%zz HTTP/1.1\r\nHost: evil.example\r\n\r\n', 403, 'TP_ERR_HOST_FORBIDDEN'],
    ['GET /api/tools/%zz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n', 400, 'TP_ERR_BAD_REQUEST'],
    [`GET /mcp/${'r'.repeat(300)} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n`, 414, 'TP_ERR_BAD_REQUEST'],
    ['POST /api/tools/register HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: abc\r\n\r\n', 400, 'TP_ERR_BAD_REQUEST'],
    [`GET /api/tools HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`, 431, 'TP_ERR_BAD_REQUEST']
  ]
  for (const [text, status, code] of cases) {
    const res = await rawHttp(t, port, text)
    assert.equal(res.status, status, text.slice(0, 60))
    assert.equal(res.body.code, code)
    assert.equal(res.body.ok, false)
    assert.equal(res.body.statusCode, status)
  }
})

test('guard: the guard answers before the body is read (headers announcing a large body, no body sent)', async (t) => {
  const { port } = await startToolport(t, { roles: ['A'] })
  const res = await rawHttp(t, port, 'POST /api/tools/register HTTP/1.1\r\nHost: evil.example\r\n' +
    'Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n')
  assert.equal(res.status, 403)
  assert.equal(res.body.code, 'TP_ERR_HOST_FORBIDDEN')
})

test('guard: a browser Origin that is not allowed is 403 TP_ERR_ORIGIN_FORBIDDEN (cross-site requests)', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  for (const origin of ['https://evil.example', 'null', 'http://localhost:5173', 'http://127.0.0.1']) {
    assertError(await inject(tp, 'POST', '/api/tools/register', tool('x'), { headers: { origin } }), 403,
      'TP_ERR_ORIGIN_FORBIDDEN')
    assertError(await inject(tp, 'GET', '/api/tools', undefined, { headers: { origin } }), 403,
      'TP_ERR_ORIGIN_FORBIDDEN')
  }
  assert.deepEqual(names(tp, 'A'), [])
})

test('guard: Sec-Fetch-Site cross-site or same-site without an allowed Origin is 403; same-origin and none pass', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  for (const site of ['cross-site', 'same-site']) {
    assertError(await inject(tp, 'GET', '/api/tools', undefined, { headers: { 'sec-fetch-site': site } }), 403,
      'TP_ERR_ORIGIN_FORBIDDEN')
  }
  for (const site of ['same-origin', 'none']) {
    assert.equal((await inject(tp, 'GET', '/api/tools', undefined, { headers: { 'sec-fetch-site': site } })).statusCode,
      200, site)
  }
})

test('guard: security.allowedOrigins admits exactly the listed origins; checkOrigin false turns the check off', async (t) => {
  const listed = await createTestToolport(t, { roles: ['A'], security: { allowedOrigins: ['http://localhost:5173'] } })
  const ok = await inject(listed, 'POST', '/api/tools/register', tool('x'),
    { headers: { origin: 'http://localhost:5173', 'sec-fetch-site': 'same-site' } })
  assert.equal(ok.statusCode, 200)
  assertError(await inject(listed, 'GET', '/api/tools', undefined, { headers: { origin: 'http://localhost:5174' } }),
    403, 'TP_ERR_ORIGIN_FORBIDDEN')
  const off = await createTestToolport(t, { roles: ['A'], security: { checkOrigin: false } })
  assert.equal((await inject(off, 'GET', '/api/tools', undefined,
    { headers: { origin: 'https://evil.example' } })).statusCode, 200)
})

test('R1: the peer check comes first: a remote peer with a bad Host and Origin is TP_ERR_NOT_LOOPBACK', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  const res = await inject(tp, 'GET', '/api/tools', undefined, {
    remoteAddress: '10.1.2.3',
    headers: { host: 'evil.example', origin: 'https://evil.example' }
  })
  assertError(res, 403, 'TP_ERR_NOT_LOOPBACK')
})

test('guard: nosniff, no-store and same-origin resource policy headers are on successes and on errors', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  const replies = [
    await inject(tp, 'GET', '/api/tools'),
    await inject(tp, 'POST', '/api/tools/register', tool('x')),
    await inject(tp, 'GET', '/nope'),
    await inject(tp, 'GET', '/api/tools', undefined, { remoteAddress: '10.1.2.3' }),
    await inject(tp, 'GET', '/api/tools', undefined, { headers: { host: 'evil.example' } }),
    await inject(tp, 'POST', '/api/tools/register', { name: '' })
  ]
  for (const reply of replies) {
    assert.equal(reply.headers['x-content-type-options'], 'nosniff')
    assert.equal(reply.headers['cache-control'], 'no-store')
    assert.equal(reply.headers['cross-origin-resource-policy'], 'same-origin')
    assert.equal(reply.headers['access-control-allow-origin'], undefined)
  }
})

test('guard: a CORS preflight gets no CORS grant', async (t) => {
  const tp = await createTestToolport(t, { roles: ['A'] })
  const res = await tp.app.inject({
    method: 'OPTIONS',
    url: '/api/tools/register',
    headers: {
      origin: 'https://evil.example',
      'access-control-request-method': 'POST',
      'access-control-request-headers': 'content-type'
    }
  })
  assert.ok(res.statusCode >= 400)
  assert.equal(res.headers['access-control-allow-origin'], undefined)
  assert.equal(res.headers['access-control-allow-methods'], undefined)
})
