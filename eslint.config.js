import neostandard from 'neostandard'
import globals from 'globals'

export default [
  ...neostandard({ ts: true, ignores: ['dist/**', 'coverage/**', 'bench/results/**'] }),
  {
    rules: {
      'n/prefer-node-protocol': 'error',
      'n/no-process-exit': 'error'
    }
  },
  {
    files: ['**/*.ts'],
    rules: {
      // STYLE: an `as const` object and a union type share one name instead of an enum; the
      // type checker already reports real redeclarations.
      '@typescript-eslint/no-redeclare': 'off'
    }
  },
  {
    // The web console: plain ES modules that run in the browser.
    files: ['console/**/*.js'],
    languageOptions: { globals: globals.browser }
  },
  {
    files: ['src/main/cli.ts', 'bench/**', 'test/fixtures/**'],
    rules: { 'n/no-process-exit': 'off' }
  }
]
