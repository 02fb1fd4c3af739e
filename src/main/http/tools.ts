// The /api/tools routes (docs/protocol.md "Routes") and POST /api/tools/call.
import type { ServerResponse } from 'node:http'
import { setTimeout as sleep } from 'node:timers/promises'
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import type { MutationOptions, Runtime } from '../runtime.js'
import { PluginKeyRequiredError } from '../errors.js'
import { isPluginKey, PLUGIN_KEY_HEADER } from '../ownership.js'
import { callSchema, listQuerySchema, parseOrThrow } from '../schemas.js'
import { ROUTE_SCHEMAS } from './openapi.js'
import { ListAnswers } from './list-body.js'
import { sendStreamed } from './streamed-json.js'
import { outputJsonOf, type ToolResult } from '../dispatch/result.js'
import { safeStringify } from '../../shared/reply.js'
import { CallCancel } from '../../shared/cancel.js'
import { kJsonArguments } from '../symbols.js'

/** Registers the routes on `app`, answering from `runtime`. */
export function registerToolRoutes (app: FastifyInstance, runtime: Runtime): void {
  app.post('/api/tools/register', { schema: ROUTE_SCHEMAS.register }, async function registerRoute (request, reply) {
    return await runtime.register(request.body, mutationOptions(runtime, request, reply))
  })

  app.post('/api/tools/unregister', { schema: ROUTE_SCHEMAS.unregister }, async function unregisterRoute (request,
    reply) {
    return await runtime.unregister(request.body, mutationOptions(runtime, request, reply))
  })

  app.post('/api/tools/clear', { schema: ROUTE_SCHEMAS.clear }, async function clearRoute (request, reply) {
    return await runtime.clear(request.body, mutationOptions(runtime, request, reply))
  })

  const listAnswers = new ListAnswers(runtime)
  app.get('/api/tools', { schema: ROUTE_SCHEMAS.list }, async function listRoute (request: FastifyRequest,
    reply: FastifyReply) {
    const query = parseOrThrow(listQuerySchema, request.query ?? {})
    const answer = await listAnswers.answer(query.role, query)
    if (Buffer.isBuffer(answer)) return await reply.type('application/json; charset=utf-8').send(answer)
    return await sendStreamed(reply, answer, runtime.options.limits.answerStallTimeoutMs)
  })

  app.post('/api/tools/call', { schema: ROUTE_SCHEMAS.call }, async function callRoute (request: FastifyRequest,
    reply: FastifyReply) {
    const call = parseOrThrow(callSchema, request.body)
    // A client that hangs up cancels its call (the worker stops the callback request). A
    // CallCancel, not an AbortController: the same contract at a tenth of the cost per request.
    const cancel = new CallCancel()
    const res = reply.raw as CancellableResponse
    res[kCallCancel] = cancel
    res.on('close', cancelOnClose)
    let result
    try {
      result = await runtime.callTool(call.role, call, { signal: cancel, [kJsonArguments]: true })
    } finally {
      res.removeListener('close', cancelOnClose)
      res[kCallCancel] = null
    }
    reply.type('application/json; charset=utf-8').send(toolResultBody(result))
    // Answered while the runtime closes: the server waits for this answer before it closes the
    // connections (a large one may still sit in the socket's buffer).
    if (runtime.closed && !reply.raw.writableFinished) holdClose(runtime, reply.raw)
  })
}

/** Per runtime, the call answers written while it closed and not yet out ('close': sent or cut). */
const answersAtClose = new WeakMap<Runtime, Set<ServerResponse>>()

function holdClose (runtime: Runtime, res: ServerResponse): void {
  let answers = answersAtClose.get(runtime)
  if (answers === undefined) answersAtClose.set(runtime, answers = new Set())
  answers.add(res)
  res.once('close', () => { answers.delete(res) })
}

/** Resolves once every answer `holdClose` holds for `runtime` is out, or after `ms`. */
export async function answersSent (runtime: Runtime, ms: number): Promise<void> {
  const answers = answersAtClose.get(runtime)
  if (answers === undefined || answers.size === 0) return
  const out = Promise.all([...answers].map(async (res) => await new Promise((resolve) => res.once('close', resolve))))
  await Promise.race([out, sleep(ms, undefined, { ref: false })])
}

const kCallCancel = Symbol('toolport.callCancel')
type CancellableResponse = ServerResponse & { [kCallCancel]?: CallCancel | null }

/** The call route's 'close' listener: one function for every request, not a closure per call. */
function cancelOnClose (this: CancellableResponse): void {
  if (!this.writableFinished) this[kCallCancel]?.abort()
}

const NO_OPTIONS: MutationOptions = Object.freeze({})

/**
 * Who asks, for ownership mode: over HTTP every register, unregister and clear must present the
 * plugin key its source is bound to (an API client is never the host). Outside ownership mode
 * the header is ignored.
 */
function mutationOptions (runtime: Runtime, request: FastifyRequest, reply: FastifyReply): MutationOptions {
  if (!runtime.options.security.enforceOwnership) return NO_OPTIONS
  const key = request.headers[PLUGIN_KEY_HEADER]
  if (!isPluginKey(key)) {
    reply.header('www-authenticate', 'Toolport-Plugin-Key')
    throw new PluginKeyRequiredError()
  }
  return { pluginKey: key }
}

/**
 * Bodies of at least this many characters are written into one Buffer (`toolResultBody`); shorter
 * ones stay a string, whose flattening costs little. A reply's text is in the body twice (as the
 * output's JSON and as `text`), so a 16 KiB reply is over it.
 */
const BUFFER_BODY_CHARS = 32 * 1024

/**
 * The call route's body: the ToolResult's JSON, as a string when short and written into one
 * Buffer when long. `text` is reused as the output's JSON where it already is that (a non-string
 * output's `text` is its JSON, often the callback's own body), so a reply is never parsed on the
 * way in only to be encoded again on the way out.
 *
 * Why a Buffer when long: sent as one long string, the concatenation was flattened by fastify
 * counting its bytes (a new ~200 KB string for a 64 KiB reply, a large-object allocation on fresh
 * pages each time) and encoded once more by node to write it: ~2.2 ms of the main thread per
 * request with 64 KiB replies, ~0.5 ms written into a Buffer.
 */
export function toolResultBody (result: ToolResult): string | Buffer {
  // Each read once: a large result decodes its text on each read, and a string output that is
  // the text itself (a text reply) is encoded once for both members.
  const text = result.text
  const textJson = JSON.stringify(text)
  let outputJson = outputJsonOf(result, text, textJson)
  if (outputJson === undefined) {
    const output = result.output
    outputJson = typeof output === 'string'
      ? output === text ? textJson : JSON.stringify(output)
      : output === null || output === undefined || text === ''
        ? 'null'
        : result.is_error ? safeStringify(output) : text
  }
  const head = result.is_error ? '{"is_error":true,"output":' : '{"is_error":false,"output":'
  const error = result.error === undefined ? '' : `,"error":${JSON.stringify(result.error)}`
  const images = result.images === undefined ? '' : `,"images":${JSON.stringify(result.images)}`
  if (outputJson.length + textJson.length + images.length < BUFFER_BODY_CHARS) {
    return `${head}${outputJson}${error},"text":${textJson}${images}}`
  }
  const parts = [head, outputJson, error, ',"text":', textJson, images, '}']
  let bytes = 0
  for (const part of parts) bytes += Buffer.byteLength(part)
  const body = Buffer.allocUnsafe(bytes)
  let offset = 0
  for (const part of parts) offset += body.write(part, offset)
  return body
}
