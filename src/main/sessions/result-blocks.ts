// A ToolResult in each provider's tool-result format, for a host's own LLM loop: the counterpart
// of `toolDefinitions` on the way back. Providers that take images in a tool result get them as
// image blocks beside the text; text-only formats say how many images were left out.
import type { ToolImage, ToolResult } from '../dispatch/result.js'
import { validationError } from '../errors.js'
import type { ImageMimeType } from '../../shared/images.js'

/** The formats `toolResultBlock` produces. */
export const RESULT_FORMATS = ['anthropic', 'openai-responses', 'openai-chat'] as const
export type ResultFormat = typeof RESULT_FORMATS[number]

/** An Anthropic Messages content block inside a `tool_result`. */
export type AnthropicResultContent =
  | { type: 'text', text: string }
  | { type: 'image', source: { type: 'base64', media_type: ImageMimeType, data: string } }

/** Anthropic Messages: the `tool_result` block that goes into the next `user` message's content. */
export interface AnthropicToolResultBlock {
  type: 'tool_result'
  tool_use_id: string
  /** The text alone when there are no images; else text and image blocks. */
  content: string | AnthropicResultContent[]
  is_error?: true
}

/** One item of an OpenAI Responses `function_call_output.output` list. */
export type OpenAIResponsesOutputContent =
  | { type: 'input_text', text: string }
  | { type: 'input_image', image_url: string, detail: 'auto' }

/** OpenAI Responses API: the `function_call_output` input item. */
export interface OpenAIResponsesFunctionCallOutput {
  type: 'function_call_output'
  call_id: string
  /** The text alone when there are no images; else `input_text` and `input_image` items. */
  output: string | OpenAIResponsesOutputContent[]
}

/** OpenAI Chat Completions (and compatible APIs): the `tool` message; text only. */
export interface OpenAIChatToolMessage {
  role: 'tool'
  tool_call_id: string
  content: string
}

/** What each format produces. */
export interface ResultBlocksByFormat {
  anthropic: AnthropicToolResultBlock
  'openai-responses': OpenAIResponsesFunctionCallOutput
  'openai-chat': OpenAIChatToolMessage
}

/**
 * A tool's result as the provider's tool-result item, answering the model's call `callId`
 * (Anthropic `tool_use.id`, OpenAI `call_id` / `tool_calls[].id`). Images go along where the
 * format takes them (Anthropic `image` blocks, Responses `input_image` items, each after its
 * `vision_prompt` as text); Chat Completions tool messages are text only, so their text says how
 * many images were left out. An unknown format throws TP_ERR_VALIDATION.
 *
 * @example
 * const result = await tp.callTool('Lanlan', { name: block.name, call_id: block.id, arguments: block.input })
 * messages.push({ role: 'user', content: [toolResultBlock(result, 'anthropic', block.id)] })
 */
export function toolResultBlock<F extends ResultFormat> (result: ToolResult, format: F,
  callId: string): ResultBlocksByFormat[F] {
  switch (format) {
    case 'anthropic':
      return anthropicBlock(result, callId) as ResultBlocksByFormat[F]
    case 'openai-responses':
      return responsesItem(result, callId) as ResultBlocksByFormat[F]
    case 'openai-chat':
      return { role: 'tool', tool_call_id: callId, content: textOnlyOutput(result) } as ResultBlocksByFormat[F]
  }
  throw validationError([{
    path: 'format',
    code: 'invalid_value',
    message: `must be one of ${RESULT_FORMATS.join(', ')}`
  }])
}

function anthropicBlock (result: ToolResult, callId: string): AnthropicToolResultBlock {
  // Read once: a large result decodes its text on each read.
  const text = result.text
  const block: AnthropicToolResultBlock = { type: 'tool_result', tool_use_id: callId, content: text }
  const images = result.images ?? []
  if (images.length > 0) {
    const content: AnthropicResultContent[] = []
    // Anthropic refuses empty text blocks.
    if (text !== '') content.push({ type: 'text', text })
    for (const image of images) {
      if (image.prompt !== undefined) content.push({ type: 'text', text: image.prompt })
      content.push({ type: 'image', source: { type: 'base64', media_type: image.mime_type, data: image.data_base64 } })
    }
    block.content = content
  }
  if (result.is_error) block.is_error = true
  return block
}

function responsesItem (result: ToolResult, callId: string): OpenAIResponsesFunctionCallOutput {
  const text = result.text
  const images = result.images ?? []
  if (images.length === 0) return { type: 'function_call_output', call_id: callId, output: text }
  const output: OpenAIResponsesOutputContent[] = []
  if (text !== '') output.push({ type: 'input_text', text })
  for (const image of images) {
    if (image.prompt !== undefined) output.push({ type: 'input_text', text: image.prompt })
    output.push({ type: 'input_image', image_url: dataUrl(image), detail: 'auto' })
  }
  return { type: 'function_call_output', call_id: callId, output }
}

function dataUrl (image: ToolImage): string {
  return `data:${image.mime_type};base64,${image.data_base64}`
}

/**
 * The result's text for a session that takes text only (Realtime `function_call_output`, Chat
 * Completions tool messages): `text`, plus a line saying how many images were left out.
 */
export function textOnlyOutput (result: ToolResult): string {
  const text = result.text
  const count = result.images?.length ?? 0
  if (count === 0) return text
  const note = `[${count} image${count === 1 ? '' : 's'} from the tool omitted: this session takes text only]`
  return text === '' ? note : `${text}\n${note}`
}
