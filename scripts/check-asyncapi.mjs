// Parses AsyncAPI documents with the AsyncAPI parser; exits non-zero on any error diagnostic.
//   node scripts/check-asyncapi.mjs DOC.json [DOC.json ...]   (NODE_PATH points at the parser)
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';

const require = createRequire(path.join(process.env.NODE_PATH ?? '.', 'noop.js'));
const { Parser } = require('@asyncapi/parser');
const parser = new Parser();
let failed = false;
for (const file of process.argv.slice(2)) {
  const { document, diagnostics } = await parser.parse(readFileSync(file, 'utf8'));
  const errors = diagnostics.filter((d) => d.severity === 0);
  if (!document || errors.length > 0) {
    failed = true;
    console.error(`${file}: not a valid AsyncAPI document`);
    for (const e of errors) console.error(`  ${e.path.join('.')}: ${e.message}`);
  } else {
    const channels = document.channels().length;
    const warnings = diagnostics.filter((d) => d.severity === 1).length;
    console.log(`${file}: AsyncAPI ${document.version()}, ${channels} channels, ${warnings} warnings`);
  }
}
process.exit(failed ? 1 : 0);
