// The fastify app and the embeddable plugin.
import fastify, {
  LogController, type FastifyInstance, type FastifyPluginCallback, type FastifyReply, type FastifyRequest
} from 'fastify'
import { isRuntime, type Runtime } from '../runtime.js'
import { describeValue } from '../../shared/util.js'
import { buildGuard } from './guard.js'
import { ConnectionPressure } from './connections.js'
import {
  buildFrameworkErrorHandler, handleClientError, handleError, handleHostedError, handleNotFound
} from './error-handler.js'
import { buildJsonParser } from './json-body.js'
import { registerToolRoutes } from './tools.js'
import { registerOperationRoutes } from './operations.js'
import { noValidation, registerDocs } from './openapi.js'
import { registerMcpRoutes } from './mcp-routes.js'
import { registerDefinitionRoutes } from './definitions.js'
import { registerEventRoutes } from './events.js'
import { buildAppGuard, isConsolePath, registerConsole } from './console.js'
import { observerOf } from '../observe/observer.js'
import { ClosedError, ConfigError } from '../errors.js'
import { buildLazySerializer } from './serializers.js'

export interface ToolportPluginOptions {
  /** The runtime whose registry the routes serve. */
  runtime: Runtime
  /**
   * Install the loopback/Host/Origin guard on the plugin's routes (default true). The standalone
   * app installs it at the root instead, so unknown paths are guarded too.
   */
  guard?: boolean | undefined
}

/**
 * A fastify plugin with every Toolport route, for a host that mounts them in its own app.
 * The guard, JSON-only body parser and error mapping apply to these routes only (encapsulated).
 *
 * @example
 * app.register(toolportPlugin, { runtime: tp })
 */
export const toolportPlugin: FastifyPluginCallback<ToolportPluginOptions> = function toolportPlugin (app, options,
  done) {
  // A bad option is an error of `register`/`ready` (thrown here, fastify would not catch it: the
  // host's process would die of an uncaught TypeError).
  const runtime: unknown = options?.runtime
  if (!isRuntime(runtime)) {
    done(new ConfigError('toolportPlugin: options.runtime must be a Toolport runtime (createToolport()\'s ' +
      `result), as in app.register(toolportPlugin, { runtime: tp }) (got ${describeValue(runtime)})`))
    return
  }
  if (options.guard !== undefined && typeof options.guard !== 'boolean') {
    done(new ConfigError(`toolportPlugin: options.guard must be a boolean (got ${describeValue(options.guard)})`))
    return
  }
  registerRoutes(app, runtime, options.guard !== false, false)
  done()
}

/**
 * The routes, in `app`'s scope. `isStandalone`: `app` is Toolport's own (buildApp), not a host's,
 * so every error is Toolport's to answer; in a host's app, errors of the host's own hooks reach
 * the host's error handler.
 */
function registerRoutes (app: FastifyInstance, runtime: Runtime, guard: boolean, isStandalone: boolean): void {
  if (guard) app.addHook('onRequest', buildGuard(runtime.options.security))
  // After the guard (a refused client learns nothing of the runtime's state): once the runtime is
  // closing, every route but the health report and the last metrics answers
  // 503 TP_ERR_CLOSED, also in a host's app that stays up (docs/architecture.md, "close()").
  // Their URLs as fastify registers them, with the host's prefix (`app.register(toolportPlugin,
  // { prefix })`), however it is spelt (a trailing slash is folded into one).
  const openAfterClose = new Set<string>()
  const { maxBodyBytes } = runtime.options.limits
  app.addHook('onRoute', (route) => {
    // The body limit is the runtime's on every route, also in a host's app whose own `bodyLimit`
    // differs: it is enforced, and named in the 413's message (fastify reads a route's own first).
    route.bodyLimit = maxBodyBytes
    // `routePath` loses its leading slash to a prefix that ends in one.
    const path = route.routePath.startsWith('/') ? route.routePath : `/${route.routePath}`
    if (OPEN_AFTER_CLOSE.has(path)) openAfterClose.add(route.url)
  })
  app.addHook('onRequest', function refuseWhenClosed (request, _reply, done) {
    if (runtime.closed && !openAfterClose.has(request.routeOptions.url ?? '')) done(new ClosedError())
    else done()
  })
  app.removeAllContentTypeParsers()
  app.addContentTypeParser('application/json', { parseAs: 'string' },
    buildJsonParser(runtime.options.limits.maxJsonDepth))
  app.setErrorHandler(isStandalone ? handleError : handleHostedError)
  app.setValidatorCompiler(noValidation)
  app.setSerializerCompiler(serializerOf)
  // In a host's app, a root reply serializer of the host's (`setReplySerializer`, an envelope)
  // would be used for these routes' objects instead of their response schemas. Each request that
  // reaches Toolport's own hooks is answered with the route's serializers; what the host's hooks
  // answer before that (its 401, its rate limit) keeps the host's.
  if (!isStandalone) app.addHook('onRequest', useOwnSerializer)
  registerToolRoutes(app, runtime)
  registerOperationRoutes(app, runtime)
  registerDefinitionRoutes(app, runtime)
  registerMcpRoutes(app, runtime)
  registerEventRoutes(app, runtime)
}

const compileSerializer = buildLazySerializer({}, undefined)

function useOwnSerializer (_request: FastifyRequest, reply: FastifyReply, done: () => void): void {
  reply.serializer(serializeOwn)
  done()
}

/** fastify calls a reply's serializer as the reply's method: the route's writer for the status, as without one. */
function serializeOwn (this: FastifyReply, payload: unknown): string {
  // What fastify does without a reply serializer, and skips with one: JSON's type with its charset.
  const type = this.getHeader('content-type')
  if (type === undefined) {
    this.header('content-type', 'application/json; charset=utf-8')
  } else if (typeof type === 'string' && type.includes('json') && !/;\s*charset=/i.test(type)) {
    this.header('content-type', `${type}; charset=utf-8`)
  }
  // fastify hands a reply's serializer strings too: a route's text (metrics) or its JSON written ahead.
  if (typeof payload === 'string') return payload
  const write = this.getSerializationFunction(String(this.statusCode))
  return write === undefined ? JSON.stringify(payload) : write(payload as Record<string, unknown>)
}

/**
 * The serializers of Toolport's routes, whatever the host's app sets (a zod type provider's
 * compiler would refuse their JSON schemas): fast-json-stringify from their response schemas, but
 * for error statuses. Those schemas document Toolport's own error body; a host's hook may answer
 * such a status with a body of its own (its 401 login page, its 404), which the schema's writer
 * would refuse (a 500). Toolport's error bodies are plain objects: JSON.stringify writes them.
 */
function serializerOf (route: Parameters<Parameters<FastifyInstance['setSerializerCompiler']>[0]>[0]): (data: unknown) => string {
  if (/^[45]/.test(String(route.httpStatus))) return stringify
  return compileSerializer(route as never) as (data: unknown) => string
}

function stringify (data: unknown): string {
  return JSON.stringify(data)
}

/** Routes that still answer once the runtime is closed: what they report stays true. */
const OPEN_AFTER_CLOSE: ReadonlySet<string> = new Set(['/api/health', '/metrics'])

/** Builds the standalone app: the guard on every request, the routes, JSON errors everywhere. */
export function buildApp (runtime: Runtime): FastifyInstance {
  const guard = buildAppGuard(runtime.options.security, runtime.options.console)
  // Typed as the default instance: the pino Logger type is wider than FastifyBaseLogger, and the
  // routes only use the base logger's methods.
  const app: FastifyInstance = fastify({
    loggerInstance: runtime.log,
    // R1: the socket's peer decides; X-Forwarded-For is never trusted.
    trustProxy: false,
    bodyLimit: runtime.options.limits.maxBodyBytes,
    // Time to receive a whole request (not to answer it: tool calls may take minutes).
    requestTimeout: 30_000,
    connectionTimeout: 0,
    keepAliveTimeout: 65_000,
    routerOptions: { maxParamLength: 256 },
    // Every answer is the guard's or in the documented shape, also for requests that never reach
    // a route: an HTTP/1.1 request without Host reaches the guard (its 403) instead of Node's bare
    // 400; what the router refuses passes the guard first; what Node cannot parse gets the JSON
    // body, the security headers and Connection: close.
    http: { requireHostHeader: false },
    frameworkErrors: buildFrameworkErrorHandler(guard),
    clientErrorHandler: handleClientError,
    forceCloseConnections: true,
    return503OnClosing: true,
    // Calls are logged by the runtime (metadata only, at debug); per-request lines would be noise.
    logController: new LogController({ disableRequestLogging: true }),
    // No child logger per request (measured in the e2e profile): the runtime logs call metadata
    // itself, and errors are logged with their code.
    childLoggerFactory: reuseLogger,
    // The response schemas (kept for /docs) get their serializers on first use (see serializers.ts).
    schemaController: { compilersFactory: { buildSerializer: buildLazySerializer } }
  }) as unknown as FastifyInstance
  app.server.headersTimeout = 15_000
  // The event ring and the console's numbers start now, not when the routes are first mounted.
  observerOf(runtime)
  app.addHook('onRequest', guard)
  const { limits } = runtime.options
  const connections = new ConnectionPressure(app.server, limits)
  if (runtime.options.security.token !== undefined) {
    const hasConsole = runtime.options.console
    // Runs only after the guard let the request through, i.e. with the valid token (but for the
    // console's files, which skip the token check and so prove nothing): under connection
    // pressure this socket is then shed last.
    app.addHook('onRequest', function markTokenSocket (request, _reply, done) {
      if (!hasConsole || !isConsolePath(request)) connections.markTrusted(request.raw.socket)
      done()
    })
  }
  app.removeAllContentTypeParsers()
  app.addContentTypeParser('application/json', { parseAs: 'string' },
    buildJsonParser(runtime.options.limits.maxJsonDepth))
  app.setErrorHandler(handleError)
  app.setNotFoundHandler(handleNotFound)
  // Docs first: @fastify/swagger collects the routes registered after it.
  registerDocs(app)
  app.register(function toolportRoutes (child, _options, done) {
    registerRoutes(child, runtime, false, true)
    done()
  })
  if (runtime.options.console) registerConsole(app)
  return app
}

function reuseLogger<T> (logger: T): T {
  return logger
}
