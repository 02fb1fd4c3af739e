// `GET /api/tools/definitions`: a role's tools in a provider's format, for a host's own LLM loop.
// It sits behind the plugin's guard like every other route; the body is built by definitions-body.ts.
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import { z } from 'zod'
import type { Runtime } from '../runtime.js'
import { parseOrThrow } from '../schemas.js'
import { DEFINITION_FORMATS } from '../sessions/definitions.js'
import { definitionsBody } from './definitions-body.js'
import { sendStreamed } from './streamed-json.js'
import { documentationOnly, errors, jsonSchema } from './openapi.js'

const definitionsQuerySchema = z.object({
  role: z.string().min(1),
  format: z.enum(DEFINITION_FORMATS).default('openai-chat')
})

/** The answer, for the document only (the body is streamed, never serialized). */
const definitionsResultSchema = z.object({
  ok: z.literal(true),
  role: z.string(),
  format: z.enum(DEFINITION_FORMATS),
  tools: z.array(z.record(z.string(), z.unknown())).describe('the role\'s tools in the format\'s own shape')
})

/**
 * The route's schema, for the OpenAPI document only: the plugin validates nothing with it (its
 * validator compiler passes every value through; the handler parses the query with zod), and its
 * answers are written as before (`documentationOnly`).
 */
const DEFINITIONS_ROUTE_SCHEMA = {
  summary: 'A role\'s tools as tool definitions in a provider\'s format, for a host\'s own LLM loop',
  tags: ['tools'],
  querystring: jsonSchema(definitionsQuerySchema, 'input'),
  response: { 200: jsonSchema(definitionsResultSchema, 'output'), ...errors(404, 422) }
}

/**
 * Registers `GET /api/tools/definitions?role=NAME&format=…`: a role's tools in a provider's
 * format, for a host's own LLM loop. Unknown role → 404; a bad format → 422; an answer larger
 * than `limits.maxDefinitionsBytes` → 422 TP_ERR_LIMIT_EXCEEDED. The answer is streamed.
 */
export function registerDefinitionRoutes (app: FastifyInstance, runtime: Runtime): void {
  app.get('/api/tools/definitions', {
    schema: DEFINITIONS_ROUTE_SCHEMA,
    serializerCompiler: documentationOnly
  }, async function definitionsRoute (request: FastifyRequest, reply: FastifyReply) {
    const query = parseOrThrow(definitionsQuerySchema, request.query ?? {})
    const role = runtime.roles.get(query.role)
    const body = await definitionsBody(role, query.format, runtime.options.limits.maxDefinitionsBytes)
    return await sendStreamed(reply, body, runtime.options.limits.answerStallTimeoutMs)
  })
}
