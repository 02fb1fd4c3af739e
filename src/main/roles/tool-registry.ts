// A role's tools: an ordered Map<name, ToolEntry> with indexes by source and by origin.
//
// Everything about a tool is worked out once, when it is registered, so a call costs two Map lookups: the
// parsed callback URL, the timeout in ms, the definition the model sees and the row `GET /api/tools`
// lists. Entries are immutable and shared by every role a registration reaches, so a fan-out to
// 100 roles builds one entry, not 100.
import type { JsonSchemaObject } from '../schemas.js'
import { CheckTime } from '../dispatch/check-time.js'
import { deepFreeze } from '../../shared/util.js'

/** What a model session is given for each tool (`ModelSession.syncTools`). */
export interface ToolDefinition {
  readonly name: string
  readonly description: string
  readonly parameters: JsonSchemaObject
}

/** One row of `GET /api/tools` (docs/protocol.md R18). */
export interface ToolListing {
  readonly name: string
  readonly description: string
  readonly source: string
  readonly callback_url: string | null
  readonly is_remote: boolean
}

/** What a local (in-process) tool handler receives besides the arguments. */
export interface LocalToolContext {
  role: string
  callId: string
  /**
   * Aborted at the tool's deadline (reason: a `TimeoutError` DOMException) or when the call is
   * cancelled or Toolport closes (reason: an `AbortError`), as the plugin SDK's handlers are.
   */
  signal: AbortSignal
}

/** A local tool's handler: returns the output (any JSON value) or throws for a tool error. */
export type LocalToolHandler = (args: unknown, context: LocalToolContext) => unknown

/** Everything `ToolEntry` is built from; the schemas or `registerLocalTool` produce it. */
export interface ToolEntryInit {
  name: string
  description: string
  parameters: JsonSchemaObject
  source: string
  timeoutMs: number
  /** Remote tools: the accepted callback URL. */
  callback?: { href: string, origin: string, path: string } | undefined
  /** Local tools: the in-process handler. */
  handler?: LocalToolHandler | undefined
  /** The compiled `parameters` (dispatch/validators.ts `compileValidator`). */
  validator: ArgumentsValidator
}

/** An argument validator compiled from a tool's `parameters` (see dispatch/arguments.ts). */
export interface ArgumentsValidator {
  /**
   * Returns '' when the arguments are valid, else a message the model can act on. A check that
   * takes long is charged to `account` (the tool's; see dispatch/check-time.ts); while it is
   * overdrawn, the tool's checks are cut short (a refusal so made sets `account.refused`).
   */
  (args: unknown, account?: CheckTime): string
}

/** One registered tool. Fixed shape: every field is set in the constructor. */
export class ToolEntry {
  readonly name: string
  readonly description: string
  readonly parameters: JsonSchemaObject
  readonly source: string
  readonly timeoutMs: number
  readonly isRemote: boolean
  /** `source` starts with `plugin:`: such tools count towards origin eviction (docs/protocol.md R13). */
  readonly isPlugin: boolean
  readonly callbackUrl: string | null
  /** `scheme://host:port`, or '' for a local tool. */
  readonly origin: string
  /** Path and query of the callback URL, or ''. */
  readonly path: string
  readonly handler: LocalToolHandler | null
  /** The start of every callback body (R9), `{"name":<json>,"arguments":`, encoded once. */
  readonly bodyPrefix: string
  readonly definition: ToolDefinition
  readonly listing: ToolListing
  /** Compiled at registration; shared by every entry with the same schema. */
  readonly validator: ArgumentsValidator
  /**
   * The main thread's time this tool's argument checks took lately (dispatch/check-time.ts): the
   * one mutable part of an entry, its own, not shared with other entries of the same schema.
   */
  readonly checkTime: CheckTime

  constructor (init: ToolEntryInit) {
    this.name = init.name
    this.description = init.description
    // Frozen all the way down: the definitions every session and format hands out share it, and a
    // host that edits one (strict mode's `additionalProperties: false`) must not change the others.
    this.parameters = deepFreeze(init.parameters)
    this.source = init.source
    this.timeoutMs = init.timeoutMs
    this.isRemote = init.callback !== undefined
    this.isPlugin = init.source.startsWith('plugin:')
    this.callbackUrl = init.callback?.href ?? null
    this.origin = init.callback?.origin ?? ''
    this.path = init.callback?.path ?? ''
    this.handler = init.handler ?? null
    this.bodyPrefix = `{"name":${JSON.stringify(init.name)},"arguments":`
    this.definition = Object.freeze({ name: init.name, description: init.description, parameters: this.parameters })
    this.listing = Object.freeze({
      name: init.name,
      description: init.description,
      source: init.source,
      callback_url: this.callbackUrl,
      is_remote: this.isRemote
    })
    this.validator = init.validator
    this.checkTime = new CheckTime()
  }
}

/** A role's tools in registration order. Mutated only on the main thread. */
export class ToolRegistry {
  readonly #byName = new Map<string, ToolEntry>()
  readonly #bySource = new Map<string, Set<string>>()
  readonly #byOrigin = new Map<string, Set<string>>()
  /** Each name's place in the registration order (increasing), to order rows found by name. */
  readonly #order = new Map<string, number>()
  #nextOrder = 0
  #revision = 0
  #definitions: readonly ToolDefinition[] | null = null
  #listing: readonly ToolListing[] | null = null

  /** Increases on every change; a sync carries the revision it pushed. */
  get revision (): number { return this.#revision }
  get size (): number { return this.#byName.size }

  get (name: string): ToolEntry | undefined {
    return this.#byName.get(name)
  }

  /**
   * Adds or replaces (docs/protocol.md R5) a tool; returns the entry it replaced. A replaced tool moves to the
   * end of the order, as a new registration of that name would.
   */
  set (entry: ToolEntry): ToolEntry | undefined {
    const previous = this.#remove(entry.name)
    this.#byName.set(entry.name, entry)
    this.#order.set(entry.name, this.#nextOrder++)
    addToIndex(this.#bySource, entry.source, entry.name)
    if (entry.origin !== '') addToIndex(this.#byOrigin, entry.origin, entry.name)
    this.#changed()
    return previous
  }

  /** Removes one tool by name; returns it, or undefined when absent. */
  delete (name: string): ToolEntry | undefined {
    const removed = this.#remove(name)
    if (removed !== undefined) this.#changed()
    return removed
  }

  /**
   * Removes every remote tool of a source (docs/protocol.md R16); returns what it removed. Local tools belong
   * to the host and leave only through `unregisterLocalTool`.
   */
  deleteBySource (source: string): ToolEntry[] {
    return this.#deleteNames(this.#bySource.get(source), isRemoteEntry)
  }

  /** Removes the `plugin:` tools whose callback is at `origin` (docs/protocol.md R13); returns them. */
  deletePluginToolsAtOrigin (origin: string): ToolEntry[] {
    return this.#deleteNames(this.#byOrigin.get(origin), isPluginEntry)
  }

  /** Tool definitions for model sessions, in registration order; memoised until the next change. */
  definitions (): readonly ToolDefinition[] {
    if (this.#definitions === null) {
      const out: ToolDefinition[] = []
      for (const entry of this.#byName.values()) out.push(entry.definition)
      this.#definitions = Object.freeze(out)
    }
    return this.#definitions
  }

  /** Rows for `GET /api/tools`, in registration order; memoised until the next change. */
  listing (): readonly ToolListing[] {
    if (this.#listing === null) {
      const out: ToolListing[] = []
      for (const entry of this.#byName.values()) out.push(entry.listing)
      this.#listing = Object.freeze(out)
    }
    return this.#listing
  }

  /**
   * Rows for `GET /api/tools?source=…&name=…` (docs/protocol.md R18), in registration order: the
   * tools of `source` (when given) named in `names` (when given); every row without either. Found
   * through the indexes, so a plugin asking for its few names costs a few lookups, however many
   * tools others hold.
   */
  filteredListing (source: string | undefined, names: ReadonlySet<string> | undefined): readonly ToolListing[] {
    if (names === undefined) {
      if (source === undefined) return this.listing()
      const out: ToolListing[] = []
      // A source's index keeps registration order: a name re-registered moves to its end too.
      for (const name of this.#bySource.get(source) ?? []) out.push((this.#byName.get(name) as ToolEntry).listing)
      return out
    }
    const found: ToolEntry[] = []
    for (const name of names) {
      const entry = this.#byName.get(name)
      if (entry !== undefined && (source === undefined || entry.source === source)) found.push(entry)
    }
    const order = this.#order
    found.sort((a, b) => (order.get(a.name) as number) - (order.get(b.name) as number))
    return found.map((entry) => entry.listing)
  }

  /** True when some tool here has its callback at `origin`. */
  hasOrigin (origin: string): boolean {
    return this.#byOrigin.has(origin)
  }

  /** Tools of one source in this registry. */
  countBySource (source: string): number {
    return this.#bySource.get(source)?.size ?? 0
  }

  /** The entries in registration order (the console's view of a role). */
  entries (): IterableIterator<ToolEntry> {
    return this.#byName.values()
  }

  names (): string[] {
    return [...this.#byName.keys()]
  }

  #deleteNames (names: Set<string> | undefined, predicate: (entry: ToolEntry) => boolean): ToolEntry[] {
    if (names === undefined) return []
    const removed: ToolEntry[] = []
    // Copy first: #remove edits the index set being walked.
    for (const name of [...names]) {
      const entry = this.#byName.get(name)
      if (entry !== undefined && predicate(entry)) {
        this.#remove(name)
        removed.push(entry)
      }
    }
    if (removed.length > 0) this.#changed()
    return removed
  }

  #remove (name: string): ToolEntry | undefined {
    const entry = this.#byName.get(name)
    if (entry === undefined) return undefined
    this.#byName.delete(name)
    this.#order.delete(name)
    removeFromIndex(this.#bySource, entry.source, name)
    if (entry.origin !== '') removeFromIndex(this.#byOrigin, entry.origin, name)
    return entry
  }

  #changed (): void {
    this.#revision++
    this.#definitions = null
    this.#listing = null
  }
}

function addToIndex (index: Map<string, Set<string>>, key: string, name: string): void {
  let names = index.get(key)
  if (names === undefined) {
    names = new Set()
    index.set(key, names)
  }
  names.add(name)
}

function removeFromIndex (index: Map<string, Set<string>>, key: string, name: string): void {
  const names = index.get(key)
  if (names === undefined) return
  names.delete(name)
  if (names.size === 0) index.delete(key)
}

function isRemoteEntry (entry: ToolEntry): boolean {
  return entry.isRemote
}

function isPluginEntry (entry: ToolEntry): boolean {
  return entry.isPlugin
}
