// The official openai JavaScript SDK against sil-openai: /v1/models, a non-streamed and a
// streamed chat completion. Usage: node openai_sdk.mjs BASE_URL (…/v1).
import { createRequire } from "node:module";
import path from "node:path";

const require = createRequire(path.join(process.env.NODE_PATH, "x.js"));
const OpenAI = require("openai").default ?? require("openai");
const client = new OpenAI({ baseURL: process.argv[2], apiKey: "unused", maxRetries: 0 });
const fail = (m) => { console.log("FAIL: " + m); process.exit(1); };
const messages = [
  { role: "system", content: "You are brief." },
  { role: "user", content: "Say hello." },
];

const models = [];
for await (const m of client.models.list()) models.push(m);
if (models.length !== 1 || typeof models[0].id !== "string") fail("models " + JSON.stringify(models));
console.log("ok: SDK models.list: " + models[0].id);

const r = await client.chat.completions.create({ model: models[0].id, messages, max_tokens: 8,
  temperature: 0, think: false });
if (r.object !== "chat.completion" || r.choices.length !== 1) fail("chat " + JSON.stringify(r));
const text = r.choices[0].message.content;
if (typeof text !== "string" || r.choices[0].message.role !== "assistant") fail("message");
if (!(r.usage.completion_tokens <= 8 && r.usage.prompt_tokens > 0)) fail("usage " + JSON.stringify(r.usage));
console.log("ok: SDK chat.completions.create: " + r.usage.completion_tokens + " tokens");

const stream = await client.chat.completions.create({ model: models[0].id, messages,
  max_tokens: 8, temperature: 0, think: false, stream: true, stream_options: { include_usage: true } });
let streamed = "", chunks = 0, finish = null, usage = null;
for await (const ch of stream) {
  chunks++;
  if (ch.object !== "chat.completion.chunk") fail("chunk " + JSON.stringify(ch));
  if (ch.choices.length) {
    streamed += ch.choices[0].delta.content ?? "";
    finish = ch.choices[0].finish_reason ?? finish;
  }
  if (ch.usage) usage = ch.usage;
}
if (streamed !== text) fail(`streamed ${JSON.stringify(streamed)} != ${JSON.stringify(text)}`);
if (finish !== r.choices[0].finish_reason || !usage) fail("finish / usage");
console.log(`ok: SDK streamed chat: ${chunks} chunks, same text, usage ${usage.completion_tokens}`);
