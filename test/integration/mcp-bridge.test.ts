// The stdio bridge (`toolport mcp --role NAME --url …`), spawned through the SDK's
// StdioClientTransport exactly as Claude Desktop or Cursor would launch it, against a real
// listening Toolport and real plugin callbacks.
import { test, type TestContext } from 'node:test'
import assert from 'node:assert/strict'
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process'
import { EventEmitter, once } from 'node:events'
import { PassThrough } from 'node:stream'
import { fileURLToPath } from 'node:url'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js'
import { ToolListChangedNotificationSchema, type CallToolResult } from '@modelcontextprotocol/sdk/types.js'
import { createToolport, type Toolport } from '../../src/main/index.js'
import { closedPort } from '../fixtures/callback-server.js'
import { main } from '../../src/main/cli.js'
import { callbackServer as callbacks, registerOverHttp as register, toolportCliArgs, waitFor, within } from '../helpers.js'

const ROOT = fileURLToPath(new URL('../../', import.meta.url))

interface Bridged {
  client: Client
  notices: EventEmitter
  /** What the bridge wrote to stderr (its diagnostics). */
  stderr: () => string
}

async function startTp (t: TestContext, port = 0): Promise<{ tp: Toolport, url: string }> {
  const tp = await createToolport({ roles: ['Lanlan', 'Mochi'], logger: false, dispatch: { mode: 'inline' } })
  const { url } = await tp.listen({ host: '127.0.0.1', port })
  t.after(() => tp.close())
  return { tp, url }
}

/** Spawns `toolport mcp` and connects an SDK client to it over stdio; closed in t.after. */
async function bridge (t: TestContext, role: string, url: string): Promise<Bridged> {
  const transport = new StdioClientTransport({
    command: process.execPath,
    args: [...toolportCliArgs(), 'mcp', '--role', role, '--url', url],
    cwd: ROOT,
    stderr: 'pipe'
  })
  let stderr = ''
  transport.stderr?.on('data', (chunk: Buffer) => { stderr += chunk.toString('utf8') })
  const client = new Client({ name: 'bridge-test', version: '1.0.0' })
  const notices = new EventEmitter()
  client.setNotificationHandler(ToolListChangedNotificationSchema, () => { notices.emit('list-changed') })
  // t.after hooks run in order, so a Toolport started earlier closes first: the bridge copes.
  t.after(() => client.close())
  await client.connect(transport)
  return { client, notices, stderr: () => stderr }
}

test('bridge: through the stdio bridge, list → register over HTTP → list_changed forwarded → list → call → result', async (t) => {
  const { url } = await startTp(t)
  const server = await callbacks(t)
  const { client, notices } = await bridge(t, 'Lanlan', url)
  assert.deepEqual((await client.listTools()).tools, [])

  const changed = once(notices, 'list-changed')
  await register(url, {
    name: 'get_weather',
    description: 'Get weather for a location.',
    role: 'Lanlan',
    parameters: { type: 'object', properties: { location: { type: 'string' } } },
    callback_url: `${server.url}/raw-output`
  })
  await changed
  assert.deepEqual((await client.listTools()).tools, [{
    name: 'get_weather',
    description: 'Get weather for a location.',
    inputSchema: { type: 'object', properties: { location: { type: 'string' } } }
  }])

  const result = await client.callTool({ name: 'get_weather', arguments: { location: 'Shanghai' } }) as CallToolResult
  assert.equal(result.isError, false)
  assert.deepEqual(result.content, [{ type: 'text', text: '{"temperature_c":28}' }])
  assert.deepEqual(result.structuredContent, { temperature_c: 28 })
  assert.deepEqual(JSON.parse(server.requests[0]!.body).arguments, { location: 'Shanghai' })
})

test('bridge: cancelling a call at the bridge cancels it in Toolport', async (t) => {
  const { tp, url } = await startTp(t)
  const server = await callbacks(t)
  const { client } = await bridge(t, 'Lanlan', url)
  await register(url, { name: 'slow', role: 'Lanlan', callback_url: `${server.url}/sleep/60000` })

  const controller = new AbortController()
  const arrived = once(server.events, 'request')
  const finished = once(tp, 'call-finished')
  const call = client.callTool({ name: 'slow', arguments: {} }, undefined, { signal: controller.signal })
  await arrived
  controller.abort(new Error('cancelled by the user'))
  await assert.rejects(call)
  assert.equal((await finished)[0].outcome, 'cancelled')
})

test('bridge: when its client goes away the bridge ends its upstream session, which detaches from the role', async (t) => {
  const { tp, url } = await startTp(t)
  const { client } = await bridge(t, 'Lanlan', url)
  assert.equal(tp.roles.get('Lanlan').sessions().length, 1)
  assert.equal(tp.roles.get('Mochi').sessions().length, 0)
  // StdioClientTransport.close ends the bridge's stdin and waits for the process to exit.
  await client.close()
  assert.equal(tp.roles.get('Lanlan').sessions().length, 0)
})

test('bridge: the bridge re-initializes after Toolport restarts (runtime-only registrations, R3) and asks the client to re-list', async (t) => {
  const first = await startTp(t)
  const port = Number(new URL(first.url).port)
  const { client, notices } = await bridge(t, 'Lanlan', first.url)
  await register(first.url, { name: 'before', callback_url: 'http://127.0.0.1:9333/before' })
  assert.deepEqual((await client.listTools()).tools.map((tool) => tool.name), ['before'])

  await first.tp.close()
  const second = await startTp(t, port)
  await register(second.url, { name: 'after', callback_url: 'http://127.0.0.1:9333/after' })
  const changed = once(notices, 'list-changed')
  assert.deepEqual((await client.listTools()).tools.map((tool) => tool.name), ['after'])
  await changed
  assert.equal(second.tp.roles.get('Lanlan').sessions().length, 1)
})

test('bridge: a bridge started before Toolport lists nothing, answers calls with an error, and connects once Toolport is up', async (t) => {
  const port = await closedPort()
  const url = `http://127.0.0.1:${port}`
  const { client, notices, stderr } = await bridge(t, 'Lanlan', url)
  assert.deepEqual((await client.listTools()).tools, [])
  const early = await client.callTool({ name: 'anything', arguments: {} }) as CallToolResult
  assert.equal(early.isError, true)
  assert.match(stderr(), /cannot reach/)

  const changed = once(notices, 'list-changed')
  const { tp } = await startTp(t, port)
  await register(url, { name: 'late', callback_url: 'http://127.0.0.1:9333/late' })
  await changed
  assert.deepEqual((await client.listTools()).tools.map((tool) => tool.name), ['late'])
  assert.equal(tp.roles.get('Lanlan').sessions().length, 1)
})

test('bridge: a --url whose server answers JSON that is no MCP is said in one line per attempt, not the answer check\'s whole issue dump', async (t) => {
  const { createServer } = await import('node:http')
  const server = createServer((request, response) => {
    request.resume()
    request.on('end', () => { response.writeHead(200, { 'content-type': 'application/json' }).end('{"hello":1}') })
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  t.after(() => new Promise<void>((resolve) => { server.closeAllConnections(); server.close(() => resolve()) }))
  const { port } = server.address() as { port: number }
  const { client, stderr } = await bridge(t, 'Lanlan', `http://127.0.0.1:${port}`)
  const early = await client.callTool({ name: 'anything', arguments: {} }) as CallToolResult
  assert.equal(early.isError, true)
  await waitFor('the bridge saying why', () => /not a JSON-RPC message/.test(stderr()))
  const lines = stderr().trimEnd().split('\n')
  for (const line of lines) assert.ok(line.length < 300 && !line.includes('"code"'), `a diagnostic line: ${line.slice(0, 300)}`)
  assert.match(lines[0] ?? '', /is this the URL of a Toolport\?/)
})

test('bridge, R6: `toolport mcp` for a role the Toolport does not have exits 1 with TP_ERR_ROLE_NOT_FOUND, saying so once, with the Toolport it asked', async (t) => {
  const { url } = await startTp(t)
  const { code, stdout, stderr } = await runMainCollecting(t, ['mcp', '--role', 'Nobody', '--url', url])
  assert.equal(code, 1)
  assert.equal(stderr, `toolport: the role 'Nobody' does not exist on the Toolport at ${url} (TP_ERR_ROLE_NOT_FOUND)\n`)
  assert.equal(stdout, '', 'stdout carries the protocol only')
})

test('bridge: a --url (or TOOLPORT_URL) under which a live Toolport has no MCP route (…/api: 404 TP_ERR_ROUTE_NOT_FOUND) is a usage error, exit 2 naming the endpoint it tried, not a Toolport "not reachable" retried forever (README bridge paragraph)', async (t) => {
  const { url } = await startTp(t)
  for (const [args, env, name] of [
    [['--url', `${url}/api`], {}, '--url'],
    [[], { TOOLPORT_URL: `${url}/api` }, 'TOOLPORT_URL']
  ] as Array<[string[], Record<string, string>, string]>) {
    const run = runMainUntil(t, ['mcp', '--role', 'Lanlan', ...args], env)
    // Without a verdict the bridge waits for Toolport, saying "cannot reach" on each try.
    const code = await Promise.race([run.code, run.logged(/cannot reach/).then(() => undefined)])
    assert.equal(code, 2, `${name}: ${run.stderr()}`)
    const first = run.stderr().split('\n')[0] ?? ''
    assert.ok(first.startsWith(`toolport: ${name} ${url}/api reaches a Toolport that has no MCP endpoint at ${url}/api/mcp/Lanlan ` +
      '(HTTP 404 TP_ERR_ROUTE_NOT_FOUND)'), first)
    assert.match(first, new RegExp(`e\\.g\\. ${url.replaceAll('.', '\\.')}\\)$`))
    assert.equal(run.stdout(), '', 'stdout carries the protocol only')
  }
})

test('bridge: `toolport mcp` without --role is a usage error (exit 2)', async (t) => {
  const { code, stderr } = await runMainCollecting(t, ['mcp'])
  assert.equal(code, 2)
  assert.match(stderr, /--role/)
})

test('bridge: a second initialize is refused with -32600, as /mcp/<role> refuses one, and the bridge keeps serving', async (t) => {
  const { url } = await startTp(t)
  const raw = rawBridge(t, ['mcp', '--role', 'Lanlan', '--url', url])
  raw.send({ ...INITIALIZE, id: 'first' })
  await raw.answer('first')
  raw.send({ jsonrpc: '2.0', method: 'notifications/initialized' })
  raw.send({ ...INITIALIZE, id: 'second' })
  raw.send({ jsonrpc: '2.0', id: 'after', method: 'ping' })
  assert.deepEqual(await raw.answer('second'), {
    jsonrpc: '2.0', id: 'second', error: { code: -32600, message: 'Invalid Request: Server already initialized' }
  })
  assert.deepEqual((await raw.answer('after')).result, {})
})

test('bridge: when its stdout is closed (EPIPE: the client is gone) the bridge exits 0 without a stack trace', async (t) => {
  const { url } = await startTp(t)
  const raw = rawBridge(t, ['mcp', '--role', 'Lanlan', '--url', url])
  raw.send(INITIALIZE)
  await raw.answer('init')
  raw.child.stdout.destroy()
  // Answers now go to a pipe nobody reads; the bridge notices at its next write.
  for (let i = 0; i < 3; i++) raw.send({ jsonrpc: '2.0', id: i, method: 'ping' })
  const [code, signal] = await within(once(raw.child, 'exit'), 'the bridge exits', 8_000)
  assert.deepEqual({ code, signal }, { code: 0, signal: null })
  assert.doesNotMatch(raw.stderr(), /^\s+at |Unhandled|uncaught|^node:/im, 'no crash on stderr')
  assert.match(raw.stderr(), /the client is gone/)
})

test('bridge: stdin ending during a call ends the session, which cancels the call, and the bridge exits 0', async (t) => {
  const { tp, url } = await startTp(t)
  const server = await callbacks(t)
  await register(url, { name: 'slow', role: 'Lanlan', callback_url: `${server.url}/sleep/60000` })
  const raw = rawBridge(t, ['mcp', '--role', 'Lanlan', '--url', url])
  raw.send(INITIALIZE)
  await raw.answer('init')
  raw.send({ jsonrpc: '2.0', method: 'notifications/initialized' })
  const arrived = once(server.events, 'request')
  const finished = once(tp, 'call-finished')
  raw.send({ jsonrpc: '2.0', id: 'call', method: 'tools/call', params: { name: 'slow', arguments: {} } })
  await arrived
  raw.child.stdin.end()
  const [code, signal] = await within(once(raw.child, 'exit'), 'the bridge exits', 30_000)
  assert.deepEqual({ code, signal }, { code: 0, signal: null })
  assert.equal((await finished)[0].outcome, 'cancelled')
  assert.equal(raw.stderr().trim(), `toolport mcp: connected to ${url}/mcp/Lanlan`)
})

test('bridge: a request reusing the id of one in flight is refused (-32600), as /mcp/<role> refuses it; the id is free again once answered or cancelled', async (t) => {
  const { tp, url } = await startTp(t)
  const server = await callbacks(t)
  await register(url, { name: 'slow', role: 'Lanlan', callback_url: `${server.url}/sleep/60000` })
  await register(url, { name: 'fast', role: 'Lanlan', callback_url: `${server.url}/echo` })
  const raw = rawBridge(t, ['mcp', '--role', 'Lanlan', '--url', url])
  raw.send(INITIALIZE)
  await raw.answer('init')
  raw.send({ jsonrpc: '2.0', method: 'notifications/initialized' })
  const call = (id: number, name: string): unknown => ({ jsonrpc: '2.0', id, method: 'tools/call', params: { name, arguments: {} } })
  const arrived = once(server.events, 'request')
  raw.send(call(8, 'slow'))
  await arrived
  raw.send(call(8, 'fast'))
  const refused = await raw.answer(null as unknown as number)
  assert.equal((refused.error as { code: number }).code, -32600)
  assert.match((refused.error as { message: string }).message, /the id 8 is in use by a request in flight/)
  // Only the first reached the plugin; a cancel for 8 cancels it, and frees the id.
  const finished = once(tp, 'call-finished')
  raw.send({ jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: 8 } })
  assert.equal((await finished)[0].outcome, 'cancelled')
  raw.send(call(8, 'fast'))
  const answer = await raw.answer(8)
  assert.equal((answer.result as { isError?: boolean }).isError, false, JSON.stringify(answer))
  assert.equal(server.requests.filter((r) => r.path.startsWith('/sleep')).length, 1)
  // Answered: free again.
  raw.send(call(8, 'fast'))
  await waitFor('a second answer to 8', () => raw.answers().filter((a) => a.id === 8).length === 2, 8_000)
})

const INITIALIZE = {
  jsonrpc: '2.0',
  id: 'init',
  method: 'initialize',
  params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'bridge-test-raw', version: '1.0.0' } }
}

/** `toolport <args>` spawned with raw stdio: the test writes JSON-RPC lines and reads the answers. */
function rawBridge (t: TestContext, args: string[]): {
  child: ChildProcessWithoutNullStreams,
  send: (message: unknown) => void,
  answer: (id: string | number) => Promise<Record<string, unknown>>,
  stderr: () => string,
  answers: () => Array<Record<string, unknown>>
} {
  const child = spawn(process.execPath, [...toolportCliArgs(), ...args], { cwd: ROOT, stdio: ['pipe', 'pipe', 'pipe'] })
  t.after(() => { if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL') })
  child.stdin.on('error', () => {})
  const answers: Array<Record<string, unknown>> = []
  let pending = ''
  child.stdout.setEncoding('utf8').on('data', (chunk: string) => {
    pending += chunk
    for (let end = pending.indexOf('\n'); end !== -1; end = pending.indexOf('\n')) {
      answers.push(JSON.parse(pending.slice(0, end)) as Record<string, unknown>)
      pending = pending.slice(end + 1)
    }
  })
  let stderr = ''
  child.stderr.setEncoding('utf8').on('data', (chunk: string) => { stderr += chunk })
  return {
    child,
    send: (message) => { child.stdin.write(`${JSON.stringify(message)}\n`) },
    answer: async (id) => {
      await waitFor(`the answer to ${JSON.stringify(id)} (stderr: ${stderr})`, () => answers.some((a) => a.id === id), 8_000)
      return answers.find((a) => a.id === id)!
    },
    stderr: () => stderr,
    answers: () => answers
  }
}

/**
 * Starts `main(args)` in this process with `env`: `code` resolves with its exit code, `logged(re)`
 * once its stderr matches `re`. Stopped in t.after if still running.
 */
function runMainUntil (t: TestContext, args: string[], env: NodeJS.ProcessEnv): {
  code: Promise<number>,
  logged: (re: RegExp) => Promise<void>,
  stdout: () => string,
  stderr: () => string
} {
  const stdin = new PassThrough()
  const out = new PassThrough()
  const err = new PassThrough()
  const seen = new EventEmitter()
  let stdout = ''
  let stderr = ''
  out.setEncoding('utf8').on('data', (chunk: string) => { stdout += chunk })
  err.setEncoding('utf8').on('data', (chunk: string) => { stderr += chunk; seen.emit('data') })
  const controller = new AbortController()
  const code = main(args, { stdin, stdout: out, stderr: err, env, stop: controller.signal })
  t.after(async () => { controller.abort('SIGTERM'); stdin.end(); await code })
  const logged = async (re: RegExp): Promise<void> => {
    while (!re.test(stderr)) await once(seen, 'data')
  }
  return { code, logged, stdout: () => stdout, stderr: () => stderr }
}

/**
 * Runs the `toolport` command in-process (`main(argv, io)`, the code the spawned bridge runs) with
 * its own streams and an empty environment; resolves with its exit code and everything it wrote.
 */
async function runMainCollecting (t: TestContext, args: string[]): Promise<{
  code: number,
  stdout: string,
  stderr: string
}> {
  const run = runMainUntil(t, args, {})
  return { code: await run.code, stdout: run.stdout(), stderr: run.stderr() }
}

test('bridge: a long session (5000 calls) writes nothing to stderr: no listener warning from the transport\'s one abort signal', async (t) => {
  const { url } = await startTp(t)
  const server = await callbacks(t)
  const { client, stderr } = await bridge(t, 'Lanlan', url)
  await register(url, { name: 'echo', role: 'Lanlan', parameters: { type: 'object' }, callback_url: `${server.url}/raw-output` })
  const CALLS = 5000 // Node warns past 1500 listeners on one signal; collections may come between
  for (let i = 0; i < CALLS; i++) {
    const result = await client.callTool({ name: 'echo', arguments: {} }) as CallToolResult
    assert.equal(result.isError, false)
  }
  assert.equal(server.requests.length, CALLS)
  assert.doesNotMatch(stderr(), /MaxListenersExceededWarning|memory leak/)
})
