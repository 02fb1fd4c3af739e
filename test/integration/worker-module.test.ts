// Worker threads started from a process run under tsx load the built dist/ modules when they are
// fresh, with an explicit execArgv: per-process flags of the parent (a V8 option such as
// --expose-gc) must not be passed on, or the worker refuses to start.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { fileURLToPath } from 'node:url'
import { distIsFresh } from '../../src/main/dispatch/worker-module.js'

const ROOT = fileURLToPath(new URL('../..', import.meta.url))

/**
 * Runs an ES module script in a fresh process with `flags`; resolves with the JSON its last line
 * prints and its stderr. `$` in an import path stands for the modules: the built `dist/` as users
 * load it when it is fresh (a process without tsx costs ~0.6 s of CPU less) unless `tsx` is asked
 * for, else the sources under tsx.
 */
async function runScript (script: string, { flags = [], tsx = false }: { flags?: string[], tsx?: boolean } = {}):
Promise<{ result: any, stderr: string }> {
  const built = !tsx && distIsFresh(ROOT)
  const source = script.replaceAll(/'\$\/([^'?]+)\.ts(\?[^']*)?'/g, (_, path: string, query = '') =>
    built ? `'./dist/${path.replace(/^src\//, '')}.js${query}'` : `'./${path}.ts${query}'`)
  const child = spawn(process.execPath, [...flags, ...(built ? [] : ['--import', 'tsx']), '--input-type=module', '-e', source],
    { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] })
  let out = ''
  let stderr = ''
  child.stdout.on('data', (chunk: Buffer) => { out += chunk.toString() })
  child.stderr.on('data', (chunk: Buffer) => { stderr += chunk.toString() })
  const [code] = await once(child, 'exit')
  assert.equal(code, 0, stderr)
  return { result: JSON.parse(out.trim().split('\n').pop() as string), stderr }
}

const PONG_SERVER = `
  import { createServer } from 'node:http'
  const received = []
  const server = createServer((req, res) => {
    let body = ''
    req.on('data', (chunk) => { body += chunk })
    req.on('end', () => { received.push(body); res.setHeader('content-type', 'application/json'); res.end('{"output":"pong"}') })
  })
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve))
  const callback = 'http://127.0.0.1:' + server.address().port + '/ping'
`

test('a pool-mode Toolport starts and dispatches in a process run with --expose-gc under tsx', async () => {
  const { result, stderr } = await runScript(`
    import { createToolport } from '$/src/main/index.ts'
    ${PONG_SERVER}
    const tp = await createToolport({ roles: ['A'], dispatch: { mode: 'pool' } })
    await tp.register({ name: 'ping', callback_url: callback })
    const result = await tp.callTool('A', { name: 'ping', arguments: {} })
    const threads = tp.health().dispatch.threads
    await tp.close()
    server.close()
    console.log(JSON.stringify({ gc: typeof globalThis.gc, threads, output: result.output }))
  `, { flags: ['--expose-gc'], tsx: true })
  assert.doesNotMatch(stderr, /ERR_WORKER_INVALID_EXEC_ARGV/)
  assert.equal(result.gc, 'function', 'the parent kept its own flag')
  assert.equal(result.threads, 1)
  assert.equal(result.output, 'pong', 'the call went through the pool worker')
})

/**
 * One fresh process for the start-up checks below (a process per check would cost ~1.5 s of CPU
 * each): pool mode first, then the first inline Toolport of the process, then an inline
 * dispatcher from a second instance of its module (a query string), whose client is not loaded yet.
 */
let startup: Promise<any> | undefined
function startupChecks (): Promise<any> {
  startup ??= runScript(`
    import { createRequire } from 'node:module'
    import { createToolport } from '$/src/main/index.ts'
    import { parseOptions } from '$/src/main/config.ts'
    ${PONG_SERVER}
    const undiciLoaded = () => Object.keys(createRequire(import.meta.url).cache).some((f) => f.includes('/node_modules/undici/'))
    const pool = await createToolport({ roles: ['A'], dispatch: { mode: 'pool' }, logger: false })
    await pool.register({ name: 'ping', callback_url: callback })
    const poolOutput = (await pool.callTool('A', { name: 'ping', arguments: {} })).output
    const afterPool = undiciLoaded()
    await pool.close()
    const inline = await createToolport({ roles: ['A'], dispatch: { mode: 'inline' }, logger: false })
    const afterInline = undiciLoaded()
    await inline.close()

    const { Dispatcher } = await import('$/src/main/dispatch/dispatcher.ts?before-load')
    const { origin, pathname } = new URL(callback)
    received.length = 0
    const dispatcher = new Dispatcher(parseOptions({ dispatch: { mode: 'inline' } }).dispatch)
    const request = (i) => ({ url: callback, origin, path: pathname, body: '{"i":' + i + '}', callId: 'c' + i,
      deadline: Date.now() + 10000, timeoutMs: 10000, maxResponseBytes: 65536 })
    const controller = new AbortController()
    // All in this turn, before the module's import can settle: 1 is cancelled while held, and 3
    // then takes its slot (the last one freed), with a newer id.
    const calls = [dispatcher.dispatch(request(0)), dispatcher.dispatch(request(1), controller.signal), dispatcher.dispatch(request(2))]
    controller.abort()
    calls.push(dispatcher.dispatch(request(3)))
    const outcomes = await Promise.all(calls)
    await dispatcher.close()
    server.close()
    console.log(JSON.stringify({ poolOutput, afterPool, afterInline, received: received.sort(),
      kinds: outcomes.map((o) => o.kind), texts: outcomes.map((o) => o.text) }))
  `).then(({ result }) => result)
  return startup
}

test('start-up: pool mode never loads undici on the main thread; inline mode has it before createToolport resolves', async () => {
  const result = await startupChecks()
  assert.equal(result.poolOutput, 'pong', 'the pool-mode call went through its worker')
  assert.equal(result.afterPool, false, 'the main thread of a pool-mode Toolport loaded no undici module')
  assert.equal(result.afterInline, true, 'createToolport resolved with the inline client loaded')
})

test('start-up: an inline dispatcher made before its client loaded holds its first calls, then sends each once; a cancelled one is answered at once and never sent', async () => {
  const result = await startupChecks()
  assert.deepEqual(result.kinds, ['ok', 'cancelled', 'ok', 'ok'])
  assert.deepEqual([result.texts[0], result.texts[2], result.texts[3]], ['pong', 'pong', 'pong'])
  assert.deepEqual(result.received.map((body: string) => JSON.parse(body).i), [0, 2, 3],
    'the plugin got each held call once, and never the cancelled one')
})
