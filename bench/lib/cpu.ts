// CPU accounting per thread, from Linux's scheduler statistics.
//
// `/proc/<pid>/task/<tid>/schedstat` holds, per thread, the nanoseconds it ran on a CPU and the
// nanoseconds it sat runnable on a run queue waiting for one. Both are exact (not the 10 ms ticks
// of /proc/<pid>/stat) and both keep counting on VMs where /proc/stat's machine totals do not move.
// The bench reads them to split CPU per call into the main thread, the pool's worker threads, the
// process's other threads (GC helpers, the JIT compiler, libuv) and the callback server, and to
// flag a window during which other processes took the cores: its threads then waited on the run
// queue far more than they ran. Off Linux every figure is NaN and nothing is flagged.
import { readdirSync, readFileSync } from 'node:fs'
import { readFile } from 'node:fs/promises'
import { availableParallelism } from 'node:os'

/** Estimated share of the cores taken by other processes above which a window is flagged. */
export const CONTENDED_SHARE = 0.25

const CORES = Math.max(1, availableParallelism())

interface Sched { runNs: number, waitNs: number }

function readSched (pid: number | 'self', tid: string): Sched | null {
  try {
    const text = readFileSync(`/proc/${pid}/task/${tid}/schedstat`, 'utf8')
    const space = text.indexOf(' ')
    const space2 = text.indexOf(' ', space + 1)
    return { runNs: Number(text.slice(0, space)), waitNs: Number(text.slice(space + 1, space2)) }
  } catch {
    return null
  }
}

function taskIds (pid: number | 'self'): string[] {
  try {
    return readdirSync(`/proc/${pid}/task`)
  } catch {
    return []
  }
}

/** Every thread of a process: tid → scheduler times. */
function threads (pid: number | 'self'): Map<string, Sched> {
  const out = new Map<string, Sched>()
  for (const tid of taskIds(pid)) {
    const s = readSched(pid, tid)
    if (s !== null) out.set(tid, s)
  }
  return out
}

/** Thread ids of this process that run dispatch worker threads (see `captureNewThreads`). */
const workerTids = new Set<string>()

/**
 * Runs `create` (which starts worker threads, e.g. a Toolport in pool mode) and records the
 * threads of this process that appeared during it as pool workers. libuv's thread pool is started
 * first, so its threads are not mistaken for workers.
 */
export async function captureNewThreads<T> (create: () => Promise<T>): Promise<T> {
  await readFile('/proc/self/stat').catch(() => null)
  const before = new Set(taskIds('self'))
  const value = await create()
  for (const tid of taskIds('self')) if (!before.has(tid)) workerTids.add(tid)
  return value
}

/** The thread ids recorded as pool workers by `captureNewThreads` (still alive). */
export function workerThreadIds (): number[] {
  pruneWorkers()
  return [...workerTids].map(Number)
}

/** Forgets worker thread ids whose threads have exited (their tids may be reused). */
function pruneWorkers (): void {
  const alive = new Set(taskIds('self'))
  for (const tid of workerTids) if (!alive.has(tid)) workerTids.delete(tid)
}

/** CPU figures of one measuring window, in µs of CPU per completed call. */
export interface CpuPerCall {
  /** This process, every thread (process.cpuUsage; includes threads that exited in the window). */
  processUs: number
  /** This process's main thread. */
  mainThreadUs: number
  /** The dispatch pool's worker threads (0 inline). */
  workerUs: number
  /** The process's other threads: GC helpers, JIT compiler, libuv (process − main − workers). */
  otherUs: number
  /** The peer process, every thread (e.g. the callback server). */
  peerUs: number
  /**
   * Estimated share of the machine's cores that other processes took during the window (0–1):
   * the time our threads (this process, the peer and `extraUs`) waited on a run queue, capped by
   * the core time they left unused. Our threads waiting while they also kept every core busy is
   * our own oversubscription (e.g. three busy threads on two cores), not foreign load.
   */
  foreignShare: number
  /** True when `foreignShare` passed CONTENDED_SHARE: read this window's absolute figures with care. */
  contended: boolean
}

interface Snapshot {
  wallNs: number
  process: number
  self: Map<string, Sched>
  peer: Map<string, Sched>
}

function sum (after: Map<string, Sched>, before: Map<string, Sched>, pick: (tid: string) => boolean): Sched {
  let runNs = 0
  let waitNs = 0
  for (const [tid, a] of after) {
    if (!pick(tid)) continue
    const b = before.get(tid)
    runNs += a.runNs - (b?.runNs ?? 0)
    waitNs += a.waitNs - (b?.waitNs ?? 0)
  }
  return { runNs, waitNs }
}

/** Measuring windows ended so far, and how many of them were flagged as contended. */
export const windowCounts = { measured: 0, contended: 0 }

/** Measures CPU between `begin()` and `end(calls)`; `peerPid` is another process to account. */
export class CpuMeter {
  readonly #peerPid: number | null
  readonly #counts: boolean
  #start: Snapshot | null = null

  /** `counts`: false for a meter over a whole run rather than one measuring window. */
  constructor (peerPid: number | null = null, counts = true) {
    this.#peerPid = peerPid
    this.#counts = counts
  }

  #snapshot (): Snapshot {
    const usage = process.cpuUsage()
    return {
      wallNs: Number(process.hrtime.bigint()),
      process: usage.user + usage.system,
      self: threads('self'),
      peer: this.#peerPid === null ? new Map() : threads(this.#peerPid)
    }
  }

  begin (): void {
    pruneWorkers()
    this.#start = this.#snapshot()
  }

  /** `extraUs`: CPU µs of other bench processes in the window (e.g. the load generator). */
  end (calls: number, extraUs = 0): CpuPerCall {
    const after = this.#snapshot()
    const before = this.#start ?? after
    const n = Math.max(1, calls)
    const processUs = (after.process - before.process) / n
    if (after.self.size === 0) {
      return {
        processUs,
        mainThreadUs: NaN,
        workerUs: NaN,
        otherUs: NaN,
        peerUs: NaN,
        foreignShare: NaN,
        contended: false
      }
    }
    const mainTid = String(process.pid)
    const main = sum(after.self, before.self, (tid) => tid === mainTid)
    const workers = sum(after.self, before.self, (tid) => workerTids.has(tid))
    const all = sum(after.self, before.self, () => true)
    const peer = sum(after.peer, before.peer, () => true)
    const mainThreadUs = main.runNs / 1000 / n
    const workerUs = workers.runNs / 1000 / n
    const capacity = CORES * Math.max(1, after.wallNs - before.wallNs)
    const ran = all.runNs + peer.runNs + extraUs * 1000
    const waited = all.waitNs + peer.waitNs
    const foreignShare = Math.max(0, Math.min(waited, capacity - ran)) / capacity
    if (this.#counts) {
      windowCounts.measured++
      if (foreignShare > CONTENDED_SHARE) windowCounts.contended++
    }
    return {
      processUs,
      mainThreadUs,
      workerUs,
      otherUs: Math.max(0, processUs - mainThreadUs - workerUs),
      peerUs: this.#peerPid === null || after.peer.size === 0 ? NaN : peer.runNs / 1000 / n,
      foreignShare,
      contended: foreignShare > CONTENDED_SHARE
    }
  }
}

/** Process CPU time in µs (all threads), for steady-state detection during warm-ups. */
export function processCpuUs (): number {
  const usage = process.cpuUsage()
  return usage.user + usage.system
}

/** Scheduler times of the whole bench process and its callback server over a whole run. */
export interface RunMeter { meter: CpuMeter }

export function runMeterStart (peerPid: number | null): RunMeter {
  const meter = new CpuMeter(peerPid, false)
  meter.begin()
  return { meter }
}

/** The run's estimated foreign share of the cores (see CpuPerCall.foreignShare); null off Linux. */
export function runForeignShare (run: RunMeter): number | null {
  const share = run.meter.end(1).foreignShare
  return Number.isFinite(share) ? share : null
}
