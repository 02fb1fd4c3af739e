// The piscina task in a real pool: outcomes stream back on a BroadcastChannel, cancellation is a
// message (never a task abort), and idle keep-alive sockets survive between batches.
import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { once } from 'node:events'
import { test } from 'node:test'
import type { TestContext } from 'node:test'
import { BroadcastChannel } from 'node:worker_threads'
import { Piscina } from 'piscina'
import type { CallOutcome, WorkerOptions } from '../../src/workers/protocol.js'
import { buildCallTask, startCallbackServer } from '../fixtures/callback-server.js'
import type { CallbackServer, CallbackServerOptions } from '../fixtures/callback-server.js'

// tsx is inherited by the worker threads (execArgv), so the .ts task file loads as it is.
const TASK_FILE = new URL('../../src/workers/call-task.ts', import.meta.url).href

interface Harness {
  server: CallbackServer
  pool: Piscina
  cancels: BroadcastChannel
  /** Resolves with the outcome of call `id` once it arrives from the worker. */
  outcome: (id: number) => Promise<CallOutcome>
  /** Call ids in the order their outcomes arrived. */
  arrivals: number[]
}

async function setup (t: TestContext, serverOptions: CallbackServerOptions = {}): Promise<Harness> {
  const server = await startCallbackServer(serverOptions)
  const workerData: WorkerOptions = {
    cancelChannel: `toolport-cancel-${randomUUID()}`,
    connectionsPerOrigin: 8,
    keepAliveTimeoutMs: 4000,
    connectTimeoutMs: 2000
  }
  const pool = new Piscina({
    filename: TASK_FILE,
    workerData,
    atomics: 'disabled',
    concurrentTasksPerWorker: 64,
    maxThreads: 1,
    minThreads: 1
  })
  const cancels = new BroadcastChannel(workerData.cancelChannel)
  const arrived = new Map<number, CallOutcome>()
  const waiting = new Map<number, (outcome: CallOutcome) => void>()
  const arrivals: number[] = []
  pool.on('message', (batch: CallOutcome[]) => {
    for (const outcome of batch) {
      arrivals.push(outcome.id)
      arrived.set(outcome.id, outcome)
      waiting.get(outcome.id)?.(outcome)
    }
  })
  t.after(async () => {
    cancels.close()
    await pool.destroy()
    await server.close()
  })
  function outcome (id: number): Promise<CallOutcome> {
    const known = arrived.get(id)
    if (known !== undefined) return Promise.resolve(known)
    return new Promise((resolve) => waiting.set(id, resolve))
  }
  return { server, pool, cancels, outcome, arrivals }
}

test('R9: a batch posts every outcome to the main thread and resolves with its call count', async (t) => {
  const { server, pool, outcome } = await setup(t)
  const calls = [buildCallTask(server.url, '/echo'), buildCallTask(server.url, '/status/500'), buildCallTask(server.url, '/text')]
  const count = await pool.run({ calls })
  assert.equal(count, 3)
  const [echo, failed, text] = await Promise.all(calls.map((call) => outcome(call.id)))
  assert.equal(echo?.kind, 'ok')
  assert.deepEqual(JSON.parse(echo?.text ?? ''), JSON.parse(calls[0]?.body ?? ''))
  assert.equal(failed?.kind, 'http')
  assert.equal(failed?.status, 500)
  assert.equal(text?.kind, 'ok')
  assert.equal(text?.text, 'plain text reply, not JSON')
})

test('R12: a fast call arrives before a slow call of the same batch has finished', async (t) => {
  const { server, pool, outcome, arrivals } = await setup(t)
  const slow = buildCallTask(server.url, '/sleep/1500')
  const fast = buildCallTask(server.url, '/echo')
  const batch = pool.run({ calls: [slow, fast] })
  assert.equal((await outcome(fast.id)).kind, 'ok')
  assert.deepEqual(arrivals, [fast.id])
  assert.equal((await outcome(slow.id)).kind, 'ok')
  assert.equal(await batch, 2)
  assert.deepEqual(arrivals, [fast.id, slow.id])
})

test('R12: a cancel message aborts one call and the same worker keeps serving', async (t) => {
  const { server, pool, cancels, outcome } = await setup(t)
  const threadId = pool.threads[0]?.threadId
  const doomed = buildCallTask(server.url, '/sleep/30000')
  const survivor = buildCallTask(server.url, '/sleep/300')
  const batch = pool.run({ calls: [doomed, survivor] })
  // Both requests reached the server, so both calls are in flight in the worker.
  await once(server.events, 'request')
  if (server.requests.length < 2) await once(server.events, 'request')
  cancels.postMessage([doomed.id])
  assert.equal((await outcome(doomed.id)).kind, 'cancelled')
  assert.equal((await outcome(survivor.id)).kind, 'ok')
  assert.equal(await batch, 2)
  const next = buildCallTask(server.url, '/echo')
  assert.equal(await pool.run({ calls: [next] }), 1)
  assert.equal((await outcome(next.id)).kind, 'ok')
  assert.equal(pool.threads.length, 1)
  assert.equal(pool.threads[0]?.threadId, threadId)
})

test('R13: a pooled call after the server closed an idle keep-alive socket succeeds', async (t) => {
  // Like uvicorn: the server drops idle sockets after 1 s without a Keep-Alive hint.
  const { server, pool, outcome } = await setup(t, { keepAliveTimeoutMs: 1000, sendKeepAliveHint: false })
  const first = buildCallTask(server.url, '/echo')
  await pool.run({ calls: [first] })
  assert.equal((await outcome(first.id)).kind, 'ok')
  await once(server.events, 'disconnect')
  const second = buildCallTask(server.url, '/echo')
  await pool.run({ calls: [second] })
  assert.equal((await outcome(second.id)).kind, 'ok')
  assert.equal(server.connections, 2)
})

test('R13: sequential pooled calls reuse one keep-alive connection', async (t) => {
  const { server, pool, outcome } = await setup(t)
  for (let i = 0; i < 20; i++) {
    const call = buildCallTask(server.url, '/echo')
    await pool.run({ calls: [call] })
    assert.equal((await outcome(call.id)).kind, 'ok')
  }
  assert.ok(server.connections <= 2, `${server.connections} connections`)
})
