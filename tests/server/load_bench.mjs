// Load benchmark for an OpenAI-compatible server (exl3 serve, or any other): N concurrent clients, each sending R
// streaming chat requests one after another. Prints throughput (generated tokens per second over the wall time, and
// per request while decoding) and latency percentiles: time to first token (TTFT) and total time per request.
// Tokens are counted from the server's usage chunk (stream_options.include_usage), not estimated from text.
// No dependencies beyond Node 18+ (fetch), so it runs on a machine without npm or network.
//
//   node tests/server/load_bench.mjs --url http://127.0.0.1:8000 --clients 64 --requests 4 --max-tokens 256
//
// Options: --url (base, without /v1), --clients N, --requests R (per client), --max-tokens T, --prompt-words W (a
// user prompt of about W words; default 64), --model NAME (default: the first of /v1/models), --api-key KEY,
// --temperature X (default 0.8), --ignore-eos (every request generates exactly T tokens), --warmup K (requests sent
// one at a time first and not counted; default 1), --json (also print the summary as one JSON line).
import { performance } from "node:perf_hooks";

function parseArgs(argv) {
    const o = { url: "http://127.0.0.1:8000", clients: 32, requests: 4, maxTokens: 128, promptWords: 64,
                model: null, apiKey: null, temperature: 0.8, ignoreEos: false, warmup: 1, json: false };
    const num = (v, name) => {
        const x = Number(v);
        if (!Number.isFinite(x) || x < 0) throw new Error(`${name} needs a non-negative number, got '${v}'`);
        return x;
    };
    for (let i = 0; i < argv.length; i++) {
        const a = argv[i], v = () => {
            if (i + 1 >= argv.length) throw new Error(`${a} needs a value`);
            return argv[++i];
        };
        switch (a) {
            case "--url": o.url = v().replace(/\/+$/, "").replace(/\/v1$/, ""); break;
            case "--clients": o.clients = num(v(), a); break;
            case "--requests": o.requests = num(v(), a); break;
            case "--max-tokens": o.maxTokens = num(v(), a); break;
            case "--prompt-words": o.promptWords = num(v(), a); break;
            case "--model": o.model = v(); break;
            case "--api-key": o.apiKey = v(); break;
            case "--temperature": o.temperature = num(v(), a); break;
            case "--ignore-eos": o.ignoreEos = true; break;
            case "--warmup": o.warmup = num(v(), a); break;
            case "--json": o.json = true; break;
            case "-h": case "--help":
                console.log("usage: node load_bench.mjs --url URL [--clients N] [--requests R] [--max-tokens T] " +
                            "[--prompt-words W] [--model M] [--api-key K] [--temperature X] [--ignore-eos] " +
                            "[--warmup K] [--json]");
                process.exit(0);
            default: throw new Error(`unknown option ${a} (see --help)`);
        }
    }
    if (o.clients < 1 || o.requests < 1 || o.maxTokens < 1) throw new Error("--clients, --requests, --max-tokens >= 1");
    return o;
}

const WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly pack their boxes of liquor " +
               "and every river runs to the sea under a pale moon").split(" ");

// A prompt of about `words` words, different per request so that no cache can answer it whole.
function prompt(words, seed) {
    const out = [`Request ${seed}: continue this story.`];
    for (let i = 0; i < words; i++) out.push(WORDS[(seed * 7 + i * 13) % WORDS.length]);
    return out.join(" ");
}

function headers(o) {
    const h = { "Content-Type": "application/json" };
    if (o.apiKey) h.Authorization = `Bearer ${o.apiKey}`;
    return h;
}

// One streaming request. Returns {ok, ttft, total, completion, prompt, error} (times in ms).
async function one(o, seed) {
    const t0 = performance.now();
    let ttft = null, usage = null, finish = null, chunks = 0;
    try {
        const body = { model: o.model, messages: [{ role: "user", content: prompt(o.promptWords, seed) }],
                       max_tokens: o.maxTokens, temperature: o.temperature, seed, stream: true,
                       stream_options: { include_usage: true } };
        if (o.ignoreEos) body.ignore_eos = true;
        const r = await fetch(`${o.url}/v1/chat/completions`, { method: "POST", headers: headers(o),
                                                                body: JSON.stringify(body) });
        if (!r.ok) return { ok: false, error: `HTTP ${r.status}: ${(await r.text()).slice(0, 200)}` };
        const decoder = new TextDecoder();
        let buf = "", done = false;
        for await (const bytes of r.body) {
            buf += decoder.decode(bytes, { stream: true });
            let nl;
            while ((nl = buf.indexOf("\n\n")) >= 0) {
                const event = buf.slice(0, nl);
                buf = buf.slice(nl + 2);
                for (const line of event.split("\n")) {
                    if (!line.startsWith("data: ")) continue;  // comments (keep-alive) and the like
                    const data = line.slice(6);
                    if (data === "[DONE]") {
                        done = true;
                        continue;
                    }
                    const chunk = JSON.parse(data);
                    if (chunk.error) return { ok: false, error: chunk.error.message };
                    chunks++;
                    if (chunk.usage) usage = chunk.usage;
                    for (const c of chunk.choices ?? []) {
                        if (ttft === null && (c.delta?.content || c.delta?.tool_calls)) ttft = performance.now() - t0;
                        if (c.finish_reason) finish = c.finish_reason;
                    }
                }
            }
        }
        const total = performance.now() - t0;
        if (!done) return { ok: false, error: "the stream ended without [DONE]" };
        if (!usage) return { ok: false, error: "no usage chunk (stream_options.include_usage)" };
        if (!finish) return { ok: false, error: "no finish_reason" };
        return { ok: true, ttft: ttft ?? total, total, completion: usage.completion_tokens,
                 prompt: usage.prompt_tokens, chunks };
    } catch (e) {
        return { ok: false, error: String(e?.cause?.code ?? e?.message ?? e) };
    }
}

function percentile(sorted, p) {
    if (sorted.length === 0) return NaN;
    const rank = (p / 100) * (sorted.length - 1);
    const lo = Math.floor(rank), hi = Math.ceil(rank);
    return sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo);
}

function stats(values) {
    const s = [...values].sort((a, b) => a - b);
    return { p10: percentile(s, 10), p50: percentile(s, 50), p90: percentile(s, 90), p99: percentile(s, 99),
             max: s[s.length - 1] ?? NaN };
}

async function main() {
    let o;
    try {
        o = parseArgs(process.argv.slice(2));
    } catch (e) {
        console.error(`load_bench: ${e.message}`);
        process.exit(2);
    }
    if (!o.model) {
        const r = await fetch(`${o.url}/v1/models`, { headers: headers(o) }).catch((e) => e);
        if (!(r instanceof Response) || !r.ok) {
            console.error(`load_bench: cannot list models at ${o.url}/v1/models: ${r.status ?? r.message}`);
            process.exit(1);
        }
        o.model = (await r.json()).data?.[0]?.id;
    }
    for (let i = 0; i < o.warmup; i++) {
        const w = await one(o, 1_000_000 + i);
        if (!w.ok) {
            console.error(`load_bench: the warm-up request failed: ${w.error}`);
            process.exit(1);
        }
    }
    console.log(`load_bench: ${o.clients} clients x ${o.requests} streaming requests, max_tokens ${o.maxTokens}` +
                `${o.ignoreEos ? " (ignore_eos)" : ""}, ~${o.promptWords}-word prompts, model '${o.model}' at ${o.url}`);
    const t0 = performance.now();
    const results = (await Promise.all(Array.from({ length: o.clients }, async (_, c) => {
        const mine = [];
        for (let k = 0; k < o.requests; k++) mine.push(await one(o, c * o.requests + k));
        return mine;
    }))).flat();
    const wall = (performance.now() - t0) / 1000;

    const ok = results.filter((r) => r.ok), failed = results.filter((r) => !r.ok);
    const completion = ok.reduce((a, r) => a + r.completion, 0), promptTokens = ok.reduce((a, r) => a + r.prompt, 0);
    const ttft = stats(ok.map((r) => r.ttft)), total = stats(ok.map((r) => r.total));
    // Per request while decoding: tokens after the first over the time after the first.
    const decode = stats(ok.filter((r) => r.completion > 1 && r.total > r.ttft)
                           .map((r) => (r.completion - 1) / ((r.total - r.ttft) / 1000)));
    const f = (x, d = 1) => (Number.isFinite(x) ? x.toFixed(d) : "n/a");
    console.log(`requests      ${ok.length} ok, ${failed.length} failed, in ${f(wall, 2)} s`);
    console.log(`tokens        ${completion} generated, ${promptTokens} prompt`);
    console.log(`throughput    ${f(completion / wall)} generated tok/s, ${f(promptTokens / wall)} prompt tok/s, ` +
                `${f(ok.length / wall, 2)} requests/s`);
    console.log(`decode/req    p50 ${f(decode.p50)} tok/s, p10 ${f(decode.p10)} tok/s (one request's speed after its ` +
                `first token)`);
    console.log(`TTFT ms       p50 ${f(ttft.p50)}  p90 ${f(ttft.p90)}  p99 ${f(ttft.p99)}  max ${f(ttft.max)}`);
    console.log(`total ms      p50 ${f(total.p50)}  p90 ${f(total.p90)}  p99 ${f(total.p99)}  max ${f(total.max)}`);
    if (failed.length) {
        const kinds = {};
        for (const r of failed) kinds[r.error] = (kinds[r.error] ?? 0) + 1;
        for (const [e, n] of Object.entries(kinds)) console.log(`failed        ${n} x ${e}`);
    }
    if (o.json)
        console.log(JSON.stringify({ clients: o.clients, requests: results.length, ok: ok.length, failed: failed.length,
                                     wall_s: wall, completion_tokens: completion, prompt_tokens: promptTokens,
                                     gen_tok_s: completion / wall, ttft_ms: ttft, total_ms: total,
                                     decode_tok_s: decode }));
    process.exit(failed.length ? 1 : 0);
}

await main();
