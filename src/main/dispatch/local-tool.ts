// Local (in-process) tools: the handler runs on the main thread, held to the tool's deadline and
// to the caller's cancellation like a callback call is, and never throws into the Runtime.
import type { ToolEntry } from '../roles/tool-registry.js'
import { errorResult, outputResult, type ToolResult } from './result.js'
import { errorText, noop, thrownText } from '../../shared/util.js'
import type { CancelSignal } from '../../shared/cancel.js'

/** How a local tool's call ended (a `call-finished` event's outcome, as for a callback call) and its result. */
export interface LocalOutcome {
  outcome: 'ok' | 'local_error' | 'timeout' | 'cancelled'
  result: ToolResult
}

/**
 * Runs an in-process tool with the tool's deadline; a throw becomes a tool error result. While it
 * runs, its cancel function sits in `running`, so that `close()` can answer it as cancelled (which
 * also clears its deadline timer, the one handle a stuck handler would otherwise keep alive).
 * The handler's signal aborts with the reasons fetch, timers and the plugin SDK's handlers use: a
 * `TimeoutError` DOMException at the deadline, an `AbortError` one when the call is cancelled.
 */
export async function runLocalTool (entry: ToolEntry, args: unknown, role: string, callId: string,
  signal: CancelSignal | undefined, running: Set<() => void>): Promise<LocalOutcome> {
  const handler = entry.handler
  if (handler === null) return { outcome: 'local_error', result: errorResult(`tool '${entry.name}' has no handler`) }
  if (signal?.aborted === true) return { outcome: 'cancelled', result: errorResult(`tool '${entry.name}' call was cancelled`) }
  const controller = new AbortController()
  let timer: NodeJS.Timeout | undefined
  let cancel: () => void = noop
  const stopped = new Promise<LocalOutcome>((resolve) => {
    timer = setTimeout(() => {
      controller.abort(new DOMException(`the tool's deadline of ${entry.timeoutMs} ms passed`, 'TimeoutError'))
      resolve({ outcome: 'timeout', result: errorResult(`tool '${entry.name}' timed out after ${entry.timeoutMs / 1000} s`) })
    }, entry.timeoutMs)
    cancel = () => {
      controller.abort(new DOMException('the call was cancelled', 'AbortError'))
      resolve({ outcome: 'cancelled', result: errorResult(`tool '${entry.name}' call was cancelled`) })
    }
  })
  running.add(cancel)
  signal?.addEventListener('abort', cancel, { once: true })
  const ran = (async (): Promise<LocalOutcome> => {
    let result: ToolResult
    try {
      result = localResult(entry.name, await handler(args, { role, callId, signal: controller.signal }))
    } catch (err) {
      result = errorResult(thrownText(err))
    }
    return { outcome: result.is_error ? 'local_error' : 'ok', result }
  })()
  try {
    return await Promise.race([ran, stopped])
  } finally {
    clearTimeout(timer)
    running.delete(cancel)
    signal?.removeEventListener('abort', cancel)
  }
}

/**
 * A handler's value as a plugin's reply would carry it: the JSON value `JSON.stringify` makes of it
 * (a Date is its string, a class instance or Map a plain object, `undefined` null), so that every
 * session reads the same output and text. A value JSON cannot encode (a BigInt, a cycle, nesting
 * past the stack) is a tool error, never a text that pretends to be the output.
 */
function localResult (name: string, value: unknown): ToolResult {
  if (typeof value === 'string') return outputResult(value)
  let json: string | undefined
  try {
    json = JSON.stringify(value)
  } catch (err) {
    return errorResult(`tool '${name}' returned an output that cannot be encoded as JSON (${errorText(err)})`)
  }
  // Nothing returned (or a function, a symbol): null, as the plugin SDKs send it.
  if (json === undefined) return outputResult(null)
  const output: unknown = JSON.parse(json)
  // The text is that JSON already (outputResult would encode the output again), a string as-is.
  return typeof output === 'string' ? outputResult(output) : { is_error: false, output, text: json }
}
