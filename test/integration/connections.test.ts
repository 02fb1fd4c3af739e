// Connection pressure, with real sockets on 127.0.0.1: idle sockets held by another local process
// must not lock clients out, and refused clients keep no socket.
import { test, type TestContext } from 'node:test'
import assert from 'node:assert/strict'
import { execFileSync } from 'node:child_process'
import { once } from 'node:events'
import { readdirSync } from 'node:fs'
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http'
import { connect, type Socket } from 'node:net'
import { randomBytes } from 'node:crypto'
import { request } from 'undici'
import { listenOnLoopback, startToolport, waitFor } from '../helpers.js'

const TOKEN = randomBytes(32).toString('hex')
/** The attack of the report: a few more idle sockets than the default maxConnections (1024). */
const ATTACK_SOCKETS = 1030

/** The soft limit on open files; each loopback connection in this process costs two. */
function openFileLimit (): number {
  try {
    return Number(execFileSync('sh', ['-c', 'ulimit -n'], { encoding: 'utf8' }).trim())
  } catch {
    return 0
  }
}

interface HeldSocket {
  socket: Socket
  isClosed: boolean
}

/** Opens `count` raw sockets (in bounded waves) and keeps them open; records which get closed. */
async function holdSockets (port: number, count: number, firstBytes = ''): Promise<HeldSocket[]> {
  const held: HeldSocket[] = []
  for (let i = 0; i < count; i += 100) {
    const wave: Array<Promise<unknown>> = []
    for (let j = i; j < Math.min(count, i + 100); j++) {
      const socket = connect(port, '127.0.0.1')
      const entry: HeldSocket = { socket, isClosed: false }
      socket.on('error', () => {})
      socket.once('close', () => { entry.isClosed = true })
      held.push(entry)
      // Resolves when connected, or when the server closed the socket first.
      wave.push(Promise.race([once(socket, 'connect'), once(socket, 'close')]).then(() => {
        if (firstBytes !== '' && !entry.isClosed) socket.write(firstBytes)
      }))
    }
    await Promise.all(wave)
  }
  return held
}

function releaseAll (held: HeldSocket[]): void {
  for (const h of held) h.socket.destroy()
}

async function getWithToken (url: string, token: string | null): Promise<{ statusCode: number, connection: unknown }> {
  const res = await request(`${url}/api/tools`, {
    headers: token === null ? {} : { authorization: `Bearer ${token}` },
    headersTimeout: 10_000,
    bodyTimeout: 10_000
  })
  await res.body.text()
  return { statusCode: res.statusCode, connection: res.headers.connection }
}

/** Sends `request` on a raw socket and resolves with everything read once the server closed it. */
async function rawUntilClosed (t: { after: (fn: () => void) => void }, port: number, request: string): Promise<string> {
  const socket = connect(port, '127.0.0.1')
  t.after(() => socket.destroy())
  await once(socket, 'connect')
  let answer = ''
  socket.setEncoding('utf8').on('data', (chunk: string) => { answer += chunk })
  const closed = once(socket, 'close')
  socket.write(request)
  await closed
  return answer
}

test('a 401 answers Connection: close and the server closes that socket', async (t) => {
  const { url, port } = await startToolport(t, { roles: ['A'], security: { token: TOKEN } })
  // A keep-alive request without the token: the server must not keep the socket for a retry.
  const answer = await rawUntilClosed(t, port, 'GET /api/tools HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\n\r\n')
  assert.match(answer, /^HTTP\/1\.1 401 /)
  assert.match(answer, /\r\nconnection: close\r\n/i)
  // With the token, the same route answers (and keeps the socket).
  assert.equal((await getWithToken(url, TOKEN)).statusCode, 200)
})

test('a 403 (foreign Host) answers Connection: close', async (t) => {
  const { port } = await startToolport(t, { roles: ['A'] })
  const answer = await rawUntilClosed(t, port, 'GET /api/tools HTTP/1.1\r\nHost: attacker.example\r\n\r\n')
  assert.match(answer, /^HTTP\/1\.1 403 /)
  assert.match(answer, /\r\nconnection: close\r\n/i)
})

test('token mode: 1030 idle sockets from another client do not lock out a request with the valid token', async (t) => {
  const limit = openFileLimit()
  if (limit < 3 * ATTACK_SOCKETS) {
    t.skip(`needs ulimit -n of at least ${3 * ATTACK_SOCKETS} (have ${limit})`)
    return
  }
  // The default caps; the short idle timeout is kept out of the way so that the reserve alone is
  // what lets the request in.
  const { url, port } = await startToolport(t, {
    roles: ['A'],
    security: { token: TOKEN },
    limits: { pressureIdleTimeoutMs: 600_000 }
  })
  // Half never send a byte; half send the start of a request head and stall (slowloris).
  const silent = await holdSockets(port, ATTACK_SOCKETS / 2)
  const stalled = await holdSockets(port, ATTACK_SOCKETS / 2, 'GET /api/tools HTTP/1.1\r\nHost: 127.0.0.1\r\n')
  const held = [...silent, ...stalled]
  t.after(() => releaseAll(held))
  // The attacker still holds most of its sockets: the server is at its reserve, not below it.
  assert.ok(held.filter((h) => !h.isClosed).length >= 1024 - 64 - 1)
  const served = await getWithToken(url, TOKEN)
  assert.equal(served.statusCode, 200)
  // The room was made by closing the attacker's idle sockets, never more than the cap allows.
  assert.ok(held.some((h) => h.isClosed), 'some attacker sockets were closed')
  // Without the token, the request is refused and its socket closed at once.
  const refused = await getWithToken(url, null)
  assert.equal(refused.statusCode, 401)
  assert.equal(refused.connection, 'close')
})

test('without token mode, idle sockets are shed for a new client as well, and a busy request is never cut', async (t) => {
  const limit = openFileLimit()
  if (limit < 1000) {
    t.skip(`needs ulimit -n of at least 1000 (have ${limit})`)
    return
  }
  const { tp, url, port } = await startToolport(t, {
    roles: ['A'],
    limits: {
      maxConnections: 100,
      reservedConnections: 10
    }
  })
  // A tool whose call stays in flight until released: its socket is busy, not idle.
  let release: () => void = () => {}
  let entered: () => void = () => {}
  const gate = new Promise<void>((resolve) => { release = resolve })
  const started = new Promise<void>((resolve) => { entered = resolve })
  await tp.roles.get('A').registerLocalTool({
    name: 'slow',
    handler: async () => {
      entered()
      await gate
      return 'done'
    }
  })
  const inFlight = request(`${url}/api/tools/call`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ role: 'A', name: 'slow', arguments: {} })
  })
  await started
  const held = await holdSockets(port, 150)
  t.after(() => releaseAll(held))
  await waitFor('the sockets to close', () => held.filter((h) => h.isClosed).length >= 60)
  assert.ok(held.filter((h) => h.isClosed).length >= 60, 'idle sockets past the reserve were closed')
  assert.equal((await getWithToken(url, null)).statusCode, 200)
  release()
  const res = await inFlight
  assert.equal(res.statusCode, 200)
  assert.equal((await res.body.json() as { output: unknown }).output, 'done')
})

test('under pressure an idle socket is closed after pressureIdleTimeoutMs', async (t) => {
  const { port } = await startToolport(t, {
    roles: ['A'],
    limits: {
      maxConnections: 20,
      reservedConnections: 10,
      pressureIdleTimeoutMs: 50
    }
  })
  const held = await holdSockets(port, 12)
  t.after(() => releaseAll(held))
  await waitFor('the sockets to close', () => held.every((h) => h.isClosed))
  assert.equal(held.filter((h) => !h.isClosed).length, 0)
})

test('below the reserve, idle sockets are left alone', async (t) => {
  const { url, port } = await startToolport(t, {
    roles: ['A'],
    limits: {
      maxConnections: 100,
      reservedConnections: 10,
      pressureIdleTimeoutMs: 10
    }
  })
  const held = await holdSockets(port, 20)
  t.after(() => releaseAll(held))
  await new Promise((resolve) => setTimeout(resolve, 100))
  assert.equal((await getWithToken(url, null)).statusCode, 200)
  assert.equal(held.filter((h) => h.isClosed).length, 0)
})

test('token mode: under pressure the token holder\'s idle keep-alive socket outlives the attacker\'s', async (t) => {
  const { port } = await startToolport(t, {
    roles: ['A'],
    security: { token: TOKEN },
    limits: {
      maxConnections: 40,
      reservedConnections: 5,
      pressureIdleTimeoutMs: 600_000
    }
  })
  const own = connect(port, '127.0.0.1')
  t.after(() => own.destroy())
  await once(own, 'connect')
  own.setEncoding('utf8')
  let ownClosed = false
  own.once('close', () => { ownClosed = true })
  const ask = async (): Promise<string> => {
    let answer = ''
    const done = new Promise<void>((resolve) => {
      const onData = (chunk: string): void => {
        answer += chunk
        if (/\r\n\r\n[\s\S]*\}$/.test(answer)) {
          own.off('data', onData)
          resolve()
        }
      }
      own.on('data', onData)
    })
    own.write(`GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${TOKEN}\r\n\r\n`)
    await done
    return answer
  }
  assert.match(await ask(), /^HTTP\/1\.1 200 /)
  // Now idle (keep-alive) — then 80 attacker sockets arrive, past the cap of 40.
  const held = await holdSockets(port, 80)
  t.after(() => releaseAll(held))
  await waitFor('the sockets to close', () => held.filter((h) => h.isClosed).length >= 40)
  assert.ok(held.filter((h) => h.isClosed).length >= 40)
  assert.equal(ownClosed, false, 'the token holder\'s socket was shed')
  assert.match(await ask(), /^HTTP\/1\.1 200 /)
})

test('token mode: a socket that only fetched a console file (which needs no token) is not the token holder\'s equal under pressure', async (t) => {
  const { port } = await startToolport(t, {
    roles: ['A'],
    security: { token: TOKEN },
    limits: { maxConnections: 40, reservedConnections: 5, pressureIdleTimeoutMs: 600_000 }
  })
  const own = connect(port, '127.0.0.1')
  t.after(() => own.destroy())
  let ownClosed = false
  own.once('close', () => { ownClosed = true })
  await once(own, 'connect')
  own.write(`GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${TOKEN}\r\n\r\n`)
  await once(own, 'data')
  // 34 sockets fetch a console file and go idle after the answer: with the token holder's, 35
  // sockets, the pressure threshold (40 - 5); the token holder's socket is the longest idle.
  const attackers: HeldSocket[] = []
  for (let i = 0; i < 34; i++) {
    const socket = connect(port, '127.0.0.1')
    const entry: HeldSocket = { socket, isClosed: false }
    socket.on('error', () => {})
    socket.once('close', () => { entry.isClosed = true })
    attackers.push(entry)
    await once(socket, 'connect')
    socket.write('GET /ui/console.css HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n')
    await once(socket, 'data')
  }
  t.after(() => releaseAll(attackers))
  // One more connection, past the threshold: one idle socket is shed, and not the token holder's.
  const newcomer = await holdSockets(port, 1)
  t.after(() => releaseAll(newcomer))
  await waitFor('one socket to be shed', () => ownClosed || attackers.some((h) => h.isClosed))
  assert.equal(ownClosed, false, 'the token holder\'s socket was shed before sockets that never showed the token')
  assert.equal(attackers.filter((h) => h.isClosed).length, 1)
})

test('pipelined requests for static files whose socket closes before their turn leave no file open, and pipelining past 32 closes the socket (SECURITY.md: no local client exhausts the server)', async (t) => {
  const { url } = await startToolport(t, { roles: ['A'] })
  const { port } = new URL(url)
  const fds = (): number => readdirSync('/proc/self/fd').length
  const baseline = fds()
  for (const count of [20, 400]) {
    const socket = connect({ host: '127.0.0.1', port: Number(port) })
    await once(socket, 'connect')
    socket.pause() // read nothing: the answers queue behind the first
    socket.write(`GET /ui/console.js HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\n\r\n`.repeat(count))
    await new Promise((resolve) => setTimeout(resolve, 300))
    socket.destroy()
    await waitFor(`the files of ${count} pipelined requests closed (${baseline} descriptors before)`, () => fds() <= baseline, 5000)
  }
  // A client that pipelines a few and reads them gets every answer.
  const socket = connect({ host: '127.0.0.1', port: Number(port) })
  let text = ''
  socket.setEncoding('utf8').on('data', (chunk: string) => { text += chunk })
  socket.write(`GET /api/health HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\n\r\n`.repeat(8))
  await waitFor('8 answers', () => text.split('HTTP/1.1 200').length - 1 === 8)
  socket.destroy() // both its ends are in this process: counted among its descriptors
  // Past 32 waiting at once, the socket is closed.
  const deep = connect({ host: '127.0.0.1', port: Number(port) })
  deep.resume() // read (and drop) what comes, so the close is seen
  deep.write(`GET /ui/console.js HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\n\r\n`.repeat(40))
  const closed = await Promise.race([once(deep, 'close').then(() => true), new Promise((resolve) => setTimeout(resolve, 5000, false))])
  assert.equal(closed, true, 'the socket pipelining 40 requests was closed')
  await waitFor('the files of a closed deep pipeline', () => fds() <= baseline, 5000)
})

test('a response being written when its client leaves is told `close` once (the event stream\'s), not a second time by the pipelining cleanup', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['A'] })
  const { port } = new URL(url)
  const closes: number[] = []
  tp.app.server.on('request', (request: IncomingMessage, response: ServerResponse) => {
    if (!(request.url ?? '').startsWith('/api/events')) return
    const at = closes.push(0) - 1
    response.on('close', () => { closes[at]!++ })
  })
  const socket = connect({ host: '127.0.0.1', port: Number(port) })
  let text = ''
  socket.setEncoding('utf8').on('data', (chunk: string) => { text += chunk })
  socket.write(`GET /api/events HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\n\r\n`)
  await waitFor('the event stream\'s first event', () => text.includes('event: hello'))
  socket.destroy()
  await waitFor('the event stream closed', () => closes[0] === 1)
  await new Promise((resolve) => setTimeout(resolve, 100))
  assert.deepEqual(closes, [1])
})

/**
 * A Toolport with a tool whose callback answers `chars` characters of U+0001 as text: the call's
 * answer writes them JSON-escaped (6 bytes each), twice (`output` and `text`), far more than the
 * kernel's socket buffers take. Its server-side sockets are collected in `serverSockets`.
 */
async function bigAnswers (t: TestContext, limits: Record<string, number>, chars = 3 * 1024 * 1024) {
  const reply = Buffer.alloc(chars, 1)
  const callback = createServer((request, response) => {
    request.resume()
    request.once('end', () => { response.writeHead(200, { 'content-type': 'text/plain' }).end(reply) })
  })
  const callbackOrigin = await listenOnLoopback(t, callback)
  const { tp, url, port } = await startToolport(t, { roles: ['A'], limits })
  const registered = await tp.register({ name: 'big', callback_url: `${callbackOrigin}/big` })
  assert.equal(registered.ok, true)
  const serverSockets: Socket[] = []
  tp.app.server.on('connection', (socket: Socket) => { serverSockets.push(socket) })
  const body = JSON.stringify({ role: 'A', name: 'big', arguments: {} })
  const callRequest = 'POST /api/tools/call HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n' +
    `content-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`
  /** Sends the call on a raw socket that reads nothing; resolves with it once its answer is written. */
  async function stalledCall (): Promise<{ client: Socket, server: Socket }> {
    const client = connect(port, '127.0.0.1')
    client.on('error', () => {})
    t.after(() => client.destroy())
    await once(client, 'connect')
    const server = await new Promise<Socket>((resolve) => {
      const find = (): void => {
        const found = serverSockets.find((socket) => socket.remotePort === client.localPort)
        if (found === undefined) setImmediate(find)
        else resolve(found)
      }
      find()
    })
    client.write(callRequest)
    await waitFor('the answer to be written', () => server.writableLength > 0 || server.destroyed)
    return { client, server }
  }
  return { url, stalledCall, body, chars }
}

test('an answer its client has not taken answerStallTimeoutMs after it was written is cut, its socket closed (SECURITY.md: no local client exhausts the server)', async (t) => {
  const { stalledCall } = await bigAnswers(t, { answerStallTimeoutMs: 200 })
  const { client, server } = await stalledCall()
  await waitFor('the stalled answer to be cut', () => server.destroyed)
  // The client, reading now, gets the part the kernel held, then the close: not the whole answer.
  let head = ''
  let received = 0
  client.on('data', (chunk: Buffer) => {
    if (head.length < 512) head += chunk.toString('latin1', 0, 512)
    received += chunk.length
  })
  await once(client, 'close')
  const length = Number(/content-length: (\d+)/i.exec(head)?.[1])
  assert.ok(length > 12 * 3 * 1024 * 1024, `answer of ${length} bytes`)
  assert.ok(received < length, `received ${received} of ${length} bytes`)
})

test('past maxUnsentAnswerBytes of answers waiting for their clients, the one waiting longest is cut, never the one just written; a client that reads gets its whole answer', async (t) => {
  const limits = { maxUnsentAnswerBytes: 1024 * 1024, answerStallTimeoutMs: 600_000 }
  const { url, stalledCall, body, chars } = await bigAnswers(t, limits)
  const first = await stalledCall()
  assert.equal(first.server.destroyed, false, 'an answer over the budget alone is kept')
  const second = await stalledCall()
  await waitFor('the first answer to be cut', () => first.server.destroyed)
  assert.equal(second.server.destroyed, false)
  const third = await stalledCall()
  await waitFor('the second answer to be cut', () => second.server.destroyed)
  assert.equal(third.server.destroyed, false)
  // A client that reads takes its answer whole, however large, while others wait.
  const res = await request(`${url}/api/tools/call`, { method: 'POST', headers: { 'content-type': 'application/json' }, body })
  assert.equal(res.statusCode, 200)
  const answer = await res.body.json() as { output: string }
  assert.equal(answer.output.length, chars)
})

test('a streamed answer (definitions, a large list, the console state) whose client takes no piece for answerStallTimeoutMs is cut, its socket closed', async (t) => {
  const { tp, port } = await startToolport(t, { roles: ['A'], limits: { answerStallTimeoutMs: 200 } })
  // ~14 MB of definitions: 150 descriptions of 16 384 control characters, 6 bytes each escaped.
  const description = '\u0001'.repeat(16_384)
  for (let i = 0; i < 150; i++) {
    assert.equal((await tp.register({ name: `t${i}`, description, callback_url: 'http://127.0.0.1:9/t' })).ok, true)
  }
  const serverSockets: Socket[] = []
  tp.app.server.on('connection', (socket: Socket) => { serverSockets.push(socket) })
  for (const path of ['/api/tools/definitions?role=A&format=openai-chat', '/api/console/state']) {
    const client = connect(port, '127.0.0.1')
    client.on('error', () => {})
    t.after(() => client.destroy())
    await once(client, 'connect')
    client.write(`GET ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n`)
    // It reads nothing: the kernel's buffers fill, the stream is paused, no piece is taken.
    await waitFor(`the server side of ${path}`, () => serverSockets.some((socket) => socket.remotePort === client.localPort))
    const server = serverSockets.find((socket) => socket.remotePort === client.localPort)!
    await waitFor(`the stalled ${path} answer to be cut`, () => server.destroyed)
  }
})

test('past maxUnsentAnswerBytes, an answer its client is taking is not cut; one whose client took nothing since it was last looked at is', async (t) => {
  const limits = { maxUnsentAnswerBytes: 1024 * 1024, answerStallTimeoutMs: 600_000 }
  const { stalledCall } = await bigAnswers(t, limits)
  const first = await stalledCall()
  // Its client takes a few MB of it (a client reading slowly), then pauses again.
  let received = 0
  const reading = new Promise<void>((resolve) => {
    first.client.on('data', (chunk: Buffer) => {
      received += chunk.length
      if (received >= 4 * 1024 * 1024) {
        first.client.pause()
        resolve()
      }
    })
  })
  first.client.resume()
  await reading
  const second = await stalledCall()
  assert.equal(first.server.destroyed, false, 'an answer being taken was cut')
  // Neither client took anything since: the next answer makes room by cutting both.
  const third = await stalledCall()
  await waitFor('the two older answers to be cut', () => first.server.destroyed && second.server.destroyed)
  assert.equal(third.server.destroyed, false)
})
