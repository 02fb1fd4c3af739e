// The dispatch paths under test, each reduced to "make one call to this callback route and tell
// whether it succeeded", so every path runs in the very same closed loop:
//
// - raw undici: `Pool.request` on the main thread, the body read as text. The floor: what any
//   client in this process must pay to send the same request (the same body and the same headers
//   as Toolport's, `callbackHeaders`, so the callback server parses the same bytes). Same
//   connection cap as Toolport's per-origin pool.
// - toolport inline / pool: `tp.callTool()` on a real Toolport (createToolport), which also parses
//   and validates the arguments, builds the body, maps the reply to a ToolResult.
// - fetch: Node's global fetch with its default dispatcher (what a naive implementation uses).
// - node:http: `http.request` with a keep-alive Agent and default options (ditto).
// - thread round trip: no call at all, one message to a worker thread and its echo back on a
//   MessageChannel, as a pool-mode call crosses a lane. Pool mode runs the raw client in a worker,
//   so at c=1 its latency cannot go below raw undici's plus this.
import { once } from 'node:events'
import { Agent as HttpAgent, request as httpRequest } from 'node:http'
import { MessageChannel, Worker } from 'node:worker_threads'
import { resolve as resolvePath } from 'node:path'
import { pathToFileURL } from 'node:url'
import { Pool } from 'undici'
import { createToolport } from '../../src/main/index.js'
import { LANE_CALLS } from '../../src/workers/protocol.js'
import type { Toolport, ToolportOptions } from '../../src/main/index.js'

/** Callback routes of bench/fixtures/callback-server.ts. */
export const ROUTES = {
  small: '/small',
  large: '/large',
  text: '/text',
  fast: '/sleep/1',
  slow: '/sleep/200',
  hold: '/sleep/1500'
} as const
export type Route = keyof typeof ROUTES

/** The arguments a model sends, as text (an OpenAI-style `arguments` string). */
export const RAW_ARGUMENTS = '{"city":"Shanghai","units":"metric"}'

export const PARAMETERS = {
  type: 'object',
  properties: { city: { type: 'string' }, units: { type: 'string', enum: ['metric', 'imperial'] } },
  required: ['city']
}

/** The body Toolport sends for a call (mirrors Runtime.callTool), so baselines send the same bytes. */
export function callbackBody (route: Route, callId: string): string {
  return `{"name":${JSON.stringify(toolName(route))},"arguments":${RAW_ARGUMENTS},"call_id":${JSON.stringify(callId)},"raw_arguments":${JSON.stringify(RAW_ARGUMENTS)}}`
}

/**
 * The headers Toolport sends with a call (src/shared/callback-client.ts; docs/protocol.md R9), so
 * that every baseline sends the same request and the callback server does the same work for it.
 * `deadlineMs` is the call's remaining budget, computed per call as Toolport does.
 */
export function callbackHeaders (callId: string, deadlineMs: number): Record<string, string> {
  return {
    'content-type': 'application/json',
    accept: 'application/json',
    'user-agent': 'toolport',
    'x-toolport-call-id': callId,
    'x-toolport-deadline-ms': String(deadlineMs)
  }
}

/** The tools' budget in the bench (timeout_seconds 60), for the baselines' deadline header. */
const CALL_BUDGET_MS = 60_000

export function toolName (route: Route): string {
  return `echo_${route}`
}

export type Caller = () => Promise<boolean>

export interface DispatchPath {
  name: string
  caller: (route: Route) => Caller
  close: () => Promise<void>
  /** Runs only at this concurrency and reply size (default: every cell). */
  only?: { concurrency: number, route: Route }
}

/** Toolport's default connection cap per origin; raw undici uses the same for a fair floor. */
export const CONNECTIONS = 64

/** `parse`: also check that the reply is JSON (`JSON.parse`), as any correct client must. */
export function rawUndiciPath (origin: string, connections = CONNECTIONS, name = 'raw undici',
  parse = false): DispatchPath {
  const pool = new Pool(origin, { connections, pipelining: 1 })
  return {
    name,
    caller (route) {
      const path = ROUTES[route]
      const body = callbackBody(route, 'call_raw')
      return async function rawCall (): Promise<boolean> {
        // Built per call, as Toolport builds them (the deadline header changes every call).
        const headers = callbackHeaders('call_raw', CALL_BUDGET_MS)
        const { statusCode, body: reply } = await pool.request({ method: 'POST', path, headers, body })
        const text = await reply.text()
        if (parse) JSON.parse(text)
        return statusCode === 200
      }
    },
    close: () => pool.destroy()
  }
}

/**
 * The floor of any design that hands a call to another thread: a worker that echoes each message
 * on a MessageChannel (the worker's event loop idle in between, as a pool worker's is at c=1). The
 * message is a lane batch of one call's size: the opcode and the nine fields of a task.
 */
export async function threadRoundTripPath (): Promise<DispatchPath> {
  const worker = new Worker(`
    const { parentPort } = require('node:worker_threads')
    parentPort.once('message', (port) => {
      port.on('message', (message) => { port.postMessage(message) })
      parentPort.postMessage('ready')
    })
  `, { eval: true })
  const { port1, port2 } = new MessageChannel()
  worker.postMessage(port2, [port2])
  await once(worker, 'message')
  // One message in flight at a time: the path runs at c=1 only (`only`).
  let answer: ((ok: boolean) => void) | null = null
  port1.on('message', () => {
    const settle = answer
    answer = null
    settle?.(true)
  })
  const message = [LANE_CALLS, 1, 'http://127.0.0.1:1/small', 'http://127.0.0.1:1', '/small', callbackBody('small', 'call_rt'),
    'call_rt', Date.now() + CALL_BUDGET_MS, CALL_BUDGET_MS, 4_194_304]
  return {
    name: 'thread round trip',
    only: { concurrency: 1, route: 'small' },
    caller () {
      return function roundTrip (): Promise<boolean> {
        return new Promise((resolve) => {
          answer = resolve
          port1.postMessage(message)
        })
      }
    },
    close: async () => {
      port1.close()
      await worker.terminate()
    }
  }
}

export function fetchPath (origin: string): DispatchPath {
  return {
    name: 'fetch',
    caller (route) {
      const url = origin + ROUTES[route]
      const body = callbackBody(route, 'call_fetch')
      return async function fetchCall (): Promise<boolean> {
        const headers = callbackHeaders('call_fetch', CALL_BUDGET_MS)
        const res = await fetch(url, { method: 'POST', headers, body })
        await res.text()
        return res.status === 200
      }
    },
    close: async () => {}
  }
}

export function nodeHttpPath (port: number): DispatchPath {
  const agent = new HttpAgent({ keepAlive: true })
  return {
    name: 'node:http',
    caller (route) {
      const path = ROUTES[route]
      const body = callbackBody(route, 'call_http')
      const length = Buffer.byteLength(body)
      return function httpCall (): Promise<boolean> {
        const options = {
          agent,
          host: '127.0.0.1',
          port,
          path,
          method: 'POST',
          headers: { ...callbackHeaders('call_http', CALL_BUDGET_MS), 'content-length': length }
        }
        return new Promise((resolve) => {
          const req = httpRequest(options, (res) => {
            res.setEncoding('utf8')
            let text = ''
            res.on('data', (chunk: string) => { text += chunk })
            res.on('end', () => { resolve(res.statusCode === 200 && text.length > 0) })
            res.on('error', () => { resolve(false) })
          })
          req.on('error', () => { resolve(false) })
          req.end(body)
        })
      }
    },
    close: async () => { agent.destroy() }
  }
}

export type CreateToolport = (options: ToolportOptions) => Promise<Toolport>

/**
 * `createToolport` of another checkout of Toolport (for A/B runs against a baseline tree): its
 * `src/main/index.ts` loaded under tsx beside this one, or with `build` its `dist/main/index.js`.
 */
export async function loadCreateToolport (dir: string, build = false): Promise<CreateToolport> {
  const url = pathToFileURL(resolvePath(dir, build ? 'dist/main/index.js' : 'src/main/index.ts')).href
  const module = await import(url) as { createToolport: CreateToolport }
  return module.createToolport
}

/** Creates a Toolport with role `bench` and one `echo_<route>` tool per callback route. */
export async function createBenchToolport (origin: string, options: ToolportOptions = {},
  create: CreateToolport = createToolport): Promise<Toolport> {
  const tp = await create({ roles: ['bench'], logger: false, ...options })
  for (const route of Object.keys(ROUTES) as Route[]) {
    const result = await tp.register({
      name: toolName(route),
      description: `bench tool answering from ${ROUTES[route]}`,
      parameters: PARAMETERS,
      callback_url: origin + ROUTES[route],
      role: 'bench',
      source: 'plugin:bench',
      timeout_seconds: 60
    })
    if (!result.ok) throw new Error(`could not register ${toolName(route)}: ${result.error ?? ''}`)
  }
  return tp
}

export async function toolportPath (origin: string, mode: 'pool' | 'inline', dispatch: ToolportOptions['dispatch'] = {},
  create: CreateToolport = createToolport, name = `toolport ${mode}`): Promise<DispatchPath & { tp: Toolport }> {
  const tp = await createBenchToolport(origin, { dispatch: { ...dispatch, mode } }, create)
  let seq = 0
  return {
    name,
    tp,
    caller (route) {
      const name = toolName(route)
      return async function toolportCall (): Promise<boolean> {
        const result = await tp.callTool('bench', { name, raw_arguments: RAW_ARGUMENTS, call_id: `call_${++seq}` })
        // Read the model-visible text, as raw undici reads the body as text: a caller that passes
        // the result on needs it, and a large result builds it only when read.
        return !result.is_error && result.text.length > 0
      }
    },
    close: () => tp.close()
  }
}
