// Operations routes: GET /api/health (liveness/readiness) and GET /metrics (Prometheus).
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import type { Runtime } from '../runtime.js'
import { healthSchema } from '../schemas.js'
import { guardErrors, jsonSchema, textBody } from './openapi.js'

export function registerOperationRoutes (app: FastifyInstance, runtime: Runtime): void {
  const health = jsonSchema(healthSchema, 'output')
  app.get('/api/health', {
    schema: {
      summary: 'Liveness and readiness, with the worker pool\'s state',
      tags: ['operations'],
      response: { ...guardErrors(), 200: health, 503: health }
    }
  }, function healthRoute (_request: FastifyRequest, reply: FastifyReply) {
    const report = runtime.health()
    reply.code(report.ok ? 200 : 503).send(report)
  })

  const metrics = runtime.metrics
  if (metrics === null) return
  app.get('/metrics', {
    schema: {
      summary: 'Prometheus metrics: calls, dispatch latency (queue and callback), evictions, syncs, registry sizes, pool',
      tags: ['operations'],
      response: {
        200: textBody('text/plain', 'Prometheus text exposition format'),
        // The last figures are still read after close: no 503.
        ...guardErrors()
      }
    }
  }, async function metricsRoute (_request: FastifyRequest, reply: FastifyReply) {
    const text = await metrics.text()
    reply.type(metrics.contentType)
    return text
  })
}
