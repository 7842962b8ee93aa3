// exl3 serve's model management as TabbyAPI's clients use it, with tiny-target and tiny-draft as two models under
// --models-dir: GET /v1/model and /v1/model/list, POST /v1/model/load (progress as server-sent events) and /unload
// with the admin key, /v1/token/encode and /decode, --model-switch, --idle-unload, and what happens to requests in
// flight when the model goes (they finish, or end with an error that says why; none is lost). Bad input on every
// route gets its error object and status, and the server stays up.
// Usage: node management_test.mjs EXL3_BINARY FALLBACK_MODEL_DIR [SHARED_DIR].
import assert from "node:assert/strict";
import { copyFileSync, mkdirSync, writeFileSync } from "node:fs";
import path from "node:path";
import OpenAI from "openai";
import { modelsDir, parseEvents, request, runTests, startServer, stopServer, testModels } from "./harness.mjs";

const [exl3, fallbackModel, sharedArg] = process.argv.slice(2);
const { target, draft } = testModels(fallbackModel, sharedArg);
const dir = modelsDir({ "tiny-target": target, "tiny-draft": draft });
mkdirSync(path.join(dir, "no-config"));                       // not a model: no config.json
mkdirSync(path.join(dir, "broken"));                          // a config but no weights: its load fails
copyFileSync(path.join(draft, "config.json"), path.join(dir, "broken", "config.json"));
writeFileSync(path.join(dir, "a-file"), "not a directory");
const USER = "user-key", ADMIN = "admin-key";
const deadline = setTimeout(() => { console.error("FAIL: the whole test took over 170 s"); process.exit(1); }, 170_000);
const running = new Set();

async function serve(args) {
    const s = await startServer(exl3, ["--models-dir", dir, "-t", "2", "-c", "2048", ...args]);
    running.add(s.proc);
    s.proc.on("exit", (code) => { console.error(`FAIL: a server died (exit ${code})`); process.exit(1); });
    return s;
}
async function close(s) {
    running.delete(s.proc);
    assert.equal(await stopServer(s.proc), 0, "the server exits cleanly on SIGTERM");
}

const user = { Authorization: `Bearer ${USER}` };
const admin = { "x-admin-key": ADMIN };
const hello = [{ role: "user", content: "Say hello." }];

function expectError(r, status, what, code) {
    assert.equal(r.status, status, `${what}: status ${r.status}, body ${r.text.slice(0, 300)}`);
    assert.equal(typeof r.json?.error?.message, "string", `${what}: an error object`);
    if (code) assert.equal(r.json.error.code, code, `${what}: ${r.text}`);
}

// POST /v1/model/load: the events streamed, the last one checked.
async function load(base, body, headers = admin) {
    const r = await request(base, "POST", "/v1/model/load", body, headers);
    if (r.status !== 200) return { status: r.status, r };
    assert.match(r.headers.get("content-type"), /text\/event-stream/);
    const events = parseEvents(r.text).map((e) => e.data);
    return { status: 200, events, last: events.at(-1) };
}

const chat = (base, body, headers = user) =>
    request(base, "POST", "/v1/chat/completions", { messages: hello, max_tokens: 4, temperature: 0, ...body }, headers);

// A long streaming reply, started and read in the background: resolves with {finish, error, tokens}.
function longStream(base, model, maxTokens) {
    return (async () => {
        const r = await fetch(`${base}/v1/chat/completions`, {
            method: "POST", headers: { ...user, "Content-Type": "application/json" },
            body: JSON.stringify({ model, messages: hello, max_tokens: maxTokens, ignore_eos: true, stream: true,
                                   stream_options: { include_usage: true } }),
        });
        const events = parseEvents(await r.text()).map((e) => e.data);
        const error = events.find((e) => e?.error)?.error;
        const finish = events.flatMap((e) => e?.choices ?? []).find((c) => c.finish_reason)?.finish_reason;
        const usage = events.find((e) => e?.usage)?.usage;
        return { status: r.status, finish, error, tokens: usage?.completion_tokens };
    })();
}

// Waits until /health says the server has jobs running (the long request has started).
async function busy(base) {
    for (let i = 0; i < 200; i++) {
        if ((await request(base, "GET", "/health")).json.jobs > 0) return;
        await new Promise((r) => setTimeout(r, 10));
    }
    assert.fail("the long request never started");
}

const tests = {
    async tabbyRoutes() {
        const s = await serve(["-m", "tiny-target", "--api-key", USER, "--admin-key", ADMIN]);
        try {
            const m = await request(s.base, "GET", "/v1/model", undefined, user);
            assert.equal(m.status, 200);
            assert.equal(m.json.id, "tiny-target");
            assert.equal(m.json.object, "model");
            assert.equal(m.json.parameters.max_seq_len, 2048);
            assert.equal(m.json.parameters.cache_mode, "FP16");
            // A user sees the loaded model; the admin every model under --models-dir (directories with config.json).
            const mine = await request(s.base, "GET", "/v1/model/list", undefined, { "x-api-key": USER });
            assert.deepEqual(mine.json.data.map((x) => x.id), ["tiny-target"]);
            const all = await request(s.base, "GET", "/v1/model/list", undefined, admin);
            assert.deepEqual(all.json.data.map((x) => x.id).sort(), ["broken", "tiny-draft", "tiny-target"]);
            const perm = async (h) => (await request(s.base, "GET", "/v1/auth/permission", undefined, h)).json;
            assert.deepEqual(await perm(admin), { permission: "admin" });
            assert.deepEqual(await perm(user), { permission: "api" });
            // The admin key is good for user routes; the user key is not good for loads.
            assert.equal((await chat(s.base, {}, { Authorization: `Bearer ${ADMIN}` })).status, 200);
            expectError(await request(s.base, "POST", "/v1/model/load", { name: "tiny-draft" }, user), 401,
                        "a load with the user key", "invalid_admin_key");
            expectError(await request(s.base, "POST", "/v1/model/unload", undefined, { "x-admin-key": "wrong" }), 401,
                        "an unload with a wrong admin key");
            expectError(await request(s.base, "GET", "/v1/model"), 401, "no key");
            // Tokens, TabbyAPI's way.
            const enc = await request(s.base, "POST", "/v1/token/encode", { text: "hello world" }, user);
            assert.equal(enc.status, 200, enc.text);
            assert.equal(enc.json.length, enc.json.tokens.length);
            const noBos = await request(s.base, "POST", "/v1/token/encode",
                                        { text: "hello world", add_bos_token: false }, user);
            assert.ok(noBos.json.length <= enc.json.length);
            const dec = await request(s.base, "POST", "/v1/token/decode", { tokens: enc.json.tokens }, user);
            assert.ok(dec.json.text.includes("hello world"), dec.text);
            const msgs = await request(s.base, "POST", "/v1/token/encode", { text: hello }, user);
            assert.ok(msgs.json.length > noBos.json.length);
            const back = await request(s.base, "POST", "/v1/token/decode", { tokens: msgs.json.tokens }, user);
            assert.ok(back.json.text.includes("Say hello."), back.text);
            expectError(await request(s.base, "POST", "/v1/token/encode", { text: 5 }, user), 400, "text as a number");
            expectError(await request(s.base, "POST", "/v1/token/encode", { text: "x", add_bos_token: "yes" }, user),
                        400, "add_bos_token as a string");
            expectError(await request(s.base, "POST", "/v1/token/decode", { tokens: [1, 1e9] }, user), 400,
                        "a token id past the vocabulary");
            expectError(await request(s.base, "POST", "/v1/token/decode", { tokens: "1 2" }, user), 400,
                        "tokens as a string");
        } finally {
            await close(s);
        }
    },
    async loadAndUnload() {
        const s = await serve(["-m", "tiny-target", "--api-key", USER, "--admin-key", ADMIN]);
        try {
            const l = await load(s.base, { name: "tiny-draft" });
            assert.equal(l.status, 200);
            assert.equal(l.last.status, "finished", JSON.stringify(l.events));
            for (const e of l.events) {
                assert.equal(e.model_type, "model");
                assert.ok(e.module >= 1 && e.module <= e.modules, JSON.stringify(e));
            }
            assert.equal((await request(s.base, "GET", "/v1/model", undefined, user)).json.id, "tiny-draft");
            const r = await chat(s.base, {});
            assert.equal(r.status, 200);
            assert.equal(r.json.model, "tiny-draft");
            expectError(await chat(s.base, { model: "tiny-target" }), 404, "the model not loaded", "model_not_found");
            // The same model again: finished at once.
            const again = await load(s.base, { name: "tiny-draft" }, { Authorization: `Bearer ${ADMIN}` });
            assert.deepEqual(again.events.map((e) => e.status), ["finished"]);
            // With a cache mode and a context of its own.
            const q = await load(s.base, { name: "tiny-target", max_seq_len: 1024, cache_mode: "Q8" });
            assert.equal(q.last.status, "finished");
            const card = (await request(s.base, "GET", "/v1/model", undefined, user)).json;
            assert.equal(card.parameters.max_seq_len, 1024);
            assert.equal(card.parameters.cache_mode, "Q8");
            assert.equal((await chat(s.base, {})).status, 200);
            // Unload: nothing loaded, a clear 503 for requests, 400 for a second unload.
            const u = await request(s.base, "POST", "/v1/model/unload", undefined, admin);
            assert.equal(u.status, 200, u.text);
            expectError(await request(s.base, "GET", "/v1/model", undefined, user), 503, "no model", "model_not_loaded");
            expectError(await chat(s.base, {}), 503, "chat with no model", "model_not_loaded");
            expectError(await request(s.base, "POST", "/v1/messages", { max_tokens: 4, messages: hello }, user), 503,
                        "messages with no model");
            expectError(await request(s.base, "POST", "/v1/model/unload", "{}", admin), 400, "a second unload",
                        "model_not_loaded");
            assert.equal((await load(s.base, { name: "tiny-target" })).last.status, "finished");
            assert.equal((await chat(s.base, {})).status, 200);
            const metrics = (await request(s.base, "GET", "/metrics", undefined, user)).text;
            assert.match(metrics, /exl3_model_loads_total 4/);
            assert.match(metrics, /exl3_model_loaded 1/);
        } finally {
            await close(s);
        }
    },
    async badLoads() {
        const s = await serve(["-m", "tiny-target", "--admin-key", ADMIN]);
        try {
            const bad = async (body, status, what, code) =>
                expectError(await request(s.base, "POST", "/v1/model/load", body, admin), status, what, code);
            await bad({}, 400, "no name", "missing_required");
            await bad({ name: 7 }, 400, "name as a number");
            await bad({ name: "../tiny-target" }, 400, "a path out of --models-dir", "invalid_value");
            await bad({ name: "/etc" }, 400, "an absolute path", "invalid_value");
            await bad({ name: "tiny-target/.." }, 400, "a path inside the name", "invalid_value");
            await bad({ name: ".." }, 400, "..", "invalid_value");
            await bad({ name: "" }, 400, "an empty name", "invalid_value");
            await bad({ name: "nope" }, 404, "a model that is not there", "model_not_found");
            await bad({ name: "no-config" }, 404, "a directory without config.json", "model_not_found");
            await bad({ name: "a-file" }, 404, "a file", "model_not_found");
            await bad({ name: "tiny-draft", cache_mode: "Q5" }, 400, "an unknown cache mode");
            await bad({ name: "tiny-draft", max_seq_len: "long" }, 400, "max_seq_len as a string");
            await bad({ name: "tiny-draft", draft: { draft_model_name: "../x" } }, 400, "a draft path");
            await bad({ name: "tiny-draft", skip_queue: "yes" }, 400, "skip_queue as a string");
            await bad("{oops", 400, "malformed JSON", "invalid_json");
            await bad(Buffer.from([0x7b, 0x22, 0x6e, 0x61, 0x6d, 0x65, 0x22, 0x3a, 0x22, 0xff, 0x22, 0x7d]), 400,
                      "invalid UTF-8", "invalid_json");
            expectError(await request(s.base, "POST", "/v1/model/unload", "{not json", admin), 400, "unload, bad JSON");
            // Still serving the model it had.
            assert.equal((await request(s.base, "GET", "/v1/model")).json.id, "tiny-target");
            // A model whose load fails: the error comes in the stream; no model is loaded after it.
            const f = await load(s.base, { name: "broken" });
            assert.equal(f.status, 200);
            assert.equal(typeof f.last.error?.message, "string", JSON.stringify(f.events));
            expectError(await chat(s.base, {}, {}), 503, "chat after a failed load", "model_not_loaded");
            assert.equal((await load(s.base, { name: "tiny-target" })).last.status, "finished");
            assert.equal((await chat(s.base, {}, {})).status, 200);
            // A draft model for speculative decoding, by name.
            const d = await load(s.base, { name: "tiny-target", draft: { draft_model_name: "tiny-draft" } });
            assert.deepEqual(d.events.map((e) => e.model_type), ["model", "model", "draft", "model"]);
            assert.equal((await request(s.base, "GET", "/v1/model")).json.parameters.draft.id, "tiny-draft");
            assert.equal((await chat(s.base, {}, {})).status, 200);
        } finally {
            await close(s);
        }
    },
    async noAdminKey() {
        // With user keys but no admin key, loads are refused (403); a server without keys lets anyone load.
        const s = await serve(["-m", "tiny-target", "--api-key", USER]);
        try {
            expectError(await request(s.base, "POST", "/v1/model/load", { name: "tiny-draft" }, user), 403,
                        "a load without --admin-key", "no_admin_key");
            expectError(await request(s.base, "POST", "/v1/model/unload", undefined, user), 403, "an unload");
        } finally {
            await close(s);
        }
        const open = await serve([]);  // no -m: starts with no model
        try {
            expectError(await chat(open.base, {}, {}), 503, "no model yet", "model_not_loaded");
            assert.equal((await load(open.base, { name: "tiny-draft" }, {})).last.status, "finished");
            assert.equal((await chat(open.base, {}, {})).status, 200);
        } finally {
            await close(open);
        }
    },
    async inFlightFinish() {
        // A load while a reply is being generated: the load waits for it (drain), the reply finishes whole, and a
        // second load meanwhile is refused (409); requests that arrive during the switch wait for the new model.
        const s = await serve(["-m", "tiny-target", "--api-key", USER, "--admin-key", ADMIN]);
        try {
            const long = longStream(s.base, "tiny-target", 600);
            await busy(s.base);
            const loading = load(s.base, { name: "tiny-draft" });
            await new Promise((r) => setTimeout(r, 100));
            expectError(await request(s.base, "POST", "/v1/model/load", { name: "tiny-target" }, admin), 409,
                        "a load while loading", "model_loading");
            expectError(await request(s.base, "POST", "/v1/model/unload", undefined, admin), 409,
                        "an unload while loading", "model_loading");
            const waiting = chat(s.base, {});  // waits for tiny-draft
            const done = await long;
            assert.equal(done.status, 200);
            assert.equal(done.error, undefined, JSON.stringify(done.error));
            assert.equal(done.finish, "length");
            assert.equal(done.tokens, 600, "the reply in flight finished whole");
            assert.equal((await loading).last.status, "finished");
            const w = await waiting;
            assert.equal(w.status, 200, w.text);
            assert.equal(w.json.model, "tiny-draft");
        } finally {
            await close(s);
        }
    },
    async inFlightEnded() {
        // --drain-timeout 0.. here 1 s: a reply still running then ends with an error that says why, streamed or
        // not; skip_queue ends it at once.
        const s = await serve(["-m", "tiny-target", "--admin-key", ADMIN, "--drain-timeout", "1"]);
        try {
            const streamed = longStream(s.base, "tiny-target", 1900);
            const whole = request(s.base, "POST", "/v1/chat/completions",
                                  { messages: hello, max_tokens: 1900, ignore_eos: true });
            await busy(s.base);
            const t0 = Date.now();
            const u = await request(s.base, "POST", "/v1/model/unload", undefined, admin);
            assert.equal(u.status, 200);
            assert.ok(Date.now() - t0 >= 900, "the unload waited for the drain timeout");
            const st = await streamed;
            assert.match(st.error?.message ?? "", /unloaded/, JSON.stringify(st));
            const w = await whole;
            assert.match(w.json?.error?.message ?? "", /unloaded/, w.text.slice(0, 300));
            assert.equal((await load(s.base, { name: "tiny-target" })).last.status, "finished");
            const again = longStream(s.base, "tiny-target", 1900);
            await busy(s.base);
            const t1 = Date.now();
            const skip = await load(s.base, { name: "tiny-draft", skip_queue: true });
            assert.equal(skip.last.status, "finished");
            assert.ok(Date.now() - t1 < 900, "skip_queue does not wait");
            assert.match((await again).error?.message ?? "", /unloaded to load 'tiny-draft'/);
            assert.equal((await request(s.base, "GET", "/health")).json.status, "ok");
        } finally {
            await close(s);
        }
    },
    async modelSwitch() {
        const s = await serve(["-m", "tiny-target", "--api-key", USER, "--model-switch"]);
        try {
            const client = new OpenAI({ apiKey: USER, baseURL: `${s.base}/v1`, maxRetries: 0, timeout: 30_000 });
            const ids = [];
            for await (const m of client.models.list()) ids.push(m.id);
            assert.deepEqual(ids.sort(), ["broken", "tiny-draft", "tiny-target"]);
            const a = await client.chat.completions.create({ model: "tiny-draft", messages: hello, max_tokens: 4 });
            assert.equal(a.model, "tiny-draft");
            const b = await client.chat.completions.create({ model: "tiny-target", messages: hello, max_tokens: 4 });
            assert.equal(b.model, "tiny-target");
            // Many requests for both models at once: every one is answered by the model it named.
            const all = await Promise.all(Array.from({ length: 12 }, (_, i) => {
                const model = i % 2 ? "tiny-draft" : "tiny-target";
                return client.chat.completions.create({ model, messages: hello, max_tokens: 6 })
                    .then((r) => assert.equal(r.model, model));
            }));
            assert.equal(all.length, 12);
            expectError(await chat(s.base, { model: "gpt-4" }), 404, "a model not under --models-dir",
                        "model_not_found");
            expectError(await chat(s.base, { model: "../tiny-target" }), 404, "a path", "model_not_found");
            const f = await chat(s.base, { model: "broken" });
            expectError(f, 503, "a model whose load fails", "model_load_failed");
            assert.equal((await chat(s.base, { model: "tiny-target" })).status, 200);
            // Anthropic requests switch too.
            const m = await request(s.base, "POST", "/v1/messages",
                                    { model: "tiny-draft", max_tokens: 4, messages: hello }, { "x-api-key": USER });
            assert.equal(m.status, 200, m.text);
            assert.equal(m.json.model, "tiny-draft");
        } finally {
            await close(s);
        }
        // Without --model-switch another model is a 404, as before.
        const fixed = await serve(["-m", "tiny-target"]);
        try {
            expectError(await chat(fixed.base, { model: "tiny-draft" }, {}), 404, "no switching", "model_not_found");
        } finally {
            await close(fixed);
        }
    },
    async idleUnload() {
        const s = await serve(["-m", "tiny-target", "--idle-unload", "1"]);
        try {
            assert.equal((await chat(s.base, {}, {})).status, 200);
            let state = "";
            for (let i = 0; i < 50 && state !== "unloaded"; i++) {
                await new Promise((r) => setTimeout(r, 100));
                state = (await request(s.base, "GET", "/health")).json.model_state;
            }
            assert.equal(state, "unloaded", "unloaded after a second without requests");
            // Still listed, and the next request loads it again.
            const list = await request(s.base, "GET", "/v1/models");
            assert.deepEqual(list.json.data.map((m) => m.id), ["tiny-target"]);
            const r = await chat(s.base, {}, {});
            assert.equal(r.status, 200, r.text);
            assert.equal(r.json.model, "tiny-target");
            assert.match((await request(s.base, "GET", "/metrics")).text, /exl3_model_loads_total 2/);
        } finally {
            await close(s);
        }
    },
};

const failed = await runTests(tests);
for (const p of running) await stopServer(p);
clearTimeout(deadline);
console.log(failed ? `${failed} failed` : "all passed");
process.exit(failed ? 1 : 0);
