// Worker threads started from a process run under tsx load the built dist/ modules when they are
// fresh, with an explicit execArgv: per-process flags of the parent (a V8 option such as
// --expose-gc) must not be passed on, or the worker refuses to start.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { fileURLToPath } from 'node:url'

const ROOT = fileURLToPath(new URL('../..', import.meta.url))

test('a pool-mode Toolport starts and dispatches in a process run with --expose-gc under tsx', async () => {
  const script = `
    import { createServer } from 'node:http'
    import { createToolport } from './src/main/index.ts'
    const server = createServer((req, res) => {
      req.resume()
      req.on('end', () => { res.setHeader('content-type', 'application/json'); res.end('{"output":"pong"}') })
    })
    await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve))
    const tp = await createToolport({ roles: ['A'], dispatch: { mode: 'pool' } })
    await tp.register({ name: 'ping', callback_url: 'http://127.0.0.1:' + server.address().port + '/ping' })
    const result = await tp.callTool('A', { name: 'ping', arguments: {} })
    const threads = tp.health().dispatch.threads
    await tp.close()
    server.close()
    console.log(JSON.stringify({ gc: typeof globalThis.gc, threads, output: result.output }))
  `
  const child = spawn(process.execPath, ['--expose-gc', '--import', 'tsx', '--input-type=module', '-e', script],
    { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] })
  let out = ''
  let err = ''
  child.stdout.on('data', (chunk: Buffer) => { out += chunk.toString() })
  child.stderr.on('data', (chunk: Buffer) => { err += chunk.toString() })
  const [code] = await once(child, 'exit')
  assert.equal(code, 0, err)
  assert.doesNotMatch(err, /ERR_WORKER_INVALID_EXEC_ARGV/)
  const result = JSON.parse(out.trim().split('\n').pop() as string) as { gc: string, threads: number, output: unknown }
  assert.equal(result.gc, 'function', 'the parent kept its own flag')
  assert.equal(result.threads, 1)
  assert.equal(result.output, 'pong', 'the call went through the pool worker')
})
