// The per-role MCP endpoint (`/mcp/:role`, MCP Streamable HTTP).
//
// It sits behind the plugin's guard (loopback peer, Host, Origin; Origin validation is a MUST
// of MCP's Streamable HTTP transport), and POST bodies arrive already parsed by the plugin's
// JSON parser (application/json only, size and depth capped). An unknown role is a 404 in the
// TP_ERR_* shape; errors of the MCP protocol itself (no or unknown session, a body that is not
// JSON) answer JSON-RPC errors with the statuses the MCP transport specifies, so MCP clients
// react as they should (a 404 for a session makes them start a new one).
import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import type { Runtime } from '../runtime.js'
import { RoleNotFoundError, isToolportError } from '../errors.js'
import { McpSessions, type McpSession, type McpSessionsOptions } from '../sessions/mcp.js'
import { loadMcpSdk } from '../sessions/mcp-sdk.js'
import { errorText } from '../../shared/util.js'
import { handleError } from './error-handler.js'

/** JSON-RPC error codes the MCP SDK uses for transport-level errors. */
const RPC_BAD_REQUEST = -32000
const RPC_SESSION_NOT_FOUND = -32001
const RPC_PARSE_ERROR = -32700
const RPC_INVALID_REQUEST = -32600

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

  // preClose, not onClose: event streams never end on their own, and the server waits for them.
  app.addHook('preClose', async function closeMcpSessions () {
    await sessions.closeAll()
  })

  async function mcpRoute (request: FastifyRequest, reply: FastifyReply): Promise<void> {
    const role = (request.params as { role: string }).role
    const header = request.headers['mcp-session-id']
    const sessionId = typeof header === 'string' && header !== '' ? header : undefined
    // A removed role's sessions ended with it (McpSessions, on `role-removed`).
    if (!runtime.roles.has(role)) throw new RoleNotFoundError(role)
    let session: McpSession | null | undefined
    if (sessionId === undefined) {
      if (request.method !== 'POST' || !(await loadMcpSdk()).types.isInitializeRequest(request.body)) {
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

  const routeOptions = { errorHandler: mcpErrorHandler }
  app.post('/mcp/:role', routeOptions, mcpRoute)
  app.get('/mcp/:role', routeOptions, mcpRoute)
  app.delete('/mcp/:role', routeOptions, mcpRoute)
  return sessions
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
  handleError.call(this, err, request, reply)
}

function sendRpcError (reply: FastifyReply, statusCode: number, code: number, message: string): void {
  reply.code(statusCode).type('application/json').send({ jsonrpc: '2.0', error: { code, message }, id: null })
}
