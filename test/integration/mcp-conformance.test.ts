// The official MCP conformance runner (@modelcontextprotocol/conformance, its own SDK client and
// raw requests) against a real Toolport on 127.0.0.1, whose role's tools come from a real plugin
// answering through the callback protocol. Every scenario that applies to a tools-only server
// must pass with no failed check and no warning.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { spawn, type ChildProcess } from 'node:child_process'
import { EventEmitter, once } from 'node:events'
import { mkdtemp, readdir, readFile, rm } from 'node:fs/promises'
import { createRequire } from 'node:module'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { startToolport } from '../helpers.js'
import { startConformancePlugin } from '../fixtures/conformance-plugin.js'

const SCENARIOS = [
  'server-initialize',
  'ping',
  'tools-list',
  'tools-call-simple-text',
  'tools-call-error',
  'tools-call-image',
  'json-schema-2020-12',
  'dns-rebinding-protection',
  'server-sse-multiple-streams',
  'server-sse-polling'
] as const

/** One scenario may take this long (the slowest waits up to 10 s for a stream by design). */
const SCENARIO_TIMEOUT_MS = 60_000

const HERE = dirname(fileURLToPath(import.meta.url))
const RUNNER = join(dirname(createRequire(import.meta.url).resolve('@modelcontextprotocol/conformance/package.json')),
  'dist', 'index.js')

interface Check {
  id: string
  name: string
  status: 'SUCCESS' | 'FAILURE' | 'WARNING' | 'INFO' | 'SKIPPED'
  errorMessage?: string
}

/** What test/fixtures/conformance-runner.mjs prints after each run, with the exit code. */
const EXIT_MARKER = '@@conformance-runner-exit@@'

/**
 * The runner's command, run once per scenario in one process of its own for all of them
 * (test/fixtures/conformance-runner.mjs): the same command line and code as `conformance server`
 * alone, without a process start and the runner's loading per scenario.
 */
class Runner {
  /** Emits `progress` on each chunk of output and when the process ends. */
  readonly #events = new EventEmitter()
  #out = ''
  #child: ChildProcess = this.#spawn()

  #spawn (): ChildProcess {
    const child = spawn(process.execPath, [join(HERE, '../fixtures/conformance-runner.mjs'), RUNNER],
      { stdio: ['ignore', 'pipe', 'pipe', 'ipc'] })
    const collect = (chunk: Buffer): void => {
      if (child !== this.#child) return
      this.#out += chunk.toString('utf8')
      this.#events.emit('progress')
    }
    child.stdout?.on('data', collect)
    child.stderr?.on('data', collect)
    child.on('exit', () => this.#events.emit('progress'))
    return child
  }

  get #ended (): boolean { return this.#child.exitCode !== null || this.#child.signalCode !== null }

  /**
   * Runs `conformance <args>`; resolves with what it printed and its exit code (null: it did not
   * end). A run past `timeoutMs` is killed with its process, and the next run gets a new one.
   */
  async run (args: string[], timeoutMs: number): Promise<{ output: string, code: number | null }> {
    if (this.#ended) this.#child = this.#spawn()
    this.#out = ''
    this.#child.send({ args })
    const signal = AbortSignal.timeout(timeoutMs)
    for (;;) {
      const at = this.#out.indexOf(EXIT_MARKER)
      if (at !== -1) {
        return { output: this.#out.slice(0, at), code: Number(/^ (\d+)/.exec(this.#out.slice(at + EXIT_MARKER.length))?.[1]) }
      }
      if (this.#ended) return { output: `${this.#out}\n(the runner's process ended)`, code: null }
      try {
        await once(this.#events, 'progress', { signal })
      } catch {
        await this.close()
        return { output: `${this.#out}\n(killed: no end within ${timeoutMs} ms)`, code: null }
      }
    }
  }

  async close (): Promise<void> {
    if (this.#ended) return
    const exited = once(this.#child, 'exit')
    this.#child.kill('SIGKILL')
    await exited
  }
}

/** Runs one scenario; resolves with its checks. */
async function runScenario (runner: Runner, url: string, scenario: string, outDir: string): Promise<{
  checks: Check[],
  output: string
}> {
  const { output, code } = await runner.run(['server', '--url', url, '--scenario', scenario, '-o', outDir],
    SCENARIO_TIMEOUT_MS)
  const dirs = (await readdir(outDir)).filter((d) => d.startsWith(`server-${scenario}-`))
  assert.equal(dirs.length, 1, `the runner wrote no results for ${scenario} (exit ${code}):\n${output}`)
  const checks = JSON.parse(await readFile(join(outDir, dirs[0] as string, 'checks.json'), 'utf8')) as Check[]
  return { checks, output: `${output}${code === 0 ? '' : `\n(exit: ${code})`}` }
}

test('the MCP conformance runner passes every tools-server scenario without failures or warnings', { timeout: SCENARIOS.length * SCENARIO_TIMEOUT_MS }, async (t) => {
  // Ended before Toolport closes (after hooks run in the order they were added), as each
  // scenario's own process had ended before.
  const runner = new Runner()
  t.after(() => runner.close())
  const { url } = await startToolport(t, { roles: ['Conformance'] })
  const plugin = await startConformancePlugin(url, 'Conformance')
  t.after(() => plugin.close())
  const outDir = await mkdtemp(join(tmpdir(), 'toolport-conformance-'))
  t.after(() => rm(outDir, { recursive: true, force: true }))
  const endpoint = `${url}/mcp/Conformance`

  for (const scenario of SCENARIOS) {
    await t.test(scenario, async () => {
      const { checks, output } = await runScenario(runner, endpoint, scenario, outDir)
      assert.ok(checks.length > 0, `no checks ran:\n${output}`)
      const bad = checks.filter((c) => c.status === 'FAILURE' || c.status === 'WARNING')
      assert.deepEqual(bad.map((c) => `${c.status} ${c.id}: ${c.errorMessage ?? ''}`), [],
        `scenario ${scenario} has failed checks or warnings`)
      assert.ok(checks.some((c) => c.status === 'SUCCESS'), `no check succeeded:\n${output}`)
    })
  }
  // The calls reached the plugin through the callback protocol, not a stand-in.
  assert.equal(plugin.calls.get('test_simple_text'), 1)
  assert.equal(plugin.calls.get('test_error_handling'), 1)
  assert.equal(plugin.calls.get('test_reconnection'), 1)
})
