// Maps every error a route can raise to the JSON error body (docs/protocol.md "Errors of the API itself"):
// `{ ok: false, statusCode, code, error, message, details? }` with a stable TP_ERR_* code.
import { STATUS_CODES } from 'node:http'
import type { FastifyError, FastifyReply, FastifyRequest } from 'fastify'
import {
  BadJsonError, BadRequestError, BodyTooLargeError, InternalError, RouteNotFoundError,
  UnsupportedMediaTypeError, isToolportError, type ErrorDetail, type ToolportError
} from '../errors.js'

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
  if (mapped.statusCode === 401 || mapped.statusCode === 403) reply.header('connection', 'close')
  reply.code(mapped.statusCode).type('application/json').send(errorBody(mapped))
}

/** fastify's setNotFoundHandler. */
export function handleNotFound (request: FastifyRequest, reply: FastifyReply): void {
  const err = new RouteNotFoundError(`${request.method} ${request.url.split('?')[0]}`) as ToolportError
  reply.code(404).type('application/json').send(errorBody(err))
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
