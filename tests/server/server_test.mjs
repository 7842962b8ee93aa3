// exl3 serve driven by the official openai client: chat, completions, streaming with usage, models, bad input (each
// must get its 4xx and leave the server up), clients that disconnect (streaming and not), tool calls (forced, round
// trip, streamed deltas, tool_choice "required" and strict "auto" held to valid calls; in the Hermes, Llama 3 and
// Mistral formats), reasoning (reasoning_content whole and streamed, a reasoning budget, enable_thinking) and a load
// test of concurrent streaming clients. Usage: node server_test.mjs EXL3_BINARY FALLBACK_MODEL_DIR [SHARED_DIR]: the model is
// SHARED_DIR/models/tiny-target (EXL3_SHARED_DIR overrides SHARED_DIR) when it is there, else the fallback.
// Loopback only; every wait is bounded.
import { existsSync } from "node:fs";
import assert from "node:assert/strict";
import OpenAI from "openai";
import { runTests, startServer, stopServer } from "./harness.mjs";

const [exl3, fallbackModel, sharedArg] = process.argv.slice(2);
const shared = process.env.EXL3_SHARED_DIR || sharedArg;
const modelDir = shared && existsSync(`${shared}/models/tiny-target/config.json`) ? `${shared}/models/tiny-target`
                                                                                   : fallbackModel;
// The real templates: ../shared's, else the copies committed for the tests.
const committed = new URL("../fixtures/chat/templates", import.meta.url).pathname;
const templates = shared && existsSync(`${shared}/templates`) ? `${shared}/templates`
                                                               : existsSync(committed) ? committed : null;
const KEY = "test-key";
const CONTEXT = 512;  // room for the tool prompts of the templates tested
const deadline = setTimeout(() => fail("the whole test took over 150 s"), 150_000);
let server;
const extraServers = new Set();

function fail(msg) {
    console.error("FAIL:", msg);
    if (server) server.kill("SIGKILL");
    for (const s of extraServers) s.kill("SIGKILL");
    process.exit(1);
}

// Starts a server on a free port (--port 0) and reads the port from its stdout line; `extra` may set its own -c.
function start(extra = []) {
    const context = extra.includes("-c") ? [] : ["-c", String(CONTEXT)];
    return startServer(exl3, ["-m", modelDir, ...context, "--api-key", KEY, "--max-body-mb", "1",
                              "--max-queue", "96", "-t", "2", ...extra]);
}
const stop = stopServer;

// Runs fn(base) against a second server started with `extra` options, then stops it (it must exit cleanly).
async function withServer(extra, what, fn) {
    const s = await start(extra);
    extraServers.add(s.proc);
    s.proc.on("exit", (code) => fail(`the ${what} server died (exit ${code})`));
    try {
        await fn(s.base);
    } finally {
        const code = await stop(s.proc);
        extraServers.delete(s.proc);
        assert.equal(code, 0, `the ${what} server exited with ${code}`);
    }
}

const main = await start().catch((e) => fail(e.message));
server = main.proc;
const base = main.base;
console.log(`model: ${modelDir}`);
server.on("exit", (code) => fail(`the server died (exit ${code})`));
const client = new OpenAI({ apiKey: KEY, baseURL: base + "/v1", maxRetries: 0, timeout: 30_000 });
const MODEL = modelDir.split("/").filter(Boolean).pop();
const msgs = [{ role: "system", content: "Be brief." }, { role: "user", content: "Say hello." }];

async function raw(method, path, body, { key = KEY, type = "application/json", at = base, signal } = {}) {
    const headers = { "Content-Type": type };
    if (key !== null) headers.Authorization = `Bearer ${key}`;
    const r = await fetch(at + path, { method, headers, body, signal });
    const text = await r.text();
    let json = null;
    try { json = JSON.parse(text); } catch { /* not JSON: the caller checks */ }
    return { status: r.status, json, text };
}

function expectError(r, status, what) {
    assert.equal(r.status, status, `${what}: status ${r.status}, body ${r.text.slice(0, 200)}`);
    assert.ok(r.json && r.json.error && typeof r.json.error.message === "string", `${what}: an OpenAI error object`);
    assert.ok("type" in r.json.error && "param" in r.json.error && "code" in r.json.error, `${what}: all fields`);
}

async function healthy() {
    const r = await raw("GET", "/health", undefined, { key: null });
    assert.equal(r.status, 200);
    assert.equal(r.json.status, "ok");
}

// Collects one streaming chat reply and checks its shape.
async function streamChat(params) {
    const stream = await client.chat.completions.create({ model: MODEL, messages: msgs, stream: true,
                                                          stream_options: { include_usage: true }, ...params });
    let text = "", role = null, finish = null, usage = null, chunks = 0;
    for await (const chunk of stream) {
        chunks++;
        assert.equal(chunk.object, "chat.completion.chunk");
        if (chunk.usage) usage = chunk.usage;
        for (const c of chunk.choices) {
            if (chunks === 1) role = c.delta.role;
            if (c.delta.content) text += c.delta.content;
            if (c.finish_reason) finish = c.finish_reason;
        }
    }
    assert.equal(role, "assistant", "the first chunk carries the role");
    assert.ok(finish === "stop" || finish === "length", `finish_reason ${finish}`);
    assert.ok(usage && usage.completion_tokens >= 1 && usage.total_tokens === usage.prompt_tokens +
              usage.completion_tokens, "a usage chunk");
    return { text, finish, usage };
}

// Waits until the server has cancelled `atLeast` jobs in all and has none left.
async function cancelledAtLeast(atLeast, what) {
    for (let i = 0; i < 80; i++) {
        const m = await raw("GET", "/metrics");
        const n = Number((m.text.match(/exl3_cancelled_total (\d+)/) || [])[1]);
        if (n >= atLeast && /exl3_queue_depth 0/.test(m.text)) return;
        await new Promise((r) => setTimeout(r, 100));
    }
    assert.fail(`${what}: the disconnected client's job was not cancelled`);
}

// Tools: get_time takes no parameters, get_weather a city.
const TOOLS = [
    { type: "function", function: { name: "get_time", description: "The current time",
                                     parameters: { type: "object", properties: {} } } },
    { type: "function", function: { name: "get_weather", description: "The weather in a city",
                                     parameters: { type: "object", properties: { city: { type: "string" } },
                                                   required: ["city"] } } },
];
const askTime = [{ role: "user", content: "What time is it?" }];

// A tiny model does not write tool calls by itself. Forced, deterministically and with ordinary request fields only:
// tool_choice names get_time, so the server opens the call up to its arguments; greedy decoding with logit_bias on
// "{", "}", " }" (and "]" for Mistral's list) and EOS, and a repetition penalty of 10 over the last 4 tokens, make the
// model write "{", "}", " }" (, "]") and stop: each biased token wins once, then is pushed below the next.
async function forcedToolCallParams(at, closeList) {
    const id = async (text) => {
        const r = await raw("POST", "/tokenize", JSON.stringify({ prompt: text, add_special_tokens: false }), { at });
        assert.equal(r.status, 200);
        assert.equal(r.json.tokens.length, 1, `'${text}' is one token`);
        return r.json.tokens[0];
    };
    const bias = { [await id("{")]: 100, [await id("}")]: 80, [await id(" }")]: 65 };
    if (closeList) bias[await id("]")] = 50;
    bias[await id("<|im_end|>")] = 40;
    return { messages: askTime, tools: TOOLS, tool_choice: { type: "function", function: { name: "get_time" } },
             temperature: 0, max_tokens: 8, logit_bias: bias, repetition_penalty: 10, penalty_range: 4 };
}

// Request fields that make the tiny model write "<tool_call>" (several tokens here) by itself, greedily: each of its
// tokens biased 10 below the one before, and a repetition penalty of 10 over as many tokens, so that each biased token
// wins once, in order, then sinks below the next.
async function writesToolCallOpening(at) {
    const r = await raw("POST", "/tokenize", JSON.stringify({ prompt: "<tool_call>", add_special_tokens: false }), { at });
    assert.equal(r.status, 200);
    const ids = r.json.tokens;
    return { temperature: 0, logit_bias: Object.fromEntries(ids.map((id, i) => [id, 100 - 10 * i])),
             repetition_penalty: 10, penalty_range: ids.length };
}

// One forced call, non-streaming and streaming: the same call; the deltas in OpenAI's order (id, type and name
// first, then arguments); then the call goes back in with its result and the server answers.
async function toolCallRoundTrip(at, closeList, idPattern) {
    const c = new OpenAI({ apiKey: KEY, baseURL: at + "/v1", maxRetries: 0, timeout: 30_000 });
    const params = { model: MODEL, ...(await forcedToolCallParams(at, closeList)) };
    const r = await c.chat.completions.create(params);
    const choice = r.choices[0];
    assert.equal(choice.finish_reason, "tool_calls", JSON.stringify(r));
    assert.equal(choice.message.content, null);
    assert.equal(choice.message.tool_calls.length, 1);
    const call = choice.message.tool_calls[0];
    assert.equal(call.type, "function");
    assert.match(call.id, idPattern);
    assert.equal(call.function.name, "get_time");
    assert.deepEqual(JSON.parse(call.function.arguments), {});

    // Streamed: raw deltas checked one by one, and the SDK's own accumulator.
    const stream = await c.chat.completions.create({ ...params, stream: true });
    const calls = [];
    let finish = null, content = "";
    for await (const chunk of stream) {
        for (const ch of chunk.choices) {
            if (ch.delta.content) content += ch.delta.content;
            if (ch.finish_reason) finish = ch.finish_reason;
            for (const d of ch.delta.tool_calls ?? []) {
                if (!calls[d.index]) {
                    assert.ok(d.id && d.type === "function" && d.function.name, "a call's first delta: id, type, name");
                    assert.equal(d.function.arguments, "", "arguments come after the name");
                    calls[d.index] = { id: d.id, type: d.type, function: { name: d.function.name, arguments: "" } };
                } else {
                    assert.equal(d.id, undefined);
                    calls[d.index].function.arguments += d.function.arguments ?? "";
                }
            }
        }
    }
    assert.equal(finish, "tool_calls");
    assert.equal(content, "");
    const strip = (list) => list.map(({ id, ...rest }) => rest);
    assert.deepEqual(strip(calls), strip(choice.message.tool_calls));
    const final = await c.chat.completions.stream(params).finalChatCompletion();
    assert.equal(final.choices[0].finish_reason, "tool_calls");
    assert.deepEqual(strip(final.choices[0].message.tool_calls.map(({ id, type, function: f }) =>
        ({ id, type, function: { name: f.name, arguments: f.arguments } }))), strip(choice.message.tool_calls));

    // Round trip: the call and its result go back in; the template renders them and the server answers.
    const history = [...askTime, { role: "assistant", content: null, tool_calls: [call] },
                     { role: "tool", tool_call_id: call.id, content: "12:00" }];
    const back = await c.chat.completions.create({ model: MODEL, messages: history, tools: TOOLS, max_tokens: 6,
                                                   temperature: 0 });
    assert.ok(["stop", "length", "tool_calls"].includes(back.choices[0].finish_reason));
    const t = await raw("POST", "/tokenize", JSON.stringify({ messages: history, tools: TOOLS }), { at });
    assert.equal(t.status, 200, t.text);
    const d = await raw("POST", "/detokenize", JSON.stringify({ tokens: t.json.tokens }), { at });
    assert.ok(d.json.prompt.includes("get_time") && d.json.prompt.includes("12:00"), d.json.prompt);
    return d.json.prompt;
}

const tests = {
    async models() {
        const list = await client.models.list();
        const ids = [];
        for await (const m of list) ids.push(m.id);
        assert.deepEqual(ids, [MODEL]);
    },
    async chat() {
        const r = await client.chat.completions.create({ model: MODEL, messages: msgs, max_tokens: 8, temperature: 0 });
        assert.equal(r.object, "chat.completion");
        assert.equal(r.choices.length, 1);
        assert.equal(r.choices[0].message.role, "assistant");
        assert.equal(typeof r.choices[0].message.content, "string");
        assert.ok(["stop", "length"].includes(r.choices[0].finish_reason));
        assert.ok(r.usage.prompt_tokens > 0 && r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 8);
        // Greedy is deterministic, and the streamed text is the same reply.
        const again = await client.chat.completions.create({ model: MODEL, messages: msgs, max_tokens: 8,
                                                            temperature: 0 });
        assert.equal(again.choices[0].message.content, r.choices[0].message.content);
        const s = await streamChat({ max_tokens: 8, temperature: 0 });
        assert.equal(s.text, r.choices[0].message.content);
    },
    async jsonMode() {
        // response_format json_object: the reply is a JSON object (or, cut by max_tokens, the start of one), the same
        // whole and streamed (seeded or greedy); chat and completions.
        const m = [{ role: "user", content: "Describe a lighthouse as JSON." }];
        const isObjectOrStart = (text, finish, what) => {
            if (finish === "stop") {
                const v = JSON.parse(text);
                assert.ok(v !== null && typeof v === "object" && !Array.isArray(v), `${what}: an object: ${text}`);
            } else {
                assert.equal(finish, "length", what);
                assert.match(text, /^\s*\{/, `${what}: the start of an object: ${text}`);
            }
        };
        const rf = { type: "json_object" };
        for (const temperature of [0, 0.8]) {
            const r = await client.chat.completions.create({ model: MODEL, messages: m, max_tokens: 160, temperature,
                                                             seed: 5, response_format: rf });
            const c = r.choices[0];
            isObjectOrStart(c.message.content, c.finish_reason, `chat, temperature ${temperature}`);
            const s = await streamChat({ messages: m, max_tokens: 160, temperature, seed: 5, response_format: rf });
            assert.equal(s.text, c.message.content, "streamed as whole");
            assert.equal(s.finish, c.finish_reason);
        }
        const cr = await client.completions.create({ model: MODEL, prompt: "A lighthouse: ", max_tokens: 160,
                                                     temperature: 0, response_format: rf });
        isObjectOrStart(cr.choices[0].text, cr.choices[0].finish_reason, "completions");
        await healthy();
    },
    async jsonSchema() {
        // response_format json_schema: the reply is a value of the schema (declared properties in order, required
        // ones present, types and enums kept), the same whole and streamed; what cannot be held to is a 400.
        const m = [{ role: "user", content: "Describe a lighthouse as JSON." }];
        const schema = {
            type: "object", additionalProperties: false, required: ["name", "height", "lit", "color"],
            properties: {
                name: { type: "string", maxLength: 30 }, height: { type: "integer" }, lit: { type: "boolean" },
                color: { enum: ["red", "white", "green"] }, notes: { type: ["string", "null"] },
            },
        };
        const rf = { type: "json_schema", json_schema: { name: "lighthouse", schema, strict: true } };
        let closed = 0;
        for (const temperature of [0, 0.8]) {
            const r = await client.chat.completions.create({ model: MODEL, messages: m, max_tokens: 300, temperature,
                                                             seed: 9, response_format: rf });
            const c = r.choices[0];
            const s = await streamChat({ messages: m, max_tokens: 300, temperature, seed: 9, response_format: rf });
            assert.equal(s.text, c.message.content, "streamed as whole");
            assert.equal(s.finish, c.finish_reason);
            if (c.finish_reason !== "stop") {
                assert.equal(c.finish_reason, "length");
                continue;
            }
            ++closed;
            const v = JSON.parse(c.message.content);
            assert.deepEqual(Object.keys(v).filter((k) => k !== "notes"), ["name", "height", "lit", "color"]);
            assert.equal(typeof v.name, "string");
            assert.ok([...v.name].length <= 30);
            assert.ok(Number.isInteger(v.height), c.message.content);
            assert.equal(typeof v.lit, "boolean");
            assert.ok(["red", "white", "green"].includes(v.color));
            assert.ok(!("notes" in v) || v.notes === null || typeof v.notes === "string");
        }
        assert.ok(closed > 0, "a reply closed its object within 300 tokens");
        const bad = async (format, pattern) => assert.rejects(
            client.chat.completions.create({ model: MODEL, messages: m, max_tokens: 8, response_format: format }),
            (e) => e.status === 400 && pattern.test(e.message), JSON.stringify(format));
        await bad({ type: "json_schema", json_schema: { name: "x", schema: { type: "object", properties: {
            code: { type: "string", pattern: "^[A-Z]+$" } } } } }, /'pattern' is not supported/);
        await bad({ type: "json_schema", json_schema: { name: "x" } }, /json_schema/);
        await bad({ type: "json_schema", json_schema: { name: "x", schema: { type: "string" } } }, /root/);
        await bad({ type: "xml" }, /not supported/);
        await healthy();
    },
    async prefixCache() {
        // A long system prompt asked twice: the second request takes whole KV pages of it from the prefix cache and
        // says so in usage.prompt_tokens_details.cached_tokens (and in the metrics).
        const system = "You answer briefly. ".repeat(30);
        const m = [{ role: "system", content: system }, { role: "user", content: "Say hi." }];
        const first = await client.chat.completions.create({ model: MODEL, messages: m, max_tokens: 4, temperature: 0 });
        const second = await client.chat.completions.create({ model: MODEL, messages: m, max_tokens: 4,
                                                              temperature: 0 });
        assert.equal(second.choices[0].message.content, first.choices[0].message.content);
        const cached = second.usage.prompt_tokens_details?.cached_tokens ?? 0;
        assert.ok(cached >= 64 && cached < second.usage.prompt_tokens, `cached ${cached} of ${second.usage.prompt_tokens}`);
        const metrics = await raw("GET", "/metrics");
        assert.match(metrics.text, /exl3_prompt_tokens_cached_total [1-9]/);
    },
    async chatParameters() {
        const r = await client.chat.completions.create({
            model: MODEL, messages: [{ role: "user", content: [{ type: "text", text: "Hi" }, { type: "text", text: "!" }] }],
            max_completion_tokens: 6, temperature: 0.8, top_p: 0.9, seed: 7, stop: ["\n\n", "zzz"], n: 2,
            presence_penalty: 0.5, frequency_penalty: 0.5, logit_bias: { "5": 1.5 }, logprobs: true, top_logprobs: 2,
            user: "tester", top_k: 40, min_p: 0.05, dry_multiplier: 0.8, unknown_field: { ignored: true },
        });
        assert.equal(r.choices.length, 2);
        for (const c of r.choices) {
            assert.ok(Array.isArray(c.logprobs.content));
            for (const t of c.logprobs.content) {
                assert.equal(typeof t.logprob, "number");
                assert.ok(t.top_logprobs.length <= 2);
            }
        }
    },
    async completions() {
        const r = await client.completions.create({ model: MODEL, prompt: "Once upon a time", max_tokens: 8,
                                                   temperature: 0 });
        assert.equal(r.object, "text_completion");
        assert.equal(typeof r.choices[0].text, "string");
        assert.ok(r.usage.completion_tokens >= 1);
        const stream = await client.completions.create({ model: MODEL, prompt: "Once upon a time", max_tokens: 8,
                                                        temperature: 0, stream: true });
        let text = "", finish = null;
        for await (const chunk of stream) {
            for (const c of chunk.choices) {
                text += c.text;
                if (c.finish_reason) finish = c.finish_reason;
            }
        }
        assert.equal(text, r.choices[0].text);
        assert.ok(finish);
    },
    async tokenize() {
        const t = await raw("POST", "/tokenize", JSON.stringify({ prompt: "hello world" }));
        assert.equal(t.status, 200);
        assert.ok(t.json.tokens.length > 0);
        const d = await raw("POST", "/detokenize", JSON.stringify({ tokens: t.json.tokens }));
        assert.equal(d.status, 200);
        assert.ok(d.json.prompt.includes("hello world"));
        // An id past the vocabulary is an error, not a token silently left out.
        expectError(await raw("POST", "/detokenize", JSON.stringify({ tokens: [t.json.tokens[0], 99999999] })), 400,
                    "detokenize id out of vocab");
    },
    async echo() {
        // echo returns the prompt as given (no BOS text the server added), then the reply.
        const r = await client.completions.create({ model: MODEL, prompt: "Once upon a time", max_tokens: 4,
                                                   temperature: 0, echo: true });
        const plain = await client.completions.create({ model: MODEL, prompt: "Once upon a time", max_tokens: 4,
                                                       temperature: 0 });
        assert.equal(r.choices[0].text, "Once upon a time" + plain.choices[0].text);
    },
    async errors() {
        const chat = (body) => raw("POST", "/v1/chat/completions", typeof body === "string" ? body : JSON.stringify(body));
        expectError(await chat("{not json"), 400, "malformed JSON");
        expectError(await chat({ messages: msgs, max_tokens: "ten" }), 400, "max_tokens as a string");
        expectError(await chat({ messages: msgs, temperature: [1] }), 400, "temperature as a list");
        expectError(await chat({ messages: "hello" }), 400, "messages as a string");
        expectError(await chat({ messages: [{ role: "user", content: 5 }] }), 400, "content as a number");
        expectError(await chat({ messages: [{ role: "wizard", content: "x" }] }), 400, "unknown role");
        expectError(await chat({ messages: [] }), 400, "empty messages");
        expectError(await chat({ messages: msgs, n: 0 }), 400, "n = 0");
        expectError(await chat({ messages: msgs, logit_bias: { "abc": 1 } }), 400, "logit_bias key");
        expectError(await chat({ messages: msgs, logit_bias: { "99999999": 1 } }), 400, "logit_bias id out of vocab");
        expectError(await chat([1, 2]), 400, "a body that is not an object");
        const bad = Buffer.concat([Buffer.from('{"messages":[{"role":"user","content":"'), Buffer.from([0xff, 0xfe]),
                                   Buffer.from('"}]}')]);
        expectError(await raw("POST", "/v1/chat/completions", bad), 400, "invalid UTF-8");
        const long = "word ".repeat(CONTEXT + 100);
        expectError(await chat({ messages: [{ role: "user", content: long }] }), 400, "prompt longer than the context");
        expectError(await raw("POST", "/v1/completions", JSON.stringify({ prompt: long })), 400, "long completion");
        expectError(await raw("POST", "/v1/completions", JSON.stringify({ prompt: 12 })), 400, "prompt as a number");
        expectError(await chat({ model: "gpt-4", messages: msgs }), 404, "unknown model");
        expectError(await raw("GET", "/v1/nothing-here"), 404, "unknown route");
        expectError(await raw("GET", "/v1/models", undefined, { key: null }), 401, "missing key");
        expectError(await raw("GET", "/v1/models", undefined, { key: "wrong" }), 401, "wrong key");
        expectError(await chat(JSON.stringify({ messages: [{ role: "user", content: "x".repeat(2 << 20) }] })), 413,
                    "body over --max-body-mb");
        // Through the client: the SDK's typed errors.
        await assert.rejects(client.chat.completions.create({ model: "nope", messages: msgs }),
                             (e) => e.status === 404 && e.error?.code === "model_not_found");
        await assert.rejects(new OpenAI({ apiKey: "bad", baseURL: base + "/v1", maxRetries: 0 }).models.list(),
                             (e) => e.status === 401);
        // A huge max_tokens is capped to what the context leaves, not an error.
        const r = await client.chat.completions.create({ model: MODEL, messages: msgs, max_tokens: 1e12,
                                                        temperature: 0, stop: ["."] });
        assert.ok(["stop", "length"].includes(r.choices[0].finish_reason));
        assert.ok(r.usage.total_tokens <= CONTEXT);
        await healthy();
    },
    async toolCalls() {
        const prompt = await toolCallRoundTrip(base, false, /^call_[0-9a-f]{24}$/);
        // Hermes/Qwen: the call rendered back as the model writes it, the result as a tool response.
        assert.ok(prompt.includes('<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'), prompt);
        assert.ok(prompt.includes("<tool_response>\n12:00\n</tool_response>"), prompt);
        // Arguments arrive as a JSON string and are rendered as the mapping templates expect.
        const history = [...askTime, { role: "assistant", content: "",
                                       tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather",
                                                      arguments: '{"city": "Paris"}' } }] },
                         { role: "tool", tool_call_id: "call_1", content: "sunny" }];
        const t = await raw("POST", "/tokenize", JSON.stringify({ messages: history, tools: TOOLS }));
        const d = await raw("POST", "/detokenize", JSON.stringify({ tokens: t.json.tokens }));
        assert.ok(d.json.prompt.includes('{"name": "get_weather", "arguments": {"city": "Paris"}}'), d.json.prompt);
        const r = await client.chat.completions.create({ model: MODEL, messages: history, tools: TOOLS, max_tokens: 6,
                                                        temperature: 0 });
        assert.equal(r.choices[0].message.role, "assistant");
    },
    async toolChoice() {
        const count = async (body) => (await raw("POST", "/tokenize", JSON.stringify(body))).json.count;
        // none: the tools are not rendered at all.
        assert.equal(await count({ messages: askTime, tools: TOOLS, tool_choice: "none" }),
                     await count({ messages: askTime }));
        assert.ok(await count({ messages: askTime, tools: TOOLS }) > await count({ messages: askTime }));
        // auto: an ordinary reply (content, or calls if the model wrote any).
        const auto = await client.chat.completions.create({ model: MODEL, messages: askTime, tools: TOOLS,
                                                           tool_choice: "auto", max_tokens: 8, temperature: 0 });
        assert.ok(["stop", "length", "tool_calls"].includes(auto.choices[0].finish_reason));
        // required: see requiredToolChoice.
        const named = await client.chat.completions.create({ model: MODEL, messages: askTime, tools: TOOLS,
            tool_choice: { type: "function", function: { name: "get_weather" } }, max_tokens: 8, temperature: 0 });
        const n = named.choices[0].message;
        assert.ok(n.tool_calls?.[0]?.function.name === "get_weather" ||
                  n.content.startsWith('<tool_call>\n{"name": "get_weather", "arguments": '), JSON.stringify(n));
        // A named function's arguments are generated under its parameters' schema: when they close, the reply is
        // that call with arguments the schema admits (whole and streamed alike); a schema with keywords that cannot
        // be held to leaves the arguments free (no error).
        const alarm = { type: "function", function: { name: "set_alarm", parameters: {
            type: "object", additionalProperties: false, required: ["hour", "label"],
            properties: { hour: { type: "integer" }, label: { type: "string", maxLength: 12 },
                          days: { type: "array", items: { enum: ["mon", "tue"] }, maxItems: 2 } } } } };
        let closed = 0;
        for (const temperature of [0, 0.8]) {
            const body = { model: MODEL, messages: [{ role: "user", content: "Wake me at seven." }],
                           tools: [...TOOLS, alarm], tool_choice: { type: "function", function: { name: "set_alarm" } },
                           max_tokens: 300, temperature, seed: 4 };
            const r = await client.chat.completions.create(body);
            const c = r.choices[0];
            const final = await client.chat.completions.stream(body).finalChatCompletion();
            assert.deepEqual(final.choices[0].message.tool_calls?.map((t) => t.function),
                             c.message.tool_calls?.map((t) => t.function), "streamed as whole");
            if (c.finish_reason === "length") continue;
            ++closed;
            assert.equal(c.finish_reason, "tool_calls", JSON.stringify(c));
            assert.equal(c.message.tool_calls[0].function.name, "set_alarm");
            const args = JSON.parse(c.message.tool_calls[0].function.arguments);
            assert.ok(Number.isInteger(args.hour), JSON.stringify(args));
            assert.ok(typeof args.label === "string" && [...args.label].length <= 12, JSON.stringify(args));
            assert.ok(Object.keys(args).every((k) => ["hour", "label", "days"].includes(k)), JSON.stringify(args));
            assert.ok(!args.days || args.days.every((d) => d === "mon" || d === "tue"), JSON.stringify(args));
        }
        assert.ok(closed > 0, "a constrained call closed within 300 tokens");
        const free = await client.chat.completions.create({ model: MODEL, messages: askTime, max_tokens: 4,
            tools: [{ type: "function", function: { name: "f", parameters: { type: "object", properties: {
                d: { type: "string", format: "date" } } } } }],
            tool_choice: { type: "function", function: { name: "f" } } });
        assert.ok(["length", "stop", "tool_calls"].includes(free.choices[0].finish_reason));
        const chat = (body) => raw("POST", "/v1/chat/completions", JSON.stringify(body));
        expectError(await chat({ messages: askTime, tool_choice: "required" }), 400, "required without tools");
        expectError(await chat({ messages: askTime, tools: TOOLS, tool_choice: { type: "function",
                                 function: { name: "nope" } } }), 400, "a named function not in tools");
        expectError(await chat({ messages: askTime, tools: [{ type: "function" }] }), 400, "a tool without function");
        expectError(await chat({ messages: askTime, tools: TOOLS, parallel_tool_calls: "no" }), 400,
                    "parallel_tool_calls as a string");
        expectError(await chat({ messages: askTime, tools: TOOLS, tool_choice: 7 }), 400, "tool_choice as a number");
    },
    async toolFormats() {
        // The same round trip with Llama 3.1's and Mistral's templates (tools parsed in the format each teaches).
        if (!templates) return console.log("     (no ../shared/templates: Llama and Mistral formats skipped)");
        for (const [file, closeList, idPattern] of [
            ["meta-llama-Llama-3.1-8B-Instruct.jinja", false, /^call_[0-9a-f]{24}$/],
            ["mistralai-Mistral-Nemo-Instruct-2407.jinja", true, /^[A-Za-z0-9]{9}$/]]) {
            const s = await start(["--chat-template", `${templates}/${file}`]);
            extraServers.add(s.proc);
            s.proc.on("exit", (code) => fail(`the ${file} server died (exit ${code})`));
            try {
                const prompt = await toolCallRoundTrip(s.base, closeList, idPattern);
                if (closeList) assert.match(prompt, /\[TOOL_CALLS\]\[\{"name": "get_time", "arguments": \{\}, "id": "[A-Za-z0-9]{9}"\}\]/);
                else assert.ok(prompt.includes('{"name": "get_time", "parameters": {}}'), prompt);
            } finally {
                const code = await stop(s.proc);
                extraServers.delete(s.proc);
                assert.equal(code, 0, `the ${file} server exited with ${code}`);
            }
        }
    },
    async requiredToolChoice() {
        // tool_choice "required": the reply is always a valid call of one of the tools -- the format's framing and the
        // arguments under the union of the tools' schemas -- greedy and sampled, whole and streamed alike.
        const alarm = { type: "function", function: { name: "set_alarm", parameters: {
            type: "object", additionalProperties: false, required: ["hour"],
            properties: { hour: { type: "integer" }, label: { type: "string", maxLength: 8 } } } } };
        const tools = [...TOOLS, alarm];
        const valid = (call) => {
            const args = JSON.parse(call.function.arguments);
            if (call.function.name === "get_time") return Object.keys(args).length === 0;
            if (call.function.name === "get_weather") return typeof args.city === "string";
            return call.function.name === "set_alarm" && Number.isInteger(args.hour) &&
                   Object.keys(args).every((k) => k === "hour" || k === "label");
        };
        const names = new Set();
        for (const [temperature, seed] of [[0, 1], [1, 2], [1, 3], [1.2, 4], [1.2, 5]]) {
            const body = { model: MODEL, messages: askTime, tools, tool_choice: "required", max_tokens: 200, temperature,
                           seed };
            const r = await client.chat.completions.create(body);
            const c = r.choices[0];
            assert.equal(c.finish_reason, "tool_calls", JSON.stringify(c));
            assert.equal(c.message.tool_calls.length, 1, JSON.stringify(c.message));
            assert.ok(valid(c.message.tool_calls[0]), JSON.stringify(c.message.tool_calls[0]));
            names.add(c.message.tool_calls[0].function.name);
            const final = await client.chat.completions.stream(body).finalChatCompletion();
            assert.equal(final.choices[0].finish_reason, "tool_calls");
            assert.deepEqual(final.choices[0].message.tool_calls.map((t) => t.function),
                             c.message.tool_calls.map((t) => t.function), "streamed as whole");
        }
        console.log(`     required: calls of ${[...names].join(", ")}`);
        // "auto" with every tool strict: a call, when the model writes one, is valid; here the model is pushed to
        // open one (logit_bias on the tokens of "<tool_call>"): without strict what follows is junk and the reply is
        // content, with strict it is a call.
        const opens = await writesToolCallOpening(base);
        const strict = tools.map((t) => ({ ...t, function: { ...t.function, strict: true } }));
        for (const [list, want] of [[tools, "content"], [strict, "call"]]) {
            const r = await client.chat.completions.create({ model: MODEL, messages: askTime, tools: list,
                tool_choice: "auto", max_tokens: 120, ...opens });
            const m = r.choices[0].message;
            if (want === "content") {
                assert.ok(!m.tool_calls?.length && m.content.startsWith("<tool_call>"), JSON.stringify(m));
            } else {
                assert.equal(r.choices[0].finish_reason, "tool_calls", JSON.stringify(r.choices[0]));
                assert.ok(valid(m.tool_calls[0]), JSON.stringify(m));
            }
        }
    },
    async forcedCallsInEveryFormat() {
        // tool_choice "required" and a named function on the templates of the formats that are not JSON: Qwen3-Coder's
        // and Seed-OSS's XML, GLM-4.5's <arg_key>, gpt-oss's Harmony header, Gemma's Python calls, and Command R+'s
        // Action: ```json list -- each reply a valid call, parsed back the same whole and streamed.
        // (Command R+'s template prints every parameter's description: it needs one.)
        const tools = TOOLS.map((t) => ({ ...t, function: { ...t.function,
            parameters: { ...t.function.parameters, additionalProperties: false } } }));
        tools[1].function.parameters.properties = { city: { type: "string", description: "The city" } };
        for (const file of ["Qwen-Qwen3-Coder-30B-A3B-Instruct.jinja", "llama-cpp-glm-4.5.jinja",
                            "openai-gpt-oss-120b.jinja", "ByteDance-Seed-OSS.jinja", "vllm-gemma3-pythonic.jinja",
                            "CohereForAI-c4ai-command-r-plus-tool_use.jinja"]) {
            // Command R+'s preamble alone is some 600 tokens.
            const context = file.includes("command-r-plus") ? ["-c", "1024"] : [];
            await withServer(["--chat-template", `${committed}/${file}`, ...context], file, async (at) => {
                const c = new OpenAI({ apiKey: KEY, baseURL: at + "/v1", maxRetries: 0, timeout: 30_000 });
                for (const tool_choice of ["required", { type: "function", function: { name: "get_weather" } }]) {
                    const body = { model: MODEL, messages: askTime, tools, tool_choice, max_tokens: 120,
                                   temperature: 0.8, seed: 3 };
                    const r = await c.chat.completions.create(body);
                    const call = r.choices[0].message.tool_calls?.[0];
                    assert.equal(r.choices[0].finish_reason, "tool_calls", `${file}: ${JSON.stringify(r.choices[0])}`);
                    const args = JSON.parse(call.function.arguments);
                    if (tool_choice !== "required") assert.equal(call.function.name, "get_weather", file);
                    assert.ok(call.function.name === "get_time" ? Object.keys(args).length === 0
                                                                : typeof args.city === "string", JSON.stringify(call));
                    const final = await c.chat.completions.stream(body).finalChatCompletion();
                    assert.deepEqual(final.choices[0].message.tool_calls.map((t) => t.function), [call.function],
                                     `${file}: streamed as whole`);
                }
            });
        }
    },
    async reasoning() {
        // QwQ's template opens <think> in the prompt, so the reply starts inside reasoning. The tiny model never closes
        // it; max_reasoning_tokens makes the server close it after that many tokens and the answer follow.
        if (!templates) return console.log("     (no templates: reasoning skipped)");
        await withServer(["--chat-template", `${templates}/Qwen-QwQ-32B.jinja`], "QwQ", async (at) => {
            const c = new OpenAI({ apiKey: KEY, baseURL: at + "/v1", maxRetries: 0, timeout: 30_000 });
            const body = { model: MODEL, messages: askTime, max_tokens: 16, temperature: 0, max_reasoning_tokens: 5 };
            const r = await c.chat.completions.create(body);
            const m = r.choices[0].message;
            assert.ok(typeof m.reasoning_content === "string" && m.reasoning_content.length > 0, JSON.stringify(m));
            assert.equal(typeof m.content, "string");
            assert.ok(!m.content.includes("</think>") && !m.reasoning_content.includes("</think>"), JSON.stringify(m));
            assert.equal(r.usage.completion_tokens_details.reasoning_tokens, 5);
            // Streamed: delta.reasoning_content first, then delta.content; the same text.
            const stream = await c.chat.completions.create({ ...body, stream: true,
                                                             stream_options: { include_usage: true } });
            let reasoning = "", content = "", order = "", usage = null;
            for await (const chunk of stream) {
                if (chunk.usage) usage = chunk.usage;
                for (const ch of chunk.choices) {
                    if (ch.delta.reasoning_content) { reasoning += ch.delta.reasoning_content; order += "r"; }
                    if (ch.delta.content) { content += ch.delta.content; order += "c"; }
                }
            }
            assert.equal(reasoning, m.reasoning_content);
            assert.equal(content, m.content);
            assert.match(order, /^r+c*$/, "reasoning streams before the answer");
            assert.equal(usage.completion_tokens_details.reasoning_tokens, 5);
            // A budget of 0: no reasoning at all; no budget: all of the reply is reasoning (the block never closes).
            const zero = (await c.chat.completions.create({ ...body, max_reasoning_tokens: 0 })).choices[0].message;
            assert.ok(!zero.reasoning_content && zero.content.length > 0, JSON.stringify(zero));
            const none = (await c.chat.completions.create({ ...body, max_reasoning_tokens: undefined })).choices[0];
            assert.ok(none.message.reasoning_content.length > 0 && none.message.content === "", JSON.stringify(none));
            // Reasoning that writes a call in the format's syntax is not a call; the call after it is parsed (strict
            // tools, as OpenAI's strict mode has them, hold it valid). The request's bias makes the model write
            // "<tool_call>" (or most of it: the prompt's "<think>" is inside the penalty's window) in its reasoning,
            // and again after the budget closes the block.
            const opens = await writesToolCallOpening(at);
            const strict = TOOLS.map((t) => ({ ...t, function: { ...t.function, strict: true,
                parameters: { ...t.function.parameters, additionalProperties: false } } }));
            const t = await c.chat.completions.create({ model: MODEL, messages: askTime, tools: strict, max_tokens: 120,
                max_reasoning_tokens: 12, ...opens });
            const tm = t.choices[0].message;
            assert.ok(tm.reasoning_content.includes("_call>"), JSON.stringify(tm));
            assert.equal(t.choices[0].finish_reason, "tool_calls", JSON.stringify(t.choices[0]));
            assert.equal(tm.tool_calls.length, 1, JSON.stringify(tm));
            // A forced call skips reasoning: the prompt's block is closed before the call's opening.
            const f = await c.chat.completions.create({ ...(await forcedToolCallParams(at, false)),
                                                        model: MODEL, max_reasoning_tokens: 3 });
            assert.equal(f.choices[0].finish_reason, "tool_calls", JSON.stringify(f.choices[0]));
            assert.ok(!f.choices[0].message.reasoning_content, JSON.stringify(f.choices[0].message));
            // Bad budgets and template variables: clear 400s naming the field.
            const chat = (b) => raw("POST", "/v1/chat/completions", JSON.stringify({ messages: askTime, ...b }),
                                    { at });
            for (const [b, param] of [[{ max_reasoning_tokens: -1 }, "max_reasoning_tokens"],
                                      [{ max_reasoning_tokens: 2.5 }, "max_reasoning_tokens"],
                                      [{ max_reasoning_tokens: "5" }, "max_reasoning_tokens"],
                                      [{ chat_template_kwargs: [1] }, "chat_template_kwargs"],
                                      [{ chat_template_kwargs: { messages: [] } }, "chat_template_kwargs"],
                                      [{ enable_thinking: "yes" }, "enable_thinking"],
                                      [{ reasoning_effort: "extreme" }, "reasoning_effort"]]) {
                const e = await chat(b);
                expectError(e, 400, JSON.stringify(b));
                assert.equal(e.json.error.param, param);
            }
            assert.match((await chat({ max_reasoning_tokens: -1 })).json.error.message, /integer >= 0/);
        });
    },
    async thinkingSwitch() {
        // Qwen3's template: enable_thinking (top level, as vLLM clients send it, or in chat_template_kwargs) reaches
        // the template, which then writes an empty think block into the prompt.
        if (!templates) return console.log("     (no templates: enable_thinking skipped)");
        await withServer(["--chat-template", `${templates}/Qwen-Qwen3-0.6B.jinja`], "Qwen3", async (at) => {
            const rendered = async (extra) => {
                const t = await raw("POST", "/tokenize", JSON.stringify({ messages: askTime, ...extra }), { at });
                assert.equal(t.status, 200, t.text);
                return (await raw("POST", "/detokenize", JSON.stringify({ tokens: t.json.tokens }), { at }))
                    .json.prompt;
            };
            assert.ok(!(await rendered({})).includes("<think>"));
            for (const extra of [{ enable_thinking: false }, { chat_template_kwargs: { enable_thinking: false } }])
                assert.ok((await rendered(extra)).endsWith("<|im_start|>assistant\n<think>\n\n</think>\n\n"),
                          JSON.stringify(extra));
            // The reply after an empty block is all answer.
            const c = new OpenAI({ apiKey: KEY, baseURL: at + "/v1", maxRetries: 0, timeout: 30_000 });
            const r = await c.chat.completions.create({ model: MODEL, messages: askTime, max_tokens: 6, temperature: 0,
                                                        enable_thinking: false });
            assert.ok(!r.choices[0].message.reasoning_content, JSON.stringify(r.choices[0].message));
            assert.equal(r.usage.completion_tokens_details.reasoning_tokens, 0);
        });
    },
    async speculative() {
        // A server with n-gram proposals (--ngram) and one with the model as its own draft (--draft-model): the
        // same greedy replies as the main server, whole and streamed, and the proposals counted in /metrics.
        const prompt = "The cat sat on the mat. The cat sat on the mat. The cat";
        const want = await client.completions.create({ model: MODEL, prompt, max_tokens: 24, temperature: 0 });
        for (const extra of [["--ngram"], ["--draft-model", modelDir, "--draft-tokens", "3"]]) {
            const s = await start(extra);
            extraServers.add(s.proc);
            s.proc.on("exit", (code) => fail(`the ${extra[0]} server died (exit ${code})`));
            try {
                const c = new OpenAI({ apiKey: KEY, baseURL: s.base + "/v1", maxRetries: 0, timeout: 30_000 });
                const r = await c.completions.create({ model: MODEL, prompt, max_tokens: 24, temperature: 0 });
                assert.equal(r.choices[0].text, want.choices[0].text, extra[0]);
                assert.equal(r.usage.completion_tokens, want.usage.completion_tokens);
                let text = "";
                const stream = await c.completions.create({ model: MODEL, prompt, max_tokens: 24, temperature: 0,
                                                            stream: true });
                for await (const chunk of stream) text += chunk.choices[0]?.text ?? "";
                assert.equal(text, want.choices[0].text, `${extra[0]}, streamed`);
                const m = await raw("GET", "/metrics", undefined, { at: s.base });
                const drafted = Number((m.text.match(/exl3_spec_draft_tokens_total (\d+)/) || [])[1]);
                const kept = Number((m.text.match(/exl3_spec_accepted_tokens_total (\d+)/) || [])[1]);
                assert.ok(drafted > 0 && kept > 0 && kept <= drafted, `${extra[0]}: ${kept} of ${drafted} kept`);
            } finally {
                const code = await stop(s.proc);
                extraServers.delete(s.proc);
                assert.equal(code, 0, `the ${extra[0]} server exited with ${code}`);
            }
        }
    },
    async disconnectWhole() {
        // A non-streaming request whose client goes away: the server notices at a write of its body (it sends
        // whitespace while the jobs run) and cancels the jobs.
        const before = Number(((await raw("GET", "/metrics")).text.match(/exl3_cancelled_total (\d+)/) || [])[1]);
        const ac = new AbortController();
        const pending = client.chat.completions.create({ model: MODEL, messages: msgs, max_tokens: 220, n: 16,
                                                        ignore_eos: true }, { signal: ac.signal });
        setTimeout(() => ac.abort(), 300);
        await assert.rejects(pending);
        await cancelledAtLeast(before + 1, "non-streaming");
        // A long one that is not cut off gets its whole, well-formed reply.
        const r = await client.chat.completions.create({ model: MODEL, messages: msgs, max_tokens: 200, n: 6,
                                                        ignore_eos: true, temperature: 0 });
        assert.equal(r.choices.length, 6);
        for (const ch of r.choices) assert.equal(ch.finish_reason, "length");
    },
    async disconnect() {
        const before = Number(((await raw("GET", "/metrics")).text.match(/exl3_cancelled_total (\d+)/) || [])[1]);
        const ac = new AbortController();
        const stream = await client.chat.completions.create({ model: MODEL, messages: msgs, max_tokens: 200,
                                                              ignore_eos: true, stream: true }, { signal: ac.signal });
        let n = 0;
        try {
            for await (const _ of stream) if (++n === 3) ac.abort();
        } catch { /* the abort */ }
        // The server notices at its next write and cancels the job.
        await cancelledAtLeast(before + 1, "streaming");
    },
    async load() {
        const t0 = Date.now();
        const clients = Array.from({ length: 32 }, async (_, i) => {
            const out = [];
            for (let k = 0; k < 2; k++) out.push(await streamChat({ max_tokens: 12, temperature: 0.7, seed: i * 2 + k }));
            return out;
        });
        const results = (await Promise.all(clients)).flat();
        assert.equal(results.length, 64);
        for (const r of results) assert.ok(r.usage.completion_tokens >= 1);
        console.log(`load: 64 streamed replies from 32 clients in ${Date.now() - t0} ms`);
        await healthy();
        const m = await raw("GET", "/metrics");
        assert.match(m.text, /exl3_requests_total\{route="chat_completions"\} \d+/);
        assert.match(m.text, /exl3_queue_depth 0/);
    },
};

const failed = await runTests(tests);
const code = await stop(server);
clearTimeout(deadline);
if (code !== 0) fail(`the server exited with ${code} on SIGTERM`);
console.log(failed ? `${failed} failed` : "all passed");
process.exit(failed ? 1 : 0);
