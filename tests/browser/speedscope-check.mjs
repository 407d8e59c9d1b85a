// Validates a speedscope JSON file against the file-format schema shipped in speedscope's own npm
// package (the one speedscope.app documents), with ajv.
// usage: node speedscope-check.mjs FILE.speedscope.json   (prints `valid` or the errors; exit 1)
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import Ajv from 'ajv';

const require = createRequire(import.meta.url);
const schemaPath = require.resolve('speedscope/dist/release/file-format-schema.json');
const schema = JSON.parse(readFileSync(schemaPath, 'utf8'));
const file = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const ajv = new Ajv({ allErrors: true, strict: false });
const validate = ajv.compile(schema);
if (validate(file)) {
  console.log('valid');
} else {
  console.log(JSON.stringify(validate.errors.slice(0, 10)));
  process.exitCode = 1;
}
