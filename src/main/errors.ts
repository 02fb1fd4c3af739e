// The error catalogue: every error thrown on the main thread comes from here.
//
// Built with @fastify/error as fastify's own lib/errors.js is: a stable code, a `%s` message
// format and an HTTP status. The README's error table lists exactly these codes (a test checks).
//
// The named import, not the default one: the declarations tsc emits for these constants then name
// their type `import("@fastify/error").FastifyErrorConstructor`, which resolves under every
// moduleResolution. From a default import they said `createError.FastifyErrorConstructor`, a
// namespace that a consumer with moduleResolution "bundler" (skipLibCheck off) cannot see (TS2503).
import { createError } from '@fastify/error'

/** One problem found while validating a request, as sent in `details`. */
export interface ErrorDetail {
  /** Dotted path of the field, e.g. `callback_url` or `parameters.properties`. */
  path: string
  /** A machine-readable reason (zod's issue code, or ours). */
  code: string
  message: string
}

/** 403: the socket's peer is not a loopback address (docs/protocol.md R1). */
export const NotLoopbackError = createError('TP_ERR_NOT_LOOPBACK',
  'Toolport accepts loopback clients only; %s is not a loopback address', 403)

/** 403: the Host header does not name this machine's loopback interface (DNS rebinding). */
export const HostForbiddenError = createError('TP_ERR_HOST_FORBIDDEN',
  'Host header %s is not allowed; use localhost, 127.0.0.1 or [::1]', 403)

/** 403: a browser Origin that is not on the allow-list (cross-site requests). */
export const OriginForbiddenError = createError('TP_ERR_ORIGIN_FORBIDDEN',
  'cross-origin request refused: %s', 403)

/** 401: token mode is on and the request lacks the right `Authorization: Bearer` token. */
export const UnauthorizedError = createError('TP_ERR_UNAUTHORIZED', 'a valid Authorization: Bearer token is required',
  401)

/**
 * 401: ownership mode is on and a register, unregister or clear request lacks a well-formed
 * `X-Toolport-Plugin-Key` (the credential a source is bound to).
 */
export const PluginKeyRequiredError = createError('TP_ERR_PLUGIN_KEY_REQUIRED',
  'ownership mode: an X-Toolport-Plugin-Key header of 32 to 512 visible ASCII characters is required', 401)

/** 403: ownership mode: the source is bound to another plugin key (or to the host). */
export const NotOwnerError = createError('TP_ERR_NOT_OWNER',
  "source '%s' belongs to another plugin key; only its owner may register, unregister or clear its tools", 403)

/** 422: a registration would take a role past `maxToolsPerRole` or a source past `maxToolsPerSource`. */
export const LimitExceededError = createError('TP_ERR_LIMIT_EXCEEDED', 'limit exceeded: %s', 422)

/** 404: a role named in a request does not exist (docs/protocol.md R6, R17, R18). */
export const RoleNotFoundError = createError('TP_ERR_ROLE_NOT_FOUND', "role '%s' does not exist", 404)

/** 404: no route matches the method and path. */
export const RouteNotFoundError = createError('TP_ERR_ROUTE_NOT_FOUND', 'no route %s', 404)

/** 422: a field failed validation (docs/protocol.md R2, R7); `details` lists every problem. */
export const ValidationError = createError('TP_ERR_VALIDATION', 'invalid request: %s', 422)

/** 400: the body is not parseable JSON. */
export const BadJsonError = createError('TP_ERR_BAD_JSON', 'the body is not valid JSON: %s', 400)

/** 400: a request fastify could not read (bad Content-Length, bad URL, …). */
export const BadRequestError = createError('TP_ERR_BAD_REQUEST', 'bad request: %s', 400)

/** 413: the body is larger than `maxBodyBytes`. */
export const BodyTooLargeError = createError('TP_ERR_BODY_TOO_LARGE',
  'the body is larger than the limit of %s bytes', 413)

/** 413: the JSON body nests deeper than `maxJsonDepth`. */
export const JsonTooDeepError = createError('TP_ERR_JSON_TOO_DEEP',
  'the JSON body nests deeper than the limit of %s levels', 413)

/** 415: a body that is not `application/json`. */
export const UnsupportedMediaTypeError = createError('TP_ERR_UNSUPPORTED_MEDIA_TYPE',
  'the body must be application/json (got %s)', 415)

/** 409: library only: `roles.add` of a role that exists. */
export const RoleExistsError = createError('TP_ERR_ROLE_EXISTS', "role '%s' already exists", 409)

/** 500: library only: options that fail the config schema. */
export const ConfigError = createError('TP_ERR_CONFIG', '%s', 500)

/** 503: the runtime is closing or closed. */
export const ClosedError = createError('TP_ERR_CLOSED', 'Toolport is closed', 503)

/** 503: `GET /api/events` already has `events.maxSubscribers` subscribers. */
export const StreamFullError = createError('TP_ERR_STREAM_FULL',
  'the event stream has %s subscribers already; try again later', 503)

/** 500: a bug. The message never carries stack traces, credentials or callback bodies. */
export const InternalError = createError('TP_ERR_INTERNAL', 'internal error', 500)

/** Every error code with its HTTP status, for the catalogue test and the README table. */
export const ERROR_CODES: Readonly<Record<string, number>> = Object.freeze({
  TP_ERR_NOT_LOOPBACK: 403,
  TP_ERR_HOST_FORBIDDEN: 403,
  TP_ERR_ORIGIN_FORBIDDEN: 403,
  TP_ERR_UNAUTHORIZED: 401,
  TP_ERR_PLUGIN_KEY_REQUIRED: 401,
  TP_ERR_NOT_OWNER: 403,
  TP_ERR_LIMIT_EXCEEDED: 422,
  TP_ERR_ROLE_NOT_FOUND: 404,
  TP_ERR_ROUTE_NOT_FOUND: 404,
  TP_ERR_VALIDATION: 422,
  TP_ERR_BAD_JSON: 400,
  TP_ERR_BAD_REQUEST: 400,
  TP_ERR_BODY_TOO_LARGE: 413,
  TP_ERR_JSON_TOO_DEEP: 413,
  TP_ERR_UNSUPPORTED_MEDIA_TYPE: 415,
  TP_ERR_ROLE_EXISTS: 409,
  TP_ERR_CONFIG: 500,
  TP_ERR_CLOSED: 503,
  TP_ERR_STREAM_FULL: 503,
  TP_ERR_INTERNAL: 500
})

/** An error from this catalogue: it has a stable `code` and a `statusCode`. */
export interface ToolportError extends Error {
  code: string
  statusCode: number
  details?: ErrorDetail[]
}

/** True for an error that came from this catalogue. */
export function isToolportError (err: unknown): err is ToolportError {
  if (!(err instanceof Error)) return false
  const code = (err as Error & { code?: unknown }).code
  return typeof code === 'string' && Object.hasOwn(ERROR_CODES, code)
}

/** Builds a 422 with the problems attached as `details`. */
export function validationError (details: ErrorDetail[]): ToolportError {
  const summary = details.map(formatDetail).join('; ')
  const err = new ValidationError(summary) as ToolportError
  err.details = details
  return err
}

/**
 * Builds the 422 of a size limit: the message names the option (`limits.…`), and `details` holds
 * one problem whose path is that option, as every 422 carries (docs/protocol.md R7).
 */
export function limitExceeded (option: string, message: string, advice = ''): ToolportError {
  const err = new LimitExceededError(`${message} (${option})`) as ToolportError
  err.details = [{ path: option, code: 'too_big', message: advice === '' ? message : `${message}; ${advice}` }]
  return err
}

function formatDetail (detail: ErrorDetail): string {
  return detail.path === '' ? detail.message : `${detail.path}: ${detail.message}`
}
