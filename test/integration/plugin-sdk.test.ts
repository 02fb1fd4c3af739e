// The plugin SDK (`toolport/plugin`) against a real Toolport process: registration, the callback
// protocol (docs/protocol.md R9–R12), and re-registration after a restart (R3) or a removal, with no action by
// the plugin's code. Toolport runs as `toolport serve` in a child process so it can be SIGKILLed
// and restarted on the same port; everything listens on 127.0.0.1 only.
import { test, type TestContext } from 'node:test'
import assert from 'node:assert/strict'
import { spawn, type ChildProcess } from 'node:child_process'
import { EventEmitter, errorMonitor, once } from 'node:events'
import { createServer as createHttpServer } from 'node:http'
import { connect, createServer, type AddressInfo } from 'node:net'
import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { Agent, request } from 'undici'
import { z } from 'zod'
import {
  createPlugin, Image, PluginError, ToolError, ToolOutput, type Plugin, type PluginOptions, type RegisteredEvent
} from '../../src/plugin/index.js'
import { toolDefinitions, type ToolResult } from '../../src/main/index.js'
import { session, startToolport, toolportCliArgs, waitFor, within } from '../helpers.js'
import { closedPort } from '../fixtures/callback-server.js'

const ROOT = fileURLToPath(new URL('../../', import.meta.url))
const SOURCE = 'plugin:sdk-test'
// Generous bounds on waits for real processes; never part of an assertion.
const PROCESS_START_MS = 30_000
const REREGISTER_MS = 30_000

/** `toolport serve` as a child process (see toolportCliArgs); resolves once it printed its listening line. */
async function spawnToolport (port: number): Promise<ChildProcess> {
  const env = { ...process.env }
  for (const key of Object.keys(env)) if (key.startsWith('TOOLPORT_')) delete env[key]
  const child = spawn(process.execPath, [
    ...toolportCliArgs(), 'serve', '--port', String(port), '--role', 'A', '--log-level', 'warn'
  ], { cwd: ROOT, env, stdio: ['ignore', 'pipe', 'pipe'] })
  let stdout = ''
  let stderr = ''
  child.stderr!.setEncoding('utf8').on('data', (chunk: string) => { stderr += chunk })
  child.stdout!.setEncoding('utf8')
  const signal = AbortSignal.timeout(PROCESS_START_MS)
  await new Promise<void>((resolve, reject) => {
    const onData = (chunk: string): void => {
      stdout += chunk
      if (stdout.includes('Toolport listening on')) finish()
    }
    const onExit = (code: number | null): void => { finish(new Error(`toolport exited (${code}) before listening: ${stderr}`)) }
    const onAbort = (): void => { finish(new Error(`toolport did not listen within ${PROCESS_START_MS} ms: ${stderr}`)) }
    function finish (err?: Error): void {
      child.stdout!.off('data', onData)
      child.off('exit', onExit)
      signal.removeEventListener('abort', onAbort)
      if (err === undefined) resolve()
      else reject(err)
    }
    child.stdout!.on('data', onData)
    child.once('exit', onExit)
    signal.addEventListener('abort', onAbort, { once: true })
  })
  // Keep draining stdout so the child never blocks on a full pipe.
  child.stdout!.resume()
  return child
}

async function killHard (child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return
  const exited = once(child, 'exit')
  child.kill('SIGKILL')
  await exited
}

interface Reply { statusCode: number, body: any }

/** Resolves once `registered` events (from now on) have covered every name in `names`. */
async function registeredAgain (plugin: Plugin, names: string[]): Promise<RegisteredEvent[]> {
  const seen = new Set<string>()
  const events: RegisteredEvent[] = []
  const signal = AbortSignal.timeout(REREGISTER_MS)
  return await new Promise((resolve, reject) => {
    const onRegistered = (event: RegisteredEvent): void => {
      events.push(event)
      for (const name of event.names) seen.add(name)
      if (names.every((n) => seen.has(n))) done()
    }
    const onAbort = (): void => { done(new Error(`not registered again within ${REREGISTER_MS} ms: ${names.join(', ')}`)) }
    function done (err?: Error): void {
      plugin.off('registered', onRegistered)
      signal.removeEventListener('abort', onAbort)
      if (err === undefined) resolve(events)
      else reject(err)
    }
    plugin.on('registered', onRegistered)
    signal.addEventListener('abort', onAbort, { once: true })
  })
}

function toolsOf (listing: Reply, role: string): Map<string, {
  source: string,
  callback_url: string,
  is_remote: boolean
}> {
  assert.equal(listing.statusCode, 200)
  const rows = listing.body.tools_by_role[role] as Array<{
    name: string,
    source: string,
    callback_url: string,
    is_remote: boolean
  }>
  return new Map(rows.map((row) => [row.name, row]))
}

/**
 * A plugin of role A at `tp` that logs nothing and polls instead of following the event stream,
 * unless `options` says otherwise; stopped when the test ends.
 */
function quietPlugin<const T extends Record<string, unknown>> (t: TestContext, tp: { url: string },
  options: Omit<PluginOptions<T>, 'toolportUrl'>): Plugin {
  const plugin = createPlugin<T>({ toolportUrl: tp.url, role: 'A', logger: false, watchEvents: false, ...options })
  t.after(() => plugin.stop({ graceMs: 0 }))
  return plugin
}

test('createPlugin refuses bad options up front, naming every problem (TP_ERR_PLUGIN_OPTIONS)', () => {
  const handler = (): null => null
  assert.throws(() => createPlugin({
    toolportUrl: 'http://192.0.2.1:3917',
    source: 'weather',
    role: '',
    tools: {
      '': { handler },
      ok: { handler, timeoutSeconds: 301 },
      // A type error too (ToolParameters): refused at run time for JavaScript callers.
      list: { handler, parameters: z.array(z.string()) as never },
      nohandler: {} as never
    }
  }), (err: unknown) => {
    assert.ok(err instanceof PluginError)
    assert.equal(err.code, 'TP_ERR_PLUGIN_OPTIONS')
    assert.deepEqual(err.details.map((d) => d.path).sort(), [
      'role', 'source', 'toolportUrl', 'tools.', 'tools.list.parameters', 'tools.nohandler.handler',
      'tools.ok.timeoutSeconds'
    ])
    return true
  })
  assert.throws(() => createPlugin({
    toolportUrl: 'http://127.0.0.1:3917',
    source: 'plugin:',
    tools: { a: { handler } }
  }),
  { code: 'TP_ERR_PLUGIN_OPTIONS' })
  assert.throws(() => createPlugin({ toolportUrl: 'http://127.0.0.1:3917', source: 'plugin:x', tools: {} }),
    { code: 'TP_ERR_PLUGIN_OPTIONS' })
  // A lone surrogate has no UTF-8, so no callback URL path: refused here, as the Python SDK does,
  // not later in start() with a URIError.
  assert.throws(() => createPlugin({ toolportUrl: 'http://127.0.0.1:3917', source: 'plugin:x', tools: { 'a\ud800': { handler } } }),
    (err: unknown) => err instanceof PluginError && err.code === 'TP_ERR_PLUGIN_OPTIONS' &&
      err.details.some((d) => d.path === 'tools.a\ud800' && /lone surrogates/.test(d.message)))
  assert.throws(() => createPlugin({
    toolportUrl: 'http://127.0.0.1:3917',
    source: 'plugin:x',
    host: '0.0.0.0',
    tools: { a: { handler } }
  }),
  { code: 'TP_ERR_PLUGIN_OPTIONS' })
  // JSON has no Infinity: sent, `{"maximum": Infinity}` would be `{"maximum": null}` (Toolport
  // refuses a number outside a double's range as invalid_schema).
  assert.throws(() => createPlugin({
    toolportUrl: 'http://127.0.0.1:3917',
    source: 'plugin:x',
    tools: { a: { handler, parameters: { type: 'object', properties: { n: { type: 'number', maximum: Infinity } } } } }
  }), (err: unknown) => {
    assert.ok(err instanceof PluginError)
    assert.deepEqual(err.details.map((d) => d.path), ['tools.a.parameters.properties.n.maximum'])
    return true
  })
})

test('start() rejects with TP_ERR_PLUGIN_UNREACHABLE when nothing listens and startTimeoutMs is 0; a registration never sent (no connection) is not cleared, so nothing warns of a failed clear', async () => {
  const port = await closedPort()
  const warnings: string[] = []
  const plugin = createPlugin({
    toolportUrl: `http://127.0.0.1:${port}`,
    source: SOURCE,
    logger: { warn: (message: string) => { warnings.push(message) } },
    startTimeoutMs: 0,
    tools: { noop: { handler: () => null } }
  })
  await assert.rejects(plugin.start(), { code: 'TP_ERR_PLUGIN_UNREACHABLE' })
  assert.equal(plugin.isRunning, false)
  assert.deepEqual(warnings, [])
  assert.deepEqual(await plugin.stop(), { isCleared: false, removed: 0, error: null })
  // A failed start leaves a stopped plugin behind: its server is closed, and it cannot start again.
  await assert.rejects(plugin.start(), { code: 'TP_ERR_PLUGIN_STATE' })
})

test('a start() whose registration Toolport took but whose answer never came clears it when it fails (README "Plugin SDK": a failed start() clears what it registered)', async (t) => {
  const tp = await startToolport(t, { roles: ['A'] })
  // A loopback proxy that passes every request to Toolport but withholds the answers to
  // registrations: Toolport registers the tool, the plugin never hears of it.
  const held: Array<() => void> = []
  const proxy = createHttpServer((req, res) => {
    const target = new URL(req.url ?? '/', tp.url)
    const chunks: Buffer[] = []
    req.on('data', (chunk: Buffer) => chunks.push(chunk))
    req.on('end', () => {
      (async () => {
        const answer = await request(target, {
          method: req.method as 'GET' | 'POST',
          headers: { 'content-type': req.headers['content-type'] ?? 'application/json' },
          body: chunks.length === 0 ? undefined : Buffer.concat(chunks)
        })
        const body = await answer.body.text()
        const send = (): void => { res.writeHead(answer.statusCode, { 'content-type': 'application/json' }).end(body) }
        if (target.pathname === '/api/tools/register') held.push(send)
        else send()
      })().catch(() => { res.destroy() })
    })
  })
  await new Promise<void>((resolve) => { proxy.listen(0, '127.0.0.1', resolve) })
  t.after(async () => {
    proxy.closeAllConnections()
    await new Promise((resolve) => { proxy.close(resolve) })
  })
  const plugin = createPlugin({
    toolportUrl: `http://127.0.0.1:${(proxy.address() as AddressInfo).port}`,
    source: 'plugin:held-answer',
    role: 'A',
    logger: false,
    watchEvents: false,
    startTimeoutMs: 0,
    requestTimeoutMs: 500,
    tools: { held: { handler: () => null } }
  })
  await assert.rejects(plugin.start(), { code: 'TP_ERR_PLUGIN_UNREACHABLE' })
  assert.equal(held.length, 1, 'Toolport got the registration')
  // The failed start() cleared the source: no tool is left pointing at its closed server.
  assert.deepEqual(tp.tp.list('A').tools_by_role.A?.map((row) => row.name), [])
})

test('a start() answered `ok: false` after the registry took the tool (every role\'s sync failed) clears it (README "Plugin SDK": a failed start() clears what it registered)', async (t) => {
  const tp = await startToolport(t, { roles: ['A'] })
  tp.tp.roles.get('A').attachSession(session('refuses', 'throw'))
  const plugin = createPlugin({
    toolportUrl: tp.url,
    source: 'plugin:sync-failed',
    role: 'A',
    logger: false,
    watchEvents: false,
    startTimeoutMs: 0,
    tools: { unsynced: { handler: () => null } }
  })
  await assert.rejects(plugin.start(), (err: unknown) => {
    assert.ok(err instanceof PluginError)
    assert.equal(err.code, 'TP_ERR_PLUGIN_REFUSED')
    assert.match(err.message, /did not register 'unsynced'/)
    return true
  })
  // Toolport's registry held it (docs/protocol.md R8: a failed sync is not rolled back) until the
  // failed start() cleared the source.
  assert.deepEqual(tp.tp.list('A').tools_by_role.A?.map((row) => row.name), [])
})

test('a start() answered `ok: false` because no role took the tool (no roles exist) sends no clear: nothing of it is registered (README "Plugin SDK")', async (t) => {
  const tp = await startToolport(t, { roles: [] })
  const plugin = createPlugin({
    toolportUrl: tp.url,
    source: 'plugin:no-roles',
    role: null,
    logger: false,
    watchEvents: false,
    startTimeoutMs: 0,
    tools: { lonely: { handler: () => null } }
  })
  await assert.rejects(plugin.start(), { code: 'TP_ERR_PLUGIN_REFUSED' })
  // A clear would have answered (removed 0) and made this isCleared: true.
  assert.deepEqual(await plugin.stop(), { isCleared: false, removed: 0, error: null })
})

test('a start() whose tool name every role refused (a local tool holds it) rejects at once naming the reason, never retrying for startTimeoutMs; a role that refused it beside one that took it is warned about as a refusal, not a failed sync (README "Plugin SDK": start and stop)', async (t) => {
  const tp = await startToolport(t, { roles: ['A', 'B'] })
  await tp.tp.roles.get('A').registerLocalTool({ name: 'get_time', handler: () => 'local' })
  const only = createPlugin({
    toolportUrl: tp.url,
    source: 'plugin:taken',
    role: 'A',
    logger: false,
    watchEvents: false,
    // Long enough that a retried refusal would outlive the test's hang guard below.
    startTimeoutMs: 600_000,
    tools: { get_time: { handler: () => 'remote' } }
  })
  await within(assert.rejects(only.start(), (err: unknown) => {
    assert.ok(err instanceof PluginError)
    assert.equal(err.code, 'TP_ERR_PLUGIN_REFUSED')
    assert.match(err.message, /did not register 'get_time'.*\(A: 'get_time' is a local tool of this role/)
    assert.deepEqual(err.details.map((d) => d.path), ['A'])
    return true
  }), 'start() to reject', 20_000)
  // Nothing of it was registered, so its failed start() sent no clear.
  assert.deepEqual(await only.stop(), { isCleared: false, removed: 0, error: null })

  const warnings: string[] = []
  const both = createPlugin({
    toolportUrl: tp.url,
    source: 'plugin:taken-in-one',
    role: null,
    logger: { warn: (message: string) => { warnings.push(message) } },
    watchEvents: false,
    tools: { get_time: { handler: () => 'remote' } }
  })
  t.after(() => both.stop({ graceMs: 0 }))
  assert.deepEqual((await both.start()).roles, ['B'])
  assert.equal(warnings.length, 1, warnings.join('\n'))
  assert.match(warnings[0] as string, /'get_time' registered, but 1 role\(s\) refused it: the name is taken \(A: 'get_time' is a local tool/)
})

test('a plugin whose tool another instance of its source took over warns naming that callback\'s origin, never its secret path (README "Plugin SDK" → Privacy)', async (t) => {
  const tp = await startToolport(t, { roles: ['A'] })
  const warnings: string[] = []
  const common = {
    toolportUrl: tp.url, source: 'plugin:twice', role: 'A', watchEvents: false, tools: { shared: { handler: () => null } }
  }
  const logger = { warn: (message: string) => { warnings.push(message) } }
  const first = createPlugin({ ...common, pollIntervalMs: 50, logger })
  await first.start()
  t.after(() => first.stop({ graceMs: 0 }))
  const second = createPlugin({ ...common, logger: false })
  await second.start()
  t.after(() => second.stop({ graceMs: 0 }))
  await waitFor('the first instance\'s warning', () => warnings.some((w) => w.includes('another callback')))
  const taker = String(tp.tp.list('A').tools_by_role.A?.[0]?.callback_url)
  const warning = warnings.find((w) => w.includes('another callback')) as string
  assert.ok(warning.includes(new URL(taker).origin), warning)
  assert.ok(!warning.includes(new URL(taker).pathname), `the warning quotes the other instance's secret path: ${warning}`)
})

test('a plugin against a real Toolport process', { timeout: 180_000 }, async (t: TestContext) => {
  // Nothing listens there yet: the plugin starts first, and Toolport is started (and restarted) on it.
  const port = await closedPort()
  const toolportUrl = `http://127.0.0.1:${port}`
  let toolport: ChildProcess | null = null
  const agent = new Agent({ keepAliveTimeout: 10, keepAliveMaxTimeout: 10 })

  const http = async (method: 'GET' | 'POST', url: string, body?: unknown, headers: Record<string,
    string> = {}): Promise<Reply> => {
    const res = await request(url, {
      dispatcher: agent,
      method,
      headers: body === undefined ? headers : { 'content-type': 'application/json', ...headers },
      ...(body === undefined ? {} : { body: typeof body === 'string' ? body : JSON.stringify(body) })
    })
    const text = await res.body.text()
    let parsed: unknown = text
    try { parsed = JSON.parse(text) } catch {}
    return { statusCode: res.statusCode, body: parsed }
  }
  const api = async (method: 'GET' | 'POST', path: string, body?: unknown): Promise<Reply> => await http(method,
    toolportUrl + path, body)
  const call = async (name: string, args: unknown, callId?: string): Promise<any> => {
    const reply = await api('POST', '/api/tools/call', {
      role: 'A',
      name,
      arguments: args,
      ...(callId === undefined ? {} : { call_id: callId })
    })
    assert.equal(reply.statusCode, 200)
    return reply.body
  }

  // What the handlers saw, so tests can tell whether a handler ran.
  const weatherCalls: Array<{ args: unknown, callId: string, deadlineMs: number }> = []
  const aborts = new EventEmitter()
  // Background failures are retried by the plugin; listening keeps them out of the log.
  const backgroundErrors: PluginError[] = []

  const plugin = createPlugin({
    toolportUrl,
    source: SOURCE,
    logger: false,
    pollIntervalMs: 100,
    maxBackoffMs: 400,
    tools: {
      get_weather: {
        description: 'Get weather for a location.',
        // The refinement has no JSON Schema form: only the SDK can enforce it.
        parameters: z.object({ location: z.string().min(1), unit: z.enum(['c', 'f']).default('c') })
          .refine((v) => v.location !== 'Atlantis', { message: 'Atlantis is not on the map' }),
        handler: ({ location, unit }, ctx) => {
          weatherCalls.push({ args: { location, unit }, callId: ctx.callId, deadlineMs: ctx.deadlineMs })
          if (location === 'Nowhere') throw new Error('location not found')
          return { location, unit, temperature: 28, call_id: ctx.callId }
        }
      },
      wait_for_abort: {
        description: 'Waits until its call is abandoned.',
        parameters: { type: 'object', properties: {} },
        // 2 s: Toolport hangs up at its deadline up to the call's transit time before the plugin's
        // clock runs out, which counts as the deadline within a quarter of it (500 ms).
        timeoutSeconds: 2,
        handler: async (_args, { signal }) => {
          if (!signal.aborted) await once(signal, 'abort')
          aborts.emit('aborted', (signal.reason as Error).name)
          // Throw rather than return: a reply racing Toolport's own deadline could still be taken.
          throw signal.reason
        }
      }
    }
  })
  plugin.on('error', (err) => { backgroundErrors.push(err) })

  t.after(async () => {
    await plugin.stop({ graceMs: 0 })
    if (toolport !== null) await killHard(toolport)
    await agent.close()
  })

  // The plugin starts first: start() keeps trying until Toolport is up (startTimeoutMs).
  const starting = plugin.start()
  toolport = await spawnToolport(port)
  const started = await starting

  await t.test('start() waits for Toolport, then registers every tool with callbacks on the plugin\'s own server', async () => {
    assert.deepEqual(started.names.sort(), ['get_weather', 'wait_for_abort'])
    assert.deepEqual(started.roles, ['A'])
    assert.equal(started.url, plugin.url)
    const tools = toolsOf(await api('GET', '/api/tools'), 'A')
    for (const name of ['get_weather', 'wait_for_abort']) {
      const row = tools.get(name)
      assert.ok(row !== undefined, `${name} is listed`)
      assert.equal(row.source, SOURCE)
      assert.equal(row.is_remote, true)
      assert.equal(row.callback_url, plugin.callbackUrl(name))
      assert.ok(row.callback_url.startsWith(plugin.url + '/'))
    }
  })

  await t.test('R9, R10: a call reaches the handler with parsed arguments, call id and deadline, and returns its output', async () => {
    const result = await call('get_weather', { location: 'Shanghai' }, 'call_1')
    assert.equal(result.is_error, false)
    // unit: the zod default was applied before the handler ran.
    assert.deepEqual(result.output, { location: 'Shanghai', unit: 'c', temperature: 28, call_id: 'call_1' })
    const seen = weatherCalls.at(-1)!
    assert.equal(seen.callId, 'call_1')
    assert.ok(seen.deadlineMs > 0 && seen.deadlineMs <= 30_000)
  })

  await t.test('R11: a handler that throws gives is_error with the error\'s message', async () => {
    const result = await call('get_weather', { location: 'Nowhere' })
    assert.equal(result.is_error, true)
    assert.equal(result.error, 'location not found')
  })

  await t.test('arguments the schema refuses are an error result, and the handler never runs', async () => {
    const before = weatherCalls.length
    // Refused by the SDK's zod check (a refinement JSON Schema cannot carry).
    const refined = await call('get_weather', { location: 'Atlantis' })
    assert.equal(refined.is_error, true)
    assert.match(refined.error, /Atlantis is not on the map/)
    // Refused by Toolport against the converted JSON Schema: it was registered, not dropped.
    const mistyped = await call('get_weather', { location: 42 })
    assert.equal(mistyped.is_error, true)
    // And straight to the callback, bypassing Toolport: the SDK checks by itself.
    const direct = await http('POST', plugin.callbackUrl('get_weather'), {
      name: 'get_weather',
      arguments: { location: 42 },
      call_id: 'c'
    })
    assert.equal(direct.statusCode, 200)
    assert.equal(direct.body.is_error, true)
    assert.match(direct.body.error, /^invalid arguments: /)
    assert.equal(weatherCalls.length, before)
  })

  await t.test('R12: the handler\'s signal aborts once the call is abandoned at its deadline', async () => {
    const aborted = once(aborts, 'aborted')
    const result = await call('wait_for_abort', {})
    assert.equal(result.is_error, true)
    // Whichever comes first, the SDK's deadline timer or Toolport hanging up at its own deadline,
    // the handler is told it was the deadline.
    const [reason] = await aborted
    assert.equal(reason, 'TimeoutError')
  })

  await t.test('R14: the callback server answers only what looks like Toolport', async () => {
    const url = plugin.callbackUrl('get_weather')
    const body = { name: 'get_weather', arguments: { location: 'Paris' } }
    assert.equal((await http('POST', url, JSON.stringify(body), { 'content-type': 'text/plain' })).statusCode, 415)
    assert.equal((await http('POST', url, body, { host: 'attacker.example' })).statusCode, 403)
    assert.equal((await http('POST', url, body, { origin: 'http://attacker.example' })).statusCode, 403)
    assert.equal((await http('POST', `${plugin.url}/tools/get_weather`, body)).statusCode, 404)
    assert.equal((await http('GET', url)).statusCode, 405)
  })

  await t.test('start() of another plugin fails at once when Toolport refuses it (R6: unknown role)', async () => {
    const other = createPlugin({
      toolportUrl,
      source: 'plugin:other',
      role: 'Nobody',
      logger: false,
      tools: { x: { handler: () => null } }
    })
    await assert.rejects(other.start(), (err: unknown) => {
      assert.ok(err instanceof PluginError)
      assert.equal(err.code, 'TP_ERR_PLUGIN_REFUSED')
      assert.equal(err.statusCode, 404)
      assert.equal(err.toolportCode, 'TP_ERR_ROLE_NOT_FOUND')
      return true
    })
  })

  await t.test('R3: after Toolport is killed and restarted on the same port, the tools come back by themselves', async () => {
    const back = registeredAgain(plugin, ['get_weather', 'wait_for_abort'])
    const checkFailed = once(plugin, 'error')
    await killHard(toolport!)
    // The plugin notices: its next check cannot reach Toolport (a background error, retried).
    const [failure] = await checkFailed
    assert.equal((failure as PluginError).code, 'TP_ERR_PLUGIN_UNREACHABLE')
    toolport = await spawnToolport(port)
    const events = await back
    assert.ok(events.every((e) => e.reason === 'restored'))
    const tools = toolsOf(await api('GET', '/api/tools'), 'A')
    assert.equal(tools.get('get_weather')?.callback_url, plugin.callbackUrl('get_weather'))
    assert.equal(tools.get('wait_for_abort')?.callback_url, plugin.callbackUrl('wait_for_abort'))
    // The new Toolport reaches the same callback server.
    const result = await call('get_weather', { location: 'Lisbon', unit: 'f' })
    assert.deepEqual(result.output, { location: 'Lisbon', unit: 'f', temperature: 28, call_id: result.output.call_id })
  })

  await t.test('R15, R13: a tool removed behind the plugin\'s back (as by an eviction) is registered again', async () => {
    const back = registeredAgain(plugin, ['wait_for_abort'])
    const removed = await api('POST', '/api/tools/unregister', { name: 'wait_for_abort' })
    assert.equal(removed.body.removed, true)
    const [event] = await back
    assert.deepEqual(event!.names, ['wait_for_abort'])
    assert.ok(toolsOf(await api('GET', '/api/tools'), 'A').has('wait_for_abort'))
  })

  await t.test('R16: stop() clears the plugin\'s source and closes its callback server', async () => {
    const callbackUrl = plugin.callbackUrl('get_weather')
    const result = await plugin.stop()
    assert.deepEqual(result, { isCleared: true, removed: 2, error: null })
    assert.equal(plugin.isRunning, false)
    const tools = toolsOf(await api('GET', '/api/tools'), 'A')
    assert.equal(tools.size, 0)
    await assert.rejects(http('POST', callbackUrl, { name: 'get_weather', arguments: { location: 'Paris' } }),
      { code: 'ECONNREFUSED' })
  })
})

test('a zod schema whose own formats use lookaheads (hostname, emoji, ISO duration) or a regex RE2 cannot run starts: the pattern is left out of what Toolport gets, and zod still checks it (README "Plugin SDK" → Arguments)', async (t) => {
  const tp = await startToolport(t, { roles: ['A'] })
  const plugin = quietPlugin(t, tp, {
    source: 'plugin:zod-formats',
    startTimeoutMs: 0,
    tools: {
      lookup: {
        parameters: z.object({
          host: z.hostname(),
          mood: z.emoji().optional(),
          span: z.iso.duration().optional(),
          twice: z.string().regex(/^(a)\1$/).optional(),
          hosts: z.tuple([z.hostname(), z.hostname()]).optional(),
          code: z.string().regex(/^[A-Z]{3}$/)
        }),
        handler: ({ host }) => host
      }
    }
  })
  await plugin.start()
  const [row] = tp.tp.list('A').tools_by_role.A ?? []
  assert.equal(row?.name, 'lookup')
  const [definition] = toolDefinitions(tp.tp.roles.get('A'), 'mcp')
  type Properties = Record<string, Record<string, unknown>>
  const properties = (definition?.inputSchema as unknown as { properties: Properties }).properties
  for (const name of ['host', 'mood', 'span', 'twice']) assert.equal(properties[name]?.pattern, undefined, name)
  const tuple = properties.hosts?.prefixItems as Array<Record<string, unknown>>
  for (const item of tuple) assert.equal(item.pattern, undefined)
  // A pattern RE2 runs is kept, and Toolport checks it.
  assert.equal(properties.code?.pattern, '^[A-Z]{3}$')
  assert.equal((await tp.tp.callTool('A', { name: 'lookup', arguments: { host: 'example.com', code: 'abc' } })).is_error, true)
  assert.deepEqual(await tp.tp.callTool('A', { name: 'lookup', arguments: { host: 'example.com', code: 'ABC' } }),
    { is_error: false, output: 'example.com', text: 'example.com' })
  // zod checks what Toolport was not given.
  const refused = await tp.tp.callTool('A', { name: 'lookup', arguments: { host: 'example.com', code: 'ABC', twice: 'ab' } })
  assert.equal(refused.is_error, true)
  assert.match(String(refused.error), /^invalid arguments: /)
})

test('createPlugin refuses a JSON Schema that breaks its dialect\'s meta-schema, as Toolport does at registration (README "Plugin SDK" → Arguments)', async (t) => {
  const { tp } = await startToolport(t, { roles: ['A'] })
  const handler = (): null => null
  for (const parameters of [
    { type: 'object', required: ['a', 'a'] },
    { type: 'object', minProperties: 1.5 },
    { type: 'object', properties: { a: 5 } },
    { $schema: 'http://json-schema.org/draft-07/schema#', type: 'object', required: ['a', 'a'] }
  ]) {
    // Toolport's own verdict on the same schema: a 422, not a start() that fails later.
    await assert.rejects(tp.register({ name: 'x', callback_url: 'http://127.0.0.1:9/tools/x', parameters }),
      { statusCode: 422 }, `Toolport refuses ${JSON.stringify(parameters)}`)
    assert.throws(() => createPlugin({ toolportUrl: 'http://127.0.0.1:3917', source: 'plugin:x', tools: { a: { handler, parameters } } }),
      (err: unknown) => err instanceof PluginError && err.code === 'TP_ERR_PLUGIN_OPTIONS' &&
        err.details.length === 1 && err.details[0]?.path === 'tools.a.parameters' && /JSON Schema/.test(err.details[0].message),
      JSON.stringify(parameters))
  }
  // A schema that is not JSON at all is named, not walked forever.
  const cyclic: Record<string, unknown> = { type: 'object' }
  cyclic.properties = { a: cyclic }
  assert.throws(() => createPlugin({ toolportUrl: 'http://127.0.0.1:3917', source: 'plugin:x', tools: { a: { handler, parameters: cyclic } } }),
    { code: 'TP_ERR_PLUGIN_OPTIONS' })
  // What the meta-schema allows still passes.
  createPlugin({
    toolportUrl: 'http://127.0.0.1:3917',
    source: 'plugin:x',
    tools: { a: { handler, parameters: { type: 'object', required: ['a'], minProperties: 1, properties: { a: true } } } }
  })
})

test('a token is visible ASCII only (0x21–0x7E), as Toolport\'s security.token: others are refused at createPlugin, never left to fail start() (README "Plugin SDK" options)', async (t) => {
  const handler = (): null => null
  for (const token of ['', ' ', 'abc\ndef', 'a b', `${'k'.repeat(40)} `, 'tök'.padEnd(40, 'x'), 't😀'.padEnd(40, 'x'), 'a\u007f'.padEnd(40, 'x')]) {
    assert.throws(() => createPlugin({ toolportUrl: 'http://127.0.0.1:3917', source: 'plugin:x', token, tools: { a: { handler } } }),
      (err: unknown) => err instanceof PluginError && err.code === 'TP_ERR_PLUGIN_OPTIONS' &&
        err.details.some((d) => d.path === 'token' && /visible ASCII/.test(d.message)),
      JSON.stringify(token))
  }
  // Every visible ASCII character, in token mode: the plugin registers with it.
  let token = ''
  for (let c = 0x21; c <= 0x7e; c++) token += String.fromCharCode(c)
  const { tp, url } = await startToolport(t, { roles: ['A'], security: { token } })
  const plugin = createPlugin({ toolportUrl: url, source: 'plugin:ascii-token', token, logger: false, watchEvents: false, startTimeoutMs: 0, tools: { a: { handler } } })
  t.after(() => plugin.stop({ graceMs: 0 }))
  assert.deepEqual((await plugin.start()).names, ['a'])
  assert.equal(tp.list().tools_by_role.A?.[0]?.source, 'plugin:ascii-token')
})

test('an output holding NaN or ±Infinity anywhere is an error result, never a silent null; outputs with null or "null" are not (README "Plugin SDK" → Calls)', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['A'] })
  const outputs: Record<string, () => unknown> = {
    nan: () => NaN,
    minus_infinity: () => -Infinity,
    nested: () => ({ a: [1, { b: Infinity }] }),
    number_object: () => [Object(NaN)],  // a Number object, as `new Number(NaN)` makes
    to_json: () => ({ at: { toJSON: () => NaN } }),
    deep: () => {
      let deep: unknown = [NaN]
      for (let i = 0; i < 600; i++) deep = [deep]
      return deep
    },
    fine_nulls: () => ({ a: null, b: 'null', c: [null, 1.5, -0], d: new Date(0) }),
    fine_deep: () => {
      let deep: unknown = [null]
      for (let i = 0; i < 600; i++) deep = [deep]
      return deep
    }
  }
  const tools: Record<string, { handler: () => unknown }> = {}
  for (const [name, output] of Object.entries(outputs)) tools[name] = { handler: output }
  const plugin = createPlugin({ toolportUrl: url, source: 'plugin:non-finite', logger: false, watchEvents: false, tools })
  t.after(() => plugin.stop({ graceMs: 0 }))
  await plugin.start()
  for (const name of ['nan', 'minus_infinity', 'nested', 'number_object', 'to_json', 'deep']) {
    const result = await tp.callTool('A', { name, arguments: {} })
    assert.equal(result.is_error, true, `${name}: ${JSON.stringify(result)}`)
    assert.match(String(result.error), /could not be encoded as JSON/, name)
  }
  const fine = await tp.callTool('A', { name: 'fine_nulls', arguments: {} })
  assert.deepEqual(fine.output, { a: null, b: 'null', c: [null, 1.5, 0], d: '1970-01-01T00:00:00.000Z' })
  assert.equal((await tp.callTool('A', { name: 'fine_deep', arguments: {} })).is_error, false)
})

test('a zod transform or refinement that throws refuses the arguments as an error result, and the log never holds their text (README "Plugin SDK" → Arguments, Privacy)', async (t) => {
  const { tp, url } = await startToolport(t, { roles: ['A'] })
  const lines: string[] = []
  const record = (line: string): void => { lines.push(line) }
  const ran: string[] = []
  const plugin = createPlugin({
    toolportUrl: url,
    source: 'plugin:throwing-schema',
    watchEvents: false,
    logger: { debug: record, info: record, warn: record, error: record },
    tools: {
      parse_json: {
        parameters: z.object({ data: z.string().transform((text) => JSON.parse(text) as unknown) }),
        handler: (args) => { ran.push('parse_json'); return args.data }
      },
      refine_throws: {
        parameters: z.object({
          n: z.number().refine((n) => { if (n < 0) throw new RangeError('n is negative'); return true })
        }),
        handler: (args) => { ran.push('refine_throws'); return args.n }
      }
    }
  })
  t.after(() => plugin.stop({ graceMs: 0 }))
  await plugin.start()
  const parsed = await tp.callTool('A', { name: 'parse_json', arguments: { data: 'secret-text{' } })
  assert.equal(parsed.is_error, true, JSON.stringify(parsed))
  assert.match(String(parsed.error), /^invalid arguments: /)
  const refined = await tp.callTool('A', { name: 'refine_throws', arguments: { n: -1 } })
  assert.equal(refined.is_error, true, JSON.stringify(refined))
  assert.equal(refined.error, 'invalid arguments: n is negative')
  assert.deepEqual(ran, [], 'no handler ran on refused arguments')
  // Valid arguments still pass the same schemas.
  assert.deepEqual((await tp.callTool('A', { name: 'parse_json', arguments: { data: '{"a":1}' } })).output, { a: 1 })
  assert.equal((await tp.callTool('A', { name: 'refine_throws', arguments: { n: 2 } })).output, 2)
  assert.ok(!lines.some((line) => line.includes('secret-text')), lines.join('\n'))
  assert.ok(!lines.some((line) => line.includes('internal error')), lines.join('\n'))
})

test('start() on a port that is taken rejects with a PluginError (TP_ERR_PLUGIN_LISTEN, cause EADDRINUSE) and leaves the plugin stopped (README "Plugin SDK" errors)', async (t) => {
  const taken = createServer()
  taken.listen(0, '127.0.0.1')
  await once(taken, 'listening')
  t.after(() => { taken.close() })
  const port = (taken.address() as AddressInfo).port
  const plugin = createPlugin({
    toolportUrl: 'http://127.0.0.1:3917', source: 'plugin:busy', port, logger: false, tools: { a: { handler: () => null } }
  })
  await assert.rejects(plugin.start(), (err: unknown) => {
    assert.ok(err instanceof PluginError, String(err))
    assert.equal(err.code, 'TP_ERR_PLUGIN_LISTEN')
    assert.equal((err.cause as NodeJS.ErrnoException).code, 'EADDRINUSE')
    assert.match(err.message, new RegExp(`127\\.0\\.0\\.1:${port}`))
    return true
  })
  assert.equal(plugin.isRunning, false)
  await assert.rejects(plugin.start(), { code: 'TP_ERR_PLUGIN_STATE' })
})

test('the callback server\'s url spells an IPv6 host as the URL parser does ([::1] for 0:0:0:0:0:0:0:1), as its callback URLs (README "Plugin SDK": url)', async (t) => {
  const { url } = await startToolport(t, { roles: ['A'] })
  const plugin = createPlugin({
    toolportUrl: url, source: 'plugin:v6', host: '0:0:0:0:0:0:0:1', logger: false, watchEvents: false, tools: { a: { handler: () => null } }
  })
  t.after(() => plugin.stop({ graceMs: 0 }))
  const started = await plugin.start()
  assert.match(started.url, /^http:\/\/\[::1\]:\d+$/)
  assert.equal(plugin.url, started.url)
  assert.ok(plugin.callbackUrl('a').startsWith(`${started.url}/`), plugin.callbackUrl('a'))
})

test('stop() waits its grace for calls only: a socket still sending its headers, or idle, is closed at once (a closing server no longer times headers out)', async (t) => {
  const tp = await startToolport(t, { roles: ['A'] })
  const plugin = createPlugin({
    toolportUrl: tp.url,
    source: 'plugin:stopper',
    role: 'A',
    logger: false,
    watchEvents: false,
    tools: { ping: { handler: () => 'pong' } }
  })
  await plugin.start()
  const { port } = new URL(plugin.url)
  const sockets = await Promise.all([0, 1].map(async () => {
    const socket = connect(Number(port), '127.0.0.1')
    await once(socket, 'connect')
    socket.on('error', () => {})
    return socket
  }))
  // One sends half a request and waits; the other sends nothing.
  sockets[0]!.write('POST /x HTTP/1.1\r\nHost: 127.0.0.1\r\n')
  t.after(() => { for (const socket of sockets) socket.destroy() })
  const closedAt = sockets.map(async (socket) => { await once(socket, 'close') })
  const stopped = plugin.stop({ graceMs: 600_000 })
  // A hang guard, not a timing: without the fix stop() waits the whole 10-minute grace.
  const guard = new Promise((resolve) => { setTimeout(resolve, 15_000).unref() }).then(() => 'still waiting')
  assert.deepEqual(await Promise.race([stopped.then((r) => r.isCleared), guard]), true)
  await Promise.all(closedAt)
})

test('stop() resolves once the last call in flight is answered: the answer ends its connection (Connection: close) instead of the socket idling until a keep-alive timeout (README "Plugin SDK": start and stop)', async (t) => {
  const tp = await startToolport(t, { roles: ['A'] })
  let release!: () => void
  const released = new Promise<void>((resolve) => { release = resolve })
  let started!: () => void
  const running = new Promise<void>((resolve) => { started = resolve })
  const plugin = quietPlugin(t, tp, {
    source: 'plugin:stop-after-call',
    tools: { slow: { handler: async () => { started(); await released; return 'done' } } }
  })
  await plugin.start()
  // Straight to the callback, as Toolport calls it, on a keep-alive connection of the test's own.
  const socket = connect(Number(new URL(plugin.url).port), '127.0.0.1')
  await once(socket, 'connect')
  t.after(() => { socket.destroy() })
  let answer = ''
  socket.setEncoding('utf8').on('data', (chunk: string) => { answer += chunk })
  const ended = once(socket, 'end')
  const body = JSON.stringify({ name: 'slow', arguments: {}, call_id: 'c1' })
  const path = new URL(plugin.callbackUrl('slow')).pathname
  socket.write(`POST ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\n` +
    `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`)
  await running
  const stopped = plugin.stop({ graceMs: 600_000 })
  // Answer only once the server closed (stop() clears the source first): a new connection is refused.
  const port = Number(new URL(plugin.url).port)
  for (let refused = false; !refused;) {
    const probe = connect(port, '127.0.0.1')
    refused = await new Promise<boolean>((resolve) => {
      probe.once('connect', () => { probe.destroy(); resolve(false) })
      probe.once('error', () => { resolve(true) })
    })
    if (!refused) await new Promise((resolve) => setTimeout(resolve, 10))
  }
  release()
  // A hang guard, not a timing (stop() resolves in ms with the answer ending its connection, and
  // after the server's 5 s keep-alive timeout without): the header below is what fails without it.
  const guard = new Promise((resolve) => { setTimeout(resolve, 60_000).unref() }).then(() => 'still waiting')
  assert.deepEqual(await Promise.race([stopped.then((r) => r.isCleared), guard]), true)
  await ended
  assert.match(answer, /^HTTP\/1\.1 200 /)
  assert.match(answer, /\r\nconnection: close\r\n/i, answer)
  assert.ok(answer.endsWith('"done"}') || answer.includes('"output":"done"'), answer)
})

test('a handler answers an error with an output beside it (ToolError) and images (ToolOutput, Image, Image.fromFile), which reach the ToolResult as a plugin\'s reply carries them (README "Plugin SDK" → Calls; "Errors and images from a plugin")', async (t) => {
  const png = Buffer.from('iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==', 'base64')
  const dir = await mkdtemp(join(tmpdir(), 'toolport-image-'))
  t.after(() => rm(dir, { recursive: true, force: true }))
  const file = join(dir, 'radar.PNG')
  await writeFile(file, png)
  const tp = await startToolport(t, { roles: ['A'] })
  const plugin = quietPlugin(t, tp, {
    source: 'plugin:results',
    tools: {
      radar: { handler: async () => new ToolOutput({ city: 'Oslo' }, { images: [await Image.fromFile(file, { visionPrompt: 'Describe it.' })] }) },
      picture: { handler: () => new Image(png, 'image/png') },
      no_data: { handler: () => { throw new ToolError('NO_DATA', { output: { reason: 'no such city' } }) } },
      bare: { handler: () => { throw new ToolError('BARE') } },
      unencodable: { handler: () => { throw new ToolError('BAD', { output: { n: Number.NaN } }) } }
    }
  })
  await plugin.start()
  const call = async (name: string): Promise<ToolResult> => await tp.tp.callTool('A', { name, arguments: {} })

  const radar = await call('radar')
  assert.deepEqual({ ...radar }, {
    is_error: false,
    output: { city: 'Oslo' },
    text: '{"city":"Oslo"}',
    images: [{ mime_type: 'image/png', data_base64: png.toString('base64'), prompt: 'Describe it.' }]
  })
  const picture = await call('picture')
  assert.equal(picture.is_error, false)
  assert.equal(picture.output, null)
  assert.deepEqual(picture.images, [{ mime_type: 'image/png', data_base64: png.toString('base64') }])
  assert.deepEqual({ ...await call('no_data') }, {
    is_error: true,
    error: 'NO_DATA',
    output: { reason: 'no such city' },
    text: '{"error":"NO_DATA","output":{"reason":"no such city"}}'
  })
  assert.deepEqual({ ...await call('bare') }, { is_error: true, error: 'BARE', output: null, text: '{"error":"BARE"}' })
  const unencodable = await call('unencodable')
  assert.equal(unencodable.is_error, true)
  assert.equal(unencodable.error, 'BAD (its output could not be encoded as JSON: NaN is not a JSON number)')

  assert.throws(() => new Image(png, 'text/plain'), TypeError)
  await assert.rejects(Image.fromFile(join(dir, 'radar.bin')), /cannot tell the image type/)
})

test('a zod union of object schemas (z.discriminatedUnion, z.union) is a tool\'s parameters: registered as its anyOf/oneOf, checked by Toolport and by zod, the handler typed by the union (README "Plugin SDK" → Arguments)', async (t) => {
  const tp = await startToolport(t, { roles: ['A'] })
  const circle = z.object({ shape: z.literal('circle'), r: z.number().positive() })
  const square = z.object({ shape: z.literal('square'), side: z.number().positive() })
  const plugin = quietPlugin(t, tp, {
    source: 'plugin:shapes',
    tools: {
      area: {
        parameters: z.discriminatedUnion('shape', [circle, square]),
        handler: (args) => args.shape === 'circle' ? Math.round(Math.PI * args.r * args.r) : args.side * args.side
      },
      either: {
        parameters: z.union([z.object({ a: z.string() }), z.object({ b: z.number() })]),
        handler: (args) => 'a' in args ? args.a : args.b
      }
    }
  })
  await plugin.start()
  const call = async (name: string, args: Record<string, unknown>): Promise<ToolResult> =>
    await tp.tp.callTool('A', { name, arguments: args })
  assert.equal((await call('area', { shape: 'circle', r: 2 })).output, 13)
  assert.equal((await call('area', { shape: 'square', side: 3 })).output, 9)
  assert.equal((await call('either', { b: 4 })).output, 4)
  // Toolport's check of the schema as registered: no branch fits.
  const refused = await call('area', { shape: 'triangle', side: 3 })
  assert.equal(refused.is_error, true)
  assert.doesNotMatch(String(refused.error), /^invalid arguments: /, 'refused by Toolport, before the plugin')
  // A branch's own bounds hold (positive()).
  const negative = await call('area', { shape: 'square', side: 0 })
  assert.equal(negative.is_error, true)
  // A provider's definition: one object, the branches merged.
  const openai = toolDefinitions(tp.tp.roles.get('A'), 'openai-chat').find((d) => d.function.name === 'area')
  assert.equal((openai?.function.parameters as { type?: unknown }).type, 'object')
})

/** `registeredAgain(plugin, names)`, or the plugin's first background error, whichever comes first. */
async function registeredAgainOrError (plugin: Plugin, names: string[]): Promise<RegisteredEvent[]> {
  const stopWatching = new AbortController()
  const failed = once(plugin, 'error', { signal: stopWatching.signal }).then(
    ([err]) => { throw err instanceof Error ? err : new Error(String(err)) },
    async () => await new Promise<never>(() => {}))
  try {
    return await Promise.race([registeredAgain(plugin, names), failed])
  } finally {
    stopWatching.abort()
  }
}

test('R18: a check reads only the plugin\'s own names, so other sources\' tools past its 64 MiB answer cap do not keep a removed tool from coming back', async (t) => {
  const tp = await startToolport(t, { roles: ['A'], limits: { maxDescriptionChars: 1024 * 1024 } })
  // 11 tools of 1 MiB descriptions of U+0001 (six characters each in JSON): 66 MiB in role A.
  for (let i = 0; i < 11; i++) {
    const result = await tp.tp.register({
      name: `big_${i}`,
      description: '\u0001'.repeat(1024 * 1024),
      callback_url: 'http://127.0.0.1:9/big',
      source: 'plugin:big',
      role: 'A'
    })
    assert.equal(result.ok, true)
  }
  const plugin = quietPlugin(t, tp, {
    source: 'plugin:weather',
    pollIntervalMs: 50,
    tools: { get_weather: { handler: () => 'sunny' } }
  })
  await plugin.start()
  const back = registeredAgainOrError(plugin, ['get_weather'])
  assert.equal((await tp.tp.unregister({ name: 'get_weather' })).removed, true)
  const [event] = await back
  assert.equal(event?.reason, 'restored')
  assert.equal((await tp.tp.callTool('A', { name: 'get_weather' })).output, 'sunny')
})

test('R18: a plugin with more names than one list request holds checks them all, over several requests', async (t) => {
  const tp = await startToolport(t, { roles: ['A'] })
  const tools: Record<string, { handler: () => string }> = {}
  // 64-character names: about 60 fit in one request's query.
  const names = Array.from({ length: 150 }, (_, i) => `tool_${String(i).padStart(3, '0')}_`.padEnd(64, 'x'))
  for (const name of names) tools[name] = { handler: () => name }
  const plugin = quietPlugin(t, tp, { source: 'plugin:many', pollIntervalMs: 50, tools })
  await plugin.start()
  // One name from each request's share, and the last.
  const removed = [names[0]!, names[70]!, names[149]!]
  const back = registeredAgainOrError(plugin, removed)
  for (const name of removed) assert.equal((await tp.tp.unregister({ name })).removed, true)
  await back
  const listed = tp.tp.list('A').tools_by_role.A ?? []
  assert.deepEqual(listed.map((row) => row.name).sort(), [...names].sort())
})

test('a `registered` or `error` listener that throws (or rejects) is logged and ignored: start() and stop() resolve, a re-registration stays a success, and the listeners after it still run (README "Plugin SDK": events)', { timeout: 60_000 }, async (t) => {
  const tp = await startToolport(t, { roles: ['A'] })
  const logged: string[] = []
  const plugin = quietPlugin(t, tp, {
    source: 'plugin:weather',
    pollIntervalMs: 50,
    logger: { error: (message: string) => { logged.push(message) } },
    tools: { get_weather: { handler: () => 'sunny' } }
  })
  const registered: RegisteredEvent[] = []
  const errors: string[] = []
  plugin.on('registered', () => { throw new Error('bug in a registered listener') })
  plugin.on('registered', async () => { throw new Error('bug in an async listener') })
  plugin.on('registered', (event) => { registered.push(event) })
  plugin.on('error', (err) => { errors.push(err.code); throw new Error('bug in an error listener') })
  const monitored: string[] = []
  const emitter: EventEmitter = plugin
  emitter.on(errorMonitor, (err: PluginError) => { monitored.push(err.code) })

  const started = await plugin.start()
  assert.deepEqual(started.names, ['get_weather'])
  assert.equal(plugin.isRunning, true)
  assert.deepEqual(registered.map((e) => e.reason), ['start'])

  const back = registeredAgain(plugin, ['get_weather'])
  assert.equal((await tp.tp.unregister({ name: 'get_weather' })).removed, true)
  await back
  assert.deepEqual(registered.map((e) => e.reason), ['start', 'restored'])
  assert.deepEqual(errors, [], 'a re-registration whose listener threw is no failure')
  await waitFor('the async listener\'s rejections to be logged',
    () => logged.filter((m) => m.includes('bug in an async listener')).length === 2)
  assert.equal(logged.filter((m) => m.includes("'registered' listener threw: bug in a registered listener")).length, 2,
    logged.join('\n'))

  // Toolport gone: stop()'s clear fails, its `error` listener throws, and stop() still resolves.
  await tp.tp.close()
  const stopped = await plugin.stop({ graceMs: 0 })
  assert.equal(stopped.isCleared, false)
  assert.equal(errors.length, 1)
  assert.deepEqual(monitored, errors, 'events.errorMonitor sees each error first, as with emit()')
  assert.equal(plugin.isRunning, false)
  assert.ok(logged.some((m) => m.includes("'error' listener threw: bug in an error listener")), logged.join('\n'))
})
