// What a handler may return or throw besides a plain output, as the Python SDK has them: an error
// with an output beside it (ToolError), and images in the reply's `images` channel (Image,
// ToolOutput). README "Errors and images from a plugin" has the reply they become.
import { readFile } from 'node:fs/promises'
import { extname } from 'node:path'

/** Image types by file extension, for `Image.fromFile` (the four Toolport passes on). */
const MIME_BY_EXTENSION: Readonly<Record<string, string>> = {
  '.png': 'image/png',
  '.jpg': 'image/jpeg',
  '.jpeg': 'image/jpeg',
  '.webp': 'image/webp',
  '.gif': 'image/gif'
}

/**
 * Throw it in a handler to answer the model with a tool error: `message` is what the model reads
 * as `error` (a short code such as `"NO_DATA"`, or a sentence), and `output` (any JSON value)
 * travels beside it; the model reads `{"error":"NO_DATA","output":{"reason":"no such city"}}`.
 *
 * @example
 * throw new ToolError('NO_DATA', { output: { reason: 'no such city' } })
 */
export class ToolError extends Error {
  readonly output: unknown

  constructor (message: string, options: { output?: unknown, cause?: unknown } = {}) {
    super(String(message), options.cause === undefined ? undefined : { cause: options.cause })
    this.name = 'ToolError'
    this.output = options.output
  }
}

/**
 * An image for a vision-capable model, sent in the reply's `images` channel. Toolport passes on
 * PNG, JPEG, WebP and GIF whose bytes agree with `mime`.
 *
 * @example
 * return new ToolOutput({ city: 'Oslo' }, { images: [await Image.fromFile('radar.png')] })
 */
export class Image {
  readonly data: Uint8Array
  readonly mime: string
  readonly visionPrompt: string | undefined

  constructor (data: Uint8Array, mime = 'image/png', visionPrompt?: string) {
    if (!(data instanceof Uint8Array)) throw new TypeError('Image data must be a Uint8Array (a Buffer)')
    if (typeof mime !== 'string' || !mime.startsWith('image/')) {
      throw new TypeError(`Image mime must be an image/* type (got ${JSON.stringify(mime)})`)
    }
    if (visionPrompt !== undefined && typeof visionPrompt !== 'string') {
      throw new TypeError('Image visionPrompt must be a string')
    }
    this.data = data
    this.mime = mime
    this.visionPrompt = visionPrompt
  }

  /** An image read from a file; its type comes from the file name's extension unless given. */
  static async fromFile (path: string | URL, options: { mime?: string, visionPrompt?: string } = {}): Promise<Image> {
    const mime = options.mime ?? MIME_BY_EXTENSION[extname(String(path)).toLowerCase()]
    if (mime === undefined) throw new TypeError(`cannot tell the image type of ${String(path)}; pass { mime }`)
    return new Image(await readFile(path), mime, options.visionPrompt)
  }

  /** The reply's form of it (README "Errors and images from a plugin"). */
  toJSON (): { data_b64: string, mime: string, vision_prompt?: string } {
    const data = Buffer.from(this.data.buffer, this.data.byteOffset, this.data.byteLength).toString('base64')
    return this.visionPrompt === undefined
      ? { data_b64: data, mime: this.mime }
      : { data_b64: data, mime: this.mime, vision_prompt: this.visionPrompt }
  }
}

/**
 * A tool's output together with images.
 *
 * @example
 * return new ToolOutput({ city: 'Oslo' }, { images: [new Image(png, 'image/png')] })
 */
export class ToolOutput {
  readonly value: unknown
  readonly images: readonly Image[]

  constructor (value: unknown, options: { images?: readonly Image[] } = {}) {
    const images = options.images ?? []
    if (!Array.isArray(images) || !images.every((image) => image instanceof Image)) {
      throw new TypeError('ToolOutput images must be an array of Image objects')
    }
    this.value = value
    this.images = [...images]
  }
}

/**
 * A handler's return value split into the output and its images: a ToolOutput, an Image, or a
 * non-empty array of only Images (then the output is null); anything else is the output itself.
 */
export function splitImages (result: unknown): { output: unknown, images: readonly Image[] } {
  if (result instanceof ToolOutput) return { output: result.value, images: result.images }
  if (result instanceof Image) return { output: null, images: [result] }
  if (Array.isArray(result) && result.length > 0 && result.every((item) => item instanceof Image)) {
    return { output: null, images: result as Image[] }
  }
  return { output: result, images: [] }
}
