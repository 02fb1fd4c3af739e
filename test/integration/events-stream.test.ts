// GET /api/events: the live event stream, over real sockets on 127.0.0.1, parsed with the same
// SSE parser the plugin SDK and the console use.
import assert from 'node:assert/strict'
import { once } from 'node:events'
import { request as httpRequest, type IncomingMessage, type ClientRequest } from 'node:http'
import { connect } from 'node:net'
import { test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { createParser, type EventSourceMessage } from 'eventsource-parser'
import { startCallbackServer, closedPort } from '../fixtures/callback-server.js'
import { httpJson, session, startToolport } from '../helpers.js'

interface Received { id: string | undefined, event: string, data: any }

/** A subscriber on a real socket; `next(type)` waits for the next event of that type. */
class StreamReader {
  readonly events: Received[] = []
  readonly comments: string[] = []
  raw = ''
  statusCode = 0
  headers: IncomingMessage['headers'] = {}
  readonly #waiters: Array<() => void> = []
  #request: ClientRequest | null = null
  #cursor = 0

  static async open (url: string, headers: Record<string, string> = {}): Promise<StreamReader> {
    const reader = new StreamReader()
    const parser = createParser({
      onEvent: (message: EventSourceMessage) => {
        reader.events.push({ id: message.id, event: message.event ?? 'message', data: JSON.parse(message.data) })
        for (const wake of reader.#waiters.splice(0)) wake()
      },
      onComment: (comment) => { reader.comments.push(comment); for (const wake of reader.#waiters.splice(0)) wake() }
    })
    const req = httpRequest(url, { headers: { accept: 'text/event-stream', ...headers } })
    reader.#request = req
    req.end()
    const [res] = await once(req, 'response') as [IncomingMessage]
    reader.statusCode = res.statusCode ?? 0
    reader.headers = res.headers
    res.setEncoding('utf8')
    res.on('data', (chunk: string) => { reader.raw += chunk; parser.feed(chunk) })
    res.on('error', () => {})
    return reader
  }

  /** The next event of `type` after those already taken (waits up to 5 s). */
  async next (type: string): Promise<Received> {
    const deadline = Date.now() + 5000
    for (;;) {
      for (let i = this.#cursor; i < this.events.length; i++) {
        const event = this.events[i] as Received
        if (event.event === type) {
          this.#cursor = i + 1
          return event
        }
      }
      const left = deadline - Date.now()
      if (left <= 0) throw new Error(`no '${type}' event within 5 s; got ${this.events.map((e) => e.event).join(', ')}`)
      await Promise.race([new Promise<void>((resolve) => this.#waiters.push(resolve)), sleep(left)])
    }
  }

  /** Waits until a comment line arrives. */
  async nextComment (): Promise<string> {
    const seen = this.comments.length
    const deadline = Date.now() + 5000
    while (this.comments.length === seen) {
      if (Date.now() > deadline) throw new Error('no comment within 5 s')
      await Promise.race([new Promise<void>((resolve) => this.#waiters.push(resolve)), sleep(100)])
    }
    return this.comments[seen] as string
  }

  close (): void {
    this.#request?.destroy()
  }
}

async function openStream (t: { after: (fn: () => void) => void }, url: string, headers: Record<string,
  string> = {}): Promise<StreamReader> {
  const reader = await StreamReader.open(url, headers)
  t.after(() => reader.close())
  return reader
}

test('/api/health carries an instance_id, new for every instance, and hello repeats it first', async (t) => {
  const a = await startToolport(t, { roles: ['Lanlan'] })
  const b = await startToolport(t, { roles: ['Lanlan'] })
  const health = await httpJson(`${a.url}/api/health`, 'GET')
  assert.match(health.body.instance_id, /^[0-9a-f-]{36}$/)
  const other = await httpJson(`${b.url}/api/health`, 'GET')
  assert.notEqual(other.body.instance_id, health.body.instance_id)

  const reader = await openStream(t, `${a.url}/api/events`)
  assert.equal(reader.statusCode, 200)
  assert.match(String(reader.headers['content-type']), /^text\/event-stream/)
  assert.equal(reader.headers['cache-control'], 'no-store')
  const hello = await reader.next('hello')
  assert.equal(reader.events[0]?.event, 'hello', 'hello comes first')
  assert.equal(hello.data.instance_id, health.body.instance_id)
  assert.equal(hello.data.replay, 'none')
})

test('registered, unregistered and cleared name the origin, each role and tool, and the roles', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['Lanlan', 'Mochi'] })
  const reader = await openStream(t, `${url}/api/events`)
  await reader.next('hello')

  await tp.register({
    name: 'get_weather',
    callback_url: 'http://127.0.0.1:9333/tools/get_weather',
    source: 'plugin:weather'
  })
  const registered = await reader.next('registered')
  assert.deepEqual(registered.data, {
    origin: 'http://127.0.0.1:9333',
    source: 'plugin:weather',
    tools: [{ role: 'Lanlan', name: 'get_weather' }, { role: 'Mochi', name: 'get_weather' }],
    roles: ['Lanlan', 'Mochi']
  })
  assert.match(registered.id ?? '', /^[0-9a-f]{8}-\d+$/)

  await tp.unregister({ name: 'get_weather', role: 'Mochi' })
  const unregistered = await reader.next('unregistered')
  assert.deepEqual(unregistered.data.tools, [{ role: 'Mochi', name: 'get_weather' }])
  assert.deepEqual(unregistered.data.roles, ['Mochi'])

  await tp.clear({ source: 'plugin:weather' })
  const cleared = await reader.next('cleared')
  assert.equal(cleared.data.origin, 'http://127.0.0.1:9333')
  assert.deepEqual(cleared.data.tools, [{ role: 'Lanlan', name: 'get_weather' }])
})

test('role-added and role-removed, and sync with the role\'s sessions, duration and failures', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['Lanlan'] })
  const reader = await openStream(t, `${url}/api/events`)
  await reader.next('hello')
  tp.roles.add('Nova')
  assert.deepEqual((await reader.next('role-added')).data, { role: 'Nova' })
  tp.roles.remove('Nova')
  assert.deepEqual((await reader.next('role-removed')).data, { role: 'Nova' })

  const role = tp.roles.get('Lanlan')
  role.attachSession(session('good', 'instant'))
  await reader.next('sync')
  role.attachSession(session('bad', 'throw'))
  const failed = await reader.next('sync')
  assert.equal(failed.data.role, 'Lanlan')
  assert.equal(failed.data.sessions, 2)
  assert.equal(failed.data.failures, 1)
  assert.equal(failed.data.ok, false)
  assert.equal(typeof failed.data.duration_ms, 'number')
})

test('R14: a call event carries metadata only, never arguments, replies or a free-text tool name', async (t) => {
  const callback = await startCallbackServer()
  t.after(() => callback.close())
  const { tp, url } = await startToolport(t, { roles: ['Lanlan'] })
  const reader = await openStream(t, `${url}/api/events`)
  await reader.next('hello')
  await tp.register({ name: 'echo', callback_url: `${callback.url}/echo`, source: 'plugin:echo' })

  const secret = 'my-card-number-4111111111111111'
  const result = await tp.callTool('Lanlan', { name: 'echo', arguments: { note: secret } })
  assert.ok(result.text.includes(secret), 'the callback did echo the secret back')
  const call = await reader.next('call')
  assert.deepEqual(Object.keys(call.data).sort(), ['bytes', 'duration_ms', 'is_error', 'outcome', 'role', 'source',
    'tool'])
  assert.equal(call.data.role, 'Lanlan')
  assert.equal(call.data.tool, 'echo')
  assert.equal(call.data.source, 'plugin:echo')
  assert.equal(call.data.outcome, 'ok')
  assert.ok(call.data.bytes > secret.length, 'the reply size is reported')

  await tp.callTool('Lanlan', { name: `tell-them-${secret}`, arguments: {} })
  const unknown = await reader.next('call')
  assert.equal(unknown.data.outcome, 'unknown_tool')
  assert.equal(unknown.data.tool, null)
  assert.ok(!reader.raw.includes(secret), 'the secret never appears in the stream')
})

test('call events carry no id, are never replayed, and at most maxCallEventsPerSecond stream per second', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['Lanlan'], events: { maxCallEventsPerSecond: 5 } })
  // The longest name and source there are: each call's event is ~470 bytes instead of ~130, so the
  // socket buffers below fill after fewer calls.
  const name = 'n'.repeat(64)
  await tp.roles.get('Lanlan').registerLocalTool({ name, source: 's'.repeat(256), handler: () => 'ok' })
  const reader = await openStream(t, `${url}/api/events?types=call,registered`)
  await reader.next('hello')
  const started = performance.now()
  for (let i = 0; i < 50; i++) await tp.callTool('Lanlan', { name: 'noop', arguments: {} })
  const seconds = Math.floor((performance.now() - started) / 1000) + 1
  await tp.register({ name: 'marker', callback_url: 'http://127.0.0.1:9333/marker' })
  const marker = await reader.next('registered')
  const calls = reader.events.filter((e) => e.event === 'call')
  assert.ok(calls.length >= 5, `the first calls of the second are streamed (${calls.length})`)
  assert.ok(calls.length <= 5 * (seconds + 1), `${calls.length} call events for 50 calls in ${seconds} s`)
  assert.ok(calls.every((e) => e.id === undefined), 'call events carry no id')
  // A reconnect from before the calls replays the registry change only.
  const first = reader.events.find((e) => e.event === 'hello')
  assert.ok(marker.id !== undefined && first?.id !== undefined)
  const again = await openStream(t, `${url}/api/events?types=call,registered`, { 'last-event-id': first.id })
  const hello = await again.next('hello')
  assert.equal(hello.data.replayed, 1)
  assert.equal((await again.next('registered')).data.tools[0].name, 'marker')
  assert.equal(again.events.filter((e) => e.event === 'call').length, 0)
})

test('R13: an evicted origin is announced with its tools, roles and failures', async (t) => {
  const port = await closedPort()
  const { tp, url } = await startToolport(t, { roles: ['Lanlan'] })
  const reader = await openStream(t, `${url}/api/events?types=evicted`)
  await reader.next('hello')
  await tp.register({ name: 'gone', callback_url: `http://127.0.0.1:${port}/gone`, source: 'plugin:gone' })
  for (let i = 0; i < 3; i++) await tp.callTool('Lanlan', { name: 'gone', arguments: {} })
  const evicted = await reader.next('evicted')
  assert.deepEqual(evicted.data, {
    origin: `http://127.0.0.1:${port}`,
    source: 'plugin:gone',
    tools: [{ role: 'Lanlan', name: 'gone' }],
    roles: ['Lanlan'],
    failures: 3
  })
})

test('Last-Event-ID replays exactly the events missed; an id of another instance replays nothing', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['Lanlan'] })
  const first = await openStream(t, `${url}/api/events?types=registered`)
  await first.next('hello')
  await tp.register({ name: 'one', callback_url: 'http://127.0.0.1:9333/one' })
  const seen = await first.next('registered')
  first.close()

  await tp.register({ name: 'two', callback_url: 'http://127.0.0.1:9333/two' })
  await tp.register({ name: 'three', callback_url: 'http://127.0.0.1:9333/three' })
  const again = await openStream(t, `${url}/api/events?types=registered`, { 'last-event-id': seen.id as string })
  const hello = await again.next('hello')
  assert.equal(hello.data.replay, 'complete')
  assert.equal(hello.data.replayed, 2)
  assert.deepEqual([(await again.next('registered')).data.tools[0].name,
    (await again.next('registered')).data.tools[0].name], ['two', 'three'])

  const stranger = await openStream(t, `${url}/api/events?types=registered`, { 'last-event-id': 'deadbeef-1' })
  assert.equal((await stranger.next('hello')).data.replay, 'none')
  await sleep(50)
  assert.deepEqual(stranger.events.map((e) => e.event), ['hello'])
})

test('a replay from before the ring\'s oldest event says it is partial', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['Lanlan'], events: { replaySize: 16 } })
  const first = await openStream(t, `${url}/api/events`)
  const hello = await first.next('hello')
  first.close()
  for (let i = 0; i < 20; i++) tp.roles.add(`r${i}`)
  const again = await openStream(t, `${url}/api/events`, { 'last-event-id': hello.id as string })
  const second = await again.next('hello')
  assert.equal(second.data.replay, 'partial')
  assert.equal(second.data.replayed, 16)
})

test('the replay ring holds at most events.replayMaxBytes: with many roles the oldest events go first, and a replay from before them is partial (README "Live events")', async (t) => {
  // 300 roles: each global registration's event names every one (~12 KiB of frame).
  const roles = Array.from({ length: 300 }, (_, i) => `role_${String(i).padStart(3, '0')}`)
  const { tp, url } = await startToolport(t, { roles, events: { replaySize: 2048, replayMaxBytes: 64 * 1024 } })
  const first = await openStream(t, `${url}/api/events?types=registered`)
  const hello = await first.next('hello')
  first.close()
  const total = 40
  for (let i = 0; i < total; i++) await tp.register({ name: `tool_${i}`, callback_url: 'http://127.0.0.1:9333/a' })
  const again = await openStream(t, `${url}/api/events?types=registered`, { 'last-event-id': hello.id as string })
  const second = await again.next('hello')
  assert.equal(second.data.replay, 'partial')
  const replayed = second.data.replayed as number
  assert.ok(replayed >= 1 && replayed < total, `replayed ${replayed} of ${total}`)
  const names: string[] = []
  let bytes = 0
  for (let i = 0; i < replayed; i++) {
    const event = await again.next('registered')
    assert.equal(event.data.tools.length, roles.length)
    names.push(event.data.tools[0].name)
    bytes += JSON.stringify(event.data).length
  }
  // The newest are the ones held, in order, and together within the cap.
  assert.deepEqual(names, Array.from({ length: replayed }, (_, i) => `tool_${total - replayed + i}`))
  assert.ok(bytes <= 64 * 1024, `${bytes} bytes replayed`)
})

test('?types= and ?role= filter the stream; an unknown type is a 422', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['Lanlan', 'Mochi'] })
  const byRole = await openStream(t, `${url}/api/events?role=Mochi`)
  const byType = await openStream(t, `${url}/api/events?types=role-added,unregistered`)
  await byRole.next('hello')
  await byType.next('hello')
  await tp.register({ name: 'only_lanlan', callback_url: 'http://127.0.0.1:9333/a', role: 'Lanlan' })
  await tp.register({ name: 'only_mochi', callback_url: 'http://127.0.0.1:9333/b', role: 'Mochi' })
  tp.roles.add('Nova')
  await byType.next('role-added')
  assert.equal((await byRole.next('registered')).data.tools[0].name, 'only_mochi')
  assert.deepEqual(byRole.events.map((e) => e.event), ['hello', 'registered'])
  assert.deepEqual(byType.events.map((e) => e.event), ['hello', 'role-added'])

  const bad = await httpJson(`${url}/api/events?types=registered,nonsense`, 'GET')
  assert.equal(bad.statusCode, 422)
  assert.equal(bad.body.code, 'TP_ERR_VALIDATION')
})

test('an idle stream gets heartbeat comments', async (t) => {
  const { url } = await startToolport(t, { roles: ['Lanlan'], events: { heartbeatMs: 100 } })
  const reader = await openStream(t, `${url}/api/events`)
  await reader.next('hello')
  assert.equal(await reader.nextComment(), 'heartbeat')
})

test('a subscriber that stops reading is dropped, and calls keep being answered meanwhile', async (t) => {
  const { tp, url, port } = await startToolport(t, {
    roles: ['Lanlan'],
    events: {
      maxSubscriberBufferBytes: 1024,
      heartbeatMs: 100,
      // Every call streamed, so the calls below fill the unread buffer quickly.
      maxCallEventsPerSecond: 1_000_000
    }
  })
  // The longest name and source there are: each call's event is ~470 bytes instead of ~130, so the
  // socket buffers below fill after fewer calls.
  const name = 'n'.repeat(64)
  await tp.roles.get('Lanlan').registerLocalTool({ name, source: 's'.repeat(256), handler: () => 'ok' })
  // A raw socket that sends the request and then never reads: the kernel buffers fill, then ours.
  const socket = connect(port, '127.0.0.1')
  await once(socket, 'connect')
  socket.write(`GET /api/events HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nAccept: text/event-stream\r\n\r\n`)
  socket.pause()
  t.after(() => socket.destroy())
  const closed = once(socket, 'close')
  let stats = await httpJson(`${url}/api/console/stats`, 'GET')
  for (let i = 0; i < 50 && stats.body.events.subscribers === 0; i++) {
    await sleep(20)
    stats = await httpJson(`${url}/api/console/stats`, 'GET')
  }
  assert.equal(stats.body.events.subscribers, 1)

  // Bounded: at most 200 000 calls (about 90 MB of events), stopping once the subscriber is gone.
  let answered = 0
  for (let round = 0; round < 200; round++) {
    const batch = []
    for (let i = 0; i < 1000; i++) batch.push(tp.callTool('Lanlan', { name, arguments: {} }))
    for (const result of await Promise.all(batch)) if (!result.is_error) answered++
    await sleep(15)
    stats = await httpJson(`${url}/api/console/stats`, 'GET')
    if (stats.body.events.dropped > 0) break
  }
  assert.equal(stats.body.events.dropped, 1, 'the slow subscriber was dropped')
  assert.equal(stats.body.events.subscribers, 0)
  assert.ok(answered >= 1000)
  socket.resume()
  await closed
})

test('the stream is behind the same guard: foreign Host 403, token mode 401 without the token', async (t) => {
  const token = 'a-very-long-test-token-of-at-least-32-bytes'
  const { url, port } = await startToolport(t, { roles: ['Lanlan'], security: { token } })
  const noToken = await openStream(t, `${url}/api/events`)
  assert.equal(noToken.statusCode, 401)
  const withToken = await openStream(t, `${url}/api/events`, { authorization: `Bearer ${token}` })
  assert.equal(withToken.statusCode, 200)
  await withToken.next('hello')
  const foreign = await openStream(t, `${url}/api/events`, {
    authorization: `Bearer ${token}`,
    host: `attacker.example:${port}`
  })
  assert.equal(foreign.statusCode, 403)
  const crossSite = await openStream(t, `${url}/api/events`, {
    authorization: `Bearer ${token}`,
    origin: 'http://attacker.example'
  })
  assert.equal(crossSite.statusCode, 403)
})

test('more subscribers than events.maxSubscribers are answered 503 TP_ERR_STREAM_FULL', async (t) => {
  const { url } = await startToolport(t, { roles: ['Lanlan'], events: { maxSubscribers: 1 } })
  const one = await openStream(t, `${url}/api/events`)
  await one.next('hello')
  const two = await httpJson(`${url}/api/events`, 'GET')
  assert.equal(two.statusCode, 503)
  assert.equal(two.body.code, 'TP_ERR_STREAM_FULL')
})

test('closing the server ends an open event stream as a stream ends (its last chunk written), not as a reset connection', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['A'] })
  const req = httpRequest(`${url}/api/events`, { headers: { accept: 'text/event-stream' } })
  req.end()
  const [res] = await once(req, 'response') as [IncomingMessage]
  assert.equal(res.statusCode, 200)
  res.resume()
  const ending = new Promise<string>((resolve) => {
    res.on('end', () => { resolve('end') })
    res.on('error', (err) => { resolve(`error: ${err.message}`) })
    res.on('aborted', () => { resolve('aborted') })
  })
  await tp.close()
  assert.equal(await ending, 'end')
  assert.equal(res.complete, true, 'the chunked body was terminated')
})
