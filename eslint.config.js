import neostandard from 'neostandard'
import globals from 'globals'

export default [
  ...neostandard({ ts: true, ignores: ['dist/**', 'coverage/**', 'bench/results/**', 'assembly/**'] }),
  {
    rules: {
      'n/prefer-node-protocol': 'error',
      'n/no-process-exit': 'error'
    }
  },
  {
    rules: {
      // Test titles are sentences the runner prints on one line, and a message or JSON built in a
      // string or template literal reads worse cut in pieces: wrapping either helps no reader.
      '@stylistic/max-len': ['error', {
        code: 120,
        ignoreUrls: true,
        ignoreTemplateLiterals: true,
        ignoreRegExpLiterals: true,
        ignoreStrings: true,
        ignorePattern: String.raw`^\s*(await t\.)?(test|it|describe)\(['\x60]`
      }]
    }
  },
  {
    files: ['src/workers/**', 'src/shared/**', 'src/plugin/**'],
    rules: {
      // docs/architecture.md "Import rules": a worker thread or a plugin process must not load the server.
      '@typescript-eslint/no-restricted-imports': ['error', {
        patterns: [{
          regex: String.raw`(^|/)main(/|$)`,
          message: 'src/workers, src/shared and src/plugin never import from src/main'
        }]
      }]
    }
  },
  {
    files: ['**/*.ts'],
    rules: {
      // An `as const` object and a union type share one name instead of an enum; the
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
