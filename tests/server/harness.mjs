// What the server tests share: the models they use, `exl3 serve` started on a free port and stopped, raw HTTP
// requests, and the loop that runs a file's tests (EXL3_SERVER_TESTS=a,b picks some). Loopback only.
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, symlinkSync } from "node:fs";
import os from "node:os";
import path from "node:path";

// tiny-target from ../shared (EXL3_SHARED_DIR overrides) when it is there, else the fallback (tiny-draft, committed).
export function testModels(fallbackModel, sharedArg) {
    // ../shared only where it is there (a plain clone has none: its tests skip what needs it).
    const dir = process.env.EXL3_SHARED_DIR || sharedArg;
    const shared = dir && existsSync(dir) ? dir : undefined;
    const target = shared && existsSync(`${shared}/models/tiny-target/config.json`) ? `${shared}/models/tiny-target`
                                                                                      : fallbackModel;
    return { shared, target, draft: path.resolve(fallbackModel) };
}

// A directory of models for --models-dir: links named as given ({name: dir}); removed at exit.
export function modelsDir(models) {
    const dir = mkdtempSync(path.join(os.tmpdir(), "exl3-models-"));
    for (const [name, target] of Object.entries(models)) symlinkSync(path.resolve(target), path.join(dir, name));
    process.on("exit", () => rmSync(dir, { recursive: true, force: true }));
    return dir;
}

// Starts `exl3 serve --port 0 ARGS` and reads the address from its stdout line.
export function startServer(exl3, args) {
    return new Promise((resolve, reject) => {
        const proc = spawn(exl3, ["serve", "--port", "0", ...args], { stdio: ["ignore", "pipe", "inherit"] });
        let out = "";
        proc.stdout.on("data", (d) => {
            out += d;
            const m = out.match(/listening on (http:\/\/[0-9.]+:\d+)/);
            if (m) resolve({ proc, base: m[1] });
        });
        proc.on("exit", (code) => reject(new Error(`exl3 serve exited with ${code} before listening`)));
        setTimeout(() => reject(new Error("exl3 serve did not listen within 20 s")), 20_000);
    });
}

// SIGTERM; resolves with the exit code (or signal).
export function stopServer(proc) {
    proc.removeAllListeners("exit");
    const exited = new Promise((r) => proc.on("exit", (c, sig) => r(c ?? sig)));
    proc.kill("SIGTERM");
    return exited;
}

// One request; body: an object (sent as JSON), a string or bytes. Returns {status, json, text, headers}.
export async function request(base, method, path_, body, headers = {}) {
    const h = { ...headers };
    let data = body;
    if (body !== undefined && typeof body === "object" && !(body instanceof Uint8Array)) data = JSON.stringify(body);
    if (data !== undefined && !h["Content-Type"]) h["Content-Type"] = "application/json";
    const r = await fetch(base + path_, { method, headers: h, body: data });
    const text = await r.text();
    let json = null;
    try { json = JSON.parse(text); } catch { /* not JSON: the caller checks */ }
    return { status: r.status, json, text, headers: r.headers };
}

// Server-sent events of a response body: [{event, data}] (data parsed when it is JSON).
export function parseEvents(text) {
    const events = [];
    for (const block of text.split("\n\n")) {
        let event = null, data = null;
        for (const line of block.split("\n")) {
            if (line.startsWith("event:")) event = line.slice(6).trim();
            else if (line.startsWith("data:")) data = (data ?? "") + line.slice(5).trim();
        }
        if (data === null) continue;
        try { data = JSON.parse(data); } catch { /* [DONE] */ }
        events.push({ event, data });
    }
    return events;
}

// Runs the tests in order (or those EXL3_SERVER_TESTS names); a test that returns a string was skipped for that
// reason. Resolves with the number that failed.
export async function runTests(tests) {
    const only = process.env.EXL3_SERVER_TESTS ? process.env.EXL3_SERVER_TESTS.split(",") : Object.keys(tests);
    let failed = 0;
    for (const name of only.filter((n) => n in tests)) {
        const t0 = Date.now();
        try {
            const skipped = await tests[name]();
            console.log(typeof skipped === "string" ? `skip ${name}: ${skipped}` : `ok   ${name} (${Date.now() - t0} ms)`);
        } catch (e) {
            failed++;
            console.log(`FAIL ${name}: ${e.stack || e}`);
        }
    }
    return failed;
}

// The end of a test file: stops its server (which must exit cleanly on SIGTERM), reports and exits.
export async function finish(proc, failed, deadline) {
    const code = await stopServer(proc);
    clearTimeout(deadline);
    if (code !== 0) {
        console.error(`FAIL: the server exited with ${code} on SIGTERM`);
        process.exit(1);
    }
    console.log(failed ? `${failed} failed` : "all passed");
    process.exit(failed ? 1 : 0);
}
