// The only body parser: application/json, size-capped by fastify, depth-capped here.
//
// The depth check walks the raw text once, iteratively, before JSON.parse or any recursive work
// (schema validation, JSON Schema compilation) can meet a hostile 100 000-deep body.
import type { FastifyRequest } from 'fastify'
import { BadJsonError, JsonTooDeepError } from '../errors.js'
import { errorText } from '../../shared/util.js'

/** Largest nesting depth of JSON text (brackets outside strings); stops counting past `limit`. */
export function jsonDepthExceeds (text: string, limit: number): boolean {
  let depth = 0
  let inString = false
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i)
    if (inString) {
      if (c === 92) i++ // backslash: skip the escaped character
      else if (c === 34) inString = false
      continue
    }
    if (c === 34) inString = true
    else if (c === 123 || c === 91) {
      if (++depth > limit) return true
    } else if (c === 125 || c === 93) depth--
  }
  return false
}

/** Builds fastify's content-type parser for application/json with the given depth limit. */
export function buildJsonParser (maxDepth: number) {
  return function parseJsonBody (request: FastifyRequest, body: string | Buffer, done: (err: Error | null,
    body?: unknown) => void): void {
    const text = typeof body === 'string' ? body : body.toString('utf8')
    if (text.length === 0) {
      // GET and DELETE carry no body; some clients still label the empty one application/json
      // (the MCP Python SDK's DELETE on close): that is no body, not a bad one.
      if (request.method === 'GET' || request.method === 'DELETE') {
        done(null, undefined)
        return
      }
      done(new BadJsonError('the body is empty'))
      return
    }
    if (jsonDepthExceeds(text, maxDepth)) {
      done(new JsonTooDeepError(String(maxDepth)))
      return
    }
    try {
      done(null, JSON.parse(text))
    } catch (err) {
      done(new BadJsonError(errorText(err)))
    }
  }
}
