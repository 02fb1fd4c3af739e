// docs/protocol.md R1 with a real non-loopback peer: the test creates a network namespace joined to this one
// by a veth pair with private 10.x addresses, binds Toolport on the host side of the pair, and
// sends requests from inside the namespace. No traffic leaves the pair; the namespace and the
// pair are deleted afterwards. Needs root and `ip netns`; skipped with a message otherwise.
import { test, type TestContext } from 'node:test'
import assert from 'node:assert/strict'
import { execFile } from 'node:child_process'
import { promisify } from 'node:util'
import { createTestToolport } from '../helpers.js'

const run = promisify(execFile)

/**
 * Names and addresses of one test's namespace and pair, unique per process and test: the kernel
 * tears a deleted namespace down asynchronously, so the next test must not reuse its names.
 */
function pairFor (tag: number) {
  const id = `${process.pid}${tag}`
  const octet = (process.pid * 2 + tag) % 254
  const net6 = `fd7e:213:${((process.pid * 2 + tag) % 65_535).toString(16)}:`
  return {
    ns: `tp${id}`,
    hostIf: `tph${id}`.slice(0, 15),
    nsIf: `tpn${id}`.slice(0, 15),
    // A /30 private to this pair.
    net: `10.213.${octet}`,
    hostAddr: `10.213.${octet}.1`,
    nsAddr: `10.213.${octet}.2`,
    // A unique-local /64 private to this pair, for the IPv6 case.
    hostAddr6: `${net6}:1`,
    nsAddr6: `${net6}:2`
  }
}
type Pair = ReturnType<typeof pairFor>

/**
 * Runs in the namespace: one HTTP request described by a JSON argument; prints `{ status, body }`.
 * With `raw`, the text is written as-is on a socket and the response is read by Content-Length.
 */
const CLIENT = `
const http = require('node:http')
const net = require('node:net')
const o = JSON.parse(process.argv[1])
const done = (status, body) => { process.stdout.write(JSON.stringify({ status, body })) }
const fail = (err) => { process.stderr.write(String(err && err.message)); process.exitCode = 1 }
if (o.raw !== undefined) {
  const socket = net.connect({ host: o.host, port: o.port, localAddress: o.localAddress }, () => socket.write(o.raw))
  let received = Buffer.alloc(0)
  socket.on('data', (chunk) => {
    received = Buffer.concat([received, chunk])
    const split = received.indexOf('\\r\\n\\r\\n')
    if (split === -1) return
    const head = received.subarray(0, split).toString('latin1')
    const length = Number((/\\r\\ncontent-length: *(\\d+)/i.exec(head) || [])[1])
    const body = received.subarray(split + 4)
    if (!(body.length >= length)) return
    done(Number(head.split(' ')[1]), body.subarray(0, length).toString('utf8'))
    socket.destroy()
  })
  socket.on('error', fail)
} else {
  const req = http.request({ host: o.host, port: o.port, path: o.path, method: o.method, localAddress: o.localAddress, headers: o.headers }, (res) => {
    let text = ''
    res.setEncoding('utf8')
    res.on('data', (chunk) => { text += chunk })
    res.on('end', () => done(res.statusCode, text))
  })
  req.on('error', fail)
  req.end(o.body)
}
`

interface NamespaceRequest {
  method?: 'GET' | 'POST'
  host: string
  port: number
  path?: string
  /** Raw HTTP/1.1 text to send instead of a request built by node:http. */
  raw?: string
  body?: string
  /** Source address of the connection (one of the namespace's addresses). */
  localAddress?: string
  headers?: Record<string, string>
}

async function fromNamespace (pair: Pair, request: NamespaceRequest): Promise<{ status: number, body: any }> {
  const headers = { ...(request.body === undefined ? {} : { 'content-type': 'application/json' }), ...request.headers }
  const { stdout } = await run('ip', ['netns', 'exec', pair.ns, process.execPath, '-e', CLIENT,
    JSON.stringify({ ...request, headers })],
  { timeout: 20_000 })
  const reply = JSON.parse(stdout) as { status: number, body: string }
  return { status: reply.status, body: JSON.parse(reply.body) }
}

/** Creates the namespace and the veth pair; null (after t.skip) when this machine cannot. */
async function createNamespace (t: TestContext, tag: number): Promise<Pair | null> {
  if (typeof process.getuid !== 'function' || process.getuid() !== 0) {
    t.skip('not running as root: cannot create a network namespace for a real non-loopback peer')
    return null
  }
  const pair = pairFor(tag)
  const { stdout: addresses } = await run('ip', ['-o', '-4', 'addr', 'show']).catch(() => ({ stdout: '' }))
  if (addresses.includes(`${pair.net}.`)) {
    t.skip(`${pair.net}.0/30 is already in use on this machine`)
    return null
  }
  try {
    await run('ip', ['netns', 'add', pair.ns])
  } catch (err) {
    t.skip(`\`ip netns add\` failed, so no namespace peer can be made here: ${(err as Error).message.split('\n')[0]}`)
    return null
  }
  t.after(async () => {
    // Deleting the namespace destroys its end of the pair, and with it the host end and its routes.
    await run('ip', ['netns', 'del', pair.ns]).catch(() => {})
    await run('ip', ['link', 'del', pair.hostIf]).catch(() => {})
  })
  await run('ip', ['link', 'add', pair.hostIf, 'type', 'veth', 'peer', 'name', pair.nsIf])
  await run('ip', ['link', 'set', pair.nsIf, 'netns', pair.ns])
  await run('ip', ['addr', 'add', `${pair.hostAddr}/30`, 'dev', pair.hostIf])
  await run('ip', ['link', 'set', pair.hostIf, 'up'])
  await run('ip', ['netns', 'exec', pair.ns, 'ip', 'addr', 'add', `${pair.nsAddr}/30`, 'dev', pair.nsIf])
  await run('ip', ['netns', 'exec', pair.ns, 'ip', 'link', 'set', pair.nsIf, 'up'])
  await run('ip', ['netns', 'exec', pair.ns, 'ip', 'link', 'set', 'lo', 'up'])
  return pair
}

test('R1: a real peer on a non-loopback address (a network namespace over a veth pair) gets 403 TP_ERR_NOT_LOOPBACK', { timeout: 120_000 }, async (t) => {
  const pair = await createNamespace(t, 1)
  if (pair === null) return
  const tp = await createTestToolport(t, { roles: ['A'], security: { allowNonLoopbackBind: true } })
  const { port } = await tp.listen({ host: pair.hostAddr, port: 0 })
  const at = { host: pair.hostAddr, port }

  const list = await fromNamespace(pair, { ...at, method: 'GET', path: '/api/tools' })
  assert.equal(list.status, 403)
  assert.equal(list.body.ok, false)
  assert.equal(list.body.statusCode, 403)
  assert.equal(list.body.code, 'TP_ERR_NOT_LOOPBACK')

  // A remote caller may send any Host header it likes: the peer address still decides.
  const register = await fromNamespace(pair, {
    ...at,
    method: 'POST',
    path: '/api/tools/register',
    headers: { host: '127.0.0.1' },
    body: JSON.stringify({ name: 'x', callback_url: 'http://127.0.0.1:9/x' })
  })
  assert.equal(register.status, 403)
  assert.equal(register.body.code, 'TP_ERR_NOT_LOOPBACK')

  // Refused before the body is read: a malformed body changes nothing.
  const malformed = await fromNamespace(pair, { ...at, method: 'POST', path: '/api/tools/register', body: '{not json' })
  assert.equal(malformed.status, 403)
  assert.equal(malformed.body.code, 'TP_ERR_NOT_LOOPBACK')

  // Refused before the body is read: headers announce a large body that is never sent.
  const headersOnly = await fromNamespace(pair, {
    ...at,
    raw: 'POST /api/tools/register HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n'
  })
  assert.equal(headersOnly.status, 403)
  assert.equal(headersOnly.body.code, 'TP_ERR_NOT_LOOPBACK')

  const unknown = await fromNamespace(pair, { ...at, method: 'GET', path: '/no/such/route' })
  assert.equal(unknown.status, 403)
  assert.equal(unknown.body.code, 'TP_ERR_NOT_LOOPBACK')

  assert.deepEqual(tp.list('A').tools_by_role.A, [])
})

test('R1: a real IPv6 peer whose address is IPv4-compatible (::127.0.0.1, not ::ffff:127.0.0.1) gets 403 TP_ERR_NOT_LOOPBACK', { timeout: 120_000 }, async (t) => {
  const pair = await createNamespace(t, 2)
  if (pair === null) return
  try {
    await run('ip', ['-6', 'addr', 'add', `${pair.hostAddr6}/64`, 'dev', pair.hostIf, 'nodad'])
    await run('ip', ['netns', 'exec', pair.ns, 'ip', '-6', 'addr', 'add', `${pair.nsAddr6}/64`, 'dev', pair.nsIf,
      'nodad'])
    // The peer's source address: the deprecated IPv4-compatible form, which Node prints as
    // "::127.0.0.1". The host route sends the replies back into this pair only.
    await run('ip', ['netns', 'exec', pair.ns, 'ip', '-6', 'addr', 'add', '::127.0.0.1/128', 'dev', pair.nsIf, 'nodad'])
    await run('ip', ['-6', 'route', 'add', '::127.0.0.1/128', 'dev', pair.hostIf])
  } catch (err) {
    t.skip(`IPv6 is not available on the veth pair: ${(err as Error).message.split('\n')[0]}`)
    return
  }
  const tp = await createTestToolport(t, { roles: ['A'], security: { allowNonLoopbackBind: true } })
  const { port } = await tp.listen({ host: pair.hostAddr6, port: 0 })
  const reply = await fromNamespace(pair, {
    host: pair.hostAddr6,
    port,
    method: 'POST',
    path: '/api/tools/register',
    localAddress: '::127.0.0.1',
    headers: { host: '127.0.0.1' },
    body: JSON.stringify({ name: 'x', callback_url: 'http://127.0.0.1:9/x' })
  })
  assert.equal(reply.status, 403)
  assert.equal(reply.body.code, 'TP_ERR_NOT_LOOPBACK')
  assert.deepEqual(tp.list('A').tools_by_role.A, [])
})
