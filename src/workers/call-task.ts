// The piscina task: runs a batch of callback calls on this worker thread.
//
// Outcomes do not travel back as the task's return value: a batch's fast call must not wait for
// its slow one, so each outcome is posted on this thread's parentPort as soon as it exists,
// coalesced per event-loop turn (one postMessage carries every outcome that finished in the same
// turn, which matters at ~80 µs per message). The task itself resolves, with the number of calls,
// only after all of its outcomes have been posted.
//
// Cancellation is a message on the cancel channel, never piscina's task `signal`: aborting a
// running piscina task terminates the whole thread and every keep-alive socket in it.
//
// Module-level state is per thread (STYLE §2): one CallbackClient, the in-flight controllers and
// the outcomes waiting for the next flush.
import { BroadcastChannel, parentPort, workerData, type MessagePort } from 'node:worker_threads'
import { CallbackClient } from './callback-client.js'
import type { BatchTask, CallOutcome, CallTask, WorkerOptions } from './protocol.js'

const options = workerData as WorkerOptions

const client = new CallbackClient({
  connectionsPerOrigin: options.connectionsPerOrigin,
  keepAliveTimeoutMs: options.keepAliveTimeoutMs,
  connectTimeoutMs: options.connectTimeoutMs,
  maxImages: options.maxImages,
  maxImageBytes: options.maxImageBytes
})

// Point to point to the main thread (piscina re-emits it as the pool's 'message' event).
const results = parentPort as MessagePort
const cancels = new BroadcastChannel(options.cancelChannel)
// The cancel channel must not keep the thread alive; piscina's own port does while the pool wants it.
cancels.unref()

cancels.onmessage = function onCancel (event: unknown): void {
  // The main thread broadcasts to every thread; ids that run elsewhere are simply absent here.
  const ids = (event as MessageEvent).data as unknown
  if (!Array.isArray(ids)) return
  for (const id of ids) {
    client.cancel(id as number)
  }
}

let pending: CallOutcome[] = []
let flushed: Promise<void> | null = null
let resolveFlushed: (() => void) | null = null

function flush (): void {
  const batch = pending
  const resolve = resolveFlushed
  pending = []
  flushed = null
  resolveFlushed = null
  results.postMessage(batch)
  resolve?.()
}

function captureFlushResolver (resolve: () => void): void {
  resolveFlushed = resolve
}

/** Queues an outcome for this turn's message; resolves once that message was posted. */
function post (outcome: CallOutcome): Promise<void> {
  pending.push(outcome)
  if (flushed === null) {
    flushed = new Promise<void>(captureFlushResolver)
    setImmediate(flush)
  }
  return flushed
}

async function runCall (task: CallTask): Promise<void> {
  // Cancellation goes through client.cancel(id), so no AbortController per call.
  await post(await client.call(task))
}

/**
 * Runs every call of the batch concurrently and resolves with the number of calls once all of
 * their outcomes were posted to the main thread.
 *
 * @example
 * await pool.run({ calls: [task] }) // 1; the outcome arrives as the pool's 'message' event
 */
export default async function runBatch (batch: BatchTask): Promise<number> {
  const calls = batch.calls
  const running: Promise<void>[] = new Array(calls.length)
  for (let i = 0; i < calls.length; i++) {
    running[i] = runCall(calls[i] as CallTask)
  }
  await Promise.all(running)
  return calls.length
}
