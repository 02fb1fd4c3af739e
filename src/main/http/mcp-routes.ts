// The per-role MCP endpoint (`/mcp/:role`, MCP Streamable HTTP).
//
// It sits behind the plugin's guard (loopback peer, Host, Origin; Origin validation is a MUST
// of MCP's Streamable HTTP transport), and POST bodies arrive already parsed by the plugin's
// JSON parser (application/json only, size and depth capped). An unknown role is a 404 in the
// TP_ERR_* shape; errors of the MCP protocol itself (no or unknown session, a body that is not
// JSON) answer JSON-RPC errors with the statuses the MCP transport specifies, so MCP clients
// react as they should (a 404 for a session makes them start a new one).
import type { ServerResponse } from 'node:http'
import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest, FastifySchema } from 'fastify'
import type { Runtime } from '../runtime.js'
import { RoleNotFoundError, isToolportError } from '../errors.js'
import { McpSessions, type McpSession, type McpSessionsOptions } from '../sessions/mcp.js'
import { loadMcpSdk } from '../sessions/mcp-sdk.js'
import { readJsonRpcBody } from '../sessions/mcp-info.js'
import { kOnClose } from '../symbols.js'
import { errorText } from '../../shared/util.js'
import { handleError, isHostError } from './error-handler.js'
import { ERROR_BODY_JSON_SCHEMA, documentationOnly, errorResponses, errors } from './openapi.js'

/** JSON-RPC error codes the MCP SDK uses for transport-level errors. */
const RPC_BAD_REQUEST = -32000
const RPC_SESSION_NOT_FOUND = -32001
const RPC_PARSE_ERROR = -32700
const RPC_INVALID_REQUEST = -32600

/** A JSON-RPC message (request, notification or response) as the document describes it. */
const RPC_MESSAGE = {
  type: 'object',
  properties: { jsonrpc: { type: 'string', const: '2.0' } },
  required: ['jsonrpc']
}

/** A JSON-RPC error of the MCP transport (the SDK's or the endpoint's own). */
const RPC_ERROR = {
  type: 'object',
  properties: {
    jsonrpc: { type: 'string', const: '2.0' },
    error: {
      type: 'object',
      properties: { code: { type: 'integer' }, message: { type: 'string' }, data: {} },
      required: ['code', 'message']
    },
    id: { type: ['string', 'number', 'null'] }
  },
  required: ['jsonrpc', 'error', 'id']
}

/** An error answer of the endpoint: a JSON-RPC error, or a TP_ERR_* body (an unknown role, …). */
function mcpError (description: string, rpcOnly = false): Record<string, unknown> {
  return rpcOnly
    ? { ...RPC_ERROR, description }
    : { description, anyOf: [ERROR_BODY_JSON_SCHEMA, RPC_ERROR] }
}

const MCP_ERRORS: Record<number, Record<string, unknown>> = {
  ...errors(),
  // A role segment over 256 characters (`maxParamLength`): answered before the route runs.
  ...errorResponses([414]),
  400: mcpError('no valid Mcp-Session-Id (start with an initialize request), a body that is not JSON or not ' +
    'JSON-RPC, an unsupported MCP-Protocol-Version (JSON-RPC errors)'),
  404: mcpError('unknown role (TP_ERR_ROLE_NOT_FOUND), or an unknown or ended session (JSON-RPC error -32001: ' +
    'start a new session)'),
  406: mcpError('the Accept header lacks application/json and text/event-stream (POST) or text/event-stream (GET)',
    true),
  409: mcpError('the session\'s event stream is already open', true),
  413: mcpError('body too large or too deep (JSON-RPC error -32600, `data.code` TP_ERR_BODY_TOO_LARGE or ' +
    'TP_ERR_JSON_TOO_DEEP)', true),
  415: mcpError('the body is not application/json (TP_ERR_UNSUPPORTED_MEDIA_TYPE)'),
  500: mcpError('the request failed inside the server (JSON-RPC error -32603)'),
  503: mcpError('too many MCP sessions with requests in flight, or Toolport is closed (TP_ERR_CLOSED)')
}

function mcpErrors (...statuses: number[]): Record<number, Record<string, unknown>> {
  const out: Record<number, Record<string, unknown>> = {}
  for (const status of [401, 403, 400, 404, 408, 414, 431, 500, 503, ...statuses]) out[status] = MCP_ERRORS[status]!
  return out
}

const SESSION_HEADERS = {
  type: 'object',
  properties: {
    'mcp-session-id': {
      type: 'string',
      description: 'the session, from the initialize answer\'s Mcp-Session-Id; absent on the initialize request only'
    }
  }
}

/**
 * The document's view of the endpoint (docs/protocol.md "MCP endpoint"); the MCP SDK's transport
 * answers, so the schemas describe and never validate or serialize (`documentationOnly`).
 */
const MCP_ROUTE_SCHEMAS: Record<'POST' | 'GET' | 'DELETE', FastifySchema> = {
  POST: {
    summary: 'MCP Streamable HTTP: a JSON-RPC message of the role\'s MCP session (initialize opens one)',
    tags: ['tools'],
    headers: SESSION_HEADERS,
    body: { anyOf: [RPC_MESSAGE, { type: 'array', items: RPC_MESSAGE }], description: 'a JSON-RPC message or a batch' },
    response: {
      200: {
        description: 'the JSON-RPC answer, as JSON or as an event stream',
        content: {
          'application/json': { schema: { anyOf: [RPC_MESSAGE, { type: 'array', items: RPC_MESSAGE }] } },
          'text/event-stream': { schema: { type: 'string' } }
        }
      },
      202: { type: 'null', description: 'notifications or responses only: accepted, no body' },
      ...mcpErrors(406, 413, 415)
    }
  },
  GET: {
    summary: 'MCP Streamable HTTP: the session\'s event stream of server messages',
    tags: ['tools'],
    headers: SESSION_HEADERS,
    response: {
      200: { description: 'the event stream', content: { 'text/event-stream': { schema: { type: 'string' } } } },
      ...mcpErrors(406, 409)
    }
  },
  DELETE: {
    summary: 'MCP Streamable HTTP: end the session',
    tags: ['tools'],
    headers: SESSION_HEADERS,
    response: {
      200: { type: 'null', description: 'the session ended (no body)' },
      ...mcpErrors(413, 415)
    }
  }
}

/**
 * Registers `POST|GET|DELETE /mcp/:role` on `app`. Every session ends when the app closes.
 * Returns the sessions, for hosts and tests that watch them.
 *
 * @example
 * const sessions = registerMcpRoutes(app, tp)
 * sessions.on('session-opened', ({ role, sessionId }) => {})
 */
export function registerMcpRoutes (app: FastifyInstance, runtime: Runtime,
  options: McpSessionsOptions = {}): McpSessions {
  const sessions = new McpSessions(runtime, options)

  // Every session ends with the runtime, also in a host's app that stays up after it …
  const removeCloseHook = runtime[kOnClose](async () => { await sessions.closeAll() })
  // … and with the app. preClose, not onClose: event streams never end on their own, and the
  // server waits for them.
  app.addHook('preClose', async function closeMcpSessions () {
    removeCloseHook()
    await sessions.closeAll()
  })

  async function mcpRoute (request: FastifyRequest, reply: FastifyReply): Promise<void> {
    const role = (request.params as { role: string }).role
    const header = request.headers['mcp-session-id']
    const sessionId = typeof header === 'string' && header !== '' ? header : undefined
    // A removed role's sessions ended with it (McpSessions, on `role-removed`).
    if (!runtime.roles.has(role)) throw new RoleNotFoundError(role)
    const { types } = await loadMcpSdk()
    if (request.method === 'POST') {
      // JSON that is no JSON-RPC body is -32600, as the bridge answers such a line; the SDK
      // answers it -32700 "Parse error" (and takes `[]` as a batch of nothing, answered 202).
      const messages = readJsonRpcBody(request.body, types.JSONRPCMessageSchema, types.isInitializeRequest)
      if (typeof messages === 'string') {
        sendRpcError(reply, 400, RPC_INVALID_REQUEST, messages)
        return
      }
    }
    let session: McpSession | null | undefined
    if (sessionId === undefined) {
      if (request.method !== 'POST' || !types.isInitializeRequest(request.body)) {
        sendRpcError(reply, 400, RPC_BAD_REQUEST,
          'Bad Request: no valid Mcp-Session-Id header; start with an initialize request')
        return
      }
      // The client is the connection that initializes (see sessions/mcp.ts).
      const socket = request.raw.socket
      session = await sessions.open(role, `${socket.remoteAddress ?? ''}:${socket.remotePort ?? ''}`)
      if (session === null) {
        sendRpcError(reply, 503, RPC_BAD_REQUEST,
          'Service Unavailable: too many MCP sessions with requests in flight, or the server is closing')
        return
      }
    } else {
      session = sessions.get(sessionId)
      if (session === undefined || session.role !== role) {
        sendRpcError(reply, 404, RPC_SESSION_NOT_FOUND, 'Session not found')
        return
      }
    }
    // From here the SDK transport writes the raw response; keep the guard's headers on it.
    for (const [name, value] of Object.entries(reply.getHeaders())) {
      if (value !== undefined) reply.raw.setHeader(name, value)
    }
    keepNoStore(reply.raw)
    reply.hijack()
    try {
      await session.handle(request.raw, reply.raw, request.body)
    } catch (err) {
      request.log.error({ role, message: errorText(err) }, 'MCP request failed')
      if (!reply.raw.headersSent) {
        reply.raw.writeHead(500, { 'content-type': 'application/json' })
        reply.raw.end(JSON.stringify({ jsonrpc: '2.0', error: { code: -32603, message: 'Internal error' }, id: null }))
      } else {
        reply.raw.destroy()
      }
    }
  }

  const routeOptions = { errorHandler: mcpErrorHandler, serializerCompiler: documentationOnly }
  app.post('/mcp/:role', { ...routeOptions, schema: MCP_ROUTE_SCHEMAS.POST }, mcpRoute)
  app.get('/mcp/:role', { ...routeOptions, schema: MCP_ROUTE_SCHEMAS.GET }, mcpRoute)
  app.delete('/mcp/:role', { ...routeOptions, schema: MCP_ROUTE_SCHEMAS.DELETE }, mcpRoute)
  return sessions
}

/**
 * The SDK's transport answers its event streams with `Cache-Control: no-cache, no-transform`;
 * every answer says `no-store` (SECURITY.md). Its other headers (`X-Accel-Buffering`, …) stay.
 */
function keepNoStore (res: ServerResponse): void {
  res.setHeader('cache-control', 'no-store')
  const writeHead = res.writeHead
  res.writeHead = function writeHeadNoStore (this: ServerResponse, ...args: unknown[]): ServerResponse {
    // writeHead's headers would override the one set above: drop their cache-control.
    const last = args.length - 1
    const headers = args[last]
    if (Array.isArray(headers)) {
      const kept: unknown[] = []
      for (let i = 0; i + 1 < headers.length; i += 2) {
        if (String(headers[i]).toLowerCase() !== 'cache-control') kept.push(headers[i], headers[i + 1])
      }
      args[last] = kept
    } else if (headers !== null && typeof headers === 'object') {
      args[last] = Object.fromEntries(Object.entries(headers).filter(([name]) => name.toLowerCase() !== 'cache-control'))
    }
    return Reflect.apply(writeHead, this, args) as ServerResponse
  } as ServerResponse['writeHead']
}

/**
 * A body that cannot be read as JSON is a JSON-RPC error object for MCP clients (-32700 parse
 * error; -32600 for one over the size or depth limit), with the TP_ERR_* code in `data`. Every
 * other error keeps the usual TP_ERR_* body.
 */
function mcpErrorHandler (this: FastifyInstance, err: FastifyError, request: FastifyRequest,
  reply: FastifyReply): void {
  const code = (err as { code?: unknown }).code
  if (isToolportError(err) && (code === 'TP_ERR_BAD_JSON' || code === 'TP_ERR_JSON_TOO_DEEP' ||
    code === 'TP_ERR_BODY_TOO_LARGE')) {
    const rpcCode = code === 'TP_ERR_BAD_JSON' ? RPC_PARSE_ERROR : RPC_INVALID_REQUEST
    const message = `${rpcCode === RPC_PARSE_ERROR ? 'Parse error' : 'Invalid Request'}: ${err.message}`
    reply.code(err.statusCode).type('application/json')
      .send({ jsonrpc: '2.0', error: { code: rpcCode, message, data: { code } }, id: null })
    return
  }
  if (err.code === 'FST_ERR_CTP_BODY_TOO_LARGE') {
    reply.code(413).type('application/json')
      .send({
        jsonrpc: '2.0',
        error: {
          code: RPC_INVALID_REQUEST,
          message: 'Invalid Request: the body is too large',
          data: { code: 'TP_ERR_BODY_TOO_LARGE' }
        },
        id: null
      })
    return
  }
  // A host's hook's own error goes on to the host's handler, as on the other routes.
  if (isHostError(err)) throw err
  handleError.call(this, err, request, reply)
}

function sendRpcError (reply: FastifyReply, statusCode: number, code: number, message: string): void {
  reply.code(statusCode).type('application/json').send({ jsonrpc: '2.0', error: { code, message }, id: null })
}
