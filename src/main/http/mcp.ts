// The per-role MCP endpoint (`/mcp/:role`, MCP Streamable HTTP) and `GET /api/tools/definitions`.
//
// Both sit behind the plugin's guard (loopback peer, Host, Origin; Origin validation is a MUST
// of MCP's Streamable HTTP transport), and POST bodies arrive already parsed by the plugin's
// JSON parser (application/json only, size and depth capped). An unknown role is a 404 in the
// TP_ERR_* shape; errors of the MCP protocol itself (no or unknown session) answer JSON-RPC
// errors with the statuses the MCP transport specifies, so MCP clients react as they should
// (a 404 for a session makes them start a new one).
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import { isInitializeRequest } from '@modelcontextprotocol/sdk/types.js'
import { z } from 'zod'
import type { Runtime } from '../runtime.js'
import { RoleNotFoundError } from '../errors.js'
import { parseOrThrow } from '../schemas.js'
import { McpSessions, type McpSession, type McpSessionsOptions } from '../sessions/mcp.js'
import { DEFINITION_FORMATS } from '../sessions/definitions.js'
import { definitionsBody } from './definitions-body.js'
import { errorText } from '../../shared/util.js'

/** JSON-RPC error codes the MCP SDK uses for transport-level errors. */
const RPC_BAD_REQUEST = -32000
const RPC_SESSION_NOT_FOUND = -32001

/**
 * Registers `POST|GET|DELETE /mcp/:role` on `app`. Every session ends when the app closes.
 * Returns the sessions, for hosts and tests that watch them.
 *
 * @example
 * const sessions = registerMcpRoutes(app, tp)
 * sessions.on('session-opened', ({ role, sessionId }) => {})
 */
export function registerMcpRoutes (app: FastifyInstance, runtime: Runtime, options: McpSessionsOptions = {}): McpSessions {
  const sessions = new McpSessions(runtime, options)

  // preClose, not onClose: event streams never end on their own, and the server waits for them.
  app.addHook('preClose', async function closeMcpSessions () {
    await sessions.closeAll()
  })

  async function mcpRoute (request: FastifyRequest, reply: FastifyReply): Promise<void> {
    const role = (request.params as { role: string }).role
    const header = request.headers['mcp-session-id']
    const sessionId = typeof header === 'string' && header !== '' ? header : undefined
    if (!runtime.roles.has(role)) {
      // A session of a role that was removed since ends with it.
      const orphan = sessionId === undefined ? undefined : sessions.get(sessionId)
      if (orphan !== undefined && orphan.role === role) await orphan.close('role-removed')
      throw new RoleNotFoundError(role)
    }
    let session: McpSession | null | undefined
    if (sessionId === undefined) {
      if (request.method !== 'POST' || !isInitializeRequest(request.body)) {
        sendRpcError(reply, 400, RPC_BAD_REQUEST, 'Bad Request: no valid Mcp-Session-Id header; start with an initialize request')
        return
      }
      session = await sessions.open(role)
      if (session === null) {
        sendRpcError(reply, 503, RPC_BAD_REQUEST, 'Service Unavailable: too many MCP sessions, or the server is closing')
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

  app.post('/mcp/:role', mcpRoute)
  app.get('/mcp/:role', mcpRoute)
  app.delete('/mcp/:role', mcpRoute)
  return sessions
}

const definitionsQuerySchema = z.object({
  role: z.string().min(1),
  format: z.enum(DEFINITION_FORMATS).default('openai-chat')
})

/**
 * Registers `GET /api/tools/definitions?role=NAME&format=…`: a role's tools in a provider's
 * format, for a host's own LLM loop. Unknown role → 404; a bad format → 422; an answer larger
 * than `limits.maxDefinitionsBytes` → 422 TP_ERR_LIMIT_EXCEEDED. The answer is streamed.
 */
export function registerDefinitionRoutes (app: FastifyInstance, runtime: Runtime): void {
  app.get('/api/tools/definitions', async function definitionsRoute (request: FastifyRequest, reply: FastifyReply) {
    const query = parseOrThrow(definitionsQuerySchema, request.query ?? {})
    const role = runtime.roles.get(query.role)
    const body = await definitionsBody(role, query.format, runtime.options.limits.maxDefinitionsBytes)
    return await reply.type('application/json; charset=utf-8').header('content-length', body.bytes).send(body.stream())
  })
}

function sendRpcError (reply: FastifyReply, statusCode: number, code: number, message: string): void {
  reply.code(statusCode).type('application/json').send({ jsonrpc: '2.0', error: { code, message }, id: null })
}
