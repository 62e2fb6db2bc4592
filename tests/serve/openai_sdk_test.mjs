// `veloxquant serve` through the official OpenAI Node SDK (issue 32): a chat of four turns whose
// history holds the SDK's own reply objects (non-streamed, streamed by hand, and the SDK's
// stream helper's finalMessage(), which adds `parsed`), each turn continuing the server's
// session (usage.prompt_tokens_details.cached_tokens > 0); logprobs, top_logprobs, penalties,
// logit_bias, n=2, seed 0, response_format text; the legacy completions endpoint with logprobs;
// an unsupported feature as the SDK's BadRequestError.
// Usage: node openai_sdk_test.mjs SDK_DIR BASE_URL API_KEY (run by serve_sdk_test.py).
import { createRequire } from 'node:module';
import path from 'node:path';

const [sdkDir, baseURL, apiKey] = process.argv.slice(2);
const require = createRequire(path.join(sdkDir, 'package.json'));
const sdk = require('openai');
const OpenAI = sdk.OpenAI ?? sdk.default;
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60000 });
const model = 'stories260K.bin';

let failures = 0;
function check(cond, what) {
  console.log((cond ? 'ok   ' : 'FAIL ') + what);
  if (!cond) failures += 1;
}
const joined = (entries) => entries.map((e) => e.token).join('');
const wellFormed = (entries, top) =>
  entries.every((e) => typeof e.token === 'string' && e.logprob <= 0 && Array.isArray(e.bytes) &&
    Buffer.from(e.bytes).toString('utf8') === e.token && e.top_logprobs.length === top &&
    (top === 0 || e.top_logprobs[0].logprob >= e.top_logprobs[top - 1].logprob));

const history = [
  { role: 'developer', content: 'You tell short stories.' },
  { role: 'user', content: [{ type: 'text', text: 'Once upon a time' }] },
];

// Turn 1: not streamed, two choices, everything a client may send.
const r1 = await client.chat.completions.create({
  model, messages: history, max_tokens: 12, temperature: 0.8, seed: 0, n: 2, logprobs: true,
  top_logprobs: 2, presence_penalty: 0.5, frequency_penalty: 0.25, logit_bias: { 1: -100 },
  response_format: { type: 'text' }, stop: null, user: 'sdk-test',
});
check(r1.object === 'chat.completion' && r1.choices.length === 2 &&
      r1.choices[0].index === 0 && r1.choices[1].index === 1, 'turn 1: n=2 gives choices 0 and 1');
for (const c of r1.choices) {
  check(['stop', 'length'].includes(c.finish_reason) && c.message.role === 'assistant' &&
        c.message.content.length > 0, `turn 1 choice ${c.index}: ${JSON.stringify(c.message.content)} (${c.finish_reason})`);
  check(joined(c.logprobs.content) === c.message.content && wellFormed(c.logprobs.content, 2),
        `turn 1 choice ${c.index}: logprobs.content spells the reply, 2 alternatives each`);
}
check(r1.usage.completion_tokens === r1.choices.reduce((n, c) => n + c.logprobs.content.length, 0),
      'turn 1: usage counts both choices\' tokens');
// The same request again: seed 0 is deterministic.
const again = await client.chat.completions.create({
  model, messages: history, max_tokens: 12, temperature: 0.8, seed: 0, n: 2, logprobs: true,
  top_logprobs: 2, presence_penalty: 0.5, frequency_penalty: 0.25, logit_bias: { 1: -100 },
  response_format: { type: 'text' },
});
check(again.choices.map((c) => c.message.content).join('|') ===
      r1.choices.map((c) => c.message.content).join('|'), 'seed 0: the same request, the same choices');

history.push(r1.choices[0].message);  // the SDK's object as it came (refusal: null, ...)
history.push({ role: 'user', content: 'And then?' });

// Turn 2: streamed by hand, logprobs in the chunks, include_usage.
const s2 = await client.chat.completions.create({
  model, messages: history, max_tokens: 10, temperature: 0.7, seed: 0, stream: true,
  stream_options: { include_usage: true }, logprobs: true, top_logprobs: 1,
});
let text2 = '';
const lp2 = [];
let finish2 = null;
let usage2 = null;
for await (const chunk of s2) {
  if (chunk.usage) usage2 = chunk.usage;
  for (const c of chunk.choices) {
    text2 += c.delta?.content ?? '';
    if (c.logprobs?.content) lp2.push(...c.logprobs.content);
    if (c.finish_reason) finish2 = c.finish_reason;
  }
}
check(text2.length > 0 && ['stop', 'length'].includes(finish2), `turn 2 (stream): ${JSON.stringify(text2)} (${finish2})`);
check(joined(lp2) === text2 && wellFormed(lp2, 1), 'turn 2: the chunks\' logprobs spell the reply');
check(usage2 !== null && usage2.prompt_tokens_details.cached_tokens > 0,
      `turn 2: continues turn 1's session (${usage2?.prompt_tokens_details?.cached_tokens} cached tokens)`);
history.push({ role: 'assistant', content: text2 });
history.push({ role: 'user', content: 'The end.' });

// Turn 3: the SDK's stream helper; its finalMessage() goes into the history as it is.
const s3 = client.chat.completions.stream({
  model, messages: history, max_tokens: 8, temperature: 0, seed: 0,
});
const m3 = await s3.finalMessage();
check(m3.role === 'assistant' && typeof m3.content === 'string' && m3.content.length > 0,
      `turn 3 (stream helper): ${JSON.stringify(m3.content)}; its message has keys ${Object.keys(m3).sort().join(',')}`);
history.push(m3);
history.push({ role: 'user', content: [{ type: 'text', text: 'Again' }, { type: 'text', text: '.' }] });

// Turn 4: not streamed, after the helper's message.
const r4 = await client.chat.completions.create({ model, messages: history, max_tokens: 6, temperature: 0 });
check(r4.choices.length === 1 && r4.choices[0].logprobs === null && r4.choices[0].message.content.length > 0,
      `turn 4: ${JSON.stringify(r4.choices[0].message.content)}`);
check(r4.usage.prompt_tokens_details.cached_tokens > 0,
      `turn 4: the helper's reply object continues the session (${r4.usage.prompt_tokens_details.cached_tokens} cached tokens)`);

// The legacy completions endpoint with logprobs.
const c = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 6, logprobs: 3, temperature: 0 });
const lp = c.choices[0].logprobs;
check(lp.tokens.join('') === c.choices[0].text && lp.token_logprobs.length === lp.tokens.length &&
      lp.top_logprobs.every((t) => Object.keys(t).length <= 3) && lp.text_offset[0] === 0,
      'completions: tokens, token_logprobs, top_logprobs, text_offset');

// Unsupported features: OpenAI's error, as the SDK raises it.
try {
  await client.chat.completions.create({ model, messages: history, response_format: { type: 'json_object' } });
  check(false, 'response_format json_object is refused');
} catch (e) {
  check(e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === 'response_format' &&
        e.code === 'unsupported_value', `response_format json_object: BadRequestError (${e.message})`);
}
try {
  await client.chat.completions.create({
    model, messages: history,
    tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: {} } } }],
  });
  check(false, 'tools are refused');
} catch (e) {
  check(e instanceof OpenAI.BadRequestError && e.param === 'tools' && e.code === 'unsupported_parameter',
        `tools: BadRequestError (${e.message})`);
}

console.log(failures ? `${failures} failed` : 'all passed');
process.exit(failures ? 1 : 0);
