// `GET /api/tools/definitions`: a role's tools in a provider's format, for a host's own LLM loop.
// It sits behind the plugin's guard like every other route; the body is built by definitions-body.ts.
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import { z } from 'zod'
import type { Runtime } from '../runtime.js'
import { parseOrThrow } from '../schemas.js'
import { DEFINITION_FORMATS } from '../sessions/definitions.js'
import { definitionsBody } from './definitions-body.js'

const definitionsQuerySchema = z.object({
  role: z.string().min(1),
  format: z.enum(DEFINITION_FORMATS).default('openai-chat')
})

/**
 * Registers `GET /api/tools/definitions?role=NAME&format=…`: a role's tools in a provider's
 * format, for a host's own LLM loop. Unknown role → 404; a bad format → 422; an answer larger
 * than `limits.maxDefinitionsBytes` → 422 TP_ERR_LIMIT_EXCEEDED. The answer is streamed.
 */
export function registerDefinitionRoutes (app: FastifyInstance, runtime: Runtime): void {
  app.get('/api/tools/definitions', async function definitionsRoute (request: FastifyRequest, reply: FastifyReply) {
    const query = parseOrThrow(definitionsQuerySchema, request.query ?? {})
    const role = runtime.roles.get(query.role)
    const body = await definitionsBody(role, query.format, runtime.options.limits.maxDefinitionsBytes)
    return await reply.type('application/json; charset=utf-8').header('content-length', body.bytes).send(body.stream())
  })
}
