// Consecutive connection-level failures per callback origin (docs/protocol.md R13, "Eviction").
//
// Only calls to `plugin:` tools count. A connection-level failure (the connection could not be
// established) increments; any HTTP response from the origin (also one over maxResponseBytes, or
// a 2xx refused for its Content-Encoding) and any new registration there reset. Read timeouts,
// broken replies and replies dropped for the reply-byte budget neither count nor reset. Reaching
// the threshold returns true once.
//
// Each origin has an epoch that a reset or an eviction advances; a call records its outcome
// against the epoch it was dispatched in, so failures of calls sent before a re-registration (or
// before an eviction) can never count against the tools registered after it. Epochs come from one
// counter for all origins, so an origin forgotten and registered again never reuses an epoch that
// calls still queued from before hold.
import { ENCODED_REPLY_CODE, type CallOutcome } from '../../workers/protocol.js'

/** What a call's outcome says of its origin (docs/protocol.md "Eviction"). */
export type OriginVerdict = 'unreachable' | 'answered' | 'neither'

/** The verdict on a call's origin from its outcome. */
export function originVerdict (outcome: Pick<CallOutcome, 'kind' | 'message'>): OriginVerdict {
  switch (outcome.kind) {
    case 'connect': return 'unreachable'
    case 'ok': case 'http': case 'too_large': return 'answered'
    // The one `protocol` outcome with a whole HTTP reply head behind it: a compressed 2xx.
    case 'protocol': return outcome.message.startsWith(ENCODED_REPLY_CODE) ? 'answered' : 'neither'
    default: return 'neither'
  }
}

interface OriginState {
  failures: number
  epoch: number
}

export class OriginHealth {
  readonly #origins = new Map<string, OriginState>()
  readonly #threshold: number
  /** The last epoch handed out (0: an origin never registered). */
  #lastEpoch = 0

  constructor (threshold: number) {
    this.#threshold = threshold
  }

  /** The origin's current epoch; pass it back to `record` with the call's outcome. */
  epoch (origin: string): number {
    return this.#origins.get(origin)?.epoch ?? 0
  }

  /** Records a call's verdict; true when the origin has just reached the eviction threshold. */
  record (origin: string, verdict: OriginVerdict, countsForEviction: boolean, epoch: number): boolean {
    const state = this.#origins.get(origin)
    if (verdict === 'unreachable') {
      if (!countsForEviction) return false
      if (state === undefined) {
        if (epoch !== 0) return false
        if (this.#threshold <= 1) {
          this.#origins.set(origin, { failures: 0, epoch: ++this.#lastEpoch })
          return true
        }
        this.#origins.set(origin, { failures: 1, epoch: 0 })
        return false
      }
      if (state.epoch !== epoch) return false
      state.failures++
      if (state.failures < this.#threshold) return false
      // Evicting: later failures of calls already in flight belong to the old epoch.
      state.failures = 0
      state.epoch = ++this.#lastEpoch
      return true
    }
    if (verdict === 'answered' && state !== undefined && state.epoch === epoch) state.failures = 0
    return false
  }

  /** A new registration at the origin: start counting afresh. */
  reset (origin: string): void {
    const state = this.#origins.get(origin)
    if (state === undefined) this.#origins.set(origin, { failures: 0, epoch: ++this.#lastEpoch })
    else {
      state.failures = 0
      state.epoch = ++this.#lastEpoch
    }
  }

  /** Forgets origins that no registry uses any more (keeps the map bounded). */
  forget (isInUse: (origin: string) => boolean): void {
    for (const origin of this.#origins.keys()) {
      if (!isInUse(origin)) this.#origins.delete(origin)
    }
  }

  /** Current consecutive failures at an origin (0 when healthy). */
  failures (origin: string): number {
    return this.#origins.get(origin)?.failures ?? 0
  }

  get threshold (): number { return this.#threshold }
}
