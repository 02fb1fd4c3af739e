// The OpenAI-Realtime session adapter against a local `ws` server on 127.0.0.1 that
// plays the provider's documented event sequences, with real plugin callbacks behind the tools.
//
// The host side is what a real host writes: a `ws` client whose messages go to
// `handleServerEvent` and whose `send` the adapter uses.
import { test, type TestContext } from 'node:test'
import assert from 'node:assert/strict'
import { EventEmitter, once } from 'node:events'
import type { AddressInfo } from 'node:net'
import { WebSocket, WebSocketServer } from 'ws'
import {
  createRealtimeSession, createToolport, type RealtimeSession, type RealtimeSessionOptions,
  type Toolport
} from '../../src/main/index.js'
import { startCallbackServer, type CallbackServer } from '../fixtures/callback-server.js'

type Json = Record<string, any>

/** How the fake provider answers a `session.update`. */
type UpdateReply = 'ack' | 'reject' | 'silent'

/**
 * A fake realtime provider: answers session.update as told (session.updated echoing the session,
 * or an `error` naming the update's event_id, or nothing), records every client event, and plays
 * server events on demand.
 */
class FakeProvider extends EventEmitter {
  readonly received: Json[] = []
  updateReply: (event: Json) => UpdateReply = () => 'ack'
  socket: WebSocket | null = null
  readonly #server: WebSocketServer

  constructor (server: WebSocketServer) {
    super()
    this.#server = server
    server.on('connection', (socket) => {
      this.socket = socket
      socket.on('message', (data) => this.#onClientEvent(JSON.parse(data.toString()) as Json))
      this.emit('connection')
    })
  }

  get url (): string {
    return `ws://127.0.0.1:${(this.#server.address() as AddressInfo).port}`
  }

  /** Client events of one type, in arrival order. */
  sent (type: string): Json[] {
    return this.received.filter((e) => e.type === type)
  }

  /** Resolves once `n` client events of this type have arrived in total. */
  async waitFor (type: string, n = 1): Promise<Json[]> {
    while (this.sent(type).length < n) await once(this, 'client-event')
    return this.sent(type)
  }

  play (...events: Json[]): void {
    for (const event of events) this.socket?.send(JSON.stringify({ event_id: `evt_${Math.random().toString(36).slice(2)}`, ...event }))
  }

  #onClientEvent (event: Json): void {
    this.received.push(event)
    if (event.type === 'session.update') {
      const reply = this.updateReply(event)
      if (reply === 'ack') {
        this.play({ type: 'session.updated', session: { object: 'realtime.session', ...event.session } })
      } else if (reply === 'reject') {
        this.play({
          type: 'error',
          error: {
            type: 'invalid_request_error',
            code: 'invalid_value',
            message: 'Invalid tool schema.',
            param: 'session.tools',
            event_id: event.event_id
          }
        })
      }
    }
    this.emit('client-event', event)
  }

  async close (): Promise<void> {
    for (const client of this.#server.clients) client.terminate()
    await new Promise<void>((resolve) => this.#server.close(() => resolve()))
  }
}

interface Setup {
  tp: Toolport
  provider: FakeProvider
  callbacks: CallbackServer
  session: RealtimeSession
  /** The host's socket to the provider; its messages go to the adapter first. */
  ws: WebSocket
}

/**
 * A Toolport (role Lanlan), a callback server, the fake provider, and a host connected to it
 * through the adapter. The adapter's first session.update has already been acknowledged.
 */
async function setup (t: TestContext, options: Partial<RealtimeSessionOptions> = {},
  tools: Json[] = []): Promise<Setup> {
  const tp = await createToolport({ roles: ['Lanlan', 'Mochi'], logger: false, dispatch: { mode: 'inline' } })
  const callbacks = await startCallbackServer()
  const server = new WebSocketServer({ host: '127.0.0.1', port: 0 })
  await once(server, 'listening')
  const provider = new FakeProvider(server)
  const ws = new WebSocket(provider.url)
  await once(ws, 'open')
  for (const tool of tools) {
    const result = await tp.register({ ...tool, callback_url: `${callbacks.url}${String(tool.callback_url)}` })
    assert.equal(result.ok, true)
  }
  const session = createRealtimeSession({
    toolport: tp,
    role: 'Lanlan',
    send: (event) => { ws.send(JSON.stringify(event)) },
    ...options
  })
  ws.on('message', (data) => session.handleServerEvent(data.toString()))
  t.after(async () => {
    session.close()
    ws.terminate()
    await provider.close()
    await callbacks.close()
    await tp.close()
  })
  if (options.attach !== false) await provider.waitFor('session.update')
  // The attach-time sync settles once the provider answered (or the test's ack rule failed it).
  await tp.roles.get('Lanlan').sync()
  return { tp, provider, callbacks, session, ws }
}

/**
 * Every server event played before this point has been handled: a sync's session.updated travels
 * on the same socket after them.
 */
async function barrier (tp: Toolport): Promise<void> {
  const outcome = await tp.roles.get('Lanlan').sync()
  assert.equal(outcome.ok, true)
}

const WEATHER = {
  name: 'get_weather',
  description: 'Get weather for a location.',
  parameters: { type: 'object', properties: { location: { type: 'string' } }, required: ['location'] },
  callback_url: '/raw-output'
}
const ECHO = { name: 'echo', description: 'Echo the call back.', callback_url: '/echo' }
const SLOW = { name: 'slow', description: 'Never answers in time.', callback_url: '/sleep/60000' }

/** The events OpenAI plays for one function call (GA names), optionally without `name` on args.done. */
function functionCallEvents (responseId: string, itemId: string, callId: string, name: string, args: string,
  outputIndex = 0, withName = true): Json[] {
  const item = {
    id: itemId,
    object: 'realtime.item',
    type: 'function_call',
    status: 'completed',
    call_id: callId,
    name,
    arguments: args
  }
  return [
    {
      type: 'response.output_item.added',
      response_id: responseId,
      output_index: outputIndex,
      item: {
        ...item,
        status: 'in_progress',
        arguments: ''
      }
    },
    {
      type: 'response.function_call_arguments.delta',
      response_id: responseId,
      item_id: itemId,
      output_index: outputIndex,
      call_id: callId,
      delta: args
    },
    {
      type: 'response.function_call_arguments.done',
      response_id: responseId,
      item_id: itemId,
      output_index: outputIndex,
      call_id: callId,
      arguments: args,
      ...(withName ? { name } : {})
    },
    { type: 'response.output_item.done', response_id: responseId, output_index: outputIndex, item }
  ]
}

function responseDone (responseId: string, status: string, output: Json[] = []): Json {
  return { type: 'response.done', response: { id: responseId, object: 'realtime.response', status, output } }
}

test('Realtime: attaching sends session.update with the role tools (flat dialect) and a registration waits for session.updated', async (t) => {
  const { tp, provider } = await setup(t, {}, [WEATHER])
  const first = provider.sent('session.update')[0] as Json
  assert.equal(typeof first.event_id, 'string')
  assert.deepEqual(first.session.tools, [{
    type: 'function',
    name: WEATHER.name,
    description: WEATHER.description,
    parameters: WEATHER.parameters
  }])

  const result = await tp.register({ name: 'echo', callback_url: 'http://127.0.0.1:9333/echo', role: 'Lanlan' })
  assert.deepEqual(result.affected_roles, ['Lanlan'])
  assert.deepEqual(result.failed_roles, [])
  const updates = provider.sent('session.update')
  // failed_roles is empty: the sync resolved, which only the matching session.updated does.
  assert.deepEqual(updates.at(-1)?.session.tools.map((tool: Json) => tool.name), ['get_weather', 'echo'])
})

test('Realtime: the nested dialect sends {type:"function", function:{…}} (Qwen-Omni, StepFun) and is acknowledged the same way', async (t) => {
  const { tp, provider } = await setup(t, { dialect: 'nested' }, [WEATHER])
  assert.deepEqual(provider.sent('session.update')[0]?.session.tools, [{
    type: 'function',
    function: { name: WEATHER.name, description: WEATHER.description, parameters: WEATHER.parameters }
  }])
  const result = await tp.register({ name: 'echo', callback_url: 'http://127.0.0.1:9333/echo', role: 'Lanlan' })
  assert.deepEqual(result.failed_roles, [])
})

test('Realtime: sessionFields are merged into every session.update (e.g. type "realtime" for the OpenAI GA API)', async (t) => {
  const { provider } = await setup(t, { sessionFields: { type: 'realtime' } })
  assert.equal(provider.sent('session.update')[0]?.session.type, 'realtime')
})

test('Realtime, R8: an error event for the update rejects the sync: the role is in failed_roles with the provider code', async (t) => {
  const { tp, provider } = await setup(t)
  provider.updateReply = (event) =>
    event.session.tools.some((tool: Json) => tool.name === 'bad_tool') ? 'reject' : 'ack'
  const result = await tp.register({ name: 'bad_tool', callback_url: 'http://127.0.0.1:9333/bad', role: 'Lanlan' })
  assert.equal(result.ok, false)
  assert.deepEqual(result.affected_roles, [])
  assert.equal(result.failed_roles.length, 1)
  assert.equal(result.failed_roles[0]?.role, 'Lanlan')
  assert.match(result.failed_roles[0]?.error ?? '', /invalid_value/)
})

test('Realtime: an error event about another client event does not fail a pending update', async (t) => {
  const { tp, provider } = await setup(t)
  provider.updateReply = (event) => {
    // An unrelated error first (another event_id), then the real acknowledgement.
    provider.play({
      type: 'error',
      error: {
        type: 'invalid_request_error',
        code: 'x',
        message: 'not yours',
        event_id: 'evt_other'
      }
    })
    provider.play({ type: 'session.updated', session: { ...event.session } })
    return 'silent'
  }
  const result = await tp.register({ name: 'echo', callback_url: 'http://127.0.0.1:9333/echo', role: 'Lanlan' })
  assert.deepEqual(result.failed_roles, [])
})

test('Realtime: a session.update left unanswered fails the sync after ackTimeoutMs', async (t) => {
  const { tp, provider } = await setup(t, { ackTimeoutMs: 50 })
  provider.updateReply = () => 'silent'
  const result = await tp.register({ name: 'echo', callback_url: 'http://127.0.0.1:9333/echo', role: 'Lanlan' })
  assert.equal(result.ok, false)
  assert.match(result.failed_roles[0]?.error ?? '', /no session\.updated/)
})

for (const reshapes of [false, true]) {
  test(`Realtime: the late session.updated of an update given up on is not taken for the next update of the same tool names, which the provider then rejects${reshapes ? ', also from a provider that reshapes what it echoes' : ''} (README "Tool sync")`, async (t) => {
    const { tp, provider } = await setup(t, { ackTimeoutMs: 100 }, [ECHO])
    let given: Json | null = null
    provider.updateReply = (event) => {
      if (given === null) {
        // The first: left unanswered until the adapter has given up on it.
        given = event
        return 'silent'
      }
      // The second (same tool names, another description): the first one's late acknowledgement
      // comes first, then the provider rejects the second. One socket: they arrive in this order.
      const tools = (given.session.tools as Json[]).map((tool) => reshapes ? { ...tool, strict: false } : tool)
      provider.play({ type: 'session.updated', session: { object: 'realtime.session', ...given.session, tools } })
      provider.play({
        type: 'error',
        error: { type: 'invalid_request_error', code: 'invalid_value', message: 'Invalid tool schema.', event_id: event.event_id }
      })
      return 'silent'
    }
    const echo = { ...ECHO, callback_url: 'http://127.0.0.1:9333/echo', role: 'Lanlan' }
    const first = await tp.register({ ...echo, description: 'v2' })
    assert.match(first.failed_roles[0]?.error ?? '', /no session\.updated/)
    const second = await tp.register({ ...echo, description: 'v3' })
    assert.equal(second.ok, false, JSON.stringify(second))
    assert.match(second.failed_roles[0]?.error ?? '', /invalid_value/)
  })
}

test('Realtime: a provider that reshapes the tools it echoes (adds a field to each) still acknowledges every update, from a role without tools on', async (t) => {
  const { tp, provider } = await setup(t, { ackTimeoutMs: 2000 })
  provider.updateReply = (event) => {
    const tools = (event.session.tools as Json[]).map((tool) => ({ ...tool, strict: false }))
    provider.play({ type: 'session.updated', session: { object: 'realtime.session', ...event.session, tools } })
    return 'silent'
  }
  for (const description of ['v1', 'v2', 'v3']) {
    const result = await tp.register({ ...ECHO, callback_url: 'http://127.0.0.1:9333/echo', description, role: 'Lanlan' })
    assert.deepEqual(result.failed_roles, [], description)
  }
})

test('Realtime: a host\'s own update, acknowledged with the tools in place, does not pass for a pending update of the same tool names that changes them', async (t) => {
  const { tp, provider, ws } = await setup(t, { ackTimeoutMs: 300 }, [ECHO])
  let held: Json | null = null
  provider.updateReply = (event) => {
    if (event.event_id === 'host_voice') {
      // The host's own update: the provider acknowledges with the whole session, tools in place.
      provider.play({ type: 'session.updated', session: { object: 'realtime.session', voice: 'alloy', tools: provider.sent('session.update')[0]!.session.tools } })
      return 'silent'
    }
    held = event
    return 'silent'
  }
  const pending = tp.register({ ...ECHO, callback_url: 'http://127.0.0.1:9333/echo', description: 'changed', role: 'Lanlan' })
  await provider.waitFor('session.update', 2)
  ws.send(JSON.stringify({ type: 'session.update', event_id: 'host_voice', session: { voice: 'alloy' } }))
  const result = await pending
  assert.equal(result.ok, false, `the host's acknowledgement resolved our update: ${JSON.stringify(result)}`)
  assert.match(result.failed_roles[0]?.error ?? '', /no session\.updated/)
  assert.notEqual(held, null)
})

test('Realtime: parallel function calls in one response each run once, send their function_call_output, then one response.create', async (t) => {
  const { tp, provider, callbacks } = await setup(t, {}, [WEATHER, ECHO])
  provider.play(
    {
      type: 'response.created',
      response: {
        id: 'resp_1',
        object: 'realtime.response',
        status: 'in_progress',
        output: []
      }
    },
    ...functionCallEvents('resp_1', 'item_a', 'call_a', 'get_weather', '{"location":"Shanghai"}', 0),
    // The second call's arguments.done carries no name: the adapter takes it from output_item.added.
    ...functionCallEvents('resp_1', 'item_b', 'call_b', 'echo', '{"say":"hi"}', 1, false),
    responseDone('resp_1', 'completed', [
      {
        id: 'item_a',
        type: 'function_call',
        status: 'completed',
        call_id: 'call_a',
        name: 'get_weather',
        arguments: '{"location":"Shanghai"}'
      },
      {
        id: 'item_b',
        type: 'function_call',
        status: 'completed',
        call_id: 'call_b',
        name: 'echo',
        arguments: '{"say":"hi"}'
      }
    ])
  )
  await provider.waitFor('response.create')
  const outputs = provider.sent('conversation.item.create').map((e) => e.item)
  assert.equal(outputs.length, 2)
  const byCall = new Map(outputs.map((item: Json) => [item.call_id, item]))
  assert.deepEqual(byCall.get('call_a'), {
    type: 'function_call_output',
    call_id: 'call_a',
    output: '{"temperature_c":28}'
  })
  const echoed = JSON.parse(byCall.get('call_b')?.output)
  assert.equal(echoed.name, 'echo')
  assert.equal(echoed.call_id, 'call_b')
  assert.deepEqual(echoed.arguments, { say: 'hi' })

  // response.create comes after both outputs, and only once.
  const order = provider.received.map((e) => e.type).filter((type) => type !== 'session.update')
  assert.deepEqual(order, ['conversation.item.create', 'conversation.item.create', 'response.create'])
  assert.equal(callbacks.requests.length, 2)
  await barrier(tp)
  assert.equal(provider.sent('response.create').length, 1)
})

test('Realtime: duplicate events (replayed arguments.done, output_item.done, response.done) run nothing twice', async (t) => {
  const { tp, provider, callbacks } = await setup(t, {}, [WEATHER])
  const events = functionCallEvents('resp_d', 'item_d', 'call_d', 'get_weather', '{"location":"Paris"}')
  const done = responseDone('resp_d', 'completed', [
    {
      id: 'item_d',
      type: 'function_call',
      status: 'completed',
      call_id: 'call_d',
      name: 'get_weather',
      arguments: '{"location":"Paris"}'
    }
  ])
  provider.play(...events, ...events, done, done)
  await provider.waitFor('response.create')
  provider.play(...events, done)
  await barrier(tp)
  assert.equal(callbacks.requests.length, 1)
  assert.equal(provider.sent('conversation.item.create').length, 1)
  assert.equal(provider.sent('response.create').length, 1)
})

test('Realtime: a cancelled response (barge-in) aborts its running call and drops the late result: no output, no response.create', async (t) => {
  const { tp, provider, callbacks, session } = await setup(t, {}, [SLOW, WEATHER])
  const arrived = once(callbacks.events, 'request')
  const finished = once(tp, 'call-finished')
  provider.play(...functionCallEvents('resp_c', 'item_c', 'call_c', 'slow', '{}'))
  await arrived
  assert.equal(session.runningCalls, 1)
  provider.play(
    { type: 'input_audio_buffer.speech_started', audio_start_ms: 1200, item_id: 'item_user' },
    responseDone('resp_c', 'cancelled', [{
      id: 'item_c',
      type: 'function_call',
      status: 'completed',
      call_id: 'call_c',
      name: 'slow',
      arguments: '{}'
    }])
  )
  const [event] = await finished
  assert.equal(event.outcome, 'cancelled')
  await barrier(tp)
  assert.equal(provider.sent('conversation.item.create').length, 0)
  assert.equal(provider.sent('response.create').length, 0)

  // The next response is served normally.
  provider.play(...functionCallEvents('resp_n', 'item_n', 'call_n', 'get_weather', '{"location":"Oslo"}'),
    responseDone('resp_n', 'completed'))
  await provider.waitFor('response.create')
  assert.deepEqual(provider.sent('conversation.item.create').map((e) => e.item.call_id), ['call_n'])
})

test('Realtime: a `response.cancelled` event (providers without response.done status) cancels the same way', async (t) => {
  const { tp, provider, callbacks } = await setup(t, {}, [SLOW])
  const arrived = once(callbacks.events, 'request')
  const finished = once(tp, 'call-finished')
  provider.play(...functionCallEvents('resp_x', 'item_x', 'call_x', 'slow', '{}'))
  await arrived
  provider.play({ type: 'response.cancelled', response_id: 'resp_x' })
  assert.equal((await finished)[0].outcome, 'cancelled')
  await barrier(tp)
  assert.equal(provider.sent('conversation.item.create').length, 0)
  assert.equal(provider.sent('response.create').length, 0)
})

test('Realtime: a model looping on tool calls hits the per-session rate limit: a model-visible refusal, one answer without tools, then silence', async (t) => {
  const { tp, provider, callbacks } = await setup(t, { rateLimit: { maxCalls: 1, windowMs: 3_600_000 } }, [WEATHER])
  const round = (n: number): void => {
    provider.play(...functionCallEvents(`resp_${n}`, `item_${n}`, `call_${n}`, 'get_weather', '{"location":"Rome"}'),
      responseDone(`resp_${n}`, 'completed'))
  }
  round(1)
  await provider.waitFor('response.create', 1)
  round(2)
  await provider.waitFor('response.create', 2)
  round(3)
  await provider.waitFor('conversation.item.create', 3)
  await barrier(tp)

  assert.equal(callbacks.requests.length, 1, 'only the first call reached the plugin')
  const outputs = provider.sent('conversation.item.create').map((e) => e.item)
  assert.equal(outputs[0]?.output, '{"temperature_c":28}')
  for (const refused of outputs.slice(1)) {
    assert.match(JSON.parse(refused.output).error, /limit/)
  }
  const creates = provider.sent('response.create')
  assert.equal(creates.length, 2, 'the second refused round in a row gets no response.create')
  assert.deepEqual(creates[1]?.response, { tool_choice: 'none' })
})

test('Realtime: autoRespond false sends the outputs but never response.create', async (t) => {
  const { tp, provider } = await setup(t, { autoRespond: false }, [WEATHER])
  provider.play(...functionCallEvents('resp_q', 'item_q', 'call_q', 'get_weather', '{"location":"Lima"}'),
    responseDone('resp_q', 'completed'))
  await provider.waitFor('conversation.item.create')
  await barrier(tp)
  assert.equal(provider.sent('response.create').length, 0)
})

test('Realtime: close() detaches the session from its role and aborts its running calls', async (t) => {
  const { tp, provider, callbacks, session } = await setup(t, {}, [SLOW])
  assert.equal(tp.roles.get('Lanlan').sessions().length, 1)
  const arrived = once(callbacks.events, 'request')
  const finished = once(tp, 'call-finished')
  provider.play(...functionCallEvents('resp_z', 'item_z', 'call_z', 'slow', '{}'))
  await arrived
  assert.equal(session.runningCalls, 1)
  session.close()
  assert.equal((await finished)[0].outcome, 'cancelled')
  assert.equal(tp.roles.get('Lanlan').sessions().length, 0)
  assert.equal(session.runningCalls, 0)
})

test('Realtime: a session whose role was removed is dropped: a role of that name added again runs none of its calls', async (t) => {
  const { tp, provider, callbacks, session, ws } = await setup(t, {}, [WEATHER])
  tp.roles.remove('Lanlan')
  tp.roles.add('Lanlan')
  const again = await tp.register({ ...WEATHER, role: 'Lanlan', callback_url: `${callbacks.url}${WEATHER.callback_url}` })
  assert.equal(again.ok, true)
  const events = [...functionCallEvents('resp_r', 'item_r', 'call_r', 'get_weather', '{"location":"Paris"}'),
    responseDone('resp_r', 'completed')]
  // The host's listener after the adapter's: once it has seen every event, the adapter has too.
  let handled = 0
  const allHandled = new Promise<void>((resolve) => {
    ws.on('message', () => { if (++handled === events.length) resolve() })
  })
  const sentBefore = provider.received.length
  provider.play(...events)
  await allHandled
  assert.equal(callbacks.requests.length, 0, 'no call reached the plugin')
  assert.equal(session.runningCalls, 0)
  assert.deepEqual(provider.received.slice(sentBefore), [], 'nothing was sent for the call')
  assert.equal(tp.roles.get('Lanlan').sessions().length, 0, 'the new role has no session')
  session.attach()
  assert.equal(tp.roles.get('Lanlan').sessions().length, 0, 'a dropped session never joins the role again')
})

test('Realtime, R6: creating a session for an unknown role throws TP_ERR_ROLE_NOT_FOUND and sends nothing', async (t) => {
  const tp = await createToolport({ roles: ['Lanlan'], logger: false, dispatch: { mode: 'inline' } })
  t.after(() => tp.close())
  const sent: unknown[] = []
  assert.throws(() => createRealtimeSession({ toolport: tp, role: 'Nobody', send: (e) => { sent.push(e) } }),
    (err: any) => err.code === 'TP_ERR_ROLE_NOT_FOUND' && err.statusCode === 404)
  assert.deepEqual(sent, [])
})
