// The `images` channel of a callback reply: `[{"data_b64", "mime", "vision_prompt"}]` beside
// `output` (README "Errors and images from a plugin"; the shape of the originating application's plugins).
//
// Checked where the reply arrived (the worker thread in pool mode, src/shared so inline mode runs
// the same code): strict base64, the image's magic bytes against its `mime`, a size cap per image
// and a count cap. A problem never fails the call: the image is left out and a sentence saying
// why goes to the model as `_image_warnings` in the output.

/** Caps on the images of one reply (`dispatch.maxImages`, `dispatch.maxImageBytes`). */
export interface ImageLimits {
  /** Most images passed on from one reply; the rest are dropped with a warning. */
  maxImages: number
  /** Largest `data_b64` accepted, in bytes (characters) of base64. */
  maxImageBytes: number
}

/** The originating application's own limits: at most 2 images, base64 of at most 2 MiB each. */
export const DEFAULT_IMAGE_LIMITS: Readonly<ImageLimits> = Object.freeze({
  maxImages: 2,
  maxImageBytes: 2 * 1024 * 1024
})

/** The image types whose magic bytes are checked and that the providers accept. */
export const IMAGE_MIME_TYPES = ['image/png', 'image/jpeg', 'image/webp', 'image/gif'] as const
export type ImageMimeType = typeof IMAGE_MIME_TYPES[number]

/** The checked images, flat (mime, base64, prompt; '' when none) so they cross threads cheaply, and the warnings. */
export interface CheckedImages {
  parts: string[]
  warnings: string[]
}

// Standard base64 (RFC 4648 §4), padded, no whitespace: what Python's base64.b64encode writes.
// With the length a multiple of 4, this also pins the padding to the last quantum.
const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/
const BASE64_ALPHABET = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/'
// 16 base64 characters decode to 12 bytes: enough for every signature below (WebP needs 12).
const SNIFF_CHARS = 16

const MIME_ALIASES: Record<string, ImageMimeType> = {
  'image/png': 'image/png',
  'image/jpeg': 'image/jpeg',
  'image/jpg': 'image/jpeg',
  'image/pjpeg': 'image/jpeg',
  'image/webp': 'image/webp',
  'image/gif': 'image/gif'
}

const LABELS: Record<ImageMimeType, string> = {
  'image/png': 'PNG', 'image/jpeg': 'JPEG', 'image/webp': 'WebP', 'image/gif': 'GIF'
}

/** The image type that the first bytes announce, or '' (PNG, JPEG, GIF87a/89a, RIFF….WEBP). */
export function sniffImageType (head: Uint8Array): ImageMimeType | '' {
  if (head.length >= 8 && head[0] === 0x89 && head[1] === 0x50 && head[2] === 0x4e && head[3] === 0x47 &&
    head[4] === 0x0d && head[5] === 0x0a && head[6] === 0x1a && head[7] === 0x0a) return 'image/png'
  if (head.length >= 3 && head[0] === 0xff && head[1] === 0xd8 && head[2] === 0xff) return 'image/jpeg'
  if (head.length >= 6 && head[0] === 0x47 && head[1] === 0x49 && head[2] === 0x46 && head[3] === 0x38 &&
    (head[4] === 0x37 || head[4] === 0x39) && head[5] === 0x61) return 'image/gif'
  if (head.length >= 12 && head[0] === 0x52 && head[1] === 0x49 && head[2] === 0x46 && head[3] === 0x46 &&
    head[8] === 0x57 && head[9] === 0x45 && head[10] === 0x42 && head[11] === 0x50) return 'image/webp'
  return ''
}

/**
 * True when `data` is canonical padded base64: the alphabet, the padding, and no stray bits in
 * the last character (RFC 4648 §3.5), so that it decodes to exactly one byte string.
 */
export function isStrictBase64 (data: string): boolean {
  if (data.length % 4 !== 0 || !BASE64.test(data)) return false
  if (data.endsWith('==')) return (BASE64_ALPHABET.indexOf(data.charAt(data.length - 3)) & 0x0f) === 0
  if (data.endsWith('=')) return (BASE64_ALPHABET.indexOf(data.charAt(data.length - 2)) & 0x03) === 0
  return true
}

/**
 * Checks the `images` value of a reply against `limits`. Never throws; whatever is wrong with an
 * image becomes a warning and the image is left out.
 *
 * @example
 * checkImages([{ data_b64: png, mime: 'image/png' }], DEFAULT_IMAGE_LIMITS) // { parts: ['image/png', png, ''],
 * warnings: [] }
 */
export function checkImages (value: unknown, limits: ImageLimits): CheckedImages {
  const parts: string[] = []
  const warnings: string[] = []
  if (value === null || value === undefined) return { parts, warnings }
  if (!Array.isArray(value)) {
    warnings.push('images: expected an array of {data_b64, mime, vision_prompt}; nothing was passed on')
    return { parts, warnings }
  }
  const count = Math.min(value.length, limits.maxImages)
  for (let i = 0; i < count; i++) checkImage(value[i], i + 1, limits, parts, warnings)
  if (value.length > limits.maxImages) {
    warnings.push(`images: ${value.length} sent, at most ${limits.maxImages} are passed on; ` +
      `image ${limits.maxImages + 1}${value.length > limits.maxImages + 1 ? `–${value.length}` : ''} dropped`)
  }
  return { parts, warnings }
}

function checkImage (image: unknown, n: number, limits: ImageLimits, parts: string[], warnings: string[]): void {
  if (typeof image !== 'object' || image === null || Array.isArray(image)) {
    warnings.push(`image ${n}: expected an object {data_b64, mime, vision_prompt}; dropped`)
    return
  }
  const { data_b64: data, mime, vision_prompt: prompt } = image as Record<string, unknown>
  if (typeof data !== 'string' || data === '') {
    warnings.push(`image ${n}: data_b64 is missing or empty; dropped`)
    return
  }
  if (data.length > limits.maxImageBytes) {
    warnings.push(`image ${n}: ${data.length} bytes of base64, more than the ${limits.maxImageBytes} allowed; dropped`)
    return
  }
  if (!isStrictBase64(data)) {
    warnings.push(`image ${n}: data_b64 is not valid base64 (standard alphabet, padded, no whitespace); dropped`)
    return
  }
  const actual = sniffImageType(Buffer.from(data.slice(0, SNIFF_CHARS), 'base64'))
  if (actual === '') {
    warnings.push(`image ${n}: the data is not a PNG, JPEG, WebP or GIF image; dropped`)
    return
  }
  let declared: ImageMimeType | undefined
  if (mime !== undefined && mime !== null && mime !== '') {
    const key = typeof mime === 'string' ? mime.trim().toLowerCase() : ''
    // hasOwn: a mime such as 'constructor' must not reach Object.prototype.
    declared = Object.hasOwn(MIME_ALIASES, key) ? MIME_ALIASES[key] : undefined
    if (declared === undefined) {
      warnings.push(`image ${n}: mime ${describe(mime)} is not one of ${IMAGE_MIME_TYPES.join(', ')}; dropped`)
      return
    }
    if (declared !== actual) {
      warnings.push(`image ${n}: mime ${describe(mime)} does not match the data, which is ${LABELS[actual]}; dropped`)
      return
    }
  }
  parts.push(actual, data, typeof prompt === 'string' ? prompt : '')
}

/**
 * A plugin's `mime` in a warning: a string as a quoted snippet, anything else by its kind. Never
 * serialised: a value may nest deeper than the thread's stack (`JSON.stringify` of a 10 000-level
 * array threw, and the whole reply failed as an internal error instead of dropping one image).
 */
function describe (value: unknown): string {
  if (typeof value === 'string') return JSON.stringify(value.length > 40 ? `${value.slice(0, 40)}…` : value)
  if (Array.isArray(value)) return '(an array)'
  return typeof value === 'object' && value !== null ? '(an object)' : `(${String(value)})`
}
