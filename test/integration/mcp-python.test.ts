// The official MCP Python SDK client (pip package `mcp`) against a real Toolport over Streamable
// HTTP: what LangChain, the OpenAI Agents SDK and every other Python MCP client run. Skips with a
// message when python3 or the package is missing (CI installs it: test/requirements.txt).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { execFile, execFileSync } from 'node:child_process'
import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { httpJson, startToolport } from '../helpers.js'
import { startCallbackServer } from '../fixtures/callback-server.js'

const SCRIPT = fileURLToPath(new URL('../fixtures/mcp_python_client.py', import.meta.url))

/**
 * Whether the package is installed, found without importing it: `import mcp` costs ~1.3 s of CPU
 * (pydantic models), paid again by the client script itself. A package that is found but broken
 * fails the test rather than skipping it.
 */
function pythonMcpMissing (): string {
  try {
    execFileSync('python3', ['-c', 'import importlib.util, sys; sys.exit(0 if importlib.util.find_spec("mcp") else 1)'],
      { stdio: 'pipe', timeout: 30_000 })
    return ''
  } catch (err) {
    return `python3 with the "mcp" package is not available (pip install -r test/requirements.txt): ${(err as Error).message.split('\n')[0] ?? ''}`
  }
}

const missing = pythonMcpMissing()

function runPython (args: string[]): Promise<{ code: number | null, stdout: string, stderr: string }> {
  return new Promise((resolve) => {
    const child = execFile('python3', [SCRIPT, ...args], { timeout: 60_000 }, (err, stdout, stderr) => {
      resolve({ code: err === null ? 0 : (child.exitCode ?? -1), stdout, stderr })
    })
  })
}

test('the MCP Python SDK client initializes, lists, calls a plugin tool and closes; its DELETE ends the session', { skip: missing === '' ? false : missing, timeout: 90_000 }, async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['Lanlan'] })
  const plugin = await startCallbackServer()
  t.after(() => plugin.close())
  const registered = await httpJson(`${url}/api/tools/register`, 'POST',
    { name: 'get_weather', description: 'Weather now', callback_url: `${plugin.url}/raw-output` })
  assert.equal(registered.statusCode, 200)

  const { code, stdout, stderr } = await runPython([`${url}/mcp/Lanlan`, 'get_weather', '{}'])
  assert.equal(code, 0, `python exited ${String(code)}:\n${stderr}`)
  const seen = JSON.parse(stdout.trim().split('\n').at(-1) as string) as {
    server: string,
    tools: string[],
    is_error: boolean,
    text: string[]
  }
  assert.equal(seen.server, 'toolport')
  assert.deepEqual(seen.tools, ['get_weather'])
  assert.equal(seen.is_error, false)
  assert.deepEqual(seen.text.map((text) => JSON.parse(text)), [{ temperature_c: 28 }])
  assert.equal(plugin.requests.length, 1, 'the call reached the plugin callback')
  // Ended by the client's DELETE on close, not by a timeout 30 s later: nothing lingers.
  assert.doesNotMatch(stderr, /Session termination failed/)
  assert.deepEqual(tp.roles.get('Lanlan').sessions(), [], 'the session left its role when the client closed')
})

test('the MCP Python SDK client, with its default 1 MiB bound on one event, lists 1.3 MB of tools and receives object outputs of 800 KB (ASCII) and 600 KB (CJK, UTF-8) (README "MCP": pages, structuredContent)', { skip: missing === '' ? false : missing, timeout: 90_000 }, async (t) => {
  const { url } = await startToolport(t, { roles: ['Lanlan'] })
  const plugin = await startCallbackServer()
  t.after(() => plugin.close())
  const description = 'd'.repeat(16_000)
  const names: string[] = []
  for (let i = 0; i < 80; i++) {
    const name = `tool_${String(i).padStart(2, '0')}`
    names.push(name)
    const registered = await httpJson(`${url}/api/tools/register`, 'POST', { name, description, callback_url: `${plugin.url}/echo` })
    assert.equal(registered.statusCode, 200)
  }
  const dir = await mkdtemp(join(tmpdir(), 'toolport-mcp-python-'))
  t.after(() => rm(dir, { recursive: true, force: true }))
  // The echo route answers the call's body, which holds the arguments twice (`arguments` and
  // `raw_arguments`): 800 KB of ASCII, or 600 KB of UTF-8 in 200 K UTF-16 units of CJK text,
  // either one sent as text only (with structuredContent too, over 1 MiB).
  for (const [what, s, least] of [['ASCII', 'x'.repeat(400_000), 800_000], ['CJK', '中'.repeat(100_000), 200_000]] as const) {
    const argumentsFile = join(dir, 'arguments.json')
    await writeFile(argumentsFile, JSON.stringify({ s }))
    const { code, stdout, stderr } = await runPython([`${url}/mcp/Lanlan`, 'tool_00', `@${argumentsFile}`])
    assert.equal(code, 0, `${what}: python exited ${String(code)}:\n${stderr.slice(-2000)}`)
    const seen = JSON.parse(stdout.trim().split('\n').at(-1) as string) as {
      tools: string[],
      pages: number,
      is_error: boolean,
      text: string[],
      text_lengths: number[]
    }
    assert.deepEqual(seen.tools, names)
    assert.ok(seen.pages > 1, `1.3 MB of tools come in pages (${seen.pages})`)
    assert.equal(seen.is_error, false)
    assert.equal(seen.text_lengths.length, 1)
    assert.ok(seen.text_lengths[0]! > least, `${what}: the whole output arrived (${seen.text_lengths[0]} characters)`)
    assert.ok(seen.text[0]!.startsWith('{'), seen.text[0])
  }
})
