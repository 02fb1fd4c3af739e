// How Toolport introduces itself to MCP clients, shared by the endpoint's sessions (mcp.ts) and
// the stdio bridge (cli-bridge.ts), which must not load the endpoint's modules to say it.
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
