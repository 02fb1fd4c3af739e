// How Toolport introduces itself to MCP clients, shared by the endpoint's sessions (mcp.ts) and
// the stdio bridge (cli-bridge.ts), which must not load the endpoint's modules to say it.
import { z } from 'zod'
import { VERSION } from '../version.js'

/** The name and version Toolport gives MCP clients in `initialize`. */
export const MCP_SERVER_INFO = Object.freeze({ name: 'toolport', version: VERSION })

/** What an MCP client is told about a role's server (the endpoint's sessions and the stdio bridge). */
export function mcpInstructions (role: string): string {
  return `The tools of the Toolport role '${role}'. The list changes while you run: tools/list again when notified.`
}

/**
 * The JSON-RPC error a request handler throws: the SDK answers `code`, `message` and `data` as they
 * are. Not an McpError, whose message carries an "MCP error <code>: " prefix that the client's
 * McpError would add a second time.
 */
export function rpcError (code: number, message: string, data?: unknown): Error {
  return Object.assign(new Error(message), data === undefined ? { code } : { code, data })
}

/** The JSON-RPC "invalid params" code (also the SDK's `ErrorCode.InvalidParams`). */
const RPC_INVALID_PARAMS = -32602

/**
 * `schema` (an SDK request schema, e.g. `CallToolRequestSchema`) for `setRequestHandler`, made to
 * answer a request whose params it refuses with -32602 "Invalid params", naming what is wrong. The
 * SDK parses each request with the handler's schema before the handler runs, and answers a
 * failed parse -32603 "Internal error" with zod's whole issue dump. The returned schema accepts
 * any params of the method and runs `schema`'s check itself, throwing the JSON-RPC error, which
 * the SDK answers as it is. What reaches the handler is the request as it came (with any keys
 * `schema` would strip), once `schema` has accepted it: the SDK's request schemas that this is
 * used with have no defaults or transforms.
 */
export function checkedRequest<S extends z.ZodObject<{ method: z.ZodLiteral<string> }>> (schema: S): S {
  const method = schema.shape.method.value
  const loose = z.object({ method: z.literal(method) }).loose().check((context) => {
    const parsed = schema.safeParse(context.value)
    if (!parsed.success) throw rpcError(RPC_INVALID_PARAMS, `Invalid params: ${describeIssues(parsed.error.issues)}`)
  })
  return loose as unknown as S
}

function describeIssues (issues: readonly z.core.$ZodIssue[]): string {
  const shown = issues.slice(0, 5).map((issue) => {
    const path = issue.path.map(String).join('.')
    return `${path === '' ? '(request)' : path}: ${issue.message}`
  })
  return shown.join('; ') + (issues.length > 5 ? `; and ${issues.length - 5} more` : '')
}

/** Messages of one JSON-RPC batch at most (the SDK's Streamable HTTP transport's own bound). */
export const MAX_BATCH_MESSAGES = 100

/** What `readJsonRpcBody` needs of the SDK's `JSONRPCMessageSchema`. */
export interface MessageSchema<M> {
  safeParse: (value: unknown) => { success: true, data: M } | { success: false }
}

/**
 * A JSON value read as a JSON-RPC 2.0 body, one message or a batch (JSON-RPC 2.0 §4–6), by the
 * endpoint's POST and the bridge's lines alike: its messages, as `schema` (the SDK's
 * `JSONRPCMessageSchema`) parses them, or the -32600 "Invalid Request" message for a value that
 * is JSON but no JSON-RPC: not a message, an empty batch, a batch over MAX_BATCH_MESSAGES or with
 * a member that is not a message, or an initialize among others.
 */
export function readJsonRpcBody<M> (value: unknown, schema: MessageSchema<M>,
  isInitialize: (message: M) => boolean): M[] | string {
  if (!Array.isArray(value)) {
    const parsed = schema.safeParse(value)
    return parsed.success ? [parsed.data] : 'Invalid Request: not a JSON-RPC 2.0 message'
  }
  if (value.length === 0) return 'Invalid Request: an empty batch'
  if (value.length > MAX_BATCH_MESSAGES) return `Invalid Request: Batch must not exceed ${MAX_BATCH_MESSAGES} messages`
  const messages: M[] = []
  for (const item of value) {
    const parsed = schema.safeParse(item)
    if (!parsed.success) return 'Invalid Request: a batch member is not a JSON-RPC 2.0 message'
    messages.push(parsed.data)
  }
  if (messages.length > 1 && messages.some(isInitialize)) return 'Invalid Request: Only one initialization request is allowed'
  return messages
}
