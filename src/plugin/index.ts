// The public entry of `toolport/plugin`: the plugin SDK. Named exports only; every value here is
// public API, listed in the README section "Plugin SDK".
//
// The SDK is a client of Toolport's HTTP API (docs/protocol.md "Routes") and a server of the callback protocol
// (docs/protocol.md R9–R14). It never imports from src/main: a plugin process must not load the server.
import { resolvePluginOptions, type PluginOptions, type PluginTool } from './options.js'
import { Plugin } from './plugin.js'

/**
 * Creates a plugin: a callback server for its tools and the registrations that point at it,
 * kept alive across Toolport restarts and evictions. Nothing happens until `start()`. Options are
 * checked at once: a `PluginError` with code `TP_ERR_PLUGIN_OPTIONS` names every problem.
 *
 * @example
 * import { z } from 'zod'
 * import { createPlugin } from 'toolport/plugin'
 *
 * const plugin = createPlugin({
 *   toolportUrl: 'http://127.0.0.1:3917',
 *   source: 'plugin:weather',
 *   tools: {
 *     get_weather: {
 *       description: 'Get weather for a location.',
 *       parameters: z.object({ location: z.string() }),
 *       handler: async ({ location }, { signal }) => ({ location, temperature_c: 28 })
 *     }
 *   }
 * })
 * await plugin.start()
 * process.once('SIGTERM', async () => { await plugin.stop() })
 */
export function createPlugin<const T extends Record<string, unknown>> (options: PluginOptions<T>): Plugin {
  return new Plugin(resolvePluginOptions(options as unknown as PluginOptions))
}

/**
 * Types one tool apart from `createPlugin`, so a tool defined in its own module keeps its
 * handler's argument type. Returns its argument unchanged.
 *
 * @example
 * export const getWeather = defineTool({
 *   parameters: z.object({ location: z.string() }),
 *   handler: ({ location }) => ({ location, temperature_c: 28 })
 * })
 */
export function defineTool<P = undefined> (tool: PluginTool<P>): PluginTool<P> {
  return tool
}

export type { Plugin } from './plugin.js'
export type { PluginEvents, RegisteredEvent, RegisteredReason, StartResult, StopResult, StopOptions } from './plugin.js'
export type {
  PluginOptions, PluginTool, PluginLogger, ToolParameters, ToolArguments, ToolCallContext, JsonSchemaObject
} from './options.js'
export { PluginError, PLUGIN_ERROR_CODES } from './errors.js'
export { Image, ToolError, ToolOutput } from './results.js'
export type { PluginErrorCode, PluginErrorDetail } from './errors.js'
