// A role's tools in each provider's wire format, so a host's own LLM loop, a
// Realtime session and the MCP endpoint all read the one registry.
//
// Every format is exactly what goes into that provider's `tools` field. The results are memoised
// per registry snapshot (`registry.definitions()` returns one frozen array until the next change),
// so a host that asks on every turn pays one WeakMap lookup, not a rebuild.
import type { ToolDefinition } from '../roles/tool-registry.js'
import type { JsonSchemaObject } from '../schemas.js'
import { validationError } from '../errors.js'
import { deepFreeze } from '../../shared/util.js'
import { forEachSubschema } from '../../shared/json-schema.js'

/** The formats `toolDefinitions` and `GET /api/tools/definitions` produce. */
export const DEFINITION_FORMATS = ['openai-chat', 'openai-realtime', 'anthropic', 'gemini', 'mcp'] as const
export type DefinitionFormat = typeof DEFINITION_FORMATS[number]

/** A JSON Schema whose root is `type: 'object'`, as every provider requires for arguments. */
export type ObjectSchema = JsonSchemaObject & { type: 'object' }

/** OpenAI Chat Completions (and compatible APIs): `tools: [{ type: 'function', function }]`. */
export interface OpenAIChatTool {
  readonly type: 'function'
  readonly function: { readonly name: string, readonly description: string, readonly parameters: ObjectSchema }
}
/** OpenAI Realtime / Azure / GLM `session.tools` (the flat dialect). */
export interface OpenAIRealtimeTool {
  readonly type: 'function'
  readonly name: string
  readonly description: string
  readonly parameters: ObjectSchema
}
/** Anthropic Messages API `tools`. */
export interface AnthropicTool {
  readonly name: string
  readonly description: string
  readonly input_schema: ObjectSchema
}
/** One Gemini function declaration; `parametersJsonSchema` takes full JSON Schema. */
export interface GeminiFunctionDeclaration {
  readonly name: string
  readonly description: string
  readonly parametersJsonSchema: ObjectSchema
}
/** A Gemini `Tool` (the `tools` array holds one, or none when the role has no tools). */
export interface GeminiTool {
  readonly functionDeclarations: readonly GeminiFunctionDeclaration[]
}
/** An MCP `Tool` as `tools/list` returns it. */
export interface McpTool {
  readonly name: string
  readonly description: string
  readonly inputSchema: ObjectSchema
}

/** What each format produces. */
export interface DefinitionsByFormat {
  'openai-chat': readonly OpenAIChatTool[]
  'openai-realtime': readonly OpenAIRealtimeTool[]
  anthropic: readonly AnthropicTool[]
  gemini: readonly GeminiTool[]
  mcp: readonly McpTool[]
}

/** Anything that can give a registry snapshot: a `Role`, or the definitions themselves. */
export type DefinitionSource =
  | readonly ToolDefinition[]
  | { readonly registry: { definitions (): readonly ToolDefinition[] } }

const BUILDERS: { [F in DefinitionFormat]: (tools: readonly ToolDefinition[]) => DefinitionsByFormat[F] } = {
  'openai-chat': (tools) => tools.map((t) => Object.freeze({
    type: 'function' as const,
    function: Object.freeze({ name: t.name, description: t.description, parameters: objectSchema(t.parameters) })
  })),
  'openai-realtime': (tools) => tools.map((t) => Object.freeze({
    type: 'function' as const, name: t.name, description: t.description, parameters: objectSchema(t.parameters)
  })),
  anthropic: (tools) => tools.map((t) => Object.freeze({
    name: t.name, description: t.description, input_schema: objectSchema(t.parameters)
  })),
  gemini: (tools) => tools.length === 0
    ? []
    : [Object.freeze({
        functionDeclarations: Object.freeze(tools.map((t) => Object.freeze({
          name: t.name, description: t.description, parametersJsonSchema: objectSchema(t.parameters)
        })))
      })],
  mcp: (tools) => tools.map((t) => Object.freeze({
    name: t.name, description: t.description, inputSchema: objectSchema(t.parameters)
  }))
}

const cache = new WeakMap<readonly ToolDefinition[], Map<DefinitionFormat, unknown>>()

/**
 * A role's tools in one provider's format, in registration order. The result is frozen and shared
 * until the registry changes: copy it before editing (the provider SDKs' types want a mutable array:
 * pass `[...tools]`). An unknown format throws TP_ERR_VALIDATION.
 *
 * @example
 * const tools = toolDefinitions(tp.roles.get('Lanlan'), 'openai-chat')
 * await openai.chat.completions.create({ model, messages, tools: [...tools] })
 */
export function toolDefinitions<F extends DefinitionFormat> (source: DefinitionSource,
  format: F): DefinitionsByFormat[F] {
  const tools = isDefinitionList(source) ? source : source.registry.definitions()
  // hasOwn: a format such as 'toString' must not reach Object.prototype.
  const build = Object.hasOwn(BUILDERS, format)
    ? BUILDERS[format] as (tools: readonly ToolDefinition[]) => DefinitionsByFormat[F]
    : undefined
  if (build === undefined) {
    throw validationError([{
      path: 'format',
      code: 'invalid_value',
      message: `must be one of ${DEFINITION_FORMATS.join(', ')}`
    }])
  }
  let byFormat = cache.get(tools)
  if (byFormat === undefined) {
    byFormat = new Map()
    // Only frozen snapshots (the registry's) are safe to memoise: a caller's own array may change.
    if (Object.isFrozen(tools)) cache.set(tools, byFormat)
  }
  let built = byFormat.get(format) as DefinitionsByFormat[F] | undefined
  if (built === undefined) {
    built = Object.freeze(build(tools)) as DefinitionsByFormat[F]
    byFormat.set(format, built)
  }
  return built
}

const objectSchemas = new WeakMap<JsonSchemaObject, ObjectSchema>()

/**
 * `parameters` in the form every provider takes, as every provider requires. MCP clients reject
 * the whole `tools/list` if one `inputSchema` is not `type: 'object'`, or if a property's schema is
 * not an object; OpenAI and Anthropic refuse a whole request whose tools include a root `anyOf`,
 * `oneOf` or `allOf` (also beside `type: 'object'`; zod's unions give one), and OpenAI one with an
 * array schema without `items`. A schema that has none of these is returned as it is; otherwise a
 * copy:
 * - gets `type: 'object'` at the root;
 * - has a root `anyOf`/`oneOf`/`allOf` of object schemas (or local `$ref`s to them) merged into its
 *   own `properties`: every branch's properties; `required`, what `allOf` requires and what every
 *   branch of an `anyOf`/`oneOf` requires; a root `not`, `enum` and `const` are left out;
 * - has `items: {}` on each array schema without `items` or `prefixItems` (the same meaning);
 * - has a property schema `true` or `false` in its object form (`{}`, `{"not": {}}`), and a
 *   `properties` or `required` that is malformed left out.
 * The plugin's own schema still validates the arguments at call time, so a looser root costs no
 * check: it only tells the model less.
 */
export function objectSchema (parameters: JsonSchemaObject): ObjectSchema {
  let fixed = objectSchemas.get(parameters)
  if (fixed === undefined) {
    fixed = isPortable(parameters) ? parameters as ObjectSchema : deepFreeze(portableCopy(parameters)) as ObjectSchema
    objectSchemas.set(parameters, fixed)
  }
  return fixed
}

const ROOT_COMBINATORS = ['allOf', 'anyOf', 'oneOf'] as const

/** Root keywords the portable form leaves out (see `objectSchema`). */
const ROOT_DROPPED = ['not', 'enum', 'const'] as const

function isPortable (schema: JsonSchemaObject): boolean {
  if (!isObjectSchema(schema) || ROOT_COMBINATORS.some((key) => schema[key] !== undefined) ||
    ROOT_DROPPED.some((key) => schema[key] !== undefined)) return false
  let portable = true
  forEachSubschema(schema, (node) => {
    if (isItemlessArray(node)) portable = false
  })
  return portable
}

function portableCopy (parameters: JsonSchemaObject): JsonSchemaObject {
  // A JSON round trip: a deep copy in which `__proto__` stays an own key.
  const copy = JSON.parse(JSON.stringify(parameters)) as JsonSchemaObject
  mergeRootCombinators(copy)
  for (const key of ROOT_DROPPED) delete copy[key]
  copy.type = 'object'
  const properties = propertiesMap(copy.properties)
  if (properties === undefined) delete copy.properties
  else copy.properties = properties
  if (!isStringArray(copy.required)) delete copy.required
  forEachSubschema(copy, (node) => {
    if (isItemlessArray(node)) node.items = {}
  })
  return copy
}

/**
 * See `objectSchema`: the root's combinators become its own properties and required. A property
 * several branches give differently is each of them (`anyOf`; `allOf` under a root `allOf`), so
 * a discriminator's `const`s all reach the model; one the root has itself keeps the root's schema
 * (the branches only narrow it). With `additionalProperties: false` at the root, a property the
 * root does not name is refused anyway, so none is added.
 */
function mergeRootCombinators (root: JsonSchemaObject): void {
  if (!ROOT_COMBINATORS.some((key) => root[key] !== undefined)) return
  const own = propertiesMap(root.properties) ?? {}
  const properties = new Map<string, unknown>(Object.entries(own))
  const required = new Set<string>(isStringArray(root.required) ? root.required as string[] : [])
  const closed = root.additionalProperties === false
  for (const key of ROOT_COMBINATORS) {
    const branches = root[key]
    delete root[key]
    if (!Array.isArray(branches)) continue
    const schemas = branches.map((branch) => localSchema(root, branch))
    const given = new Map<string, Map<string, unknown>>()
    for (const branch of schemas) {
      for (const [name, child] of Object.entries(propertiesMap(branch?.properties) ?? {})) {
        if (Object.hasOwn(own, name) || closed) continue
        const forms = given.get(name) ?? new Map<string, unknown>()
        forms.set(JSON.stringify(child), child)
        given.set(name, forms)
      }
    }
    for (const [name, forms] of given) {
      const distinct = [...forms.values()]
      const joined = distinct.length === 1 ? distinct[0] : { [key === 'allOf' ? 'allOf' : 'anyOf']: distinct }
      const earlier = properties.get(name)
      properties.set(name, earlier === undefined ? joined : { allOf: [earlier, joined] })
    }
    const requiredOf = schemas.map((branch) => isStringArray(branch?.required) ? branch?.required as string[] : [])
    const kept = key === 'allOf'
      ? requiredOf.flat()
      : (requiredOf[0] ?? []).filter((name) => requiredOf.every((list) => list.includes(name)))
    for (const name of kept) required.add(name)
  }
  if (properties.size > 0) root.properties = Object.fromEntries(properties)
  if (required.size > 0) root.required = [...required]
  else delete root.required
}

/** `branch` itself, or the `$defs`/`definitions` entry a local `$ref` names; undefined if neither is an object. */
function localSchema (root: JsonSchemaObject, branch: unknown): JsonSchemaObject | undefined {
  if (typeof branch !== 'object' || branch === null || Array.isArray(branch)) return undefined
  const ref = (branch as JsonSchemaObject).$ref
  const match = typeof ref === 'string' ? /^#\/(\$defs|definitions)\/([^/]+)$/.exec(ref) : null
  if (match === null) return branch as JsonSchemaObject
  const table = root[match[1] as string]
  let name: string
  try {
    name = decodeURIComponent(match[2] as string).replaceAll('~1', '/').replaceAll('~0', '~')
  } catch {
    return undefined // a malformed %-escape names nothing
  }
  const target = typeof table === 'object' && table !== null && Object.hasOwn(table, name)
    ? (table as Record<string, unknown>)[name]
    : undefined
  return typeof target === 'object' && target !== null && !Array.isArray(target) ? target as JsonSchemaObject : undefined
}

/**
 * An array schema (`type` "array" or a list holding it) without `items`, a tuple's `prefixItems`
 * included (the Python SDK's `tuple[float, float]`): OpenAI refuses either ("array schema missing
 * items"). `items: {}` beside `prefixItems` means what no `items` means (any further items).
 */
function isItemlessArray (node: JsonSchemaObject): boolean {
  const type = node.type
  const isArray = type === 'array' || (Array.isArray(type) && type.includes('array'))
  return isArray && node.items === undefined
}

function isObjectSchema (schema: JsonSchemaObject): schema is ObjectSchema {
  return schema.type === 'object' &&
    (schema.properties === undefined || isPropertiesMap(schema.properties)) &&
    (schema.required === undefined || isStringArray(schema.required))
}

function isPropertiesMap (value: unknown): boolean {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) return false
  for (const child of Object.values(value)) {
    if (typeof child !== 'object' || child === null) return false
  }
  return true
}

/** A `properties` map with boolean schemas in object form; undefined when it is not a map of schemas. */
function propertiesMap (value: unknown): Record<string, unknown> | undefined {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) return undefined
  if (isPropertiesMap(value)) return value as Record<string, unknown>
  const entries: Array<[string, unknown]> = []
  for (const [name, child] of Object.entries(value)) {
    if (typeof child === 'boolean') entries.push([name, child ? {} : { not: {} }])
    else if (typeof child === 'object' && child !== null) entries.push([name, child])
    else return undefined
  }
  return Object.fromEntries(entries) // own keys, `__proto__` too
}

function isStringArray (value: unknown): boolean {
  return Array.isArray(value) && value.every((v) => typeof v === 'string')
}

function isDefinitionList (source: DefinitionSource): source is readonly ToolDefinition[] {
  return Array.isArray(source)
}
