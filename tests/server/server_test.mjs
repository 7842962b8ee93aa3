// exl3 serve driven by the official openai client: chat, completions, streaming with usage, models, bad input (each
// must get its 4xx and leave the server up), a client that disconnects, and a load test of concurrent streaming
// clients. Usage: node server_test.mjs EXL3_BINARY MODEL_DIR. Loopback only; every wait is bounded.
import { spawn } from "node:child_process";
import assert from "node:assert/strict";
import OpenAI from "openai";

const [exl3, modelDir] = process.argv.slice(2);
const KEY = "test-key";
const deadline = setTimeout(() => fail("the whole test took over 90 s"), 90_000);
let server;

function fail(msg) {
    console.error("FAIL:", msg);
    if (server) server.kill("SIGKILL");
    process.exit(1);
}

// Starts the server on a free port (--port 0) and reads the port from its stdout line.
function start() {
    return new Promise((resolve, reject) => {
        server = spawn(exl3, ["serve", "-m", modelDir, "--port", "0", "-c", "256", "--api-key", KEY,
                              "--max-body-mb", "1", "--max-queue", "96", "-t", "2"],
                       { stdio: ["ignore", "pipe", "inherit"] });
        let out = "";
        server.stdout.on("data", (d) => {
            out += d;
            const m = out.match(/listening on (http:\/\/[0-9.]+:\d+)/);
            if (m) resolve(m[1]);
        });
        server.on("exit", (code) => reject(new Error(`exl3 serve exited with ${code} before listening`)));
        setTimeout(() => reject(new Error("exl3 serve did not listen within 20 s")), 20_000);
    });
}

const base = await start().catch((e) => fail(e.message));
server.on("exit", (code) => fail(`the server died (exit ${code})`));
const client = new OpenAI({ apiKey: KEY, baseURL: base + "/v1", maxRetries: 0, timeout: 30_000 });
const MODEL = modelDir.split("/").filter(Boolean).pop();
const msgs = [{ role: "system", content: "Be brief." }, { role: "user", content: "Say hello." }];

async function raw(method, path, body, { key = KEY, type = "application/json" } = {}) {
    const headers = { "Content-Type": type };
    if (key !== null) headers.Authorization = `Bearer ${key}`;
    const r = await fetch(base + path, { method, headers, body });
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
        const long = "word ".repeat(600);
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
        assert.ok(r.usage.total_tokens <= 256);
        await healthy();
    },
    async disconnect() {
        const ac = new AbortController();
        const stream = await client.chat.completions.create({ model: MODEL, messages: msgs, max_tokens: 200,
                                                              ignore_eos: true, stream: true }, { signal: ac.signal });
        let n = 0;
        try {
            for await (const _ of stream) if (++n === 3) ac.abort();
        } catch { /* the abort */ }
        // The server notices at its next write and cancels the job.
        for (let i = 0; i < 50; i++) {
            const m = await raw("GET", "/metrics");
            if (/exl3_cancelled_total [1-9]/.test(m.text) && /exl3_queue_depth 0/.test(m.text)) return;
            await new Promise((r) => setTimeout(r, 100));
        }
        assert.fail("the disconnected client's job was not cancelled");
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

const only = process.env.EXL3_SERVER_TESTS ? process.env.EXL3_SERVER_TESTS.split(",") : Object.keys(tests);
let failed = 0;
for (const name of only) {
    const t0 = Date.now();
    try {
        await tests[name]();
        console.log(`ok   ${name} (${Date.now() - t0} ms)`);
    } catch (e) {
        failed++;
        console.log(`FAIL ${name}: ${e.stack || e}`);
    }
}
server.removeAllListeners("exit");
server.kill("SIGTERM");
const code = await new Promise((r) => server.on("exit", (c, sig) => r(c ?? sig)));
clearTimeout(deadline);
if (code !== 0) fail(`the server exited with ${code} on SIGTERM`);
console.log(failed ? `${failed} failed` : "all passed");
process.exit(failed ? 1 : 0);
