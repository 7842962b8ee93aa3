// exl3 serve driven by clients nobody here wrote, against the real tiny model: the Vercel AI SDK (`ai` with
// @ai-sdk/openai-compatible), LangChain.js (@langchain/openai) and the official Anthropic SDK on /v1/messages, plus
// the Messages API's wire format (event order, stop reasons, errors) read raw.
// Usage: node clients_test.mjs EXL3_BINARY FALLBACK_MODEL_DIR [SHARED_DIR].
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import Anthropic from "@anthropic-ai/sdk";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { ChatOpenAI } from "@langchain/openai";
import { tool as lcTool } from "@langchain/core/tools";
import { generateObject, generateText, stepCountIs, streamText, tool } from "ai";
import { z } from "zod";
import { finish, parseEvents, request, runTests, startServer, stopServer, testModels } from "./harness.mjs";

const [exl3, fallbackModel, sharedArg] = process.argv.slice(2);
const { shared, target } = testModels(fallbackModel, sharedArg);
const KEY = "client-key";
const deadline = setTimeout(() => { console.error("FAIL: the whole test took over 200 s"); process.exit(1); }, 200_000);
const { proc, base } = await startServer(exl3, ["-m", target, "-c", "1024", "--api-key", KEY, "-t", "2",
                                                "--max-body-mb", "1"]);
proc.on("exit", (code) => { console.error(`FAIL: the server died (exit ${code})`); process.exit(1); });
const MODEL = target.split("/").filter(Boolean).pop();
const auth = { Authorization: `Bearer ${KEY}` };
const post = (path, body, headers = auth) => request(base, "POST", path, body, headers);

// The OpenAI route's greedy reply to a conversation: what every client must get for the same one.
async function openaiReply(messages, max_tokens) {
    const r = await post("/v1/chat/completions", { model: MODEL, messages, max_tokens, temperature: 0 });
    assert.equal(r.status, 200, r.text);
    return r.json.choices[0].message.content;
}

// Sampling that makes the tiny model write a forced get_time call's arguments "{}" and stop, deterministically:
// logit bias on "{", "}", " }" and the end of turn, and a repetition penalty over the last 4 tokens (as
// server_test.mjs does).
async function forcedCallSampling() {
    const id = async (text) => {
        const r = await post("/tokenize", { prompt: text, add_special_tokens: false });
        assert.equal(r.json.tokens.length, 1, `'${text}' is one token`);
        return r.json.tokens[0];
    };
    return { logit_bias: { [await id("{")]: 100, [await id("}")]: 80, [await id(" }")]: 65,
                           [await id("<|im_end|>")]: 40 },
             repetition_penalty: 10, penalty_range: 4 };
}
const forced = await forcedCallSampling();

const hello = [{ role: "user", content: "Say hello." }];
const provider = createOpenAICompatible({ name: "exl3", baseURL: `${base}/v1`, apiKey: KEY,
                                          supportsStructuredOutputs: true, includeUsage: true });
const aiModel = provider.chatModel(MODEL);
const aiTools = (calls) => ({
    get_time: tool({ description: "The current time", inputSchema: z.object({}),
                     execute: async () => { calls.push("get_time"); return "12:00"; } }),
    get_weather: tool({ description: "The weather in a city", inputSchema: z.object({ city: z.string() }),
                        execute: async ({ city }) => `sunny in ${city}` }),
});
const llm = (extra = {}) => new ChatOpenAI({ model: MODEL, apiKey: KEY, configuration: { baseURL: `${base}/v1` },
                                             temperature: 0, maxTokens: 8, maxRetries: 0, ...extra });
const anthropic = new Anthropic({ apiKey: KEY, baseURL: base, maxRetries: 0, timeout: 30_000 });
const getTime = { name: "get_time", description: "The current time", input_schema: { type: "object", properties: {} } };

const tests = {
    async aiGenerateText() {
        const want = await openaiReply(hello, 8);
        const r = await generateText({ model: aiModel, messages: hello, maxOutputTokens: 8, temperature: 0 });
        assert.equal(r.text, want);
        assert.ok(["stop", "length"].includes(r.finishReason), r.finishReason);
        assert.ok(r.usage.inputTokens > 0 && r.usage.outputTokens >= 1 && r.usage.outputTokens <= 8);
    },
    async aiStreamText() {
        const want = await openaiReply(hello, 8);
        const r = streamText({ model: aiModel, messages: hello, maxOutputTokens: 8, temperature: 0 });
        let text = "";
        for await (const part of r.textStream) text += part;
        assert.equal(text, want);
        assert.ok((await r.usage).outputTokens >= 1);
    },
    async aiGenerateObject() {
        // response_format json_schema from a zod schema: the object comes back parsed and valid.
        const schema = z.object({ name: z.string().max(12), lit: z.boolean(), color: z.enum(["red", "white"]) });
        const r = await generateObject({ model: aiModel, schema, maxOutputTokens: 120, temperature: 0,
                                         prompt: "Describe a lighthouse as JSON." });
        assert.equal(typeof r.object.name, "string");
        assert.ok([...r.object.name].length <= 12);
        assert.equal(typeof r.object.lit, "boolean");
        assert.ok(["red", "white"].includes(r.object.color));
    },
    async aiForcedToolCall() {
        // A named tool choice: the call, its arguments under the tool's schema, executed by the SDK.
        const calls = [];
        const r = await generateText({ model: aiModel, tools: aiTools(calls), prompt: "What time is it?",
                                       toolChoice: { type: "tool", toolName: "get_time" }, maxOutputTokens: 8,
                                       temperature: 0, providerOptions: { exl3: forced } });
        assert.equal(r.toolCalls.length, 1, JSON.stringify(r.content));
        assert.equal(r.toolCalls[0].toolName, "get_time");
        assert.deepEqual(r.toolCalls[0].input, {});
        assert.equal(r.toolResults[0].output, "12:00");
        assert.equal(r.finishReason, "tool-calls");
        assert.deepEqual(calls, ["get_time"]);
        // Streamed: the same call as a tool-call part.
        const s = streamText({ model: aiModel, tools: aiTools([]), prompt: "What time is it?",
                               toolChoice: { type: "tool", toolName: "get_time" }, maxOutputTokens: 8,
                               temperature: 0, providerOptions: { exl3: forced } });
        const parts = [];
        for await (const part of s.fullStream) if (part.type === "tool-call") parts.push(part);
        assert.equal(parts.length, 1);
        assert.equal(parts[0].toolName, "get_time");
    },
    async aiTwoStepToolRoundTrip() {
        // Step 1 calls the tool (forced), the SDK runs it and sends the result back; step 2 answers in text.
        const calls = [];
        const r = await generateText({
            model: aiModel, tools: aiTools(calls), prompt: "What time is it?", stopWhen: stepCountIs(2),
            maxOutputTokens: 8, temperature: 0, providerOptions: { exl3: forced },
            prepareStep: ({ stepNumber }) => ({ toolChoice: stepNumber === 0 ? { type: "tool", toolName: "get_time" }
                                                                              : "none" }),
        });
        assert.equal(r.steps.length, 2);
        assert.equal(r.steps[0].toolCalls[0].toolName, "get_time");
        assert.deepEqual(calls, ["get_time"]);
        assert.equal(typeof r.steps[1].text, "string");
        const body = r.steps[1].request.body;
        const sent = typeof body === "string" ? body : JSON.stringify(body);
        assert.ok(sent.includes("12:00") && sent.includes('"role":"tool"'), sent);
    },
    async aiRequiredToolLoop() {
        // tool_choice "required": every step's reply is a call of one of the tools, under the union of their schemas.
        const calls = [];
        const r = await generateText({ model: aiModel, tools: aiTools(calls), prompt: "What time is it?",
                                       toolChoice: "required", stopWhen: stepCountIs(2), maxOutputTokens: 40,
                                       temperature: 0 });
        assert.equal(r.steps.length, 2);
        for (const step of r.steps) {
            assert.ok(step.toolCalls.length >= 1, JSON.stringify(step.content));
            assert.ok(["get_time", "get_weather"].includes(step.toolCalls[0].toolName));
            assert.equal(step.finishReason, "tool-calls");
        }
        // The first step's results went back to the second.
        const body = r.steps[1].request.body;
        assert.ok((typeof body === "string" ? body : JSON.stringify(body)).includes('"role":"tool"'));
    },
    async langchainInvokeAndStream() {
        const want = await openaiReply(hello, 8);
        const m = await llm().invoke(hello);
        assert.equal(m.content, want);
        assert.ok(m.usage_metadata.output_tokens >= 1);
        let text = "";
        for await (const chunk of await llm().stream(hello)) text += chunk.content;
        assert.equal(text, want);
    },
    async langchainBindTools() {
        const getTimeTool = lcTool(async () => "12:00", { name: "get_time", description: "The current time",
                                                           schema: z.object({}) });
        const bound = llm({ modelKwargs: forced }).bindTools([getTimeTool], { tool_choice: "get_time" });
        const m = await bound.invoke("What time is it?");
        assert.equal(m.tool_calls.length, 1, JSON.stringify(m));
        assert.equal(m.tool_calls[0].name, "get_time");
        assert.deepEqual(m.tool_calls[0].args, {});
        // The call and its result back in: an ordinary reply.
        const result = await getTimeTool.invoke(m.tool_calls[0]);
        const back = await llm().invoke([{ role: "user", content: "What time is it?" }, m, result]);
        assert.equal(typeof back.content, "string");
    },
    async langchainStructuredOutput() {
        const schema = z.object({ name: z.string().max(12), lit: z.boolean() });
        const v = await llm({ maxTokens: 80 }).withStructuredOutput(schema, { method: "jsonSchema", name: "lighthouse" })
            .invoke("Describe a lighthouse as JSON.");
        assert.equal(typeof v.name, "string");
        assert.equal(typeof v.lit, "boolean");
    },
    async anthropicPlain() {
        const system = "Be brief.";
        const want = await openaiReply([{ role: "system", content: system }, ...hello], 8);
        const m = await anthropic.messages.create({ model: MODEL, max_tokens: 8, temperature: 0, system,
                                                   messages: hello });
        assert.equal(m.type, "message");
        assert.equal(m.role, "assistant");
        assert.match(m.id, /^msg_/);
        assert.equal(m.model, MODEL);
        assert.equal(m.content.length, want.trim() ? 1 : 0);
        if (m.content.length) assert.deepEqual(m.content[0], { type: "text", text: want });
        assert.ok(["end_turn", "max_tokens"].includes(m.stop_reason), m.stop_reason);
        assert.ok(m.usage.input_tokens > 0 && m.usage.output_tokens >= 1 && m.usage.output_tokens <= 8);
        // system as text blocks is the same prompt.
        const blocks = await anthropic.messages.create({ model: MODEL, max_tokens: 8, temperature: 0,
                                                        system: [{ type: "text", text: system }], messages: hello });
        assert.deepEqual(blocks.content, m.content);
        const counted = await anthropic.messages.countTokens({ model: MODEL, system, messages: hello });
        assert.equal(counted.input_tokens, m.usage.input_tokens);
    },
    async anthropicStream() {
        const params = { model: MODEL, max_tokens: 12, temperature: 0, messages: hello };
        const whole = await anthropic.messages.create(params);
        const stream = anthropic.messages.stream(params);
        let text = "";
        stream.on("text", (t) => { text += t; });
        const final = await stream.finalMessage();
        assert.deepEqual(final.content, whole.content);
        assert.equal(final.stop_reason, whole.stop_reason);
        assert.equal(final.usage.output_tokens, whole.usage.output_tokens);
        assert.equal(text, whole.content[0]?.text ?? "");
        // The wire: message_start, then each block's start / deltas / stop, message_delta, message_stop.
        const r = await post("/v1/messages", { ...params, stream: true }, { "x-api-key": KEY });
        assert.equal(r.status, 200);
        assert.match(r.headers.get("content-type"), /text\/event-stream/);
        const events = parseEvents(r.text).filter((e) => e.event !== "ping");
        for (const e of events) assert.equal(e.event, e.data.type, "each event is named as its type");
        const types = events.map((e) => e.event);
        assert.equal(types[0], "message_start");
        assert.deepEqual(types.slice(-2), ["message_delta", "message_stop"]);
        const blocks = types.slice(1, -2);
        if (blocks.length) {
            assert.equal(blocks[0], "content_block_start");
            assert.equal(blocks.at(-1), "content_block_stop");
            assert.ok(blocks.slice(1, -1).every((t) => t === "content_block_delta"));
        }
        assert.equal(events[0].data.message.usage.input_tokens, whole.usage.input_tokens);
        assert.equal(events.at(-2).data.delta.stop_reason, whole.stop_reason);
    },
    async anthropicStopReasons() {
        const long = await anthropic.messages.create({ model: MODEL, max_tokens: 24, temperature: 0, messages: hello });
        const text = long.content[0].text;
        const m = await anthropic.messages.create({ model: MODEL, max_tokens: 2, temperature: 0, messages: hello });
        assert.equal(m.stop_reason, "max_tokens");
        // A stop sequence taken from the middle of the greedy reply: the text before it, and which one matched.
        const cut = text.slice(Math.floor(text.length / 2)).match(/\S{2,}/)?.[0];
        assert.ok(cut, `a word in the second half of: ${text}`);
        const s = await anthropic.messages.create({ model: MODEL, max_tokens: 24, temperature: 0, messages: hello,
                                                   stop_sequences: ["never appears here", cut] });
        assert.equal(s.stop_reason, "stop_sequence");
        assert.equal(s.stop_sequence, cut);
        assert.equal(s.content[0].text, text.slice(0, text.indexOf(cut)));
        const streamed = await anthropic.messages.stream({ model: MODEL, max_tokens: 24, temperature: 0,
                                                           messages: hello, stop_sequences: [cut] }).finalMessage();
        assert.equal(streamed.stop_reason, "stop_sequence");
        assert.equal(streamed.stop_sequence, cut);
        // A final assistant message is the reply's start: the reply continues it.
        const prefix = text.trim().split(/\s+/)[0];  // (a reply may start with a space)
        assert.ok(prefix, `a word in: ${text}`);
        const cont = await anthropic.messages.create({ model: MODEL, max_tokens: 6, temperature: 0,
                                                      messages: [...hello, { role: "assistant", content: prefix }] });
        assert.equal(cont.type, "message");
        const counted = await anthropic.messages.countTokens({ model: MODEL, messages: hello });
        assert.ok(cont.usage.input_tokens > counted.input_tokens, "the prefix is part of the prompt");
    },
    async anthropicToolUse() {
        const params = { model: MODEL, max_tokens: 8, temperature: 0, tools: [getTime],
                         tool_choice: { type: "tool", name: "get_time" },
                         messages: [{ role: "user", content: "What time is it?" }], ...forced };
        const m = await anthropic.messages.create(params);
        assert.equal(m.stop_reason, "tool_use", JSON.stringify(m));
        const use = m.content.find((b) => b.type === "tool_use");
        assert.ok(use && use.name === "get_time" && typeof use.id === "string", JSON.stringify(m.content));
        assert.deepEqual(use.input, {});
        const final = await anthropic.messages.stream(params).finalMessage();
        assert.equal(final.stop_reason, "tool_use");
        assert.deepEqual(final.content.map(({ id, ...b }) => b), m.content.map(({ id, ...b }) => b));
        // The round trip: the tool_use and its tool_result go back; the template renders both.
        const history = [...params.messages, { role: "assistant", content: m.content },
                         { role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content: "12:00" }] }];
        const back = await anthropic.messages.create({ model: MODEL, max_tokens: 8, temperature: 0, tools: [getTime],
                                                      messages: history });
        assert.ok(["end_turn", "max_tokens", "tool_use"].includes(back.stop_reason));
        const withResult = await anthropic.messages.countTokens({ model: MODEL, tools: [getTime], messages: history });
        const without = await anthropic.messages.countTokens({ model: MODEL, tools: [getTime],
                                                               messages: params.messages });
        assert.ok(withResult.input_tokens > without.input_tokens + 5);
        // tool_choice none: the tools are not offered at all.
        const none = await anthropic.messages.countTokens({ model: MODEL, tools: [getTime], messages: params.messages,
                                                            tool_choice: { type: "none" } });
        const bare = await anthropic.messages.countTokens({ model: MODEL, messages: params.messages });
        assert.equal(none.input_tokens, bare.input_tokens);
    },
    async anthropicToolChoiceAny() {
        // tool_choice any: a call of one of the tools, always (tool_choice "required" on the OpenAI route), its
        // input under that tool's input_schema (closed objects, as zod writes them: the tiny model fills an open one
        // until max_tokens).
        const closed = (properties, required = []) => ({ type: "object", properties, required,
                                                          additionalProperties: false });
        const tools = [{ ...getTime, input_schema: closed({}) },
                       { name: "get_weather", description: "The weather in a city",
                         input_schema: closed({ city: { type: "string", maxLength: 12 } }, ["city"]) }];
        const params = { model: MODEL, max_tokens: 40, temperature: 0, tools,
                         tool_choice: { type: "any" }, messages: [{ role: "user", content: "What time is it?" }] };
        const m = await anthropic.messages.create(params);
        assert.equal(m.stop_reason, "tool_use", JSON.stringify(m));
        const use = m.content.find((b) => b.type === "tool_use");
        assert.ok(use && ["get_time", "get_weather"].includes(use.name), JSON.stringify(m.content));
        if (use.name === "get_weather") assert.equal(typeof use.input.city, "string");
        const final = await anthropic.messages.stream(params).finalMessage();
        assert.equal(final.stop_reason, "tool_use");
        assert.deepEqual(final.content.map(({ id, ...b }) => b), m.content.map(({ id, ...b }) => b));
        // With a sampling seed instead of greedy, still a call every time.
        for (const seed of [1, 2, 3]) {
            const r = await anthropic.messages.create({ ...params, temperature: 1, seed });
            assert.equal(r.stop_reason, "tool_use", JSON.stringify(r));
        }
    },
    async anthropicThinking() {
        // QwQ's template opens <think> in the prompt, so the tiny model's reply starts inside reasoning: a thinking
        // block. thinking.budget_tokens is the reasoning budget: the server closes the block after that many tokens
        // and the answer follows as text, exactly as max_reasoning_tokens on the OpenAI route.
        const template = `${shared}/templates/Qwen-QwQ-32B.jinja`;
        if (!shared || !existsSync(template)) return "no ../shared/templates";
        const s = await startServer(exl3, ["-m", target, "-c", "1024", "-t", "2", "--chat-template", template]);
        try {
            const a = new Anthropic({ apiKey: "none", baseURL: s.base, maxRetries: 0, timeout: 30_000 });
            const params = { model: MODEL, max_tokens: 16, temperature: 0, messages: hello,
                             thinking: { type: "enabled", budget_tokens: 5 } };
            const m = await a.messages.create(params);
            assert.deepEqual(m.content.map((b) => b.type).slice(0, 1), ["thinking"], JSON.stringify(m.content));
            assert.ok(m.content.slice(1).every((b) => b.type === "text"), JSON.stringify(m.content));
            const [thinking, text] = m.content;
            assert.ok(thinking.thinking.length > 0 && !thinking.thinking.includes("</think>"), thinking.thinking);
            assert.equal(thinking.signature, "");
            // What the OpenAI route gives for the same request.
            const o = await request(s.base, "POST", "/v1/chat/completions", {
                model: MODEL, messages: hello, max_tokens: 16, temperature: 0, max_reasoning_tokens: 5 });
            assert.equal(o.json.usage.completion_tokens_details.reasoning_tokens, 5);
            assert.equal(thinking.thinking, o.json.choices[0].message.reasoning_content);
            assert.equal(text?.text ?? "", o.json.choices[0].message.content.trim() ? o.json.choices[0].message.content
                                                                                     : "");
            // Streamed through the SDK: thinking deltas, then the same message.
            let thought = "";
            const stream = a.messages.stream(params);
            stream.on("thinking", (delta) => { thought += delta; });
            const final = await stream.finalMessage();
            assert.deepEqual(final.content, m.content);
            assert.equal(thought, thinking.thinking);
            // The wire: a thinking block's start, its thinking_delta events, its stop, before any text block.
            const r = await request(s.base, "POST", "/v1/messages", { ...params, stream: true });
            const events = parseEvents(r.text).filter((e) => e.event !== "ping").map((e) => e.data);
            assert.deepEqual(events[1], { type: "content_block_start", index: 0,
                                          content_block: { type: "thinking", thinking: "", signature: "" } });
            const deltas = events.filter((e) => e.type === "content_block_delta" && e.index === 0);
            assert.ok(deltas.length >= 1 && deltas.every((e) => e.delta.type === "thinking_delta"));
            // No budget: the tiny model never closes the block; all of the reply is thinking.
            const open = await a.messages.create({ ...params, thinking: { type: "adaptive" } });
            assert.deepEqual(open.content.map((b) => b.type), ["thinking"], JSON.stringify(open.content));
            assert.equal(open.stop_reason, "max_tokens");
            // display "omitted": the block without its text.
            const omitted = await a.messages.create({ ...params,
                                                      thinking: { ...params.thinking, display: "omitted" } });
            assert.deepEqual(omitted.content[0], { type: "thinking", thinking: "", signature: "" });
            // The thinking block goes back in the history with the next turn (the template drops it).
            const next = await a.messages.create({ ...params, messages: [...hello,
                { role: "assistant", content: m.content.length > 1 ? m.content : [...m.content,
                                                                                   { type: "text", text: "Hi." }] },
                { role: "user", content: "Again." }] });
            assert.equal(next.content[0].type, "thinking");
            // A forced call skips thinking: the prompt's block is closed before the call (tool_choice tool).
            const call = await a.messages.create({ ...params, max_tokens: 8, tools: [getTime],
                                                   tool_choice: { type: "tool", name: "get_time" }, ...forced,
                                                   messages: [{ role: "user", content: "What time is it?" }] });
            assert.equal(call.stop_reason, "tool_use", JSON.stringify(call));
            assert.ok(call.content.every((b) => b.type !== "thinking"), JSON.stringify(call.content));
        } finally {
            await stopServer(s.proc);
        }
    },
    async anthropicErrors() {
        const bad = async (body, status, what, headers = { "x-api-key": KEY }) => {
            const r = await post("/v1/messages", body, headers);
            assert.equal(r.status, status, `${what}: ${r.status} ${r.text.slice(0, 200)}`);
            assert.equal(r.json?.type, "error", `${what}: Anthropic's error shape: ${r.text.slice(0, 200)}`);
            assert.equal(typeof r.json.error.type, "string");
            assert.equal(typeof r.json.error.message, "string");
            return r.json.error;
        };
        const ok = { model: MODEL, max_tokens: 4, messages: hello };
        assert.equal((await bad("{nope", 400, "malformed JSON")).type, "invalid_request_error");
        await bad({ ...ok, max_tokens: undefined }, 400, "no max_tokens");
        await bad({ ...ok, max_tokens: 0 }, 400, "max_tokens 0");
        await bad({ ...ok, messages: [] }, 400, "no messages");
        await bad({ ...ok, messages: [{ role: "system", content: "x" }] }, 400, "a system role in messages");
        await bad({ ...ok, messages: [{ role: "user", content: 7 }] }, 400, "content as a number");
        await bad({ ...ok, messages: [{ role: "user", content: [{ type: "image", source: {} }] }] }, 400, "an image");
        await bad({ ...ok, messages: [{ role: "user", content: [{ text: "no type" }] }] }, 400, "a block without type");
        await bad({ ...ok, messages: [{ role: "assistant", content: [{ type: "tool_result", tool_use_id: "x" }] },
                                      ...hello] }, 400, "tool_result in an assistant message");
        await bad({ ...ok, messages: [...hello, { role: "assistant", content: "trailing " }] }, 400,
                  "a prefill ending in whitespace");
        await bad({ ...ok, system: 5 }, 400, "system as a number");
        await bad({ ...ok, temperature: 1.5 }, 400, "temperature above 1");
        await bad({ ...ok, stop_sequences: "x" }, 400, "stop_sequences as a string");
        await bad({ ...ok, tools: [{ name: "f" }] }, 400, "a tool without input_schema");
        await bad({ ...ok, tools: [{ type: "web_search_20250305", name: "web_search" }] }, 400, "a server tool");
        await bad({ ...ok, tool_choice: { type: "tool" } }, 400, "tool_choice tool without a name");
        await bad({ ...ok, tools: [getTime], tool_choice: { type: "tool", name: "nope" } }, 400, "an unknown tool");
        await bad({ ...ok, thinking: { type: "enabled" } }, 400, "thinking without budget_tokens");
        await bad({ ...ok, messages: [{ role: "user", content: [{ type: "tool_result" }] }] }, 400,
                  "tool_result without tool_use_id");
        const utf8 = Buffer.concat([Buffer.from('{"max_tokens":4,"messages":[{"role":"user","content":"'),
                                    Buffer.from([0xc3, 0x28]), Buffer.from('"}]}')]);
        await bad(utf8, 400, "invalid UTF-8");
        const deep = "[".repeat(200) + "]".repeat(200);
        await bad(`{"max_tokens":4,"messages":${deep}}`, 400, "nesting 200 deep");
        assert.equal((await bad({ ...ok, messages: [{ role: "user", content: "x".repeat(2 << 20) }] }, 413,
                                "a body over --max-body-mb")).type, "request_too_large");
        assert.equal((await bad(ok, 401, "no key", {})).type, "authentication_error");
        assert.equal((await bad({ ...ok, model: "claude-nope" }, 404, "an unknown model")).type, "not_found_error");
        const long = "word ".repeat(1100);
        await bad({ ...ok, messages: [{ role: "user", content: long }] }, 400, "a prompt longer than the context");
        // The SDK's typed errors.
        await assert.rejects(new Anthropic({ apiKey: "wrong", baseURL: base, maxRetries: 0 }).messages.create(ok),
                             (e) => e instanceof Anthropic.AuthenticationError);
        await assert.rejects(anthropic.messages.create({ ...ok, model: "claude-nope" }),
                             (e) => e instanceof Anthropic.NotFoundError && e.error?.error?.type === "not_found_error");
        const health = await request(base, "GET", "/health");
        assert.equal(health.json.status, "ok");
    },
};

await finish(proc, await runTests(tests), deadline);
