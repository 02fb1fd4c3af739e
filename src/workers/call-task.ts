// The worker thread's side of its lane: runs the callback calls the main thread posts on it.
//
// piscina owns this thread's lifecycle (start, restart after a crash, destroy), but calls never
// travel as piscina tasks: a task holds one of the worker's task slots until it resolves, so calls
// waiting on a plugin that never answers would fill the slots and stall every other plugin's
// calls. Instead this module, loaded when the thread starts, opens a lane (a MessageChannel of its
// own) and announces it once on its parentPort (piscina re-emits that as the pool's 'message'
// event). The main thread then posts each event-loop turn's calls on the lane as one flat array
// and cancels calls there; outcomes go back on the lane as each call finishes, coalesced per turn
// (one postMessage carries every outcome that finished in the same turn), so a fast call never
// waits for a slow one and nothing bounds how many calls wait on the network here: the
// dispatcher's per-origin bounds do that on the main thread.
//
// Module-level state is per thread: one CallbackClient and the outcomes waiting for
// the next flush.
import { MessageChannel, parentPort, workerData } from 'node:worker_threads'
import { CallbackClient } from '../shared/callback-client.js'
import { ReplyBudget } from '../shared/reply-budget.js'
import { LANE_CALLS, LANE_CANCEL, pushOutcome, readTask, TASK_STRIDE } from './protocol.js'
import type { CallOutcome, LaneHello, WorkerOptions } from './protocol.js'

const options = workerData as WorkerOptions

// What this thread holds of the reply budget: the main thread gives it back if the thread exits.
const replyShare = ReplyBudget.createShare()
const client = new CallbackClient({
  connectionsPerOrigin: options.connectionsPerOrigin,
  keepAliveTimeoutMs: options.keepAliveTimeoutMs,
  connectTimeoutMs: options.connectTimeoutMs,
  largeTextBytes: options.largeTextBytes,
  maxImages: options.maxImages,
  maxImageBytes: options.maxImageBytes,
  slotSpace: options.slotSpace,
  replyBudget: options.replyBudget,
  localhostV6Ports: options.localhostV6Ports,
  maxOriginReplyBytes: options.maxOriginReplyBytes,
  replyShare
})

const lane = new MessageChannel()
const port = lane.port1
// piscina's own port keeps the thread alive while the pool wants it; the lane must not.
port.unref()

let pending: unknown[] = []
// Buffers of large texts in `pending`, moved to the main thread rather than copied.
let transfer: ArrayBuffer[] = []
let isFlushScheduled = false

function flush (): void {
  const message = pending
  const moved = transfer
  pending = []
  transfer = []
  isFlushScheduled = false
  if (moved.length === 0) port.postMessage(message)
  else port.postMessage(message, moved)
}

function post (outcome: CallOutcome): void {
  pushOutcome(pending, outcome, transfer)
  if (client.running === 0 && !isFlushScheduled) {
    // The last call running here: no other outcome can join this turn's message, so it goes now
    // instead of one event-loop turn later (a lone caller's latency).
    flush()
    return
  }
  if (!isFlushScheduled) {
    isFlushScheduled = true
    setImmediate(flush)
  }
}

port.on('message', function onLaneMessage (message: unknown): void {
  if (!Array.isArray(message) || message.length === 0) return
  if (message[0] === LANE_CALLS) {
    for (let i = 1; i + TASK_STRIDE <= message.length; i += TASK_STRIDE) client.start(readTask(message, i), post)
  } else if (message[0] === LANE_CANCEL) {
    // Ids that already finished here are simply absent.
    for (let i = 1; i < message.length; i++) client.cancel(message[i] as number)
  }
})

const hello: LaneHello = { toolportLane: lane.port2, replyShare }
parentPort?.postMessage(hello, [lane.port2])

/**
 * piscina needs a task function; the dispatcher never runs tasks (calls travel on the lane).
 * Resolves with this thread's count of calls in flight, for diagnostics.
 */
export default function laneStatus (): number {
  return client.running
}
