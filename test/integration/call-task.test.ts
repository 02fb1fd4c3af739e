// The worker's lane in a real piscina pool: batches of calls posted on the lane, outcomes
// streaming back on it, cancellation as a lane message (never a task abort), and idle keep-alive
// sockets surviving between batches.
import assert from 'node:assert/strict'
import { once } from 'node:events'
import { test } from 'node:test'
import type { TestContext } from 'node:test'
import type { MessagePort } from 'node:worker_threads'
import { Piscina } from 'piscina'
import { LANE_CALLS, LANE_CANCEL, OUTCOME_STRIDE, pushTask, readOutcome } from '../../src/workers/protocol.js'
import type { CallOutcome, CallTask, LaneHello, WorkerOptions } from '../../src/workers/protocol.js'
import { createLocalhostV6Ports } from '../../src/shared/loopback.js'
import { ReplyBudget } from '../../src/shared/reply-budget.js'
import { sourceWorkerModule, workerModule, type WorkerModule } from '../../src/main/dispatch/worker-module.js'
import { buildCallTask, startCallbackServer } from '../fixtures/callback-server.js'
import type { CallbackServer, CallbackServerOptions } from '../fixtures/callback-server.js'

// The task module the pool loads: the built dist/workers/call-task.js when it is fresh, else the
// .ts file with tsx in the thread (see src/main/dispatch/worker-module.ts).
const TASK = workerModule('call-task')

interface Harness {
  server: CallbackServer
  pool: Piscina
  /** Posts a batch on the worker's lane; resolves with its call count once all of its outcomes arrived. */
  run: (calls: CallTask[]) => Promise<number>
  /** Posts a cancel message for these call ids on the lane. */
  cancel: (ids: number[]) => void
  /** Resolves with the outcome of call `id` once it arrives from the worker. */
  outcome: (id: number) => Promise<CallOutcome>
  /** Call ids in the order their outcomes arrived. */
  arrivals: number[]
}

async function setup (t: TestContext, serverOptions: CallbackServerOptions = {}, task: WorkerModule = TASK):
Promise<Harness> {
  const server = await startCallbackServer(serverOptions)
  const workerData: WorkerOptions = {
    slotSpace: 1024,
    replyBudget: ReplyBudget.create(64 * 1024 * 1024),
    localhostV6Ports: createLocalhostV6Ports(),
    maxOriginReplyBytes: 32 * 1024 * 1024,
    connectionsPerOrigin: 8,
    keepAliveTimeoutMs: 4000,
    connectTimeoutMs: 2000
  }
  const pool = new Piscina({
    filename: task.url,
    execArgv: task.execArgv,
    workerData,
    atomics: 'disabled',
    maxThreads: 1,
    minThreads: 1
  })
  // piscina unrefs a worker that runs no task: keep this thread alive until the lane is announced.
  const keepAlive = setTimeout(() => {}, 30_000)
  const [hello] = await once(pool, 'message') as [LaneHello]
  clearTimeout(keepAlive)
  const lane: MessagePort = hello.toolportLane
  const arrived = new Map<number, CallOutcome>()
  const waiting = new Map<number, ((outcome: CallOutcome) => void)[]>()
  const arrivals: number[] = []
  lane.on('message', (message: unknown[]) => {
    for (let i = 0; i < message.length; i += OUTCOME_STRIDE) {
      const outcome = readOutcome(message, i)
      arrivals.push(outcome.id)
      arrived.set(outcome.id, outcome)
      for (const resolve of waiting.get(outcome.id) ?? []) resolve(outcome)
      waiting.delete(outcome.id)
    }
  })
  t.after(async () => {
    lane.close()
    await pool.destroy()
    await server.close()
  })
  async function run (calls: CallTask[]): Promise<number> {
    const message: unknown[] = [LANE_CALLS]
    for (const call of calls) pushTask(message, call.id, call)
    lane.postMessage(message)
    await Promise.all(calls.map((call) => outcome(call.id)))
    return calls.length
  }
  function cancel (ids: number[]): void {
    lane.postMessage([LANE_CANCEL, ...ids])
  }
  function outcome (id: number): Promise<CallOutcome> {
    const known = arrived.get(id)
    if (known !== undefined) return Promise.resolve(known)
    return new Promise((resolve) => { waiting.set(id, [...(waiting.get(id) ?? []), resolve]) })
  }
  return { server, pool, run, cancel, outcome, arrivals }
}

// Both when the built module is fresh (else the task runs from its source either way).
for (const task of TASK.typescript ? [TASK] : [TASK, sourceWorkerModule('call-task')]) {
  const from = task.typescript ? 'its .ts source, tsx in the thread' : 'the built dist/ module'
  test(`R9: a batch on the lane answers every call with its outcome (the task from ${from})`, async (t) => {
    await batchAnswersEveryCall(t, task)
  })
}

async function batchAnswersEveryCall (t: TestContext, task: WorkerModule): Promise<void> {
  const { server, run, outcome } = await setup(t, {}, task)
  const calls = [buildCallTask(server.url, '/echo'), buildCallTask(server.url, '/status/500'), buildCallTask(server.url,
    '/text')]
  const count = await run(calls)
  assert.equal(count, 3)
  const [echo, failed, text] = await Promise.all(calls.map((call) => outcome(call.id)))
  assert.equal(echo?.kind, 'ok')
  assert.deepEqual(JSON.parse(echo?.text ?? ''), JSON.parse(calls[0]?.body ?? ''))
  assert.equal(failed?.kind, 'http')
  assert.equal(failed?.status, 500)
  assert.equal(text?.kind, 'ok')
  assert.equal(text?.text, 'plain text reply, not JSON')
}

test('R12: a fast call arrives before a slow call of the same batch has finished', async (t) => {
  const { server, run, outcome, arrivals } = await setup(t)
  const slow = buildCallTask(server.url, '/sleep/1500')
  const fast = buildCallTask(server.url, '/echo')
  const batch = run([slow, fast])
  assert.equal((await outcome(fast.id)).kind, 'ok')
  assert.deepEqual(arrivals, [fast.id])
  assert.equal((await outcome(slow.id)).kind, 'ok')
  assert.equal(await batch, 2)
  assert.deepEqual(arrivals, [fast.id, slow.id])
})

test('R12: a cancel message aborts one call and the same worker keeps serving', async (t) => {
  const { server, pool, run, cancel, outcome } = await setup(t)
  const threadId = pool.threads[0]?.threadId
  const doomed = buildCallTask(server.url, '/sleep/30000')
  const survivor = buildCallTask(server.url, '/sleep/300')
  const batch = run([doomed, survivor])
  // Both requests reached the server, so both calls are in flight in the worker.
  await once(server.events, 'request')
  if (server.requests.length < 2) await once(server.events, 'request')
  cancel([doomed.id])
  assert.equal((await outcome(doomed.id)).kind, 'cancelled')
  assert.equal((await outcome(survivor.id)).kind, 'ok')
  assert.equal(await batch, 2)
  const next = buildCallTask(server.url, '/echo')
  assert.equal(await run([next]), 1)
  assert.equal((await outcome(next.id)).kind, 'ok')
  assert.equal(pool.threads.length, 1)
  assert.equal(pool.threads[0]?.threadId, threadId)
})

test('R13: a pooled call after the server closed an idle keep-alive socket succeeds', async (t) => {
  // Like uvicorn: the server drops idle sockets after 1 s without a Keep-Alive hint.
  const { server, run, outcome } = await setup(t, { keepAliveTimeoutMs: 1000, sendKeepAliveHint: false })
  const first = buildCallTask(server.url, '/echo')
  await run([first])
  assert.equal((await outcome(first.id)).kind, 'ok')
  await once(server.events, 'disconnect')
  const second = buildCallTask(server.url, '/echo')
  await run([second])
  assert.equal((await outcome(second.id)).kind, 'ok')
  assert.equal(server.connections, 2)
})

test('R13: sequential pooled calls reuse one keep-alive connection', async (t) => {
  const { server, run, outcome } = await setup(t)
  for (let i = 0; i < 20; i++) {
    const call = buildCallTask(server.url, '/echo')
    await run([call])
    assert.equal((await outcome(call.id)).kind, 'ok')
  }
  assert.ok(server.connections <= 2, `${server.connections} connections`)
})
