// The official MCP conformance runner (@modelcontextprotocol/conformance, its own SDK client and
// raw requests) against a real Toolport on 127.0.0.1, whose role's tools come from a real plugin
// answering through the callback protocol. Every scenario that applies to a tools-only server
// must pass with no failed check and no warning.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { execFile } from 'node:child_process'
import { mkdtemp, readdir, readFile, rm } from 'node:fs/promises'
import { createRequire } from 'node:module'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
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

const RUNNER = join(dirname(createRequire(import.meta.url).resolve('@modelcontextprotocol/conformance/package.json')),
  'dist', 'index.js')

interface Check {
  id: string
  name: string
  status: 'SUCCESS' | 'FAILURE' | 'WARNING' | 'INFO' | 'SKIPPED'
  errorMessage?: string
}

/** Runs one scenario in the runner's own process; resolves with its checks. */
async function runScenario (url: string, scenario: string, outDir: string): Promise<{
  checks: Check[],
  output: string
}> {
  const output = await new Promise<string>((resolve) => {
    execFile(process.execPath, [RUNNER, 'server', '--url', url, '--scenario', scenario, '-o', outDir],
      { timeout: SCENARIO_TIMEOUT_MS, maxBuffer: 16 * 1024 * 1024 },
      (err, stdout, stderr) => resolve(`${stdout}${stderr}${err === null ? '' : `\n(exit: ${err.message})`}`))
  })
  const dirs = (await readdir(outDir)).filter((d) => d.startsWith(`server-${scenario}-`))
  assert.equal(dirs.length, 1, `the runner wrote no results for ${scenario}:\n${output}`)
  const checks = JSON.parse(await readFile(join(outDir, dirs[0] as string, 'checks.json'), 'utf8')) as Check[]
  return { checks, output }
}

test('the MCP conformance runner passes every tools-server scenario without failures or warnings', { timeout: SCENARIOS.length * SCENARIO_TIMEOUT_MS }, async (t) => {
  const { url } = await startToolport(t, { roles: ['Conformance'] })
  const plugin = await startConformancePlugin(url, 'Conformance')
  t.after(() => plugin.close())
  const outDir = await mkdtemp(join(tmpdir(), 'toolport-conformance-'))
  t.after(() => rm(outDir, { recursive: true, force: true }))
  const endpoint = `${url}/mcp/Conformance`

  for (const scenario of SCENARIOS) {
    await t.test(scenario, async () => {
      const { checks, output } = await runScenario(endpoint, scenario, outDir)
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
