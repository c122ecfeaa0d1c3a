// Tool calls through the official OpenAI SDK for Node against a local
// cluster serving a model whose chat template takes tools (Llama 3.1's):
// tool_choice "required" and a named function give calls whose arguments
// validate (ajv) against the function's parameters, streamed deltas
// assemble to the same call, n = 2 sampled choices both call, a
// conversation with the call and the tool's result goes back through the
// template, and "auto" answers in text or a call.
//
// Usage: node openai_tool_calls.mjs NODE_MODULES BASE_URL API_KEY
// Prints "ok - <check>" per check; on the first failure prints
// "FAIL - <check>: <why>" and exits 1.
import { createRequire } from 'node:module';
import path from 'node:path';

import { assert, CheckError, Checks, errorText as sharedErrorText, show } from './sdk_checks.mjs';

const [modulesDir, baseURL, apiKey] = process.argv.slice(2);
if (!apiKey) {
  console.error('usage: node openai_tool_calls.mjs NODE_MODULES BASE_URL API_KEY');
  process.exit(2);
}
const require = createRequire(path.resolve(modulesDir, 'package.json'));
const sdk = require('openai');
const OpenAI = sdk.OpenAI ?? sdk.default ?? sdk;
const { APIError } = OpenAI;
const Ajv = require('ajv').default;

const client = new OpenAI({ apiKey, baseURL, maxRetries: 0, timeout: 60_000 });
const ajv = new Ajv({ allErrors: true, strict: false });

const weather = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The weather in a city',
    parameters: {
      type: 'object',
      properties: {
        city: { type: 'string', maxLength: 16 },
        unit: { type: 'string', enum: ['celsius', 'fahrenheit'] },
      },
      required: ['city', 'unit'],
      additionalProperties: false,
    },
  },
};
const clock = {
  type: 'function',
  function: {
    name: 'get_time',
    parameters: {
      type: 'object',
      properties: { zone: { type: 'string', format: 'date' } },
      required: ['zone'],
      additionalProperties: false,
    },
  },
};
const tools = [weather, clock];
const messages = [{ role: 'user', content: 'What is the weather in Oslo?' }];
let model = '';

// Checks one call against the tools offered; returns its parsed arguments.
function validCall(call, what) {
  assert(call && call.type === 'function', `${what}: ${show(call)}`);
  assert(typeof call.id === 'string' && call.id.length > 0, `${what}: no id in ${show(call)}`);
  const tool = tools.find((t) => t.function.name === call.function.name);
  assert(tool, `${what}: calls ${show(call.function.name)}, which was not offered`);
  let args;
  try {
    args = JSON.parse(call.function.arguments);
  } catch (e) {
    throw new CheckError(`${what}: arguments are not JSON: ${show(call.function.arguments)}`);
  }
  const validate = ajv.compile(tool.function.parameters);
  assert(validate(args), `${what}: ${show(args)} does not validate: ${show(validate.errors)}`);
  return args;
}

const checks = new Checks(APIError);
const check = (name, fn) => checks.add(name, fn);
const errorText = (e) => sharedErrorText(e, APIError);

let firstCall = null;

check('required: the call names an offered function and its arguments validate', async () => {
  model = (await client.models.list()).data[0].id;
  const r = await client.chat.completions.create({
    model, messages, tools, tool_choice: 'required', max_tokens: 200, temperature: 0,
  });
  const choice = r.choices[0];
  assert(choice.finish_reason === 'tool_calls', `finish_reason ${show(choice.finish_reason)}: ${show(choice.message)}`);
  assert(choice.message.tool_calls?.length === 1, `tool_calls ${show(choice.message)}`);
  validCall(choice.message.tool_calls[0], 'call');
  firstCall = choice.message.tool_calls[0];
});

check('streamed: the tool_calls deltas assemble to the same call', async () => {
  const stream = await client.chat.completions.create({
    model, messages, tools, tool_choice: 'required', max_tokens: 200, stream: true,
    temperature: 0,
  });
  const calls = [];
  let finish = null;
  let content = '';
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      content += c.delta?.content ?? '';
      for (const d of c.delta?.tool_calls ?? []) {
        const call = (calls[d.index] ??= { id: '', type: 'function', function: { name: '', arguments: '' } });
        if (d.id) call.id = d.id;
        if (d.function?.name) call.function.name += d.function.name;
        if (d.function?.arguments) call.function.arguments += d.function.arguments;
      }
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert(finish === 'tool_calls', `finish_reason ${show(finish)}`);
  assert(content === '', `content beside the call: ${show(content)}`);
  assert(calls.length === 1, `calls ${show(calls)}`);
  validCall(calls[0], 'streamed call');
  // The same request whole (the cluster runs without prefix caches, so
  // both compute the prompt the same way).
  const whole = await client.chat.completions.create({
    model, messages, tools, tool_choice: 'required', max_tokens: 200, temperature: 0,
  });
  const call = whole.choices[0].message.tool_calls?.[0];
  assert(call && calls[0].function.name === call.function.name &&
         calls[0].function.arguments === call.function.arguments,
    `streamed ${show(calls[0])} differs from ${show(call)}`);
});

check('a named function is the one called', async () => {
  const r = await client.chat.completions.create({
    model, messages, tools, max_tokens: 200, temperature: 0,
    tool_choice: { type: 'function', function: { name: 'get_time' } },
  });
  const call = r.choices[0].message.tool_calls?.[0];
  assert(call?.function.name === 'get_time', show(r.choices[0]));
  validCall(call, 'named call');
});

check('n = 2 sampled: both choices call', async () => {
  const r = await client.chat.completions.create({
    model, messages, tools, tool_choice: 'required', max_tokens: 200, n: 2, temperature: 1,
    seed: 9,
  });
  assert(r.choices.length === 2, `${r.choices.length} choices`);
  for (const c of r.choices) {
    assert(c.finish_reason === 'tool_calls', `choice ${c.index}: ${show(c)}`);
    validCall(c.message.tool_calls[0], `choice ${c.index}`);
  }
});

check('a conversation with the call and the tool result goes back through the template', async () => {
  const r = await client.chat.completions.create({
    model, tools, max_tokens: 20, temperature: 0,
    messages: [
      ...messages,
      { role: 'assistant', content: null, tool_calls: [firstCall] },
      { role: 'tool', tool_call_id: firstCall.id, content: '{"temperature": 3}' },
    ],
  });
  const m = r.choices[0].message;
  assert(typeof m.content === 'string' || m.tool_calls?.length > 0, show(r.choices[0]));
  for (const call of m.tool_calls ?? []) validCall(call, 'auto call');
});

await checks.run();
