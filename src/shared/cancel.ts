// A caller's cancel, as Toolport's dispatch reads it: the part of AbortSignal it uses.
//
// Every call may carry one, and the HTTP call route needs one per request (a client that hangs
// up cancels its call). An AbortController costs ~4.5 µs to create and its EventTarget listeners
// ~2 µs more a call (measured on Node 20), a tenth of the route's main-thread time; `CallCancel`
// is the same contract for the few listeners a call has. An AbortSignal fits `CancelSignal` as is.

/** A listener: a function, or an object with `handleEvent` (no closure per call). */
export type CancelListener = (() => void) | { handleEvent: () => void }

/** What dispatch needs of a cancel signal; an AbortSignal is one. */
export interface CancelSignal {
  readonly aborted: boolean
  addEventListener: (type: 'abort', listener: CancelListener, options?: { once?: boolean }) => void
  removeEventListener: (type: 'abort', listener: CancelListener) => void
}

/**
 * A one-shot cancel signal without EventTarget. Listeners run once, in order, on `abort()`;
 * one added after the abort never runs (as with AbortSignal).
 *
 * @example
 * const cancel = new CallCancel()
 * reply.raw.once('close', () => cancel.abort())
 * await runtime.callTool(role, call, { signal: cancel })
 */
export class CallCancel implements CancelSignal {
  #aborted = false
  #listeners: CancelListener[] | null = null

  get aborted (): boolean { return this.#aborted }

  addEventListener (type: 'abort', listener: CancelListener): void {
    if (this.#aborted) return
    this.#listeners ??= []
    this.#listeners.push(listener)
  }

  removeEventListener (type: 'abort', listener: CancelListener): void {
    const listeners = this.#listeners
    if (listeners === null) return
    const i = listeners.indexOf(listener)
    if (i !== -1) listeners.splice(i, 1)
  }

  /** Cancels: runs every listener once; later calls do nothing. */
  abort (): void {
    if (this.#aborted) return
    this.#aborted = true
    const listeners = this.#listeners
    this.#listeners = null
    if (listeners === null) return
    for (const listener of listeners) {
      if (typeof listener === 'function') listener()
      else listener.handleEvent()
    }
  }
}
