// Events: what one live event-stream subscriber (the console open in a browser) costs dispatch.
// The same pool-mode Toolport runs the same closed loop (c = 128, ~100 B replies) without and
// with one subscriber on GET /api/events, interleaved (A B, then B A, …). The subscriber is a
// separate process reading the stream over HTTP, as a browser would; every call then sends a
// `call` event to it.
import { spawn, type ChildProcess } from 'node:child_process'
import { once } from 'node:events'
import { benchWarmups, closedLoop, describeWarmups, sleep, warmupFor } from './lib/loop.js'
import type { LoopResult, Warmups } from './lib/loop.js'
import { toolportPath } from './lib/clients.js'
import { captureNewThreads, CpuMeter } from './lib/cpu.js'
import { cpuSeries, fmtCpuSplit, fmtRatio, fmtRate, fmtStat, fmtUs, pairedRatio, stat } from './lib/stats.js'
import type { BenchContext, Check, Scenario, Table } from './lib/report.js'

const CONCURRENCY = 128

function plan (ctx: BenchContext): { warmups: Warmups, durationMs: number } {
  return { warmups: benchWarmups(ctx.isQuick), durationMs: ctx.isQuick ? 700 : 3_000 }
}

/** A subscriber process that reads the stream and counts what it got (printed when it ends). */
const SUBSCRIBER = `
const http = require('node:http')
let bytes = 0
const req = http.get(process.argv[1], { headers: { accept: 'text/event-stream' } }, (res) => {
  res.on('data', (chunk) => { if (bytes === 0) process.stdout.write('open\\n'); bytes += chunk.length })
})
req.on('error', () => {})
process.on('SIGTERM', () => { process.stdout.write(bytes + '\\n'); process.exit(0) })
`

async function startSubscriber (url: string): Promise<{ child: ChildProcess, stop: () => Promise<number> }> {
  const child = spawn(process.execPath, ['-e', SUBSCRIBER, `${url}/api/events`], {
    stdio: ['ignore', 'pipe',
      'inherit']
  })
  let out = ''
  child.stdout?.setEncoding('utf8')
  child.stdout?.on('data', (chunk: string) => { out += chunk })
  // Wait for its hello: the subscription is in place.
  for (let i = 0; i < 500 && !out.includes('open'); i++) await sleep(10)
  if (!out.includes('open')) throw new Error('the event-stream subscriber did not connect')
  return {
    child,
    async stop () {
      const exited = once(child, 'exit')
      child.kill('SIGTERM')
      await exited
      return Number(out.trim().split('\n').pop())
    }
  }
}

export const eventsScenario: Scenario = {
  name: 'events',
  title: 'Events: dispatch throughput with and without one /api/events subscriber (pool mode)',
  steps (ctx) {
    return 2 * ctx.reps
  },
  async run (ctx) {
    const p = plan(ctx)
    const path = await captureNewThreads(() => toolportPath(ctx.server.origin, 'pool'))
    const { url } = await path.tp.listen({ host: '127.0.0.1', port: 0 })
    const without: LoopResult[] = []
    const withOne: LoopResult[] = []
    const streamedBytes: number[] = []
    const options = (rep: number): Parameters<typeof closedLoop>[1] => ({
      concurrency: CONCURRENCY,
      ...warmupFor(p.warmups, rep),
      durationMs: p.durationMs,
      maxCalls: 2_000_000,
      cpu: new CpuMeter(ctx.server.pid)
    })
    try {
      for (let rep = 0; rep < ctx.reps; rep++) {
        // Alternate which goes first, so slow drift in the machine's load does not favour one.
        for (const withSubscriber of rep % 2 === 0 ? [false, true] : [true, false]) {
          ctx.progress.step(`${withSubscriber ? 'one subscriber' : 'no subscriber'} (rep ${rep + 1}/${ctx.reps})`)
          if (!withSubscriber) {
            without.push(await closedLoop(path.caller('small'), options(rep)))
            continue
          }
          const subscriber = await startSubscriber(url)
          try {
            withOne.push(await closedLoop(path.caller('small'), options(rep)))
          } finally {
            streamedBytes.push(await subscriber.stop())
          }
        }
      }
    } finally {
      await path.close()
    }
    const ratio = pairedRatio(withOne.map((r) => r.rps), without.map((r) => r.rps))
    const cpuRatio = pairedRatio(cpuSeries(withOne, 'processUs'), cpuSeries(without, 'processUs'))
    const table: Table = {
      title: `Dispatch at c = ${CONCURRENCY} (~100 B replies), pool mode`,
      head: ['subscribers', 'req/s', 'p50', 'p99', 'ratio', 'CPU µs/call: process · main · workers · other · server',
        'CPU per call, ratio'],
      rows: [
        ['none', fmtStat(stat(without.map((r) => r.rps)), fmtRate), fmtStat(stat(without.map((r) => r.p50Us)), fmtUs),
          fmtStat(stat(without.map((r) => r.p99Us)), fmtUs), '1.00×', fmtCpuSplit(without), '1.00×'],
        ['one (/api/events)', fmtStat(stat(withOne.map((r) => r.rps)), fmtRate),
          fmtStat(stat(withOne.map((r) => r.p50Us)), fmtUs),
          fmtStat(stat(withOne.map((r) => r.p99Us)), fmtUs), `${ratio.median.toFixed(3)}×`, fmtCpuSplit(withOne),
          fmtStat(cpuRatio, fmtRatio)]
      ]
    }
    const checks: Check[] = [{
      scenario: 'events',
      what: 'throughput with one event-stream subscriber',
      measured: `${fmtRate(stat(withOne.map((r) => r.rps)).median)} req/s`,
      ratio: `${ratio.median.toFixed(3)}× (min ${ratio.min.toFixed(3)}); CPU per call ${fmtRatio(cpuRatio.median)}`,
      target: '≥ 0.97× without',
      met: ratio.median >= 0.97
    }]
    return {
      tables: [table],
      checks,
      notes: [
        `The subscriber (its own process) read ${fmtStat(stat(streamedBytes), (b) => `${(b / 1024).toFixed(0)} KiB`)} of events per run.`,
        `With and without a subscriber alike, ${describeWarmups(p.warmups)}.`,
        'CPU µs/call from each thread\'s schedstat (see `dispatch`); the subscriber\'s own process is not counted. "CPU per call, ratio": this process\'s CPU per call with the subscriber over without, per repetition: what the stream costs Toolport, steadier than req/s on a shared machine.'
      ],
      data: { without, withOne, streamedBytes }
    }
  }
}
