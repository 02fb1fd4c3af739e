// The budget on reply bytes buffered at once, shared by every thread of one dispatcher.
//
// Replies are read into memory until they are complete (capped per call by
// `dispatch.maxResponseBytes`); without a global bound, many concurrent large replies from
// plugins on several ports (each port its own connection cap) could take the process's memory.
// Every chunk a call keeps is taken from this budget before it is kept, and given back when the
// call settles; a chunk that does not fit ends its call with the outcome kind `memory`. The counter
// lives in a SharedArrayBuffer so the main thread (inline mode, /metrics) and every worker see
// and update the same number with Atomics.

/** Index of the bytes-in-use counter; index 1 holds the limit. */
const USED = 0
const LIMIT = 1

export class ReplyBudget {
  readonly #cells: Int32Array

  /** `buffer`: from `ReplyBudget.create` (possibly on another thread). */
  constructor (buffer: SharedArrayBuffer) {
    this.#cells = new Int32Array(buffer)
  }

  /** A new shared budget of `limitBytes` (at most 2^30, so the counter never overflows an int32). */
  static create (limitBytes: number): SharedArrayBuffer {
    const buffer = new SharedArrayBuffer(8)
    Atomics.store(new Int32Array(buffer), LIMIT, limitBytes)
    return buffer
  }

  /** Takes `bytes` from the budget; false (and nothing taken) when they do not fit. */
  take (bytes: number): boolean {
    const cells = this.#cells
    const used = Atomics.add(cells, USED, bytes) + bytes
    if (used <= (cells[LIMIT] as number)) return true
    Atomics.sub(cells, USED, bytes)
    return false
  }

  /** Gives back bytes taken earlier. */
  give (bytes: number): void {
    if (bytes > 0) Atomics.sub(this.#cells, USED, bytes)
  }

  /** Bytes taken now, over every thread. */
  get used (): number {
    return Atomics.load(this.#cells, USED)
  }

  get limit (): number {
    return Atomics.load(this.#cells, LIMIT)
  }
}
