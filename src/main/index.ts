// The public library entry: named exports only. Every value exported here is public API, listed
// in the README and guarded by test/unit/exports.test.ts.
export { createToolport, Toolport } from './toolport.js'
export type { ListenOptions, ListenResult } from './toolport.js'
export { Runtime } from './runtime.js'
export type {
  RegisterResult, UnregisterResult, ClearResult, ListResult, ListFilter, FailedRole, RefusedRole, ToolCall,
  CallToolOptions, MutationOptions, HealthReport
} from './runtime.js'
export { toolportPlugin } from './http/app.js'
export type { ToolportPluginOptions } from './http/app.js'
export type { ModelSession, SyncOutcome } from './roles/sync.js'
export type { Role, LocalToolOptions } from './roles/role.js'
export type { JsonSchemaObject } from './schemas.js'
export type { RoleManager } from './roles/roles.js'
export type { ToolDefinition, ToolListing, LocalToolHandler, LocalToolContext } from './roles/tool-registry.js'
export type { ToolResult, ToolImage } from './dispatch/result.js'
export type { CancelSignal, CancelListener } from '../shared/cancel.js'
export type { ToolportOptions, ResolvedOptions } from './config.js'
export type {
  ToolportEvents, ToolRegisteredEvent, ToolRemovedEvent, OriginEvictedEvent, CallFinishedEvent, SyncFailedEvent,
  SyncFinishedEvent, RoleChangedEvent
} from './events.js'
export { ERROR_CODES, isToolportError } from './errors.js'
export type { ToolportError, ErrorDetail } from './errors.js'
export { checkCallbackUrl, isLoopbackAddress } from '../shared/loopback.js'
export { createRealtimeSession } from './sessions/realtime.js'
export type {
  RealtimeSession, RealtimeSessionOptions, RealtimeClientEvent, RealtimeDialect, RealtimeRateLimit
} from './sessions/realtime.js'
export { toolDefinitions } from './sessions/definitions.js'
export type {
  DefinitionFormat, DefinitionsByFormat, DefinitionSource, ObjectSchema, OpenAIChatTool, OpenAIRealtimeTool,
  AnthropicTool, GeminiTool, GeminiFunctionDeclaration, McpTool
} from './sessions/definitions.js'
export { toolResultBlock } from './sessions/result-blocks.js'
export type {
  ResultFormat, ResultBlocksByFormat, AnthropicToolResultBlock, AnthropicResultContent,
  OpenAIResponsesFunctionCallOutput, OpenAIResponsesOutputContent, OpenAIChatToolMessage
} from './sessions/result-blocks.js'
