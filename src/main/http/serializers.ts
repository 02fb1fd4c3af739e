// Response serializers built on a route's first answer of each status, not when the app starts.
//
// Fastify compiles a fast-json-stringify serializer for every response schema of every route
// when the app becomes ready. Toolport's routes carry response schemas for the OpenAPI document
// (/docs), ~40 of them, and most are never used by a given process (an error status, a route
// nobody calls): building them was a quarter of the CPU of creating an app (~6 of 24 ms warm,
// more at a cold start). The serializers are the ones fastify would build, from the same
// factory with the same options; only the moment changes. test/unit/serializers.test.ts builds
// every route's serializers, so a schema fast-json-stringify refuses still fails a test, not a
// first request.
import SerializerSelector from '@fastify/fast-json-stringify-compiler'

type SerializerFactory = ReturnType<typeof SerializerSelector>
type Serializer = ReturnType<ReturnType<SerializerFactory>>

/** fastify's `schemaController.compilersFactory.buildSerializer`, building each serializer on first use. */
export const buildLazySerializer: SerializerFactory = function buildLazySerializer (externalSchemas, options) {
  const compile = SerializerSelector()(externalSchemas, options)
  return function lazySerializerCompiler (route) {
    let serialize: Serializer | null = null
    return function serializeOnFirstUse (doc: unknown): string {
      serialize ??= compile(route)
      return serialize(doc)
    }
  }
}
