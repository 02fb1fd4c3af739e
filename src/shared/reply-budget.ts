// The budget on reply bytes buffered at once, shared by every thread of one dispatcher.
//
// Replies are read into memory until they are complete (capped per call by
// `dispatch.maxResponseBytes`); without a global bound, many concurrent large replies from
// plugins on several ports (each port its own connection cap) could take the process's memory.
// Every chunk a call keeps is taken from this budget before it is kept, and given back when the
// call settles; a chunk that does not fit ends its call with the outcome kind `memory`. The counter
// lives in a SharedArrayBuffer so the main thread (inline mode, /metrics) and every worker see
// and update the same number with Atomics.
//
// A pool worker also counts what it holds in a share of its own (`createShare`), which it hands
// to the main thread with its lane. A worker that exits mid-reply (a crash, or `close()`
// destroying the pool) never gives its bytes back; once it is gone the main thread takes its share
// out of the counter (`reclaim`), so the budget does not shrink for good with each such exit.

/** Index of the bytes-in-use counter; index 1 holds the limit. */
const USED = 0
const LIMIT = 1

export class ReplyBudget {
  readonly #cells: Int32Array
  readonly #share: Int32Array | null

  /**
   * `buffer`: from `ReplyBudget.create` (possibly on another thread). `share`: from
   * `ReplyBudget.createShare`, this thread's own count of what it holds, for `reclaim`.
   */
  constructor (buffer: SharedArrayBuffer, share?: SharedArrayBuffer) {
    this.#cells = new Int32Array(buffer)
    this.#share = share === undefined ? null : new Int32Array(share)
  }

  /** A new shared budget of `limitBytes` (at most 2^30, so the counter never overflows an int32). */
  static create (limitBytes: number): SharedArrayBuffer {
    const buffer = new SharedArrayBuffer(8)
    Atomics.store(new Int32Array(buffer), LIMIT, limitBytes)
    return buffer
  }

  /** A new share: one thread's count of the bytes it holds (see the file's header). */
  static createShare (): SharedArrayBuffer {
    return new SharedArrayBuffer(4)
  }

  // take() and give() update the counter and the share with no JavaScript call or loop between
  // them (only the Atomics builtins), so a thread terminated by Worker.terminate() (which stops
  // JavaScript only at such points) never stops between the two.

  /** Takes `bytes` from the budget; false (and nothing taken) when they do not fit. */
  take (bytes: number): boolean {
    const cells = this.#cells
    const used = Atomics.add(cells, USED, bytes) + bytes
    if (used <= (cells[LIMIT] as number)) {
      if (this.#share !== null) Atomics.add(this.#share, 0, bytes)
      return true
    }
    Atomics.sub(cells, USED, bytes)
    return false
  }

  /** Gives back bytes taken earlier. */
  give (bytes: number): void {
    if (bytes <= 0) return
    Atomics.sub(this.#cells, USED, bytes)
    if (this.#share !== null) Atomics.sub(this.#share, 0, bytes)
  }

  /**
   * Gives back whatever the thread that owned `share` still held. Only once that thread can no
   * longer run (it exited); a second call gives back nothing more.
   */
  reclaim (share: SharedArrayBuffer): void {
    const held = Atomics.exchange(new Int32Array(share), 0, 0)
    if (held > 0) Atomics.sub(this.#cells, USED, held)
  }

  /** Bytes taken now, over every thread. */
  get used (): number {
    return Atomics.load(this.#cells, USED)
  }

  get limit (): number {
    return Atomics.load(this.#cells, LIMIT)
  }
}
