// The body of `GET /api/tools/definitions`, streamed (see streamed-json.ts: one JSON string of
// 9000 tools with 60 KB schemas is past V8's longest string). The measure pass stops as soon as
// `limits.maxDefinitionsBytes` is passed: a 422 naming the cap, before any byte is sent.
import { limitExceeded, type ToolportError } from '../errors.js'
import { toolDefinitions, type DefinitionFormat, type GeminiTool } from '../sessions/definitions.js'
import type { Role } from '../roles/role.js'
import { streamedJson, type StreamedJson } from './streamed-json.js'

/**
 * `{ok: true, role, format, tools}` for the role and format, ready to stream. Throws 422
 * TP_ERR_LIMIT_EXCEEDED (details name `limits.maxDefinitionsBytes`) when it would be larger.
 */
export async function definitionsBody (role: Role, format: DefinitionFormat,
  maxBytes: number): Promise<StreamedJson> {
  const built = toolDefinitions(role, format)
  let items: readonly unknown[] = built
  let head = `{"ok":true,"role":${JSON.stringify(role.name)},"format":${JSON.stringify(format)},"tools":[`
  let tail = ']}'
  if (format === 'gemini' && built.length > 0) {
    // Gemini's one Tool holds every declaration: stream the declarations inside it.
    items = (built[0] as GeminiTool).functionDeclarations
    head += '{"functionDeclarations":['
    tail = ']}]}'
  }
  const body = await streamedJson([head, items, tail], maxBytes)
  if (body === null) throw tooLarge(maxBytes)
  return body
}

function tooLarge (maxBytes: number): ToolportError {
  return limitExceeded('limits.maxDefinitionsBytes', `the definitions would be larger than ${maxBytes} bytes of JSON`,
    'ask for one role at a time or raise the limit')
}
