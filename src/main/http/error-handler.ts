// Maps every error a route can raise to the JSON error body (docs/protocol.md "Errors of the API itself"):
// `{ ok: false, statusCode, code, error, message, details? }` with a stable TP_ERR_* code.
import { STATUS_CODES } from 'node:http'
import type { Http2ServerRequest } from 'node:http2'
import type { Socket } from 'node:net'
import type { FastifyError, FastifyReply, FastifyRequest } from 'fastify'
import {
  BadJsonError, BadRequestError, BodyTooLargeError, InternalError, NotLoopbackError, RouteNotFoundError,
  UnsupportedMediaTypeError, isToolportError, type ErrorDetail, type ToolportError
} from '../errors.js'
import { isLoopbackAddress } from '../../shared/loopback.js'
import type { GuardHook } from './guard.js'

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
  const mapped = toToolportError(err, request)
  if (mapped.statusCode >= 500) {
    // Code and message only: raw error objects may carry callback bodies or arguments.
    request.log.error({ code: (err as { code?: unknown }).code, message: err.message }, 'request failed')
  }
  // A refused client (no token, not loopback, foreign Host/Origin, not the owner) keeps no socket:
  // an idle keep-alive connection it holds would count against limits.maxConnections.
  if (mapped.statusCode === 401 || mapped.statusCode === 403) closeAfter(request, reply)
  reply.code(mapped.statusCode).type('application/json').send(errorBody(mapped))
}

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

/** fastify's setNotFoundHandler. */
export function handleNotFound (request: FastifyRequest, reply: FastifyReply): void {
  const err = new RouteNotFoundError(`${request.method} ${request.url.split('?')[0]}`) as ToolportError
  reply.code(404).type('application/json').send(errorBody(err))
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

/** Node's client errors: what fastify's own handler answers, with the status kept. */
const CLIENT_ERROR_STATUS: Readonly<Record<string, number>> = {
  ERR_HTTP_REQUEST_TIMEOUT: 408,
  HPE_HEADER_OVERFLOW: 431
}

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
  let mapped: ToolportError
  if (!isLoopbackAddress(socket.remoteAddress)) {
    mapped = new NotLoopbackError(socket.remoteAddress ?? 'an unknown peer') as ToolportError
  } else {
    const status = CLIENT_ERROR_STATUS[err.code ?? ''] ?? 400
    mapped = new BadRequestError(status === 408
      ? 'the request was not received in time'
      : status === 431 ? 'the request headers are too large' : `the request could not be read (${err.code ?? 'malformed'})`) as ToolportError
    mapped.statusCode = status
  }
  const body = JSON.stringify(errorBody(mapped))
  socket.end(`HTTP/1.1 ${mapped.statusCode} ${STATUS_CODES[mapped.statusCode] ?? 'Error'}\r\n` +
    'Content-Type: application/json; charset=utf-8\r\n' +
    `Content-Length: ${Buffer.byteLength(body)}\r\n` +
    'X-Content-Type-Options: nosniff\r\nCache-Control: no-store\r\nCross-Origin-Resource-Policy: same-origin\r\n' +
    `Connection: close\r\n\r\n${body}`, () => { socket.destroy() })
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
  if (status >= 400 && status < 500) {
    const mapped = new BadRequestError(err.message) as ToolportError
    mapped.statusCode = status
    return mapped
  }
  return new InternalError() as ToolportError
}
