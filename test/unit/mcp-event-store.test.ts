// The bounded per-session event store behind resumable MCP streams: what it replays, and that
// past its bounds a missed message is never skipped silently.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { setTimeout as sleep } from 'node:timers/promises'
import { setFlagsFromString } from 'node:v8'
import { runInNewContext } from 'node:vm'
import type { JSONRPCMessage } from '@modelcontextprotocol/sdk/types.js'
import { BoundedEventStore, isStandaloneEventId, streamOfEventId } from '../../src/main/sessions/event-store.js'

const GET = '_GET_stream'
const LIST_CHANGED = { jsonrpc: '2.0', method: 'notifications/tools/list_changed' } as JSONRPCMessage

function response (id: number, text: string): JSONRPCMessage {
  return { jsonrpc: '2.0', id, result: { content: [{ type: 'text', text }] } } as JSONRPCMessage
}

async function replay (store: BoundedEventStore, lastEventId: string): Promise<{
  stream: string,
  sent: Array<[string,
    JSONRPCMessage]>
}> {
  const sent: Array<[string, JSONRPCMessage]> = []
  const stream = await store.replayEventsAfter(lastEventId, {
    send: async (id, message) => {
      sent.push([id,
        message])
    }
  })
  return { stream, sent }
}

test('replays the events of the same stream after the given id, in order, without the priming event', async () => {
  const store = new BoundedEventStore()
  const priming = await store.storeEvent('post-1', {} as JSONRPCMessage)
  const first = await store.storeEvent(GET, LIST_CHANGED)
  const answer = await store.storeEvent('post-1', response(7, 'done'))
  const second = await store.storeEvent(GET, LIST_CHANGED)

  assert.equal(await store.getStreamIdForEventId(first), GET)
  assert.equal(await store.getStreamIdForEventId(priming), 'post-1')
  assert.deepEqual(await replay(store, first), { stream: GET, sent: [[second, LIST_CHANGED]] })
  assert.deepEqual(await replay(store, priming), { stream: 'post-1', sent: [[answer, response(7, 'done')]] })
  assert.deepEqual((await replay(store, second)).sent, [])
})

test('ids it never issued are not resumable', async () => {
  const store = new BoundedEventStore()
  await store.storeEvent('post-1', response(1, 'x'))
  for (const id of ['', 'nope', '99_post-1', '1_other-stream', '_GET_stream']) {
    assert.equal(await store.getStreamIdForEventId(id), undefined, id)
  }
  await assert.rejects(replay(store, 'garbage'))
})

test('past the byte bound, a missed response replays as a JSON-RPC error for its request id', async () => {
  const store = new BoundedEventStore({ maxBytes: 200 })
  const priming = await store.storeEvent('post-1', {} as JSONRPCMessage)
  const big = await store.storeEvent('post-1', response(42, 'x'.repeat(500)))
  assert.equal(store.bytes, 0, 'a message larger than the bound keeps only its marker')
  const { sent } = await replay(store, priming)
  assert.equal(sent.length, 1)
  assert.equal(sent[0]?.[0], big)
  const error = sent[0]?.[1] as { id: number, error: { code: number, message: string } }
  assert.equal(error.id, 42)
  assert.equal(error.error.code, -32603)
  assert.match(error.error.message, /send the request again/)

  // Older kept messages become markers first, so the newest stay replayable.
  const small = new BoundedEventStore({ maxBytes: 250 })
  const start = await small.storeEvent('p', {} as JSONRPCMessage)
  await small.storeEvent('p', response(1, 'a'.repeat(100)))
  await small.storeEvent('p', response(2, 'b'.repeat(100)))
  assert.ok(small.bytes <= 250)
  const replayed = (await replay(small, start)).sent.map(([, m]) => m as {
    id: number,
    result?: unknown,
    error?: unknown
  })
  assert.deepEqual(replayed.map((m) => [m.id, m.result !== undefined]), [[1, false], [2, true]])
})

test('past the count bound, a client that missed list changes on its event stream is still told to re-list', async () => {
  const store = new BoundedEventStore({ maxEvents: 4 })
  const seen = await store.storeEvent(GET, LIST_CHANGED)
  for (let i = 0; i < 10; i++) await store.storeEvent(`post-${i}`, response(i, 'r'))
  assert.equal(store.size, 4)
  const { stream, sent } = await replay(store, seen)
  assert.equal(stream, GET)
  assert.deepEqual(sent, [[seen, LIST_CHANGED]], 'one list_changed stands for every change it may have missed')
})

test('hasEventsAfter says whether a resume of that event id would be sent anything; event ids name their stream', async () => {
  const store = new BoundedEventStore({ maxEvents: 4 })
  const priming = await store.storeEvent('post-1', {} as JSONRPCMessage)
  assert.equal(store.hasEventsAfter(priming), false, 'a priming event is nothing to replay')
  const answer = await store.storeEvent('post-1', response(1, 'done'))
  assert.equal(store.hasEventsAfter(priming), true)
  assert.equal(store.hasEventsAfter(answer), false)
  assert.equal(store.hasEventsAfter('nonsense'), false)
  assert.equal(streamOfEventId(answer), 'post-1')
  assert.equal(streamOfEventId('nonsense'), undefined)
  // The event stream's list changes dropped past the count bound still owe the client one.
  const seen = await store.storeEvent(GET, LIST_CHANGED)
  assert.equal(isStandaloneEventId(seen), true)
  assert.equal(isStandaloneEventId(answer), false)
  assert.equal(store.hasEventsAfter(seen), false)
  for (let i = 0; i < 6; i++) await store.storeEvent(GET, LIST_CHANGED)
  assert.equal(store.hasEventsAfter(seen), true)
})

test('a message dropped by the count bound is no longer held: the store keeps at most its bounds in memory', async () => {
  setFlagsFromString('--expose-gc')
  const gc = runInNewContext('gc') as () => void
  const store = new BoundedEventStore({ maxEvents: 8, maxBytes: 1024 * 1024 })
  const refs: Array<WeakRef<JSONRPCMessage>> = []
  // Created in a function of their own, so no local of this test keeps them alive.
  const storeMany = async (from: number, count: number): Promise<void> => {
    for (let i = from; i < from + count; i++) {
      const message = response(i, `reply ${i}`)
      refs.push(new WeakRef(message))
      await store.storeEvent('s', message)
    }
  }
  await storeMany(0, 100)
  assert.equal(store.size, 8)
  for (let i = 0; i < 4; i++) {
    gc()
    await sleep(5)
  }
  const alive = refs.map((ref, i) => ref.deref() === undefined ? -1 : i).filter((i) => i >= 0)
  // The 8 kept are the newest; every older one is garbage.
  assert.deepEqual(alive, [92, 93, 94, 95, 96, 97, 98, 99])
})
