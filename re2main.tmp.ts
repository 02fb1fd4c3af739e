import { createToolport } from './src/main/index.ts'
const tp = await createToolport({ roles: ['A'], dispatch: { mode: 'inline' } })
for (let k = 0; k < 12; k++) {
  const properties: Record<string, unknown> = {}
  const args: Record<string, string> = {}
  for (let i = 0; i < 1000; i++) { properties[`p${i}`] = { type: 'string', pattern: `^${k}x${i}y+$` }; args[`p${i}`] = `${k}x${i}yy` }
  const r = await tp.register({ name: `t${k}`, callback_url: 'http://127.0.0.1:9/x', parameters: { type: 'object', properties } })
  let c
  for (let j = 0; j < 40; j++) c = await tp.callTool('A', { name: `t${k}`, arguments: args })
  console.log(k, r.ok, c.is_error, (c.error ?? '').slice(0, 150))
}
const probe = await tp.register({ name: 'probe', callback_url: 'http://127.0.0.1:9/x', parameters: { type: 'object', properties: { a: { type: 'string', pattern: '^q+$' } } } })
const c = await tp.callTool('A', { name: 'probe', arguments: { a: 'zz' } })
console.log('probe', probe.ok, c.is_error, (c.error ?? '').slice(0, 200))
await tp.close()
