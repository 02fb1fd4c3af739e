// The plugin SDK's error catalogue. The SDK is a client of the HTTP API and must not import from
// src/main, so it has its own small class instead of the @fastify/error catalogue; the codes
// follow the same `TP_ERR_<AREA>_<WHAT>` scheme so one `switch (err.code)` can cover both.

/** Every code a `PluginError` can carry. */
export const PLUGIN_ERROR_CODES = {
  /** `createPlugin` was given invalid options (`details` lists each problem). */
  options: 'TP_ERR_PLUGIN_OPTIONS',
  /** `start()` called twice, or after `stop()`; or `start()` interrupted by `stop()`. */
  state: 'TP_ERR_PLUGIN_STATE',
  /** Toolport could not be reached (connection failure or no answer in `requestTimeoutMs`). */
  unreachable: 'TP_ERR_PLUGIN_UNREACHABLE',
  /** Toolport answered with an HTTP error, or no role accepted a registration (docs/protocol.md R8). */
  refused: 'TP_ERR_PLUGIN_REFUSED',
  /** `start()` could not register within `startTimeoutMs`; `cause` is the last failure. */
  startTimeout: 'TP_ERR_PLUGIN_START_TIMEOUT',
  /**
   * `start()` could not listen on `host`:`port` (the port is in use, the address is not the
   * machine's); `cause` is the system error. Not retried.
   */
  listen: 'TP_ERR_PLUGIN_LISTEN'
} as const

export type PluginErrorCode = typeof PLUGIN_ERROR_CODES[keyof typeof PLUGIN_ERROR_CODES]

/** One problem with one option, e.g. `{ path: 'tools.get_weather.timeoutSeconds', message: '…' }`. */
export interface PluginErrorDetail {
  path: string
  message: string
}

export interface PluginErrorInit {
  /** The HTTP status Toolport answered with (TP_ERR_PLUGIN_REFUSED). */
  statusCode?: number | undefined
  /** The `code` of Toolport's error body, e.g. `TP_ERR_ROLE_NOT_FOUND`. */
  toolportCode?: string | undefined
  details?: PluginErrorDetail[] | undefined
  cause?: unknown
}

/**
 * An error of the plugin SDK, with a stable `code` from `PLUGIN_ERROR_CODES`.
 *
 * @example
 * try { await plugin.start() } catch (err) {
 *   if (err instanceof PluginError && err.code === 'TP_ERR_PLUGIN_REFUSED') console.error(err.toolportCode)
 * }
 */
export class PluginError extends Error {
  readonly code: PluginErrorCode
  readonly statusCode: number | undefined
  readonly toolportCode: string | undefined
  readonly details: PluginErrorDetail[]

  constructor (code: PluginErrorCode, message: string, init: PluginErrorInit = {}) {
    super(message, init.cause === undefined ? undefined : { cause: init.cause })
    this.name = 'PluginError'
    this.code = code
    this.statusCode = init.statusCode
    this.toolportCode = init.toolportCode
    this.details = init.details ?? []
  }
}

/** Registrations every role refused because the name is taken (a local tool, another source's). */
const nameTaken = new WeakSet<PluginError>()

/** Marks `err` as a registration every role refused because another owner holds the name. */
export function markNameTaken (err: PluginError): void {
  nameTaken.add(err)
}

/**
 * True for a failure worth retrying: Toolport is down, overloaded or closing (5xx), or had no role
 * to take the registration. A 4xx answer is the plugin's own mistake and will not heal by itself,
 * nor does a name every role refused because a local tool or another source holds it.
 */
export function isTransient (err: unknown): boolean {
  if (!(err instanceof PluginError)) return false
  if (err.code === PLUGIN_ERROR_CODES.unreachable) return true
  if (err.code !== PLUGIN_ERROR_CODES.refused || nameTaken.has(err)) return false
  return err.statusCode === undefined || err.statusCode >= 500
}
