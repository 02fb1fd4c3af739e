// An MCP session for the load generator: opened with the official MCP SDK's client, then handed
// to autocannon as the headers its `tools/call` requests carry (the e2e scenario and `npm run
// profile -- --path mcp`).
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { RAW_ARGUMENTS, toolName } from './clients.js'

const JSON_HEADERS = { 'content-type': 'application/json' }

/** MCP's `tools/call` runs on one session, which takes at most 32 calls at once by default. */
export const MCP_MAX_CONCURRENCY = 32

// `[<id>]`: the load generator gives each request an id of its own, as JSON-RPC requires of
// requests in flight on one session.
export const MCP_CALL_BODY = JSON.stringify({
  jsonrpc: '2.0',
  id: '[<id>]',
  method: 'tools/call',
  params: { name: toolName('small'), arguments: JSON.parse(RAW_ARGUMENTS) as unknown }
})

/** An MCP session of the SDK's client: the headers its requests carry, for the load generator. */
export interface McpSession {
  headers: Record<string, string>
  close: () => Promise<void>
}

/**
 * Opens an MCP session on `url` with the MCP SDK's client and makes one call, which must succeed:
 * a refused or failed MCP call is still an HTTP 200, which the load generator would count as
 * answered. The load generator then POSTs `tools/call` with the session's headers.
 */
export async function mcpSession (url: string): Promise<McpSession> {
  const client = new Client({ name: 'toolport-bench', version: '1' })
  const transport = new StreamableHTTPClientTransport(new URL(url))
  await client.connect(transport)
  try {
    const probe = await client.callTool({ name: toolName('small'), arguments: JSON.parse(RAW_ARGUMENTS) as Record<string, unknown> })
    if (probe.isError === true) throw new Error(`MCP tools/call on ${url} did not succeed: ${JSON.stringify(probe).slice(0, 300)}`)
    const { sessionId, protocolVersion } = transport
    if (sessionId === undefined || protocolVersion === undefined) throw new Error(`MCP initialize on ${url} opened no session`)
    return {
      headers: {
        ...JSON_HEADERS,
        accept: 'application/json, text/event-stream',
        'mcp-session-id': sessionId,
        'mcp-protocol-version': protocolVersion
      },
      close: () => client.close()
    }
  } catch (err) {
    await client.close()
    throw err
  }
}
