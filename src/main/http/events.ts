// GET /api/events (Server-Sent Events) and the console's two read-only JSON routes,
// GET /api/console/state and GET /api/console/stats. All sit behind the same guard as every
// route: loopback peer, Host, Origin, and the bearer token in token mode.
import type { ServerResponse } from 'node:http'
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import { z } from 'zod'
import type { Runtime } from '../runtime.js'
import { ClosedError, StreamFullError, validationError } from '../errors.js'
import { parseOrThrow } from '../schemas.js'
import { observerOf, type ConsoleState } from '../observe/observer.js'
import { STREAM_EVENT_TYPES, type EventFilter } from '../observe/event-hub.js'
import { ERROR_BODY_JSON_SCHEMA as errorBody, errors, jsonSchema, textBody } from './openapi.js'
import { sendStreamed, streamedJson, type JsonPart } from './streamed-json.js'

const eventsQuerySchema = z.object({
  /** Only events that concern this role (`hello` always comes). */
  role: z.string().min(1).max(128).optional(),
  /** Comma-separated event types (`hello` always comes). */
  types: z.string().min(1).max(512).optional()
})

const EVENT_TYPES: ReadonlySet<string> = new Set(STREAM_EVENT_TYPES)

/** How long a closing server waits for an event stream's last chunk to be written. */
const STREAM_END_MS = 500

/** Ends `res`; resolves once its last chunk is written, or after `ms` (then it is destroyed). */
async function endWithin (res: ServerResponse, ms: number): Promise<void> {
  await new Promise<void>((resolve) => {
    const timer = setTimeout(() => { res.destroy(); resolve() }, ms)
    res.once('close', () => { clearTimeout(timer); resolve() })
    res.end(() => { clearTimeout(timer); resolve() })
  })
}

/**
 * Registers the event stream and the console's JSON routes on `app`. Streams opened through this
 * app end when it closes (before the server waits for its connections).
 */
export function registerEventRoutes (app: FastifyInstance, runtime: Runtime): void {
  const observer = observerOf(runtime)
  const open = new Map<ServerResponse, () => void>()

  app.addHook('preClose', async function endEventStreams () {
    // Ended, not destroyed: a reader sees the stream end (a fetch reader, the plugin SDKs', would
    // see a network error otherwise). The server destroys every connection next, so the ends are
    // waited for, briefly: a reader that stopped reading does not hold the close up.
    const ended: Array<Promise<void>> = []
    for (const [res, unsubscribe] of open) {
      unsubscribe()
      ended.push(endWithin(res, STREAM_END_MS))
    }
    open.clear()
    await Promise.all(ended)
  })

  app.get('/api/events', {
    schema: {
      summary: 'Live events (Server-Sent Events): hello, registered, unregistered, cleared, evicted, sync, call, role-added, role-removed',
      tags: ['operations'],
      querystring: jsonSchema(eventsQuerySchema, 'input'),
      response: {
        200: textBody('text/event-stream', 'the event stream (a HEAD answers its headers only)'),
        ...errors(422),
        503: { ...errorBody, description: 'every subscriber slot is taken (TP_ERR_STREAM_FULL), or Toolport is closed (TP_ERR_CLOSED)' }
      }
    }
  }, function eventsRoute (request: FastifyRequest, reply: FastifyReply) {
    if (runtime.closed) throw new ClosedError()
    const query = parseOrThrow(eventsQuerySchema, request.query ?? {})
    const filter: EventFilter = { types: parseTypes(query.types), role: query.role ?? null }
    if (!observer.hub.hasRoom) throw new StreamFullError(String(runtime.options.events.maxSubscribers))
    const lastEventId = request.headers['last-event-id']
    const res = reply.raw
    // The guard's headers (nosniff, no-store, …) travel on the raw response too.
    for (const [name, value] of Object.entries(reply.getHeaders())) {
      if (value !== undefined) res.setHeader(name, value)
    }
    reply.hijack()
    res.writeHead(200, {
      'content-type': 'text/event-stream; charset=utf-8',
      'cache-control': 'no-store',
      // Tells a buffering reverse proxy (nginx) to pass events through at once.
      'x-accel-buffering': 'no'
    })
    // A HEAD gets the GET's checks and headers, and no stream: it never takes a subscriber's slot.
    if (request.method === 'HEAD') {
      res.end()
      return
    }
    res.socket?.setNoDelay(true)
    const unsubscribe = observer.hub.subscribe(res, filter, typeof lastEventId === 'string' ? lastEventId : undefined)
    open.set(res, unsubscribe)
    res.once('close', () => {
      unsubscribe()
      open.delete(res)
    })
  })

  app.get('/api/console/state', {
    schema: { summary: 'The console\'s view of the registry: roles, tools, sessions, last syncs, origins, evictions, recent calls', tags: ['operations'], hide: true }
  }, async function consoleStateRoute (_request: FastifyRequest, reply: FastifyReply) {
    // Streamed (streamed-json.ts): every tool's description is in it, so one JSON string of it
    // can be longer than V8 allows, as the list's.
    const body = await streamedJson(consoleStateParts(observer.state()))
    return await sendStreamed(reply, body, runtime.options.limits.answerStallTimeoutMs)
  })

  app.get('/api/console/stats', {
    schema: {
      summary: 'The console\'s live numbers: pool, event stream, per-second call statistics',
      tags: ['operations'],
      hide: true
    }
  }, function consoleStatsRoute () {
    return observer.liveStats()
  })
}

/** The console state as parts: each role's tools are items, written one at a time. */
function consoleStateParts (state: ConsoleState): JsonPart[] {
  const { roles, ...rest } = state
  const parts: JsonPart[] = ['{"roles":[']
  let comma = ''
  for (const { tools, ...role } of roles) {
    // `{"name":…,"last_sync":…` and then the tools: the object has keys, so it ends in `}`.
    parts.push(`${comma}${JSON.stringify(role).slice(0, -1)},"tools":[`, tools, ']}')
    comma = ','
  }
  // The other members: `"instance_id":…}`.
  parts.push(`],${JSON.stringify(rest).slice(1)}`)
  return parts
}

/** The `types` filter as a set, or null for every type; an unknown type is a 422 naming it. */
function parseTypes (text: string | undefined): ReadonlySet<string> | null {
  if (text === undefined) return null
  const types = new Set(text.split(',').map((t) => t.trim()).filter((t) => t !== ''))
  const unknown = [...types].filter((t) => !EVENT_TYPES.has(t))
  if (unknown.length > 0) {
    throw validationError([{
      path: 'types',
      code: 'invalid_value',
      message: `unknown event type(s) ${unknown.join(', ')}; known: ${STREAM_EVENT_TYPES.join(', ')}`
    }])
  }
  types.add('hello')
  return types
}
