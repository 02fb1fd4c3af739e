import neostandard from 'neostandard'

export default [
  ...neostandard({ ts: true, ignores: ['dist/**', 'coverage/**', 'bench/results/**'] }),
  {
    rules: {
      'n/prefer-node-protocol': 'error',
      'n/no-process-exit': 'error'
    }
  },
  {
    files: ['src/main/cli.ts', 'bench/**', 'test/fixtures/**'],
    rules: { 'n/no-process-exit': 'off' }
  }
]
