// How much of the machine other processes used while the bench ran (Linux /proc; null
// elsewhere). The load average cannot tell, since it counts the bench's own processes too:
// here the bench's CPU time (this process, its threads and its reaped children: the callback
// servers, load generators and probes) is subtracted from the machine's busy time.
import { readFileSync } from 'node:fs'

export interface CpuSnapshot { machineBusy: number, machineTotal: number, own: number }

export function cpuSnapshot (): CpuSnapshot | null {
  try {
    const line = readFileSync('/proc/stat', 'utf8').split('\n')[0] ?? ''
    const [, user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0] = line.trim().split(/\s+/).map(Number)
    const self = readFileSync('/proc/self/stat', 'utf8')
    // Fields after "(comm)": state is field 3; utime, stime, cutime, cstime are fields 14–17.
    const fields = self.slice(self.lastIndexOf(')') + 2).split(' ').map(Number)
    const own = (fields[11] ?? 0) + (fields[12] ?? 0) + (fields[13] ?? 0) + (fields[14] ?? 0)
    const busy = user + nice + system + irq + softirq + steal
    return { machineBusy: busy, machineTotal: busy + idle + iowait, own }
  } catch {
    return null
  }
}

/** Share (0–1) of the machine's CPU capacity used by processes other than the bench. */
export function foreignShare (before: CpuSnapshot | null, after: CpuSnapshot | null): number | null {
  if (before === null || after === null) return null
  const total = after.machineTotal - before.machineTotal
  if (total <= 0) return null
  const foreign = (after.machineBusy - before.machineBusy) - (after.own - before.own)
  return Math.max(0, foreign / total)
}

// Per-call CPU accounting: CPU time is what a saturated 2-core machine runs out of, and unlike
// wall-clock figures it barely moves when other processes compete for the cores.

/** Clock ticks per second of /proc times (USER_HZ; 100 on every Linux this runs on). */
const TICKS_PER_S = 100

function procTicks (file: string): number | null {
  try {
    const stat = readFileSync(file, 'utf8')
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
    return Number(fields[11]) + Number(fields[12])
  } catch {
    return null
  }
}

/** CPU figures of one measuring window, in µs of CPU per completed call. */
export interface CpuPerCall {
  /** This process, every thread (main, pool workers, GC helpers). */
  processUs: number
  /** This process's main thread only (Linux; NaN elsewhere). */
  mainThreadUs: number
  /** Another process, e.g. the callback server (Linux; NaN elsewhere). */
  peerUs: number
}

/** Measures CPU between `begin()` and `end(calls)`; `peerPid` is another process to account. */
export class CpuMeter {
  readonly #peerPid: number | null
  #process = 0
  #main: number | null = null
  #peer: number | null = null

  constructor (peerPid: number | null = null) {
    this.#peerPid = peerPid
  }

  begin (): void {
    const usage = process.cpuUsage()
    this.#process = usage.user + usage.system
    this.#main = procTicks(`/proc/self/task/${process.pid}/stat`)
    this.#peer = this.#peerPid === null ? null : procTicks(`/proc/${this.#peerPid}/stat`)
  }

  end (calls: number): CpuPerCall {
    const usage = process.cpuUsage()
    const main = procTicks(`/proc/self/task/${process.pid}/stat`)
    const peer = this.#peerPid === null ? null : procTicks(`/proc/${this.#peerPid}/stat`)
    const n = Math.max(1, calls)
    const ticksToUs = 1e6 / TICKS_PER_S
    return {
      processUs: (usage.user + usage.system - this.#process) / n,
      mainThreadUs: main === null || this.#main === null ? Number.NaN : ((main - this.#main) * ticksToUs) / n,
      peerUs: peer === null || this.#peer === null ? Number.NaN : ((peer - this.#peer) * ticksToUs) / n
    }
  }
}
