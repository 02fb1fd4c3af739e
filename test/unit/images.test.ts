// The checks of a reply's `images` (src/shared/images.ts) and how their outcome reaches the text
// the model reads (src/shared/reply.ts): strict base64, magic bytes against `mime`, size and count
// caps, and every problem as an `_image_warnings` sentence instead of a failed call.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import fc from 'fast-check'
import { checkImages, DEFAULT_IMAGE_LIMITS, isStrictBase64, sniffImageType } from '../../src/shared/images.js'
import { mapReply } from '../../src/shared/reply.js'

const PNG = Buffer.from('89504e470d0a1a0a0000000d49484452', 'hex').toString('base64')
const JPEG = Buffer.from('ffd8ffe000104a46494600010100000100010000', 'hex').toString('base64')
const GIF = Buffer.from('GIF87a\x01\x00\x01\x00\x00\x00\x00', 'latin1').toString('base64')
const WEBP = Buffer.concat([Buffer.from('RIFF'), Buffer.from([36, 0, 0, 0]),
  Buffer.from('WEBPVP8 ')]).toString('base64')
const J = 'application/json'

test('magic bytes: PNG, JPEG, GIF87a/89a and WebP are recognised, anything else is not', () => {
  assert.equal(sniffImageType(Buffer.from(PNG, 'base64')), 'image/png')
  assert.equal(sniffImageType(Buffer.from(JPEG, 'base64')), 'image/jpeg')
  assert.equal(sniffImageType(Buffer.from(GIF, 'base64')), 'image/gif')
  assert.equal(sniffImageType(Buffer.from(WEBP, 'base64')), 'image/webp')
  assert.equal(sniffImageType(Buffer.from('RIFF\x00\x00\x00\x00WAVE')), '')
  assert.equal(sniffImageType(Buffer.from('%PDF-1.7')), '')
  assert.equal(sniffImageType(new Uint8Array(0)), '')
})

test('base64 is strict: standard alphabet, padded, no whitespace, no stray bits', () => {
  assert.equal(isStrictBase64(PNG), true)
  assert.equal(isStrictBase64('QQ=='), true)
  assert.equal(isStrictBase64('QUI='), true)
  for (const bad of ['QQ', 'QQ=', 'Q===', 'QR==', 'QUJ=', 'QU I=', 'QUI=\n', 'QU-_', '====', 'QUI=QUI=',
    'data:image/png;base64,QQ==']) {
    assert.equal(isStrictBase64(bad), false, bad)
  }
})

test('property: strict base64 accepts exactly what Buffer encodes', () => {
  fc.assert(fc.property(fc.uint8Array({ maxLength: 64 }), (bytes) => {
    const encoded = Buffer.from(bytes).toString('base64')
    assert.equal(isStrictBase64(encoded), true)
  }), { numRuns: 500 })
  fc.assert(fc.property(fc.string({ maxLength: 16 }), (text) => {
    if (isStrictBase64(text)) assert.equal(Buffer.from(text, 'base64').toString('base64'), text)
  }), { numRuns: 2000 })
})

test('good images pass with the type their bytes announce; a missing mime is taken from the bytes; jpg is jpeg', () => {
  const checked = checkImages([
    { data_b64: PNG, mime: 'image/png', vision_prompt: 'what is it?' },
    { data_b64: JPEG, mime: 'IMAGE/JPG' }
  ], DEFAULT_IMAGE_LIMITS)
  assert.deepEqual(checked, { parts: ['image/png', PNG, 'what is it?', 'image/jpeg', JPEG, ''], warnings: [] })
  assert.deepEqual(checkImages([{ data_b64: WEBP }], DEFAULT_IMAGE_LIMITS).parts, ['image/webp', WEBP, ''])
})

test('each problem drops its image with a warning naming it; the good ones still pass', () => {
  const limits = { maxImages: 8, maxImageBytes: 64 }
  const checked = checkImages([
    { data_b64: 'a?b=', mime: 'image/png' },
    { data_b64: PNG, mime: 'image/gif' },
    { data_b64: 'A'.repeat(68), mime: 'image/png' },
    { data_b64: Buffer.from('%PDF-1.7 not an image').toString('base64') },
    { data_b64: GIF, mime: 'image/bmp' },
    { data_b64: GIF, mime: 'constructor' },
    { mime: 'image/png' },
    'not an object',
    { data_b64: GIF, mime: 'image/gif', vision_prompt: 42 }
  ], limits)
  assert.deepEqual(checked.parts, [])
  assert.equal(checked.warnings.length, 9)
  assert.match(checked.warnings[0] ?? '', /^image 1: .*not valid base64/)
  assert.match(checked.warnings[1] ?? '', /^image 2: mime "image\/gif" does not match the data, which is PNG/)
  assert.match(checked.warnings[2] ?? '', /^image 3: 68 bytes of base64, more than the 64 allowed/)
  assert.match(checked.warnings[3] ?? '', /^image 4: the data is not a PNG, JPEG, WebP or GIF image/)
  assert.match(checked.warnings[4] ?? '', /^image 5: mime "image\/bmp" is not one of/)
  assert.match(checked.warnings[5] ?? '', /^image 6: mime "constructor" is not one of/)
  assert.match(checked.warnings[6] ?? '', /^image 7: data_b64 is missing or empty/)
  assert.match(checked.warnings[7] ?? '', /^image 8: expected an object/)
  assert.match(checked.warnings[8] ?? '', /^images: 9 sent, at most 8 are passed on; image 9 dropped/)
})

test('a mime that is not a string is named by its kind, never serialised: one nested past the stack drops its image, not the reply', () => {
  let deep: unknown = 'image/png'
  for (let i = 0; i < 200_000; i++) deep = [deep]
  const checked = checkImages([{ data_b64: PNG, mime: deep }, { data_b64: PNG, mime: { type: 'png' } },
    { data_b64: PNG, mime: 42 }, { data_b64: PNG, mime: 'image/png' }], { maxImages: 8, maxImageBytes: 1024 })
  assert.deepEqual(checked.warnings, [
    'image 1: mime (an array) is not one of image/png, image/jpeg, image/webp, image/gif; dropped',
    'image 2: mime (an object) is not one of image/png, image/jpeg, image/webp, image/gif; dropped',
    'image 3: mime (42) is not one of image/png, image/jpeg, image/webp, image/gif; dropped'
  ])
  assert.deepEqual(checked.parts, ['image/png', PNG, ''])
})

test('the count cap keeps the first images; a value that is not an array is one warning', () => {
  const four = [PNG, JPEG, GIF, WEBP].map((data) => ({ data_b64: data }))
  const checked = checkImages(four, DEFAULT_IMAGE_LIMITS)
  assert.deepEqual(checked.parts, ['image/png', PNG, '', 'image/jpeg', JPEG, ''])
  assert.deepEqual(checked.warnings, ['images: 4 sent, at most 2 are passed on; image 3–4 dropped'])
  assert.equal(checkImages({ data_b64: PNG }, DEFAULT_IMAGE_LIMITS).warnings.length, 1)
  assert.deepEqual(checkImages(null, DEFAULT_IMAGE_LIMITS), { parts: [], warnings: [] })
})

test('R11: an error reply\'s text carries its non-null output; the error message rules are unchanged', () => {
  assert.deepEqual(mapReply('{"output":{"reason":"no_data"},"is_error":true,"error":"NO_DATA"}', J),
    { text: '{"error":"NO_DATA","output":{"reason":"no_data"}}', textIsJson: false, toolError: 'NO_DATA' })
  assert.deepEqual(mapReply('{"output": null, "is_error": true, "error": "gone"}', J),
    { text: '{"error":"gone"}', textIsJson: false, toolError: 'gone' })
  // No error string: the output is the message, and still the output.
  assert.deepEqual(mapReply('{"output":"kaput","is_error":true}', J),
    { text: '{"error":"kaput","output":"kaput"}', textIsJson: false, toolError: 'kaput' })
  assert.equal(mapReply('{"output":{"a": [1]},"is_error":true}', J).toolError, '{"a":[1]}')
  assert.equal(mapReply('{"error":{"code": 7},"is_error":true}', J).toolError, '{"code":7}')
  assert.equal(mapReply('{"error":"\\u004eO","is_error":true}', J).toolError, 'NO')
})

test('images: warnings join the output the model reads, whatever its kind, and images cross as flat parts', () => {
  const bad = '{"data_b64":"!!","mime":"image/png"}'
  const good = `{"data_b64":"${PNG}","mime":"image/png","vision_prompt":"look"}`
  const object = mapReply(`{"output":{"a":1},"is_error":false,"images":[${bad},${good}]}`, J)
  assert.equal(object.textIsJson, true)
  assert.deepEqual(JSON.parse(object.text), { a: 1, _image_warnings: [JSON.parse(object.text)._image_warnings[0]] })
  assert.deepEqual(object.images, ['image/png', PNG, 'look'])
  assert.deepEqual(Object.keys(JSON.parse(mapReply(`{"output":{ },"images":[${bad}]}`, J).text)), ['_image_warnings'])
  assert.deepEqual(Object.keys(JSON.parse(mapReply(`{"output":[1],"images":[${bad}]}`, J).text)), ['output',
    '_image_warnings'])
  assert.deepEqual(Object.keys(JSON.parse(mapReply(`{"is_error":false,"images":[${bad}]}`, J).text)),
    ['_image_warnings'])
  const error = mapReply(`{"output":{"reason":"x"},"is_error":true,"error":"E","images":[${bad}]}`, J)
  assert.deepEqual(Object.keys(JSON.parse(error.text).output), ['reason', '_image_warnings'])
  // No images, or `images: null`: the three-field reading, no `images` key.
  assert.deepEqual(mapReply('{"output":1,"images":null}', J), { text: '1', textIsJson: true, toolError: '' })
  assert.deepEqual(mapReply('{"output":1,"images":[]}', J), { text: '1', textIsJson: true, toolError: '' })
  // `images` without output/is_error is not an envelope: the object is the output.
  assert.equal(mapReply(`{"images":[${good}]}`, J).images, undefined)
})
