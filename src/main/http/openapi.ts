// Route schemas for OpenAPI and for fastify's response serializers, generated from the same zod
// schemas the Runtime validates requests with (zod 4's own `toJSONSchema`), so the docs at
// /openapi.json cannot drift from the code.
import { z } from 'zod'
import type { FastifyInstance, FastifySchema } from 'fastify'
import swagger from '@fastify/swagger'
import swaggerUi from '@fastify/swagger-ui'
import {
  callSchema, clearResultSchema, clearSchema, errorBodySchema, listQuerySchema, listResultSchema,
  registerResultSchema, registerSchema, toolResultSchema, unregisterResultSchema, unregisterSchema
} from '../schemas.js'
import { VERSION } from '../version.js'

/** A zod schema as a draft-7 JSON Schema without the `$schema` key (fastify and OpenAPI embed it). */
export function jsonSchema (schema: z.ZodType, io: 'input' | 'output'): Record<string, unknown> {
  const out = z.toJSONSchema(schema, { io, target: 'draft-7', unrepresentable: 'any', override: documentDefault }) as Record<string, unknown>
  delete out.$schema
  return out
}

/**
 * Keeps a field's default in the document when it is a plain value: zod leaves an input's default
 * out when a transform lies under it (`timeout_seconds`: 30), since a default is of the output type.
 */
function documentDefault (ctx: { zodSchema: z.core.$ZodTypes, jsonSchema: z.core.JSONSchema.BaseSchema }): void {
  const def = ctx.zodSchema._zod.def
  if (def.type !== 'default' || ctx.jsonSchema.default !== undefined) return
  const value: unknown = def.defaultValue
  if (value === null || ['string', 'number', 'boolean'].includes(typeof value)) ctx.jsonSchema.default = value
}

/**
 * The JSON Schema of every error answer (docs/protocol.md "Errors of the API itself"), shared by all
 * documented routes.
 */
export const ERROR_BODY_JSON_SCHEMA = jsonSchema(errorBodySchema, 'output')

/**
 * A response whose body is text of `mediaType`, for the document only: the route's error answers,
 * documented as plain schemas, stay application/json.
 */
export function textBody (mediaType: string, description: string): Record<string, unknown> {
  return { description, content: { [mediaType]: { schema: { type: 'string' } } } }
}

/**
 * What any route may answer before it runs: a request Node's parser could not read (400), one not
 * received in time (408), headers too large (431).
 */
const TRANSPORT_ERRORS = [400, 408, 431]

/**
 * The error statuses a route can answer: `statuses`, with the guard's 401/403, the 503 of a
 * closed runtime (every route but the health report and the metrics, which use `guardErrors`),
 * and the transport's.
 */
export function errors (...statuses: number[]): Record<number, Record<string, unknown>> {
  return errorResponses([...TRANSPORT_ERRORS, 401, 403, ...statuses, 503])
}

/** The guard's 401/403 and the transport's only: for the routes that still answer once the runtime is closed. */
export function guardErrors (): Record<number, Record<string, unknown>> {
  return errorResponses([...TRANSPORT_ERRORS, 401, 403])
}

export function errorResponses (statuses: readonly number[]): Record<number, Record<string, unknown>> {
  const out: Record<number, Record<string, unknown>> = {}
  for (const status of statuses) {
    out[status] = {
      ...ERROR_BODY_JSON_SCHEMA,
      description: ERROR_DESCRIPTIONS[status]
    }
  }
  return out
}

const ERROR_DESCRIPTIONS: Record<number, string> = {
  400: 'malformed JSON or request (TP_ERR_BAD_JSON, TP_ERR_BAD_REQUEST)',
  401: 'token mode: missing or wrong bearer token (TP_ERR_UNAUTHORIZED); ownership mode: no plugin key (TP_ERR_PLUGIN_KEY_REQUIRED)',
  403: 'not a loopback client, a foreign Host/Origin, or another plugin key\'s source ' +
    '(TP_ERR_NOT_LOOPBACK, TP_ERR_HOST_FORBIDDEN, TP_ERR_ORIGIN_FORBIDDEN, TP_ERR_NOT_OWNER)',
  404: 'unknown role (TP_ERR_ROLE_NOT_FOUND)',
  408: 'the request was not received in time (TP_ERR_BAD_REQUEST)',
  414: 'a path segment over 256 characters (TP_ERR_BAD_REQUEST)',
  413: 'body too large or too deep (TP_ERR_BODY_TOO_LARGE, TP_ERR_JSON_TOO_DEEP)',
  415: 'the body is not application/json (TP_ERR_UNSUPPORTED_MEDIA_TYPE)',
  422: 'a field failed validation, or a tool cap was reached (TP_ERR_VALIDATION, TP_ERR_LIMIT_EXCEEDED)',
  431: 'the request headers are too large (TP_ERR_BAD_REQUEST)',
  503: 'Toolport is closed (TP_ERR_CLOSED)'
}

const BODY_ERRORS = [400, 404, 413, 415, 422]

/** The plugin key header of register, unregister and clear (required in ownership mode only). */
const PLUGIN_KEY_HEADERS = {
  type: 'object',
  properties: {
    'x-toolport-plugin-key': {
      type: 'string',
      minLength: 32,
      maxLength: 512,
      description: 'ownership mode: the plugin key the source is bound to (see SECURITY.md); ignored otherwise'
    }
  }
}

/** fastify route schemas of the tool routes, keyed by route. */
export const ROUTE_SCHEMAS: Record<string, FastifySchema> = {
  register: {
    summary: 'Register or replace one remote tool (docs/protocol.md R5–R8)',
    tags: ['tools'],
    body: jsonSchema(registerSchema, 'input'),
    headers: PLUGIN_KEY_HEADERS,
    response: { 200: jsonSchema(registerResultSchema, 'output'), ...errors(...BODY_ERRORS) }
  },
  unregister: {
    summary: 'Remove a tool by name (docs/protocol.md R15, R17)',
    tags: ['tools'],
    body: jsonSchema(unregisterSchema, 'input'),
    headers: PLUGIN_KEY_HEADERS,
    response: { 200: jsonSchema(unregisterResultSchema, 'output'), ...errors(...BODY_ERRORS) }
  },
  clear: {
    summary: 'Remove every tool of a source (docs/protocol.md R16, R17)',
    tags: ['tools'],
    body: jsonSchema(clearSchema, 'input'),
    headers: PLUGIN_KEY_HEADERS,
    response: { 200: jsonSchema(clearResultSchema, 'output'), ...errors(...BODY_ERRORS) }
  },
  list: {
    summary: 'List the tools of every current role, or of one; source= and name= keep only those (docs/protocol.md R18)',
    tags: ['tools'],
    querystring: jsonSchema(listQuerySchema, 'input'),
    response: { 200: jsonSchema(listResultSchema, 'output'), ...errors(404, 422) }
  },
  call: {
    summary: 'Call a tool as a model would; answers the ToolResult (docs/protocol.md R9–R12)',
    tags: ['tools'],
    body: jsonSchema(callSchema, 'input'),
    response: { 200: jsonSchema(toolResultSchema, 'output'), ...errors(...BODY_ERRORS) }
  }
}

/**
 * Validation happens in the Runtime with the zod schemas themselves (one parse, the library and
 * the routes share it), so fastify's own validation of the documented schemas is switched off.
 */
export function noValidation (): (data: unknown) => { value: unknown } {
  return passThrough
}

function passThrough (data: unknown): { value: unknown } {
  return { value: data }
}

/**
 * The `serializerCompiler` of a route whose response schemas are for the document only: its
 * answers are written with JSON.stringify, as a route without response schemas writes them (a
 * schema's serializer would drop the properties it does not list).
 */
export function documentationOnly (): (data: unknown) => string {
  return stringify
}

function stringify (data: unknown): string {
  return JSON.stringify(data)
}

/**
 * Registers @fastify/swagger, /openapi.json and the Swagger UI at /docs on `app` itself (not in a
 * child context), before the routes, so swagger's onRoute hook sees every route.
 */
export function registerDocs (app: FastifyInstance): void {
  app.register(swagger, {
    openapi: {
      openapi: '3.1.0',
      info: {
        title: 'Toolport',
        version: VERSION,
        description: 'Runtime Tools API: local plugins register HTTP callbacks as tools a model can call. Loopback clients only.'
      },
      tags: [{ name: 'tools', description: 'the Runtime Tools API' }, {
        name: 'operations',
        description: 'health and metrics'
      }]
    }
  })
  app.register(swaggerUi, { routePrefix: '/docs' })
  app.get('/openapi.json', { schema: { hide: true } }, function openapiRoute (_request, reply) {
    reply.send(app.swagger())
  })
}
