// Maps every error a route can raise to the JSON error body (docs/protocol.md "Errors of the API itself"):
// `{ ok: false, statusCode, code, error, message, details? }` with a stable TP_ERR_* code.
import { STATUS_CODES } from 'node:http'
import type { Http2ServerRequest } from 'node:http2'
import type { Socket } from 'node:net'
import type { FastifyBaseLogger, FastifyError, FastifyReply, FastifyRequest } from 'fastify'
import {
  BadJsonError, BadRequestError, BodyTooLargeError, InternalError, RouteNotFoundError, UnsupportedMediaTypeError,
  isToolportError, type ErrorDetail, type ToolportError
} from '../errors.js'
import { peerRefusal, SECURITY_HEADERS, type GuardHook } from './guard.js'

/** The body of every error answer. */
export interface ErrorBody {
  ok: false
  statusCode: number
  code: string
  error: string
  message: string
  details?: ErrorDetail[]
}

/** fastify's setErrorHandler: answers with the mapped error. */
export function handleError (this: unknown, err: FastifyError, request: FastifyRequest, reply: FastifyReply): void {
  let mapped = toToolportError(err, request)
  // fastify reads the body of a request no route matches before its not-found handler runs: a
  // body it cannot read there (not JSON, too large or deep, of another media type) must not hide
  // that the route does not exist. The guard's refusals (401, 403) still come first, and so does
  // a request that cannot be routed at all (a bad %-escape: 400).
  if (request.is404 && UNREAD_BODY_CODES.has(mapped.code)) mapped = notFound(request)
  if (mapped.statusCode >= 500) {
    // Code and message only: raw error objects may carry callback bodies or arguments.
    request.log.error({ code: (err as { code?: unknown }).code, message: err.message }, 'request failed')
  } else {
    logRefusal(request, mapped)
  }
  // A refused client (no token, not loopback, foreign Host/Origin, not the owner) keeps no socket:
  // an idle keep-alive connection it holds would count against limits.maxConnections.
  if (mapped.statusCode === 401 || mapped.statusCode === 403) closeAfter(request, reply)
  reply.code(mapped.statusCode).type('application/json').send(errorBody(mapped))
}

/**
 * The error handler of the routes in a host's app (`toolportPlugin`): an error of the host's own
 * hooks (its 401 login, 403 ACL, 429 rate limit: an error with a status of its own that is not
 * Toolport's nor one of reading the body) is the host's to answer, and goes on to the host's
 * error handler as it is. Everything else is answered as in the standalone server.
 */
export function handleHostedError (this: unknown, err: FastifyError, request: FastifyRequest,
  reply: FastifyReply): void {
  if (isHostError(err)) throw err
  handleError(err, request, reply)
}

export function isHostError (err: FastifyError): boolean {
  if (isToolportError(err)) return false
  // fastify's own (reading the body, …) and Node's (a request stream cut) concern the route itself.
  const code: unknown = err.code
  if (typeof code === 'string' && (code.startsWith('FST_') || NODE_ERROR_CODE.test(code))) return false
  // fastify answers `statusCode`, else `status`.
  const status: unknown = err.statusCode ?? (err as { status?: unknown }).status
  return typeof status === 'number' && status >= 400 && status < 600
}

const NODE_ERROR_CODE = /^(E[A-Z0-9]+|ERR_[A-Z0-9_]+)$/

/**
 * Ends the client's connection after this answer: `Connection: close` on HTTP/1.x. HTTP/2 has no
 * such header (RFC 9113 §8.2.2; Node warns and drops it), so a host's HTTP/2 session is closed
 * instead once the answer is sent: it takes no new streams, and those in flight complete.
 */
function closeAfter (request: FastifyRequest, reply: FastifyReply): void {
  if (request.raw.httpVersionMajor < 2) {
    reply.header('connection', 'close')
    return
  }
  const session = (request.raw as unknown as Http2ServerRequest).stream?.session
  if (session !== undefined) reply.raw.once('finish', () => { if (!session.closed) session.close() })
}

/** The answers to a body that could not be read: bad JSON, too large or deep, not JSON. */
const UNREAD_BODY_CODES: ReadonlySet<string> = new Set([
  'TP_ERR_BAD_JSON', 'TP_ERR_JSON_TOO_DEEP', 'TP_ERR_BODY_TOO_LARGE', 'TP_ERR_UNSUPPORTED_MEDIA_TYPE'
])

function notFound (request: FastifyRequest): ToolportError {
  return new RouteNotFoundError(`${request.method} ${request.url.split('?')[0]}`) as ToolportError
}

/** fastify's setNotFoundHandler. */
export function handleNotFound (request: FastifyRequest, reply: FastifyReply): void {
  const mapped = notFound(request)
  logRefusal(request, mapped)
  reply.code(404).type('application/json').send(errorBody(mapped))
}

/**
 * At debug, so that an operator can see why a client is turned away (its answer says so too): the
 * code, status, method and route, never the path as sent nor anything else the client wrote.
 */
function logRefusal (request: FastifyRequest, err: ToolportError): void {
  // Refusals are what a flood sends: no log object unless debug is on (pino says; a host's logger
  // without isLevelEnabled is given the line to judge).
  const log = request.log as FastifyBaseLogger & { isLevelEnabled?: (level: string) => boolean }
  if (log.isLevelEnabled?.('debug') === false) return
  request.log.debug({
    code: err.code,
    status: err.statusCode,
    method: request.method,
    route: request.routeOptions.url
  }, 'request refused')
}

/**
 * fastify's `frameworkErrors`: a request fastify refuses before routing (a bad %-escape in the
 * path, a path parameter over `maxParamLength`) passes the guard first, as every route does, so
 * a foreign Host or a missing token is answered 403/401 and never learns more; then the refusal
 * is answered in the documented shape (a 4xx status with TP_ERR_BAD_REQUEST).
 */
export function buildFrameworkErrorHandler (guard: GuardHook) {
  return function handleFrameworkError (err: FastifyError, request: FastifyRequest, reply: FastifyReply): void {
    guard(request, reply, (refused?: Error) => {
      handleError(refused === undefined ? err : refused as FastifyError, request, reply)
    })
  }
}

/**
 * Node's client errors: the status fastify's own handler answers, kept, and the message. Any
 * other code is a 400.
 */
const CLIENT_ERRORS: ReadonlyMap<string, readonly [status: number, message: string]> = new Map([
  ['ERR_HTTP_REQUEST_TIMEOUT', [408, 'the request was not received in time']],
  ['HPE_HEADER_OVERFLOW', [431, 'the request headers are too large']]
])

/** The guard's security headers as raw HTTP/1.1 header lines, for handleClientError. */
const SECURITY_HEADER_LINES = SECURITY_HEADERS
  .map(([name, value]) => `${name.replace(/(^|-)[a-z]/g, (s) => s.toUpperCase())}: ${value}\r\n`).join('')

/**
 * fastify's `clientErrorHandler`: a request Node's HTTP parser could not read (a bad
 * Content-Length, a malformed request line or header, headers too large, not received in
 * time). There is no request to run the guard on, so only its first check applies: a peer that is
 * not loopback is answered 403 TP_ERR_NOT_LOOPBACK; every other client a 400 (408, 431) with
 * TP_ERR_BAD_REQUEST. The answer is the documented JSON body with the security headers every
 * answer carries, and closes the connection (the rest of the stream cannot be read).
 */
export function handleClientError (err: Error & { code?: string }, socket: Socket): void {
  if (err.code === 'ECONNRESET' || socket.destroyed) return
  // A response already under way on this socket (a pipelined request) cannot be followed by ours.
  const pending = (socket as Socket & { _httpMessage?: { headersSent?: boolean } })._httpMessage
  if (!socket.writable || pending?.headersSent === true) {
    socket.destroy()
    return
  }
  let mapped = peerRefusal(socket.remoteAddress) as ToolportError | null
  if (mapped === null) {
    const [status, message] = CLIENT_ERRORS.get(err.code ?? '') ??
      [400, `the request could not be read (${err.code ?? 'malformed'})`]
    mapped = new BadRequestError(message) as ToolportError
    mapped.statusCode = status
  }
  const body = errorBody(mapped)
  const json = JSON.stringify(body)
  socket.end(`HTTP/1.1 ${body.statusCode} ${body.error}\r\n` +
    'Content-Type: application/json; charset=utf-8\r\n' +
    `Content-Length: ${Buffer.byteLength(json)}\r\n` +
    SECURITY_HEADER_LINES +
    `Connection: close\r\n\r\n${json}`, () => { socket.destroy() })
}

export function errorBody (err: ToolportError): ErrorBody {
  const body: ErrorBody = {
    ok: false,
    statusCode: err.statusCode,
    code: err.code,
    error: STATUS_CODES[err.statusCode] ?? 'Error',
    message: err.message
  }
  if (err.details !== undefined) body.details = err.details
  return body
}

function toToolportError (err: FastifyError, request: FastifyRequest): ToolportError {
  if (isToolportError(err)) return err
  switch (err.code) {
    case 'FST_ERR_CTP_INVALID_MEDIA_TYPE':
      return new UnsupportedMediaTypeError(request.headers['content-type'] ?? 'no Content-Type') as ToolportError
    case 'FST_ERR_CTP_BODY_TOO_LARGE':
      return new BodyTooLargeError(String(request.routeOptions.bodyLimit ?? 'the configured')) as ToolportError
    case 'FST_ERR_CTP_EMPTY_JSON_BODY':
      return new BadJsonError('the body is empty') as ToolportError
    case 'FST_ERR_CTP_INVALID_JSON_BODY':
      return new BadJsonError(err.message) as ToolportError
  }
  if (err instanceof SyntaxError) return new BadJsonError(err.message) as ToolportError
  const status = err.statusCode ?? 500
  // A static file's path that leaves its folder (`/ui/../api/tools`): @fastify/send says 403,
  // which the API keeps for the guard's refusals (docs/protocol.md); no such file is served here.
  if (status === 403) return notFound(request)
  if (status >= 400 && status < 500) {
    const mapped = new BadRequestError(err.message) as ToolportError
    mapped.statusCode = status
    return mapped
  }
  return new InternalError() as ToolportError
}
