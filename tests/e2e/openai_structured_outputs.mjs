// Structured outputs through the official OpenAI SDK for Node against a
// local cluster: chat.completions.parse() with a zod schema, json_schema
// streamed and with n = 2 sampled, json_object on chat and completions, and
// a schema keyword the workers cannot enforce refused as a 400 naming it.
// Every output is checked with ajv against the JSON Schema that was sent.
//
// Usage: node openai_structured_outputs.mjs NODE_MODULES BASE_URL API_KEY
//   NODE_MODULES  the node_modules folder holding `openai`, `zod` and `ajv`
//   BASE_URL      the router's API, e.g. http://127.0.0.1:8101/v1
//   API_KEY       a key the router accepts
//
// Prints "ok - <check>" per check; on the first failure prints
// "FAIL - <check>: <why>" and exits 1.
import { createRequire } from 'node:module';
import path from 'node:path';

import { assert, CheckError, Checks, errorText as sharedErrorText, show } from './sdk_checks.mjs';

const [modulesDir, baseURL, apiKey] = process.argv.slice(2);
if (!apiKey) {
  console.error('usage: node openai_structured_outputs.mjs NODE_MODULES BASE_URL API_KEY');
  process.exit(2);
}
const require = createRequire(path.resolve(modulesDir, 'package.json'));
const sdk = require('openai');
const OpenAI = sdk.OpenAI ?? sdk.default ?? sdk;
const { APIError, BadRequestError } = OpenAI;
const { zodResponseFormat } = require('openai/helpers/zod');
const { z } = require('zod');
const Ajv = require('ajv').default;

const client = new OpenAI({ apiKey, baseURL, maxRetries: 0, timeout: 60_000 });
const ajv = new Ajv({ allErrors: true, strict: false });

// Parses `text` and validates it against `schema`; returns the value.
function validated(text, schema, what) {
  let value;
  try {
    value = JSON.parse(text);
  } catch (e) {
    throw new CheckError(`${what}: not JSON: ${show(text)}`);
  }
  const validate = ajv.compile(schema);
  assert(validate(value), `${what}: ${show(text)} does not validate: ${show(validate.errors)}`);
  return value;
}

// Bounded so that even a tiny story model finishes its object well inside
// max_tokens: short strings, enums, small arrays.
const Cat = z.object({
  name: z.string().max(12),
  age: z.number().int(),
  mood: z.enum(['happy', 'sleepy', 'hungry']),
  indoor: z.boolean(),
  toys: z.array(z.string().max(8)).max(2),
  owner: z.object({ name: z.string().max(10) }).nullable(),
});
const catFormat = zodResponseFormat(Cat, 'cat');
const catSchema = catFormat.json_schema.schema;
const messages = [{ role: 'user', content: 'Describe a cat as JSON.' }];
let model = '';

const checks = new Checks(APIError);
const check = (name, fn) => checks.add(name, fn);
const errorText = (e) => sharedErrorText(e, APIError);

check('parse(): a zod schema gives a parsed object that validates', async () => {
  model = (await client.models.list()).data[0].id;
  const completion = await client.chat.completions.parse({
    model, messages, response_format: catFormat, max_tokens: 300,
  });
  const choice = completion.choices[0];
  assert(choice.finish_reason === 'stop', `finish_reason ${show(choice.finish_reason)}: ${show(choice.message.content)}`);
  const parsed = choice.message.parsed;
  assert(parsed && typeof parsed === 'object', `parsed is ${show(parsed)}`);
  validated(choice.message.content, catSchema, 'content');
  assert(Cat.safeParse(parsed).success, `zod refuses ${show(parsed)}`);
});

check('json_schema streamed: the deltas assemble to JSON that validates', async () => {
  const stream = await client.chat.completions.create({
    model, messages, response_format: catFormat, max_tokens: 300, stream: true,
    temperature: 1, seed: 11,
  });
  let text = '';
  let finish = null;
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      text += c.delta?.content ?? '';
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert(finish === 'stop', `finish_reason ${show(finish)}: ${show(text)}`);
  validated(text, catSchema, 'streamed');
});

check('json_schema with n = 2 sampled: both choices validate', async () => {
  const completion = await client.chat.completions.create({
    model, messages, response_format: catFormat, max_tokens: 300, n: 2, temperature: 1,
    seed: 3,
  });
  assert(completion.choices.length === 2, `${completion.choices.length} choices`);
  for (const c of completion.choices) {
    assert(c.finish_reason === 'stop', `choice ${c.index}: finish_reason ${show(c.finish_reason)}`);
    validated(c.message.content, catSchema, `choice ${c.index}`);
  }
});

// Any JSON object has strings of any length, which a story model may not
// close within max_tokens: of four sampled choices, those that end must be
// objects, and at least one must end; the others are cut inside one.
check('json_object: chat and completions give JSON objects', async () => {
  const anyObject = { type: 'object' };
  const chat = await client.chat.completions.create({
    model, messages, response_format: { type: 'json_object' }, max_tokens: 200, n: 4,
    temperature: 1, seed: 7,
  });
  const completion = await client.completions.create({
    model, prompt: 'Once upon a time', max_tokens: 200, n: 4, temperature: 1, seed: 7,
    response_format: { type: 'json_object' },
  });
  for (const [what, texts] of [
    ['chat', chat.choices.map((c) => [c.finish_reason, c.message.content])],
    ['completions', completion.choices.map((c) => [c.finish_reason, c.text])],
  ]) {
    let ended = 0;
    for (const [finish, text] of texts) {
      if (finish === 'stop') {
        validated(text, anyObject, what);
        ended++;
      } else {
        assert(finish === 'length' && text.startsWith('{'), `${what}: ${show([finish, text])}`);
      }
    }
    assert(ended > 0, `${what}: no choice of four ended: ${show(texts)}`);
  }
});

check('regex (tandem\'s own response_format): the whole text matches', async () => {
  const regex = '(yes|no), because [a-z ]{1,30}\\.';
  const completion = await client.completions.create({
    model, prompt: 'Is the cat happy?', max_tokens: 60, temperature: 1, seed: 5,
    response_format: { type: 'regex', regex },
  });
  const text = completion.choices[0].text;
  assert(completion.choices[0].finish_reason === 'stop', show(completion.choices[0]));
  assert(new RegExp(`^(?:${regex})$`).test(text), `${show(text)} does not match ${regex}`);
});

check('400: a schema format the workers cannot enforce is named', async () => {
  let error;
  try {
    await client.chat.completions.create({
      model, messages, max_tokens: 10, response_format: { type: 'json_schema', json_schema: {
        name: 'email', schema: { type: 'object', properties: { e: { type: 'string', format: 'hostname' } } },
      } },
    });
  } catch (e) {
    error = e;
  }
  assert(error instanceof BadRequestError, `expected a BadRequestError, got ${error ? errorText(error) : 'a response'}`);
  assert(String(error.message).includes('hostname'), `the error does not name the format: ${error.message}`);
});

await checks.run();
