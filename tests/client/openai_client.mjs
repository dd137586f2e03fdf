// The official OpenAI client (the `openai` npm package) against a running `hetmoe serve`: chat and completions,
// streamed and not, the models list, an error, then a bounded load test on loopback. Exits non-zero with a line
// saying what failed. Usage: node openai_client.mjs BASE_URL
import OpenAI from "openai";

const base = process.argv[2];
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: "test-key", maxRetries: 0, timeout: 120000 });

function check(ok, what) {
  if (!ok) {
    console.error(`FAILED: ${what}`);
    process.exit(1);
  }
}

const models = await client.models.list();
check(models.data.length === 1 && models.data[0].id === "tiny", "models.list names the served model");
const model = models.data[0].id;
const messages = [
  { role: "system", content: "You are terse." },
  { role: "user", content: "Name three colours." },
];

// Chat, whole: the message, the finish reason, the usage.
const chat = await client.chat.completions.create({ model, messages, max_tokens: 8, temperature: 0, seed: 1 });
check(chat.object === "chat.completion", "chat: object");
check(typeof chat.choices[0].message.content === "string", "chat: content is text");
check(["stop", "length"].includes(chat.choices[0].finish_reason), "chat: finish reason");
check(chat.usage.prompt_tokens > 0 && chat.usage.completion_tokens > 0, "chat: usage");
check(chat.usage.total_tokens === chat.usage.prompt_tokens + chat.usage.completion_tokens, "chat: usage adds up");

// Chat, streamed: the deltas add up to the whole answer (temperature 0), the last chunk has the usage.
const stream = await client.chat.completions.create({ model, messages, max_tokens: 8, temperature: 0, stream: true });
let streamed = "";
let usage = null;
let finish = null;
for await (const chunk of stream) {
  if (chunk.choices.length && chunk.choices[0].delta.content) streamed += chunk.choices[0].delta.content;
  if (chunk.choices.length && chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
  if (chunk.usage) usage = chunk.usage;
}
check(streamed === chat.choices[0].message.content, "chat: the streamed text equals the whole one");
check(finish === chat.choices[0].finish_reason, "chat: streamed finish reason");
check(usage && usage.completion_tokens === chat.usage.completion_tokens, "chat: streamed usage");

// Logprobs: one entry per generated token.
const lp = await client.chat.completions.create({
  model, messages, max_tokens: 5, temperature: 0, logprobs: true, top_logprobs: 3, ignore_eos: true,
});
check(lp.choices[0].logprobs.content.length === 5, "chat: a logprob per token");
check(lp.choices[0].logprobs.content.every((t) => t.top_logprobs.length === 3 && t.logprob <= 0), "chat: top_logprobs");

// Tools: the request with tools, a call in the history and its result is answered; whatever the random model
// writes, a reply is either text or well-formed calls.
const tools = [{ type: "function", function: { name: "get_weather", description: "The weather in a city",
  parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } } }];
const toolHistory = [
  { role: "user", content: "Weather in Paris?" },
  { role: "assistant", content: null,
    tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: '{"city":"Paris"}' } }] },
  { role: "tool", tool_call_id: "call_1", content: "18C" },
];
for (const tool_choice of ["auto", "required", { type: "function", function: { name: "get_weather" } }]) {
  const t = await client.chat.completions.create({ model, messages: toolHistory, tools, tool_choice, max_tokens: 6 });
  const m = t.choices[0].message;
  check(["stop", "length", "tool_calls"].includes(t.choices[0].finish_reason), "tools: finish reason");
  check(typeof m.content === "string" || (m.content === null && m.tool_calls.length > 0), "tools: content or calls");
  for (const call of m.tool_calls ?? [])
    check(call.type === "function" && typeof call.function.arguments === "string", "tools: a call's shape");
}

// Completions, whole and streamed.
const prompt = "Once upon a time";
const completion = await client.completions.create({ model, prompt, max_tokens: 6, temperature: 0 });
check(completion.object === "text_completion" && typeof completion.choices[0].text === "string", "completions");
const cstream = await client.completions.create({ model, prompt, max_tokens: 6, temperature: 0, stream: true });
let ctext = "";
for await (const chunk of cstream) if (chunk.choices.length) ctext += chunk.choices[0].text;
check(ctext === completion.choices[0].text, "completions: the streamed text equals the whole one");

// A bad parameter is an APIError with status 400 and the parameter named.
try {
  await client.chat.completions.create({ model, messages, temperature: 9 });
  check(false, "a bad temperature was accepted");
} catch (e) {
  check(e instanceof OpenAI.APIError && e.status === 400, `a bad temperature gives 400 (got ${e.status})`);
  check(e.param === "temperature", "the error names the parameter");
}

// Load: 32 clients x 10 requests at once, streamed and not; every fifth streamed request is aborted after its first
// chunk. Every other request must come back complete: its own id, finish reason length (ignore_eos), exactly the
// tokens it asked for (a logprob per streamed token), and the server healthy with no slot busy afterwards.
const clients = 32, perClient = 10;
const seen = new Set();
let complete = 0, aborted = 0;
async function one(c, r) {
  const maxTokens = 1 + ((c * perClient + r) % 6);
  const body = {
    model, max_tokens: maxTokens, temperature: 0.7, seed: c * 1000 + r, ignore_eos: true,
    messages: [{ role: "user", content: `client ${c} request ${r}` }],
  };
  const streamIt = (c + r) % 2 === 0;
  if (!streamIt) {
    const res = await client.chat.completions.create(body);
    check(!seen.has(res.id), `duplicate id ${res.id}`);
    seen.add(res.id);
    check(res.choices[0].finish_reason === "length", `client ${c} request ${r}: finish ${res.choices[0].finish_reason}`);
    check(res.usage.completion_tokens === maxTokens, `client ${c} request ${r}: ${res.usage.completion_tokens} tokens`);
    complete++;
    return;
  }
  const abort = (c * perClient + r) % 5 === 0;
  const controller = new AbortController();
  const s = await client.chat.completions.create(
    { ...body, stream: true, logprobs: true }, { signal: controller.signal });
  let tokens = 0, id = null, fin = null, u = null;
  try {
    for await (const chunk of s) {
      id = chunk.id;
      if (chunk.choices.length && chunk.choices[0].logprobs) tokens += chunk.choices[0].logprobs.content.length;
      if (chunk.choices.length && chunk.choices[0].finish_reason) fin = chunk.choices[0].finish_reason;
      if (chunk.usage) u = chunk.usage;
      if (abort) {
        controller.abort();
        break;
      }
    }
  } catch (e) {
    if (!abort) throw e;
  }
  if (abort) {
    aborted++;
    return;
  }
  check(!seen.has(id), `duplicate id ${id}`);
  seen.add(id);
  check(fin === "length" && u && u.completion_tokens === maxTokens && tokens === maxTokens,
        `client ${c} request ${r}: streamed ${tokens} tokens, usage ${u && u.completion_tokens}, finish ${fin}`);
  complete++;
}
const workers = [];
for (let c = 0; c < clients; c++)
  workers.push((async () => { for (let r = 0; r < perClient; r++) await one(c, r); })());
await Promise.all(workers);
check(complete + aborted === clients * perClient, `every request answered (${complete} + ${aborted})`);

// Afterwards: healthy, nothing running or waiting, every request counted once.
let metrics = "";
for (let i = 0; i < 100; i++) {
  metrics = await (await fetch(`${base}/metrics`, { headers: { Authorization: "Bearer test-key" } })).text();
  if (/hetmoe_slots_busy 0\n/.test(metrics)) break;
  await new Promise((r) => setTimeout(r, 50));
}
const value = (name) => Number(new RegExp(`^hetmoe_${name} (\\S+)$`, "m").exec(metrics)[1]);
check(value("slots_busy") === 0, "no slot busy after the load");
check(value("queue_depth") === 0, "nothing queued after the load");
const handled = value("requests_finished_total") + value("requests_cancelled_total");
check(handled === value("requests_total"), `finished + cancelled = accepted (${handled} vs ${value("requests_total")})`);
check(value("requests_failed_total") === 0, "no request failed");
check((await fetch(`${base}/health`)).status === 200, "healthy after the load");
console.log(`ok: ${complete} complete, ${aborted} aborted mid-stream, ${value("requests_total")} requests`);
