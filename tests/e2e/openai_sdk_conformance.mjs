// tandem's OpenAI-compatible HTTP API as the official OpenAI SDK for Node
// sees it: completions and chat, streamed and not, n, logprobs, echo, stop,
// seed, penalties, logit_bias, stream_options.include_usage, and errors as the
// SDK's typed errors (400, 401, 404, 429).
//
// Usage: node openai_sdk_conformance.mjs NODE_MODULES BASE_URL API_KEY LIMITED_BASE_URL
//   NODE_MODULES      the node_modules folder holding the `openai` package
//   BASE_URL          the router's API, e.g. http://127.0.0.1:8101/v1
//   API_KEY           a key the routers accept
//   LIMITED_BASE_URL  a router started with --max_inflight=1 (for 429)
//
// Prints "ok - <check>" per check; on the first failure prints
// "FAIL - <check>: <why>" and exits 1.
import { createRequire } from 'node:module';
import path from 'node:path';

import { assert, CheckError, Checks, errorText as sharedErrorText, show } from './sdk_checks.mjs';

const [modulesDir, baseURL, apiKey, limitedBaseURL] = process.argv.slice(2);
if (!limitedBaseURL) {
  console.error('usage: node openai_sdk_conformance.mjs NODE_MODULES BASE_URL API_KEY LIMITED_BASE_URL');
  process.exit(2);
}
const sdk = createRequire(path.resolve(modulesDir, 'package.json'))('openai');
const OpenAI = sdk.OpenAI ?? sdk.default ?? sdk;
const { APIError, BadRequestError, AuthenticationError, NotFoundError, RateLimitError } = OpenAI;

// No retries: a 429 or a 5xx must surface as it came.
const clientOptions = { apiKey, maxRetries: 0, timeout: 30_000 };
const client = new OpenAI({ ...clientOptions, baseURL });
const limited = new OpenAI({ ...clientOptions, baseURL: limitedBaseURL });

function assertEq(actual, expected, what) {
  assert(actual === expected, `${what}: got ${show(actual)}, expected ${show(expected)}`);
}

function assertUsage(usage, what) {
  assert(usage && typeof usage === 'object', `${what}: no usage in ${show(usage)}`);
  for (const k of ['prompt_tokens', 'completion_tokens', 'total_tokens']) {
    assert(Number.isInteger(usage[k]) && usage[k] >= 0, `${what}: usage.${k} is ${show(usage[k])}`);
  }
  assert(usage.prompt_tokens > 0, `${what}: usage.prompt_tokens is 0`);
  assertEq(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens, `${what}: total_tokens`);
}

// The counts that do not depend on what a prefix cache held (a repeated
// prompt finds its blocks cached the second time).
function usageCounts(usage) {
  const cached = usage.prompt_tokens_details?.cached_tokens;
  assert(Number.isInteger(cached) && cached >= 0 && cached < usage.prompt_tokens,
    `usage.prompt_tokens_details.cached_tokens is ${show(cached)}`);
  return show({ prompt: usage.prompt_tokens, completion: usage.completion_tokens,
                total: usage.total_tokens });
}

// Runs `fn` expecting the SDK to throw `type`; returns the error.
async function expectError(type, fn, what) {
  let result;
  try {
    result = await fn();
  } catch (e) {
    assert(e instanceof type, `${what}: expected ${type.name}, got ${errorText(e)}`);
    return e;
  }
  throw new CheckError(`${what}: expected ${type.name}, got a response ${show(result)}`);
}

async function collect(stream) {
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  return chunks;
}

let model = '';
const prompt = 'Once upon a time';
const chatMessages = [{ role: 'user', content: 'Tell me a story about a cat.' }];

const checks = new Checks(APIError);
const check = (name, fn) => checks.add(name, fn);
const errorText = (e) => sharedErrorText(e, APIError);

check('models: list names one served model, retrieve finds it', async () => {
  const list = await client.models.list();
  const ids = list.data.map((m) => m.id);
  assertEq(ids.length, 1, 'served models');
  model = ids[0];
  const m = await client.models.retrieve(model);
  assertEq(m.id, model, 'retrieved id');
  assertEq(m.object, 'model', 'object');
});

let greedy = null;
check('completions: non-streamed greedy text, finish_reason, usage', async () => {
  const r = await client.completions.create({ model, prompt, max_tokens: 24, temperature: 0 });
  assertEq(r.object, 'text_completion', 'object');
  assertEq(r.model, model, 'model');
  assertEq(r.choices.length, 1, 'choices');
  const c = r.choices[0];
  assertEq(c.index, 0, 'index');
  assert(typeof c.text === 'string' && c.text.length > 0, `empty text: ${show(r)}`);
  assert(['length', 'stop'].includes(c.finish_reason), `finish_reason ${show(c.finish_reason)}`);
  assertUsage(r.usage, 'usage');
  assert(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 24,
    `completion_tokens ${r.usage.completion_tokens} outside [1, 24]`);
  if (c.finish_reason === 'length') assertEq(r.usage.completion_tokens, 24, 'completion_tokens at length');
  greedy = { text: c.text, finish: c.finish_reason, usage: r.usage };
});

check('completions: streamed greedy text equals the non-streamed one', async () => {
  const chunks = await collect(await client.completions.create(
    { model, prompt, max_tokens: 24, temperature: 0, stream: true }));
  assert(chunks.length >= 2, `only ${chunks.length} chunks`);
  assertEq(new Set(chunks.map((ch) => ch.id)).size, 1, 'ids of one stream\'s chunks');
  let text = '';
  const finishes = [];
  for (const ch of chunks) {
    assertEq(ch.object, 'text_completion', 'chunk object');
    for (const c of ch.choices) {
      assertEq(c.index, 0, 'chunk index');
      text += c.text;
      if (c.finish_reason) finishes.push(c.finish_reason);
    }
  }
  assertEq(text, greedy.text, 'streamed text');
  assertEq(finishes.length, 1, 'chunks with a finish_reason');
  assertEq(finishes[0], greedy.finish, 'streamed finish_reason');
  assertEq(chunks.at(-1).choices[0]?.finish_reason, greedy.finish, 'the last chunk\'s finish_reason');
});

check('completions: stream_options.include_usage ends with choices [] and usage', async () => {
  const chunks = await collect(await client.completions.create({
    model, prompt, max_tokens: 24, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  }));
  const last = chunks.at(-1);
  assertEq(last.choices.length, 0, 'the last chunk\'s choices');
  assertUsage(last.usage, 'the last chunk\'s usage');
  assertEq(usageCounts(last.usage), usageCounts(greedy.usage), 'streamed usage');
  for (const ch of chunks.slice(0, -1)) assert(ch.usage == null, `usage before the end: ${show(ch)}`);
  assertEq(chunks.slice(0, -1).map((ch) => ch.choices[0].text).join(''), greedy.text, 'text');
});

let chatGreedy = null;
check('chat: non-streamed message, finish_reason, usage', async () => {
  const r = await client.chat.completions.create(
    { model, messages: chatMessages, max_tokens: 24, temperature: 0 });
  assertEq(r.object, 'chat.completion', 'object');
  assertEq(r.model, model, 'model');
  assertEq(r.choices.length, 1, 'choices');
  const c = r.choices[0];
  assertEq(c.index, 0, 'index');
  assertEq(c.message.role, 'assistant', 'role');
  assert(typeof c.message.content === 'string' && c.message.content.length > 0, `empty content: ${show(r)}`);
  assert(['length', 'stop'].includes(c.finish_reason), `finish_reason ${show(c.finish_reason)}`);
  assertUsage(r.usage, 'usage');
  chatGreedy = { content: c.message.content, finish: c.finish_reason, usage: r.usage };
});

check('chat: streamed role delta first, content deltas, finish_reason, usage', async () => {
  const chunks = await collect(await client.chat.completions.create({
    model, messages: chatMessages, max_tokens: 24, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  }));
  assertEq(chunks[0].object, 'chat.completion.chunk', 'object');
  assertEq(chunks[0].choices[0]?.delta?.role, 'assistant', 'the first delta\'s role');
  let content = '';
  let contentChunks = 0;
  const finishes = [];
  for (const ch of chunks.slice(0, -1)) {
    assertEq(ch.choices.length, 1, `choices of ${show(ch)}`);
    const c = ch.choices[0];
    assertEq(c.index, 0, 'chunk index');
    if (c.delta.content) {
      content += c.delta.content;
      contentChunks++;
    }
    if (c.finish_reason) finishes.push(c.finish_reason);
  }
  assert(contentChunks >= 2, `${contentChunks} content deltas`);
  assertEq(content, chatGreedy.content, 'streamed content');
  assertEq(show(finishes), show([chatGreedy.finish]), 'finish_reasons');
  const last = chunks.at(-1);
  assertEq(last.choices.length, 0, 'the usage chunk\'s choices');
  assertEq(usageCounts(last.usage), usageCounts(chatGreedy.usage), 'streamed usage');
});

let sampledPair = null;
check('n=2: two choices with index 0 and 1, usage counts both', async () => {
  const r = await client.completions.create(
    { model, prompt, max_tokens: 12, temperature: 1, seed: 11, n: 2 });
  assertEq(show(r.choices.map((c) => c.index)), '[0,1]', 'indices');
  for (const c of r.choices) {
    assert(c.text.length > 0 && c.finish_reason, `choice ${show(c)}`);
  }
  sampledPair = r.choices.map((c) => c.text);
  assert(sampledPair[0] !== sampledPair[1], `both choices sampled the same text ${show(sampledPair)}`);
  assertUsage(r.usage, 'usage');
  assert(r.usage.completion_tokens >= 2, `completion_tokens ${r.usage.completion_tokens} for two choices`);
  const chat = await client.chat.completions.create(
    { model, messages: chatMessages, max_tokens: 12, temperature: 1, seed: 11, n: 2 });
  assertEq(show(chat.choices.map((c) => c.index)), '[0,1]', 'chat indices');
  for (const c of chat.choices) assertEq(c.message.role, 'assistant', 'chat role');
});

check('chat: max_completion_tokens bounds the completion', async () => {
  const r = await client.chat.completions.create(
    { model, messages: chatMessages, max_completion_tokens: 3, temperature: 0, ignore_eos: true });
  assertEq(r.usage.completion_tokens, 3, 'completion_tokens');
  assertEq(r.choices[0].finish_reason, 'length', 'finish_reason');
});

check('n=2 streamed: chunks carry their index, each choice finishes once', async () => {
  const texts = ['', ''];
  const finishes = [0, 0];
  for await (const ch of await client.completions.create(
    { model, prompt, max_tokens: 12, temperature: 1, seed: 11, n: 2, stream: true })) {
    for (const c of ch.choices) {
      assert(c.index === 0 || c.index === 1, `chunk index ${c.index}`);
      texts[c.index] += c.text;
      if (c.finish_reason) finishes[c.index]++;
    }
  }
  assertEq(show(finishes), '[1,1]', 'finish_reasons per choice');
  assertEq(show(texts), show(sampledPair), 'streamed texts of the same seed');
  const roles = [0, 0];
  const contents = ['', ''];
  for await (const ch of await client.chat.completions.create(
    { model, messages: chatMessages, max_tokens: 12, temperature: 1, seed: 11, n: 2, stream: true })) {
    for (const c of ch.choices) {
      assert(c.index === 0 || c.index === 1, `chat chunk index ${c.index}`);
      if (c.delta.role) {
        assertEq(contents[c.index], '', `choice ${c.index}'s role delta comes first`);
        roles[c.index]++;
      }
      contents[c.index] += c.delta.content ?? '';
    }
  }
  assertEq(show(roles), '[1,1]', 'role deltas per chat choice');
});

check('completions logprobs: 2 -> tokens, token_logprobs, top_logprobs aligned with the text', async () => {
  const r = await client.completions.create(
    { model, prompt, max_tokens: 24, temperature: 0, logprobs: 2 });
  const c = r.choices[0];
  assertEq(c.text, greedy.text, 'text with logprobs');
  const lp = c.logprobs;
  assert(lp && Array.isArray(lp.tokens), `logprobs ${show(lp)}`);
  const n = lp.tokens.length;
  assertEq(n, r.usage.completion_tokens, 'tokens per completion token');
  assertEq(lp.token_logprobs.length, n, 'token_logprobs length');
  assertEq(lp.top_logprobs.length, n, 'top_logprobs length');
  assertEq(lp.text_offset.length, n, 'text_offset length');
  assertEq(lp.tokens.join(''), c.text, 'tokens joined');
  let offset = 0;
  for (let i = 0; i < n; i++) {
    const tok = lp.tokens[i];
    const l = lp.token_logprobs[i];
    assert(typeof l === 'number' && l <= 0, `token_logprobs[${i}] = ${show(l)}`);
    assertEq(lp.text_offset[i], offset, `text_offset[${i}]`);
    offset += Buffer.byteLength(tok);
    const top = lp.top_logprobs[i];
    const keys = Object.keys(top);
    assert(keys.length >= 1 && keys.length <= 2, `top_logprobs[${i}] = ${show(top)}`);
    // Greedy: the chosen token is the most likely one.
    const best = Math.max(...Object.values(top));
    assert(Math.abs(best - l) < 1e-4, `token ${i} ${show(tok)} (${l}) is not the top one ${show(top)}`);
    assert(tok in top, `token ${i} ${show(tok)} missing from its top_logprobs ${show(top)}`);
  }
});

check('chat logprobs: true, top_logprobs 2 -> content entries with token, logprob, bytes', async () => {
  const r = await client.chat.completions.create(
    { model, messages: chatMessages, max_tokens: 24, temperature: 0, logprobs: true, top_logprobs: 2 });
  const c = r.choices[0];
  assertEq(c.message.content, chatGreedy.content, 'content with logprobs');
  const entries = c.logprobs?.content;
  assert(Array.isArray(entries), `logprobs ${show(c.logprobs)}`);
  assertEq(entries.length, r.usage.completion_tokens, 'entries per completion token');
  assertEq(entries.map((e) => e.token).join(''), c.message.content, 'tokens joined');
  entries.forEach((e, i) => {
    assert(typeof e.token === 'string', `entry ${i} token ${show(e)}`);
    assert(typeof e.logprob === 'number' && e.logprob <= 0, `entry ${i} logprob ${show(e)}`);
    assertEq(show(e.bytes), show([...Buffer.from(e.token)]), `entry ${i} bytes`);
    assertEq(e.top_logprobs.length, 2, `entry ${i} top_logprobs length`);
    const [a, b] = e.top_logprobs;
    assert(a.logprob >= b.logprob && b.logprob <= 0, `entry ${i} top_logprobs order ${show(e.top_logprobs)}`);
    assert(Math.abs(a.logprob - e.logprob) < 1e-4 && a.token === e.token,
      `entry ${i}: greedy token ${show(e.token)} is not the top one ${show(e.top_logprobs)}`);
  });
});

check('echo: the text starts with the prompt, then the greedy completion', async () => {
  const r = await client.completions.create(
    { model, prompt, max_tokens: 24, temperature: 0, echo: true });
  const text = r.choices[0].text;
  assert(text.startsWith(prompt), `echoed text ${show(text)} does not start with ${show(prompt)}`);
  assertEq(text.slice(prompt.length), greedy.text, 'text after the prompt');
  const s = await client.completions.create(
    { model, prompt, max_tokens: 24, temperature: 0, echo: true, stream: true });
  assertEq((await collect(s)).map((ch) => ch.choices[0]?.text ?? '').join(''), text, 'streamed echo');
});

check('echo with logprobs: prompt tokens first, the first without a logprob', async () => {
  const r = await client.completions.create(
    { model, prompt, max_tokens: 4, temperature: 0, echo: true, logprobs: 1 });
  const c = r.choices[0];
  const lp = c.logprobs;
  assertEq(lp.tokens.join(''), c.text, 'tokens joined');
  assertEq(lp.tokens.length, r.usage.prompt_tokens + r.usage.completion_tokens, 'tokens (prompt + completion)');
  assertEq(lp.token_logprobs[0], null, 'the first prompt token\'s logprob');
  for (let i = 1; i < lp.tokens.length; i++) {
    const l = lp.token_logprobs[i];
    assert(typeof l === 'number' && l <= 0, `token_logprobs[${i}] = ${show(l)}`);
  }
});

check('stop: the text ends before the stop string, finish_reason "stop"', async () => {
  const long = await client.completions.create({ model, prompt, max_tokens: 48, temperature: 0 });
  const full = long.choices[0].text;
  // A stop string found some way into the greedy text.
  const at = full.indexOf(' ', 8);
  assert(at > 0 && at + 4 <= full.length, `no word to stop at in ${show(full)}`);
  const stop = full.slice(at, at + 4);
  const expected = full.slice(0, full.indexOf(stop));
  const r = await client.completions.create({ model, prompt, max_tokens: 48, temperature: 0, stop: [stop] });
  assertEq(r.choices[0].text, expected, `text with stop ${show(stop)}`);
  assertEq(r.choices[0].finish_reason, 'stop', 'finish_reason');
  let streamed = '';
  let finish = null;
  for await (const ch of await client.completions.create(
    { model, prompt, max_tokens: 48, temperature: 0, stop, stream: true })) {
    for (const c of ch.choices) {
      streamed += c.text;
      finish = c.finish_reason ?? finish;
    }
  }
  assertEq(streamed, expected, 'streamed text with stop');
  assertEq(finish, 'stop', 'streamed finish_reason');
});

check('seed: same seed at temperature 1 gives the same text; different seeds differ', async () => {
  const sample = async (seed) => (await client.completions.create(
    { model, prompt, max_tokens: 24, temperature: 1, ...(seed === undefined ? {} : { seed }) })).choices[0].text;
  const a = await sample(1234);
  const b = await sample(1234);
  assertEq(b, a, 'text of a repeated seed');
  const seeded = new Set([a]);
  for (const seed of [1, 2, 3, 4]) seeded.add(await sample(seed));
  assert(seeded.size > 1, `five seeds gave one text ${show(a)}`);
  const unseeded = new Set();
  for (let i = 0; i < 4; i++) unseeded.add(await sample(undefined));
  assert(unseeded.size > 1, `four unseeded requests gave one text ${show([...unseeded][0])}`);
});

check('presence_penalty and frequency_penalty: 200, and they change greedy text', async () => {
  const base = await client.completions.create({ model, prompt, max_tokens: 64, temperature: 0 });
  const { data, response } = await client.completions.create(
    { model, prompt, max_tokens: 64, temperature: 0, presence_penalty: 1.5, frequency_penalty: 1.5 })
    .withResponse();
  assertEq(response.status, 200, 'status');
  assert(data.choices[0].text !== base.choices[0].text,
    `penalties left the greedy text unchanged: ${show(base.choices[0].text)}`);
  const chat = await client.chat.completions.create(
    { model, messages: chatMessages, max_tokens: 8, presence_penalty: 0.5, frequency_penalty: 0.5 })
    .withResponse();
  assertEq(chat.response.status, 200, 'chat status');
});

check('logit_bias and repetition_penalty act', async () => {
  // +100 on one token id: greedy decoding picks it every time.
  const r = await client.completions.create(
    { model, prompt, max_tokens: 6, temperature: 0, logprobs: 0, logit_bias: { 300: 100 } });
  const tokens = r.choices[0].logprobs.tokens;
  assertEq(tokens.length, 6, 'tokens');
  assert(tokens.every((t) => t === tokens[0]), `logit_bias {300: 100} gave tokens ${show(tokens)}`);
  const base = await client.completions.create({ model, prompt, max_tokens: 64, temperature: 0 });
  const rep = await client.completions.create(
    { model, prompt, max_tokens: 64, temperature: 0, repetition_penalty: 2.0 });
  assert(rep.choices[0].text !== base.choices[0].text,
    `repetition_penalty 2 left the greedy text unchanged: ${show(base.choices[0].text)}`);
});

check('400: max_tokens -1 is a BadRequestError naming max_tokens', async () => {
  const e = await expectError(BadRequestError,
    () => client.completions.create({ model, prompt, max_tokens: -1 }), 'max_tokens -1');
  assertEq(e.status, 400, 'status');
  assert(/max_tokens/.test(e.message), `message ${show(e.message)} does not name max_tokens`);
  const c = await expectError(BadRequestError,
    () => client.chat.completions.create({ model, messages: chatMessages, max_tokens: -1 }), 'chat max_tokens -1');
  assertEq(c.status, 400, 'chat status');
});

check('400: an unknown parameter is a BadRequestError naming it', async () => {
  const e = await expectError(BadRequestError,
    () => client.completions.create({ model, prompt, max_tokens: 4, frobnicate: 3 }), 'unknown parameter');
  assert(/frobnicate/.test(e.message), `message ${show(e.message)} does not name frobnicate`);
  const s = await expectError(BadRequestError,
    () => client.chat.completions.create({ model, messages: chatMessages, stream: true, frobnicate: 3 }),
    'unknown parameter, streamed chat');
  assert(/frobnicate/.test(s.message), `message ${show(s.message)} does not name frobnicate`);
});

check('request ids: x-request-id names the completion, or echoes the client\'s own', async () => {
  const { data, response } = await client.chat.completions
    .create({ model, messages: chatMessages, max_tokens: 4, temperature: 0 }).withResponse();
  assertEq(response.headers.get('x-request-id'), data.id, 'x-request-id');
  if ('_request_id' in data) assertEq(data._request_id, data.id, 'the SDK\'s _request_id');
  const own = await client.completions
    .create({ model, prompt, max_tokens: 4 }, { headers: { 'X-Request-Id': 'client-trace-7' } })
    .withResponse();
  assertEq(own.response.headers.get('x-request-id'), 'client-trace-7', 'echoed x-request-id');
});

check('fields clients send: developer role, name, store false, metadata, parallel_tool_calls', async () => {
  const plain = await client.chat.completions.create({
    model, max_tokens: 8, temperature: 0,
    messages: [{ role: 'system', content: 'Be brief.' }, ...chatMessages] });
  const sent = await client.chat.completions.create({
    model, max_tokens: 8, temperature: 0, store: false, parallel_tool_calls: false,
    metadata: { team: 'search' },
    messages: [{ role: 'developer', content: 'Be brief.' }, ...chatMessages] });
  // developer is the system role: the same greedy text.
  assertEq(sent.choices[0].message.content, plain.choices[0].message.content, 'developer text');
  const named = await client.chat.completions.create({
    model, max_tokens: 4, messages: [{ ...chatMessages[0], name: 'ada' }] });
  assertEq(named.choices.length, 1, 'choices with a named message');
  const hot = await expectError(BadRequestError,
    () => client.chat.completions.create({ model, messages: chatMessages, temperature: 2.5 }),
    'temperature 2.5');
  assert(/temperature/.test(hot.message), `message ${show(hot.message)} does not name temperature`);
  const store = await expectError(BadRequestError,
    () => client.chat.completions.create({ model, messages: chatMessages, store: true }), 'store true');
  assert(/store/.test(store.message), `message ${show(store.message)} does not name store`);
});

check('401: a wrong API key is an AuthenticationError', async () => {
  const wrong = new OpenAI({ ...clientOptions, baseURL, apiKey: `${apiKey}-wrong` });
  const e = await expectError(AuthenticationError,
    () => wrong.completions.create({ model, prompt, max_tokens: 4 }), 'wrong key');
  assertEq(e.status, 401, 'status');
  await expectError(AuthenticationError,
    () => wrong.chat.completions.create({ model, messages: chatMessages, stream: true }), 'wrong key, streamed chat');
  await expectError(AuthenticationError, () => wrong.models.list(), 'wrong key, models');
});

check('404: an unknown model is a NotFoundError', async () => {
  const e = await expectError(NotFoundError,
    () => client.completions.create({ model: 'nope', prompt, max_tokens: 4 }), 'model nope');
  assertEq(e.status, 404, 'status');
  await expectError(NotFoundError,
    () => client.chat.completions.create({ model: 'nope', messages: chatMessages, stream: true }),
    'model nope, streamed chat');
  await expectError(NotFoundError, () => client.models.retrieve('nope'), 'GET /v1/models/nope');
});

check('429: a second request while --max_inflight=1 is taken is a RateLimitError', async () => {
  const deadline = Date.now() + 30_000;
  let tries = 0;
  while (tries < 20 && Date.now() < deadline) {
    // One long stream holds the only slot; it is admitted once its headers came.
    const abort = new AbortController();
    let stream;
    try {
      stream = await limited.completions.create(
        { model, prompt, max_tokens: 500, temperature: 0, ignore_eos: true, stream: true },
        { signal: abort.signal });
    } catch (e) {
      // The slot of an earlier attempt's stream may not be free yet.
      if (e instanceof RateLimitError) {
        await new Promise((resolve) => setTimeout(resolve, 50));
        continue;
      }
      throw e;
    }
    const reader = stream[Symbol.asyncIterator]();
    const first = await reader.next();
    assert(!first.done, 'the long stream ended before its first chunk');
    let outcome;
    try {
      await limited.completions.create({ model, prompt, max_tokens: 4 });
      outcome = 'served';
    } catch (e) {
      if (!(e instanceof RateLimitError)) throw e;
      assertEq(e.status, 429, 'status');
      outcome = 'refused';
    }
    abort.abort();
    if (outcome === 'refused') return;
    // Served: the long stream may have ended first (it takes ~100 ms); try again.
    tries++;
  }
  throw new CheckError(`the second request was served ${tries} times out of ${tries}, each time right after the first chunk of a 500-token stream on the same router: is --max_inflight=1 enforced?`);
});

await checks.run();
