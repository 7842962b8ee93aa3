// The chat page at / in headless Chromium (Debian's chromium, driven by playwright-core), against exl3 serve on the
// real tiny model: the page asks for the API key, a typed prompt streams a reply (the one the API gives for the
// same settings), the stop button ends a reply, the conversation survives a reload (localStorage), and a stored
// conversation renders its Markdown (code blocks, lists, tables, links; nothing of the text runs as markup) with the
// reasoning folded. A screenshot is saved to EXL3_SCREENSHOT (default: chat-page.png in the working directory).
// Usage: node page_test.mjs EXL3_BINARY FALLBACK_MODEL_DIR [SHARED_DIR]. Exits 77 (skipped) without chromium.
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { finish, request, runTests, startServer, stopServer, testModels } from "./harness.mjs";

const CHROMIUM = process.env.EXL3_CHROMIUM || "/usr/bin/chromium";
if (!existsSync(CHROMIUM)) {
    console.log(`skipped: no ${CHROMIUM} (Debian: apt install chromium)`);
    process.exit(77);
}
const { chromium } = await import("playwright-core");

const [exl3, fallbackModel, sharedArg] = process.argv.slice(2);
const { shared, target } = testModels(fallbackModel, sharedArg);
const KEY = "page-key";
const SCREENSHOT = process.env.EXL3_SCREENSHOT || "chat-page.png";
const deadline = setTimeout(() => { console.error("FAIL: the whole test took over 150 s"); process.exit(1); }, 150_000);
const { proc, base } = await startServer(exl3, ["-m", target, "-c", "2048", "--api-key", KEY, "-t", "2"]);
proc.on("exit", (code) => { console.error(`FAIL: the server died (exit ${code})`); process.exit(1); });
const browser = await chromium.launch({
    executablePath: CHROMIUM, headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"],
});
const context = await browser.newContext({ viewport: { width: 1120, height: 700 } });
const page = await context.newPage();
const pageErrors = [];
page.on("pageerror", (e) => pageErrors.push(e.message));

const PROMPT = "Tell me a short story about a lighthouse keeper.";
const settings = { temperature: 0, max_tokens: 40 };

async function setField(id, value) {
    await page.evaluate(() => { document.getElementById("settings").open = true; });
    await page.fill(`#${id}`, String(value));
    await page.dispatchEvent(`#${id}`, "change");
}

async function storedChats() {
    return page.evaluate(() => JSON.parse(localStorage.getItem("exl3.chats")));
}

const tests = {
    async servedWithoutKey() {
        const r = await request(base, "GET", "/");
        assert.equal(r.status, 200);
        assert.match(r.headers.get("content-type"), /text\/html/);
        assert.match(r.headers.get("content-security-policy"), /script-src 'self'/);
        for (const f of ["app.js", "markdown.js", "style.css"])
            assert.equal((await request(base, "GET", `/web/${f}`)).status, 200, f);
        assert.equal((await request(base, "GET", "/web/nope.js")).status, 404);
        assert.equal((await request(base, "GET", "/web/..%2fserver.cpp")).status, 404);
        assert.equal((await request(base, "GET", "/v1/models")).status, 401, "the API still needs the key");
    },
    async streamedReply() {
        await page.goto(`${base}/`);
        await page.waitForFunction(() => /key/i.test(document.getElementById("status").textContent));
        await setField("api-key", KEY);
        await page.waitForFunction(() => /model: /.test(document.getElementById("status").textContent));
        assert.equal(await page.inputValue("#model"), target.split("/").filter(Boolean).pop());
        for (const [k, v] of Object.entries(settings)) await setField(k, v);
        await page.fill("#prompt", PROMPT);
        await page.press("#prompt", "Enter");
        await page.waitForSelector('.msg.assistant[data-state="done"]', { timeout: 30_000 });
        // What the page shows is what the API gives for the same request.
        const r = await request(base, "POST", "/v1/chat/completions", {
            messages: [{ role: "user", content: PROMPT }], temperature: 0, top_p: 1, top_k: 0, min_p: 0,
            repetition_penalty: 1, max_tokens: settings.max_tokens,
        }, { Authorization: `Bearer ${KEY}` });
        const chats = await storedChats();
        assert.equal(chats.length, 1);
        assert.equal(chats[0].messages[1].content, r.json.choices[0].message.content);
        assert.match(await page.textContent(".msg.assistant .meta"), /\d+ tokens, [\d.]+ tok\/s/);
        const shown = (await page.textContent(".msg.assistant .body")).replace(/\s+/g, " ").trim();
        assert.ok(shown.length > 10, shown);
        await page.screenshot({ path: SCREENSHOT });  // with the settings open
        console.log(`     screenshot: ${SCREENSHOT}`);
    },
    async stopButton() {
        await setField("max_tokens", 1500);
        await setField("extra", '{"ignore_eos": true}');  // a long reply for sure
        await page.fill("#prompt", "Go on, and make it long.");
        await page.press("#prompt", "Enter");
        await page.waitForSelector('.msg.assistant[data-state="streaming"]');
        await page.waitForFunction(() => {
            const m = [...document.querySelectorAll(".msg.assistant")].at(-1);
            return m.querySelector(".body").textContent.length > 20;
        });
        assert.equal(await page.isVisible("#stop"), true);
        await page.click("#stop");
        await page.waitForSelector('.msg.assistant[data-state="stopped"]');
        assert.equal(await page.isVisible("#send"), true);
        const chats = await storedChats();
        const reply = chats[0].messages.at(-1);
        assert.equal(reply.meta, "stopped");
        assert.ok(reply.content.length > 0, "the text so far is kept");
        await setField("extra", "{oops");
        await page.fill("#prompt", "Again.");
        await page.press("#prompt", "Enter");
        await page.waitForSelector('.msg.assistant[data-state="error"]');
        assert.match(await page.textContent(".msg.assistant:last-child .error"), /More fields \(JSON\)/);
        await setField("extra", "");
        await page.evaluate(() => { document.getElementById("settings").open = false; });
        // The server cancelled the job.
        for (let i = 0; i < 50; i++) {
            const h = await request(base, "GET", "/health");
            if (h.json.jobs === 0) return;
            await new Promise((r) => setTimeout(r, 100));
        }
        assert.fail("the stopped reply's job is still running");
    },
    async keptAcrossReload() {
        await page.reload();
        await page.waitForSelector(".msg.assistant");
        assert.equal(await page.locator(".msg").count(), 6);
        assert.equal(await page.locator("#chats li").count(), 1);
        assert.match(await page.textContent("#chats li span"), /lighthouse keeper/);
        await page.click("#new-chat");
        assert.equal(await page.locator(".msg").count(), 0);
        assert.equal(await page.locator("#chats li").count(), 2);
    },
    async markdownAndReasoning() {
        const content = [
            "# Title", "Some **bold**, *italic*, `code` and a [link](https://example.com/a?b=1&c=2).",
            "", "- one", "- two", "  - nested", "", "1. first", "2. second", "",
            "| a | b |", "|---|---|", "| 1 | 2 |", "",
            "```js", "const x = '<b>not bold</b>';", "```", "",
            "<script>window.injected = 1</script> <img src=x onerror=\"window.injected = 2\">",
            "[bad](javascript:alert(1))", "> quoted",
        ].join("\n");
        await page.evaluate((c) => {
            const chats = JSON.parse(localStorage.getItem("exl3.chats"));
            chats.unshift({ id: "md", title: "Markdown", messages: [
                { role: "user", content: "Show me <b>markdown</b>" },
                { role: "assistant", content: c, reasoning: "First I think.\nThen I answer." }] });
            localStorage.setItem("exl3.chats", JSON.stringify(chats));
            localStorage.setItem("exl3.current", JSON.stringify("md"));
        }, content);
        await page.reload();
        const body = page.locator(".msg.assistant .body");
        await body.waitFor();
        assert.equal(await body.locator("h1").textContent(), "Title");
        assert.equal(await body.locator("strong").first().textContent(), "bold");
        assert.equal(await body.locator("em").first().textContent(), "italic");
        assert.equal(await body.locator("p code").first().textContent(), "code");
        assert.equal(await body.locator('a[href="https://example.com/a?b=1&c=2"]').count(), 1);
        assert.equal(await body.locator("ul > li").count(), 3);
        assert.equal(await body.locator("ul ul > li").textContent(), "nested");
        assert.equal(await body.locator("ol > li").count(), 2);
        assert.equal(await body.locator("table td").count(), 2);
        assert.equal(await body.locator(".code .code-head span").textContent(), "js");
        assert.equal(await body.locator(".code code").textContent(), "const x = '<b>not bold</b>';");
        assert.equal(await body.locator("blockquote").textContent(), "quoted");
        // Nothing in the text became markup.
        assert.equal(await body.locator("script, img, b").count(), 0);
        assert.equal(await body.locator('a[href^="javascript"]').count(), 0);
        assert.equal(await page.evaluate(() => window.injected), undefined);
        assert.equal(await page.textContent(".msg.user .body"), "Show me <b>markdown</b>");
        // Reasoning: folded, opened on a click.
        const details = body.locator("details.reasoning");
        assert.equal(await details.getAttribute("open"), null);
        assert.match(await details.locator("summary").textContent(), /Reasoning \(6 words\)/);
        await details.locator("summary").click();
        assert.equal(await details.locator(".thought").textContent(), "First I think.\nThen I answer.");
    },
    async streamedReasoning() {
        if (!shared) return "no ../shared/templates";
        // QwQ's template opens <think> in the prompt: what the tiny model writes is reasoning, streamed as
        // reasoning_content into the folded block; max_reasoning_tokens (the settings' extra fields) closes it after
        // 6 tokens and the answer follows below it.
        const s = await startServer(exl3, ["-m", target, "-c", "2048", "-t", "2", "--chat-template",
                                           `${shared}/templates/Qwen-QwQ-32B.jinja`]);
        try {
            const p = await context.newPage();
            p.on("pageerror", (e) => pageErrors.push(e.message));
            await p.goto(`${s.base}/`);
            await p.evaluate(() => { document.getElementById("settings").open = true; });
            for (const [id, v] of [["max_tokens", 24], ["temperature", 0], ["extra", '{"max_reasoning_tokens": 6}']]) {
                await p.fill(`#${id}`, String(v));
                await p.dispatchEvent(`#${id}`, "change");
            }
            await p.fill("#prompt", "Think first.");
            await p.press("#prompt", "Enter");
            await p.waitForSelector('.msg.assistant[data-state="done"]', { timeout: 30_000 });
            const msg = p.locator(".msg.assistant").last();
            const details = msg.locator(".body details.reasoning");
            assert.equal(await details.count(), 1);
            assert.equal(await details.getAttribute("open"), null, "folded");
            assert.equal(await details.locator(".thought").isVisible(), false);
            assert.match(await details.locator("summary").textContent(), /^Reasoning \(\d+ words\)$/);
            // What it holds is the API's reasoning_content; the answer is outside the fold.
            const r = await request(s.base, "POST", "/v1/chat/completions", {
                messages: [{ role: "user", content: "Think first." }], temperature: 0, top_p: 1, top_k: 0, min_p: 0,
                repetition_penalty: 1, max_tokens: 24, max_reasoning_tokens: 6 });
            const want = r.json.choices[0].message;
            assert.ok(want.reasoning_content.length > 0, JSON.stringify(want));
            const stored = (await p.evaluate(() => JSON.parse(localStorage.getItem("exl3.chats"))))[0].messages.at(-1);
            assert.equal(stored.reasoning, want.reasoning_content);
            assert.equal(stored.content, want.content);
            assert.equal(await details.locator(".thought").textContent(), want.reasoning_content);
            await details.locator("summary").click();
            assert.equal(await details.locator(".thought").isVisible(), true, "opened on a click");
            const outside = await msg.locator(".body").evaluate((b) => [...b.childNodes]
                .filter((n) => !(n.matches && n.matches("details"))).map((n) => n.textContent).join("").trim());
            assert.equal(outside.length > 0, want.content.trim().length > 0, `answer shown: '${outside}'`);
            await p.close();
        } finally {
            await stopServer(s.proc);
        }
    },
};

let failed = 0;
try {
    failed = await runTests(tests);
    assert.deepEqual(pageErrors, [], "no script errors on the page");
} catch (e) {
    failed++;
    console.log(`FAIL: ${e.stack || e}`);
} finally {
    await browser.close();
}
await finish(proc, failed, deadline);
