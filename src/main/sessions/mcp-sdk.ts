// The parts of the official MCP SDK that the endpoint's sessions run on, loaded with the first
// MCP request instead of at start-up: the SDK's server, its Streamable HTTP transport and the
// protocol's schemas cost ~0.15 s of CPU to load, which a Toolport no MCP client ever reaches
// (a test's, a host that only uses the HTTP API) should not pay at every start.
import type * as ServerModule from '@modelcontextprotocol/sdk/server/index.js'
import type * as TransportModule from '@modelcontextprotocol/sdk/server/streamableHttp.js'
import type * as TypesModule from '@modelcontextprotocol/sdk/types.js'

export interface McpSdk {
  Server: typeof ServerModule.Server
  StreamableHTTPServerTransport: typeof TransportModule.StreamableHTTPServerTransport
  types: typeof TypesModule
}

let loading: Promise<McpSdk> | null = null
let loaded: McpSdk | null = null

/** Loads the SDK once; every later call returns the same promise. */
export function loadMcpSdk (): Promise<McpSdk> {
  loading ??= Promise.all([
    import('@modelcontextprotocol/sdk/server/index.js'),
    import('@modelcontextprotocol/sdk/server/streamableHttp.js'),
    import('@modelcontextprotocol/sdk/types.js')
  ]).then(([server, transport, types]) => {
    loaded = { Server: server.Server, StreamableHTTPServerTransport: transport.StreamableHTTPServerTransport, types }
    return loaded
  })
  return loading
}

/** The SDK, once `loadMcpSdk` has resolved (a session exists only after it has). */
export function mcpSdk (): McpSdk {
  if (loaded === null) throw new Error('the MCP SDK is used before loadMcpSdk() resolved')
  return loaded
}
