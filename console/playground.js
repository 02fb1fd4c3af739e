// The playground: pick a role and a tool, fill a form built from the tool's JSON Schema (or edit
// the raw JSON beside it; each follows the other), call it through POST /api/tools/call, and see
// what the model would: text, output, error, images, and the round-trip time. This is the one
// place the console shows arguments and results: the ones typed here.
const IMAGE_TYPES = new Set(['image/png', 'image/jpeg', 'image/gif', 'image/webp'])

export function setupPlayground ({ api, h }) {
  const $ = (id) => document.getElementById(id)
  const roleSelect = $('pg-role')
  const toolSelect = $('pg-tool')
  const raw = $('pg-raw')
  let roles = []
  /** Property name → { type, read(): value | undefined, write(value) } of the current form. */
  let fields = new Map()
  /** The role and tool whose form is shown, and the description and schema it was built from. */
  let shownKey = ''
  let shownDefinition = ''
  /** Reads of a definition started so far: an answer to an older one is dropped. */
  let reads = 0
  /** Whether a call is in flight: the button stays disabled until it is answered. */
  let calling = false

  /** New roles from a state read; `registryChanged`: the registry may have changed since the last. */
  function update (nextRoles, registryChanged = true) {
    roles = nextRoles
    const role = roleSelect.value
    const names = roles.map((r) => r.name)
    if ([...roleSelect.options].map((o) => o.value).join('\n') !== names.join('\n')) {
      roleSelect.replaceChildren(...names.map((name) => h('option', { value: name, selected: name === role }, name)))
    }
    // After a registry change: the tool shown may have been registered again with another schema.
    fillTools(registryChanged)
  }

  function fillTools (reread = false) {
    const role = roles.find((r) => r.name === roleSelect.value)
    const tools = role === undefined ? [] : role.tools.map((t) => t.name)
    const current = toolSelect.value
    if ([...toolSelect.options].map((o) => o.value).join('\n') !== tools.join('\n')) {
      toolSelect.replaceChildren(...tools.map((name) => h('option', { value: name, selected: name === current }, name)))
    }
    $('pg-call').disabled = calling || tools.length === 0
    loadSchema(reread === true).catch(() => {})
  }

  /**
   * Builds the form of the selected tool from its definition; `reread` reads it again even when
   * that tool's form is shown, and rebuilds only if its description or schema changed (what was
   * typed stays otherwise). A read that fails leaves the key unshown, so the next one tries again.
   */
  async function loadSchema (reread = false) {
    const role = roleSelect.value
    const name = toolSelect.value
    const key = `${role}\0${name}`
    if (key === shownKey && !reread) return
    const read = ++reads
    if (role === '' || name === '') {
      shownKey = key
      shownDefinition = ''
      buildForm({ type: 'object', properties: {} })
      $('pg-description').textContent = ''
      return
    }
    const { status, body } = await api(`/api/tools/definitions?role=${encodeURIComponent(role)}&format=mcp`)
    if (status !== 200 || read !== reads) return
    const tool = body.tools.find((t) => t.name === name)
    const definition = JSON.stringify([tool?.description ?? '', tool?.inputSchema ?? null])
    if (key === shownKey && definition === shownDefinition) return
    shownKey = key
    shownDefinition = definition
    $('pg-description').textContent = tool?.description ?? ''
    buildForm(tool?.inputSchema ?? { type: 'object', properties: {} })
  }

  function buildForm (schema) {
    fields = new Map()
    const required = new Set(Array.isArray(schema.required) ? schema.required : [])
    const rows = []
    for (const [name, prop] of Object.entries(schema.properties ?? {})) {
      const field = buildField(name, prop ?? {}, required.has(name))
      fields.set(name, field)
      rows.push(field.element)
    }
    if (rows.length === 0) rows.push(h('div', { className: 'muted small' }, 'no arguments'))
    $('pg-form').replaceChildren(h('legend', {}, 'Arguments'), ...rows)
    // A new form starts the raw editor afresh: keys typed for another tool are not this one's.
    syncRawFromForm(false)
  }

  function buildField (name, prop, isRequired) {
    const type = Array.isArray(prop.type) ? prop.type.find((t) => t !== 'null') : prop.type
    const title = h('span', {}, h('span', { className: 'field-name' }, name), isRequired
      ? h('span',
        { className: 'field-required' }, ' *')
      : null,
    type === undefined ? null : h('span', { className: 'muted' }, ` ${type}`))
    const help = prop.description ? h('span', { className: 'field-help' }, prop.description) : null
    let input
    let read
    let write
    if (Array.isArray(prop.enum)) {
      input = h('select', { name }, h('option', { value: '' }, '—'), prop.enum.map((v, i) => h('option',
        { value: String(i) }, JSON.stringify(v))))
      read = () => input.value === '' ? undefined : prop.enum[Number(input.value)]
      write = (v) => {
        const i = prop.enum.findIndex((e) => JSON.stringify(e) === JSON.stringify(v))
        input.value = i === -1 ? '' : String(i)
      }
    } else if (type === 'boolean') {
      input = h('input', { type: 'checkbox', name })
      read = () => input.indeterminate ? undefined : input.checked
      write = (v) => { input.indeterminate = v === undefined; input.checked = v === true }
      input.indeterminate = prop.default === undefined
      if (prop.default !== undefined) input.checked = prop.default === true
      const element = h('label', { className: 'check' }, input, title, help)
      input.addEventListener('change', syncRawFromForm)
      return { element, read, write }
    } else if (type === 'number' || type === 'integer') {
      input = h('input', {
        type: 'number',
        name,
        step: type === 'integer' ? '1' : 'any',
        placeholder: prop.default === undefined ? '' : String(prop.default)
      })
      read = () => input.value === '' ? undefined : Number(input.value)
      write = (v) => { input.value = typeof v === 'number' ? String(v) : '' }
    } else if (type === 'string' || type === undefined) {
      input = h('input', {
        type: 'text',
        name,
        placeholder: prop.default === undefined
          ? (prop.format ??
        '')
          : String(prop.default)
      })
      read = () => input.value === '' ? undefined : input.value
      write = (v) => { input.value = typeof v === 'string' ? v : '' }
    } else {
      // Objects and arrays: JSON in a small text area.
      input = h('textarea', { name, rows: 2, spellcheck: false, placeholder: type === 'array' ? '[ ]' : '{ }' })
      read = () => {
        if (input.value.trim() === '') return undefined
        try { return JSON.parse(input.value) } catch { return input.value }
      }
      write = (v) => { input.value = v === undefined ? '' : JSON.stringify(v) }
    }
    input.addEventListener('input', syncRawFromForm)
    input.addEventListener('change', syncRawFromForm)
    return { element: h('label', {}, title, input, help), read, write }
  }

  /**
   * Writes the form's values into the raw editor. Keys the form has no field for, typed in the raw
   * editor (`keepOthers`), stay: a field typed into never drops them silently.
   */
  function syncRawFromForm (keepOthers = true) {
    const args = {}
    const define = (name, value) => {
      // Defined, not assigned: `args[name] = value` sets no key for a property named `__proto__`.
      Object.defineProperty(args, name, { value, enumerable: true, writable: true, configurable: true })
    }
    if (keepOthers !== false) { // an event listener passes its event
      let before = null
      try { before = JSON.parse(raw.value) } catch {}
      if (before !== null && typeof before === 'object' && !Array.isArray(before)) {
        for (const name of Object.keys(before)) if (!fields.has(name)) define(name, before[name])
      }
    }
    for (const [name, field] of fields) {
      const value = field.read()
      if (value === undefined) continue
      define(name, value)
    }
    raw.value = JSON.stringify(args, null, 2)
    $('pg-raw-error').textContent = ''
  }

  function syncFormFromRaw () {
    let args
    try {
      args = JSON.parse(raw.value)
    } catch (err) {
      $('pg-raw-error').textContent = `not JSON yet: ${err.message}`
      return
    }
    $('pg-raw-error').textContent = args === null || typeof args !== 'object' ||
      Array.isArray(args)
      ? 'arguments must be a JSON object'
      : ''
    if ($('pg-raw-error').textContent !== '') return
    // Own keys only: `args.constructor`, `args.__proto__` … of an object without them are Object's.
    for (const [name, field] of fields) field.write(Object.hasOwn(args, name) ? args[name] : undefined)
  }

  async function call (event) {
    event.preventDefault()
    let args
    try {
      args = JSON.parse(raw.value)
    } catch (err) {
      $('pg-raw-error').textContent = `the arguments are not JSON: ${err.message}`
      return
    }
    const button = $('pg-call')
    if (calling) return
    calling = true
    button.disabled = true
    const started = performance.now()
    try {
      const { status, body } = await api('/api/tools/call', {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ role: roleSelect.value, name: toolSelect.value, arguments: args })
      })
      showResult(status, body, performance.now() - started)
    } catch (err) {
      showResult(0, { is_error: true, error: String(err?.message ?? err) }, performance.now() - started)
    } finally {
      calling = false
      button.disabled = toolSelect.value === ''
    }
  }

  function showResult (status, body, elapsedMs) {
    $('pg-result').hidden = false
    const isError = status !== 200 || body?.is_error === true
    const label = status !== 200 ? `HTTP ${status}` : isError ? 'tool error' : 'ok'
    $('pg-status').replaceChildren(h('span', { className: `badge ${isError ? 'bad' : 'ok'}` }, label))
    $('pg-timing').textContent = `${elapsedMs.toFixed(1)} ms round trip`
    const text = status === 200 ? body?.text : (body?.message ?? null)
    show('pg-text', text === undefined || text === null ? null : String(text))
    show('pg-output', body?.output === undefined || body?.output === null ? null : JSON.stringify(body.output, null, 2))
    show('pg-error', typeof body?.error === 'string' && status === 200 ? body.error : null)
    const images = Array.isArray(body?.images)
      ? body.images.filter((img) => IMAGE_TYPES.has(img?.mime_type) &&
      typeof img.data_base64 === 'string')
      : []
    $('pg-images-block').hidden = images.length === 0
    $('pg-images').replaceChildren(...images.map((img) => h('figure', {},
      h('img', { src: `data:${img.mime_type};base64,${img.data_base64}`, alt: img.prompt ?? 'tool image' }),
      img.prompt ? h('figcaption', {}, img.prompt) : null)))
  }

  function show (id, text) {
    $(`${id}-block`).hidden = text === null
    $(id).textContent = text ?? ''
  }

  roleSelect.addEventListener('change', () => { fillTools() })
  toolSelect.addEventListener('change', () => { loadSchema().catch(() => {}) })
  raw.addEventListener('input', syncFormFromRaw)
  $('playground').addEventListener('submit', call)
  return { update }
}
