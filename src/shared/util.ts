// Small helpers every layer uses (main thread, workers, plugin SDK). Pure, no imports: safe to load
// from any thread or process (docs/architecture.md "Import rules").

/** Does nothing: the handler of a promise whose rejection is already accounted for elsewhere. */
export function noop (): void {}

/**
 * Calls each of an emitter's `listeners` (its `rawListeners`) with `args`, guarded: a listener
 * that throws, or returns a promise that rejects, is reported to `failed` with the event's name,
 * and the listeners after it still run (EventEmitter's own emit would stop at the throw, and leave
 * the rejection unhandled). False when there were none, as emit answers.
 */
export function callListeners (emitter: unknown, listeners: readonly Function[], args: readonly unknown[],
  event: string | symbol, failed: (event: string | symbol, err: unknown) => void): boolean {
  for (const listener of listeners) {
    try {
      const returned: unknown = listener.apply(emitter, args)
      if (isThenable(returned)) returned.then(undefined, (err: unknown) => { failed(event, err) })
    } catch (err) {
      failed(event, err)
    }
  }
  return listeners.length > 0
}

function isThenable (value: unknown): value is PromiseLike<unknown> {
  return (typeof value === 'object' || typeof value === 'function') && value !== null &&
    typeof (value as { then?: unknown }).then === 'function'
}

/**
 * A bad option's value as an error message names it: a string quoted, an object or array by its
 * kind (never its contents, nor a `toString` that may throw), anything else as `String` writes it.
 *
 * @example
 * describeValue('false') // '"false"'
 * describeValue({ toolport: 1 }) // 'an object'
 */
export function describeValue (value: unknown): string {
  if (typeof value === 'string') return JSON.stringify(value)
  if (typeof value === 'function') return 'a function'
  if (typeof value === 'object' && value !== null) return Array.isArray(value) ? 'an array' : 'an object'
  return String(value)
}

/**
 * A one-line description of a thrown value, never a stack trace: the message (or the error's name
 * when the message is empty), the string thrown, or "unknown error".
 *
 * @example
 * errorText(new SyntaxError('Unexpected token')) // 'Unexpected token'
 */
export function errorText (err: unknown): string {
  try {
    if (typeof err === 'string') return err
    if (err instanceof Error) {
      // Read once each, and only strings: an error's `message` may be any value a program set,
      // or a getter that throws (as `instanceof` may on a revoked Proxy): never a throw here.
      const message: unknown = err.message
      if (typeof message === 'string' && message !== '') return message
      const name: unknown = err.name
      if (typeof name === 'string') return name
    }
  } catch {
    // A thrown value that cannot even be looked at.
  }
  return 'unknown error'
}

/**
 * What a tool's handler threw, as the error the model reads: an Error's message (its name when the
 * message is empty), a string as it is, else the value's JSON or its string. Never throws.
 *
 * @example
 * thrownText({ code: 7 }) // '{"code":7}'
 */
export function thrownText (err: unknown): string {
  try {
    // `instanceof` itself throws on a revoked Proxy.
    if (typeof err === 'string' || err instanceof Error) return errorText(err)
    const json = JSON.stringify(err)
    if (json !== undefined) return json
  } catch {
    // a cycle, a BigInt, a revoked Proxy: its string below
  }
  try {
    return String(err)
  } catch {
    return errorText(err)
  }
}

/**
 * Freezes `value` and every object and array reachable from it, iteratively (any depth), and
 * returns it. An object already frozen is taken as frozen all the way down (as this leaves it).
 */
export function deepFreeze<T> (value: T): T {
  const stack: unknown[] = [value]
  while (stack.length > 0) {
    const item = stack.pop()
    if (typeof item !== 'object' || item === null || Object.isFrozen(item)) continue
    Object.freeze(item)
    for (const child of Object.values(item)) {
      if (typeof child === 'object' && child !== null) stack.push(child)
    }
  }
  return value
}

/** A plain JSON object: not null, not an array. */
export function isPlainObject (value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value)
}

/**
 * Length in Unicode code points, as Toolport counts a tool name (docs/protocol.md R7): a surrogate
 * pair is one character, not two UTF-16 units.
 */
export function codePointLength (s: string): number {
  // The string iterator walks code points.
  return [...s].length
}

/**
 * True when `s` is well-formed Unicode: no lone surrogate, which has no UTF-8 form (so no URL or
 * UTF-8 body can carry it). A function of its own for zod's `refine` and the SDK's checks.
 */
export function isWellFormedText (s: string): boolean {
  return s.isWellFormed()
}

/** setTimeout's largest delay (~24.8 days); a larger one fires at once. */
export const MAX_TIMER_MS = 2 ** 31 - 1

/**
 * Bytes `socket` has still to send: what its stream buffers plus libuv's write queue. The
 * stream's count drops only once a whole chunk is written (an answer can be one chunk of tens of
 * MB), libuv's as the peer reads; so this falls as soon as the peer takes any part, and is above
 * 0 while the kernel's buffer is full.
 */
export function unsentBytes (socket: { readonly writableLength: number }): number {
  const queue = (socket as { _handle?: { writeQueueSize?: unknown } | null })._handle?.writeQueueSize
  return socket.writableLength + (typeof queue === 'number' ? queue : 0)
}
