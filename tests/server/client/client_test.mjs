// The `openai` npm package against `kvgraph serve` (started here on a free
// loopback port with the default model): chat and completions, streamed and
// not, tools, errors, two concurrent clients, a stream cancelled mid-way, and
// a clean shutdown. Usage: node client_test.mjs PATH/TO/kvgraph
import { spawn } from 'node:child_process';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const kvgraph = process.argv[2];
if (!kvgraph) {
  console.error('usage: node client_test.mjs PATH/TO/kvgraph');
  process.exit(2);
}
const KEY = 'client-test-key';

const server = spawn(kvgraph, ['serve', '--port', '0', '--parallel', '2', '--api-key', KEY, '-q'], {
  stdio: ['ignore', 'pipe', 'inherit'],
});
let exited = null;
server.on('exit', (code, signal) => { exited = { code, signal }; });
process.on('exit', () => { if (!exited) server.kill('SIGKILL'); });

const port = await new Promise((resolve, reject) => {
  let out = '';
  server.stdout.on('data', (d) => {
    out += d;
    const m = out.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
    if (m) resolve(Number(m[1]));
  });
  server.on('exit', () => reject(new Error(`kvgraph serve exited before listening: ${out}`)));
});
const base = `http://127.0.0.1:${port}`;
for (let i = 0; ; ++i) {
  const r = await fetch(`${base}/health`).catch(() => null);
  if (r && r.status === 200) break;
  if (i > 500) throw new Error('the server never became healthy');
  await new Promise((r) => setTimeout(r, 20));
}

const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: KEY, maxRetries: 0, timeout: 60_000 });
const metric = async (name) => {
  const text = await (await fetch(`${base}/metrics`, { headers: { Authorization: `Bearer ${KEY}` } })).text();
  const m = text.match(new RegExp(`^${name} (\\S+)$`, 'm'));
  return m ? Number(m[1]) : NaN;
};

let failed = 0;
async function check(name, fn) {
  const t0 = Date.now();
  try {
    await fn();
    console.log(`ok - ${name} (${Date.now() - t0} ms)`);
  } catch (e) {
    failed++;
    console.log(`not ok - ${name}\n  ${(e && e.stack) || e}`);
  }
}

const chatBody = (content, extra = {}) => ({
  model: 'default',
  messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content }],
  max_tokens: 24,
  temperature: 0,
  ...extra,
});

async function streamedChat(body, via = client) {
  const stream = await via.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
  let text = '', finish = null, usage = null, role = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    const c = chunk.choices[0];
    if (!c) continue;
    if (c.delta.role) role = c.delta.role;
    if (c.delta.content) text += c.delta.content;
    if (c.finish_reason) finish = c.finish_reason;
  }
  return { text, finish, usage, role };
}

await check('models.list names the served model', async () => {
  const list = await client.models.list();
  assert.equal(list.data.length, 1);
  assert.equal(list.data[0].id, 'default');
});

let whole;
await check('chat completion (not streamed)', async () => {
  whole = await client.chat.completions.create(chatBody('A wise man once said'));
  assert.equal(whole.object, 'chat.completion');
  assert.equal(whole.choices[0].message.role, 'assistant');
  assert.equal(typeof whole.choices[0].message.content, 'string');
  assert.ok(['stop', 'length'].includes(whole.choices[0].finish_reason));
  assert.ok(whole.usage.prompt_tokens > 0);
  assert.equal(whole.usage.total_tokens, whole.usage.prompt_tokens + whole.usage.completion_tokens);
});

await check('streamed chat equals the whole answer, with usage', async () => {
  const s = await streamedChat(chatBody('A wise man once said'));
  assert.equal(s.role, 'assistant');
  assert.equal(s.text, whole.choices[0].message.content);
  assert.equal(s.finish, whole.choices[0].finish_reason);
  assert.equal(s.usage.completion_tokens, whole.usage.completion_tokens);
  assert.ok(s.usage.prompt_tokens_details.cached_tokens >= 0);
});

await check('text completion, streamed and not', async () => {
  const body = { model: 'default', prompt: 'Once upon a time', max_tokens: 20, temperature: 0 };
  const c = await client.completions.create(body);
  assert.equal(c.object, 'text_completion');
  let text = '';
  for await (const chunk of await client.completions.create({ ...body, stream: true })) text += chunk.choices[0]?.text ?? '';
  assert.equal(text, c.choices[0].text);
  assert.ok(text.length > 0);
});

await check('logprobs through the SDK', async () => {
  const r = await client.chat.completions.create(chatBody('Time flies', { max_tokens: 4, logprobs: true, top_logprobs: 2 }));
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.length, r.usage.completion_tokens);
  for (const e of lp) {
    assert.ok(e.logprob <= 0);
    assert.equal(e.top_logprobs.length, 2);
  }
});

const tools = [{
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
}];
await check('tools are accepted, streamed and not', async () => {
  const r = await client.chat.completions.create(chatBody('Weather in Paris?', { tools }));
  const m = r.choices[0].message;
  // The tiny default model does not call tools: a plain reply, well formed.
  if (m.tool_calls) {
    assert.equal(r.choices[0].finish_reason, 'tool_calls');
    for (const c of m.tool_calls) JSON.parse(c.function.arguments);
  } else {
    assert.equal(typeof m.content, 'string');
  }
  const s = await streamedChat(chatBody('Weather in Paris?', { tools }));
  assert.ok(s.finish);
  // A conversation holding a call and its result.
  const r2 = await client.chat.completions.create(chatBody('', {
    messages: [
      { role: 'user', content: 'Weather in Paris?' },
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: 'sunny, 21 C' },
    ],
    tools,
  }));
  assert.equal(r2.choices[0].message.role, 'assistant');
});

await check('errors are OpenAI errors', async () => {
  await assert.rejects(client.chat.completions.create(chatBody('x', { n: 2 })), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError, String(e));
    assert.equal(e.status, 400);
    assert.equal(e.code, 'unsupported_parameter');
    return true;
  });
  const wrongKey = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'nope', maxRetries: 0 });
  await assert.rejects(wrongKey.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
  await assert.rejects(client.completions.create({ model: 'default', prompt: 'x'.repeat(20000) }),
    (e) => e.status === 400 && e.code === 'context_length_exceeded');
});

await check('two concurrent clients each get their own answer', async () => {
  const a = chatBody('The cat sat', { max_tokens: 32 }), b = chatBody('The dog ran', { max_tokens: 32 });
  const alone = [await client.chat.completions.create(a), await client.chat.completions.create(b)];
  const other = new OpenAI({ baseURL: `${base}/v1`, apiKey: KEY, maxRetries: 0 });
  const [ra, rb] = await Promise.all([client.chat.completions.create(a), streamedChat(b, other)]);
  assert.equal(ra.choices[0].message.content, alone[0].choices[0].message.content);
  assert.equal(rb.text, alone[1].choices[0].message.content);
});

await check('a stream cancelled mid-way frees its slot and stops generating', async () => {
  const before = await metric('kvgraph_generated_tokens_total');
  const cancelledBefore = await metric('kvgraph_completions_cancelled_total');
  const stream = await client.completions.create({
    model: 'default', prompt: 'Once', max_tokens: 1000, stream: true, ignore_eos: true,
  });
  let n = 0;
  for await (const chunk of stream) {
    void chunk;
    if (++n === 3) break;  // leaving the loop aborts the request
  }
  for (let i = 0; ; ++i) {
    if ((await metric('kvgraph_completions_cancelled_total')) === cancelledBefore + 1 &&
        (await metric('kvgraph_slots_busy')) === 0) break;
    if (i > 500) throw new Error('the cancelled stream was not seen as cancelled, or its slot stayed busy');
    await new Promise((r) => setTimeout(r, 10));
  }
  const generated = (await metric('kvgraph_generated_tokens_total')) - before;
  assert.ok(generated >= 3 && generated < 999, `generated ${generated} tokens`);
});

await check('SIGTERM shuts the server down cleanly', async () => {
  server.kill('SIGTERM');
  for (let i = 0; !exited; ++i) {
    if (i > 1000) throw new Error('still running 10 s after SIGTERM');
    await new Promise((r) => setTimeout(r, 10));
  }
  assert.deepEqual(exited, { code: 0, signal: null });
});

console.log(failed ? `${failed} check(s) failed` : 'all checks passed');
process.exit(failed ? 1 : 0);
