// The main thread's time in argument checks, shared out (SECURITY.md "Argument validation").
//
// `limits.maxValidationMs` bounds one check; nothing bounded their sum. A tool whose schema is an
// `anyOf` of two self-`$ref` branches, called with an argument nested 40 deep, runs each check to
// that deadline (50–75 ms) before it is refused, and 32 connections calling it in a loop took
// another plugin's calls from 7 ms to 1.75 s at p50. So checks that take long draw on accounts:
//
// - Each tool's (its `ToolEntry`'s) may take one check's deadline (`maxValidationMs`) per second,
//   5 % of the thread by default, with one deadline's worth of burst.
// - The thread's, all tools together, five deadlines per second (25 %), so that any number of
//   tools, each with an account of its own, cannot take the thread either.
//
// While a tool's account is overdrawn, its checks are cut short: each stops once it has done 2^16
// units of work (CUT_SHORT_UNITS: tens of microseconds; a whole refused call of the schema above
// took 0.1–0.2 ms in-process), and the call is refused unsent (outcome `check_budget`). While the
// thread's is, every other tool's checks stop once they would be costly (CHEAP_UNITS, 0.1–1 ms of
// work): the tools that take long cannot take the thread, and the cheap checks of every other
// tool (a few hundred strings of a `format`, a list of small objects) pass as ever. Those stops
// are charged too; once the thread's debt reaches twice its allowance (many tools, each stopped
// at the quantum), every check is cut short until it is back under that.
// Checks that finish before their cut pass: a tool that someone calls with arguments its schema
// takes long to check goes on answering the calls it can check at once.
//
// Only costly checks are charged: those that run past one quantum of the budget, which read the
// clock anyway; a cheap check reads it once, at its start, and costs two boolean reads more here.
// The accounts drain lazily (the debt left is worked out from the time of the last change when
// one is looked at), so nothing runs between calls.

/**
 * The main thread's time one tool's argument checks took lately: a leaky bucket in ms, which
 * drains at one `maxValidationMs` per second. Mutable state of an otherwise immutable ToolEntry.
 */
export class CheckTime {
  /** Costly check time not yet drained, as of `at`. */
  debtMs = 0
  /** When `debtMs` was last worked out (`performance.now()`). */
  at = 0
  /** `debtMs` passed the allowance: look at the clock before the next check. */
  isOverdrawn = false
  /**
   * The last refused call was cut short by an account (this one's or the thread's), not refused
   * by its arguments: its outcome is `check_budget`. Set on every refusal, read only after one.
   */
  refused = false
}

/** Checks of deadline length all tools together may run per second before checks are cut short. */
const THREAD_CHECKS_PER_SECOND = 5

/**
 * Past the thread's allowance, checks that would be costly are stopped at the quantum; each such
 * stop is still up to ~1 ms, charged to its tool's account, so many tools could keep many of them
 * going. Once the thread's debt is twice its allowance (overdrawn for more than this long), every
 * check is cut short, as an overdrawn tool's are.
 */
export const THREAD_CUT_SHORT_AFTER_MS = 1000

/** The thread's account: every tool's costly checks (per thread; checks run on the main thread). */
const thread = new CheckTime()

/** Works out the debt left at `now`, the account draining `allowanceMs` per second. */
function drain (account: CheckTime, now: number, allowanceMs: number): void {
  account.debtMs = Math.max(0, account.debtMs - (now - account.at) * allowanceMs / 1000)
  account.at = now
}

/**
 * How much longer, in ms, an account marked `isOverdrawn` stays overdrawn, draining `allowanceMs`
 * a second; 0 once its debt is back under `allowanceMs` (and then it is no longer marked).
 */
export function overdrawnForMs (account: CheckTime, allowanceMs: number): number {
  drain(account, performance.now(), allowanceMs)
  if (account.debtMs > allowanceMs) return (account.debtMs - allowanceMs) * 1000 / allowanceMs
  account.isOverdrawn = false
  return 0
}

/**
 * How long, in ms, all tools' costly checks stay past the thread's allowance (0: they are not).
 * Past THREAD_CUT_SHORT_AFTER_MS (a debt of twice the allowance) every check is cut short.
 */
export function threadOverdrawnForMs (maxValidationMs: number): number {
  if (!thread.isOverdrawn) return 0
  return overdrawnForMs(thread, maxValidationMs * THREAD_CHECKS_PER_SECOND)
}

/** The thread's account itself, for tests that must hold it at a given debt. */
export function threadCheckTime (): CheckTime {
  return thread
}

/** Charges a costly check of `spentMs` to its tool's account and to the thread's. */
export function chargeCheck (account: CheckTime, spentMs: number, maxValidationMs: number): void {
  const now = performance.now()
  charge(account, now, spentMs, maxValidationMs)
  charge(thread, now, spentMs, maxValidationMs * THREAD_CHECKS_PER_SECOND)
}

/** Adds `spentMs` to an account draining `allowanceMs` a second; marks it once past the allowance. */
function charge (account: CheckTime, now: number, spentMs: number, allowanceMs: number): void {
  drain(account, now, allowanceMs)
  account.debtMs += spentMs
  if (account.debtMs > allowanceMs) account.isOverdrawn = true
}
