#!/usr/bin/env python3
"""scripts/load_client.py (the stdlib load test): its stream checks against a fake server that sends good and broken
SSE streams, and a short real run against `exl3 serve` on tests/models/tiny-draft.

Usage: load_client_test.py [--exl3 PATH] [unittest arguments]. Runs from the repository root. Without --exl3 the
real-server test is skipped. Python standard library only; takes a few seconds.
"""
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
import unittest

EXL3 = None
CLIENT = "scripts/load_client.py"
DRAFT = "tests/models/tiny-draft"


def run_client(url, *args, timeout=60):
    p = subprocess.run([sys.executable, CLIENT, "--url", url, *args], capture_output=True, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def chunk(delta=None, finish=None, usage=None, choices=True, obj="chat.completion.chunk", cid="c1"):
    j = {"id": cid, "object": obj, "created": 0, "model": "m", "usage": usage}
    j["choices"] = [{"index": 0, "delta": delta or {}, "finish_reason": finish}] if choices else []
    return "data: " + json.dumps(j) + "\n\n"


USAGE = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
GOOD = [chunk({"role": "assistant", "content": "He"}), ": keep-alive\n\n", chunk({"content": "llo"}),
        chunk(finish="length"), chunk(usage=USAGE, choices=False), "data: [DONE]\n\n"]
# Each broken stream and the words its complaint must contain.
BROKEN = {
    "no_done": (GOOD[:-1], "[DONE]"),
    "no_usage": (GOOD[:4] + GOOD[5:], "usage"),
    "two_finishes": (GOOD[:4] + [chunk(finish="stop")] + GOOD[4:], "after the finish_reason"),
    "no_finish": (GOOD[:3] + GOOD[4:], "finish_reason"),
    "content_before_role": ([chunk({"content": "x"})] + GOOD[2:], "role"),
    "two_roles": (GOOD[:1] + [chunk({"role": "assistant"})] + GOOD[1:], "role"),
    "data_after_done": (GOOD + [chunk({"content": "late"})], "after [DONE]"),
    "usage_before_finish": (GOOD[:3] + [GOOD[4], GOOD[3], GOOD[5]], "before the finish_reason"),
    "bad_json": (GOOD[:2] + ["data: {not json\n\n"] + GOOD[2:], "not JSON"),
    "usage_does_not_add_up": (GOOD[:4] + [chunk(usage=dict(USAGE, total_tokens=9), choices=False)] + GOOD[5:],
                              "add up"),
    "id_changes": (GOOD[:2] + [chunk({"content": "x"}, cid="c2")] + GOOD[2:], "id changed"),
    "cut_mid_event": (GOOD[:2] + ['data: {"id": "c1"'], "inside an event"),
}


class FakeServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    stream = GOOD


class FakeHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def send_json(self, obj):
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            return self.send_json({"status": "ok", "jobs": 0})
        self.send_json({"data": [{"id": "m"}]})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()  # HTTP/1.0: the stream ends when the connection closes
        for part in self.server.stream:
            self.wfile.write(part.encode())
            self.wfile.flush()


class StreamChecksTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = FakeServer(("127.0.0.1", 0), FakeHandler)
        threading.Thread(target=cls.srv.serve_forever, daemon=True).start()
        cls.url = f"http://127.0.0.1:{cls.srv.server_address[1]}"

    @classmethod
    def tearDownClass(cls):
        cls.srv.shutdown()
        cls.srv.server_close()

    def test_a_good_stream_passes(self):
        FakeServer.stream = GOOD
        rc, out, err = run_client(self.url, "--clients", "3", "--requests", "2", "--max-tokens", "2", "--json")
        self.assertEqual(rc, 0, out + err)
        j = json.loads(out.strip().splitlines()[-1])
        self.assertEqual((j["ok"], j["failed"], j["completion_tokens"]), (6, 0, 12))
        for key in ("p50", "p90", "p99"):
            self.assertGreater(j["ttft_ms"][key], 0)
            self.assertGreaterEqual(j["total_ms"][key], j["ttft_ms"][key])
        self.assertEqual(j["health"], {"status": "ok", "jobs": 0})

    def test_every_broken_stream_fails(self):
        for name, (stream, complaint) in BROKEN.items():
            with self.subTest(name):
                FakeServer.stream = stream
                rc, out, err = run_client(self.url, "--clients", "2", "--requests", "1", "--max-tokens", "2",
                                          "--warmup", "0")
                self.assertEqual(rc, 1, out + err)
                self.assertIn("2 failed (2 malformed)", out)
                self.assertIn(complaint, out)

    def test_ignore_eos_needs_every_token(self):
        FakeServer.stream = GOOD  # 2 completion tokens, finish "length"
        rc, out, _ = run_client(self.url, "--clients", "1", "--requests", "1", "--max-tokens", "3", "--ignore-eos",
                                "--warmup", "0")
        self.assertEqual(rc, 1)
        self.assertIn("not max_tokens 3", out)


class RealServerTest(unittest.TestCase):
    def setUp(self):
        if EXL3 is None:
            self.skipTest("no --exl3 given")

    def test_chat_and_completions(self):
        p = subprocess.Popen([EXL3, "serve", "-m", DRAFT, "--port", "0", "-t", "2", "--max-batch", "8"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            line = p.stdout.readline()  # "exl3 serve: listening on http://127.0.0.1:PORT (model ...)"
            self.assertIn("listening on", line)
            url = line.split("listening on ")[1].split()[0]
            for extra in ([], ["--endpoint", "completions", "--prompt-tokens", "40"]):
                rc, out, err = run_client(url, "--clients", "6", "--requests", "2", "--max-tokens", "12",
                                          "--ignore-eos", "--json", *extra)
                self.assertEqual(rc, 0, out + err)
                j = json.loads(out.strip().splitlines()[-1])
                self.assertEqual((j["ok"], j["failed"]), (12, 0))
                self.assertEqual(j["completion_tokens"], 12 * 12)
                self.assertEqual(j["health"]["jobs"], 0)
        finally:
            p.send_signal(signal.SIGTERM)
            try:
                self.assertEqual(p.wait(timeout=30), 0)
            finally:
                if p.poll() is None:
                    p.kill()
                p.stdout.close()


def main():
    global EXL3
    argv = sys.argv[1:]
    if len(argv) >= 2 and argv[0] == "--exl3":
        EXL3 = os.path.abspath(argv[1])
        argv = argv[2:]
    unittest.main(argv=[sys.argv[0], *argv], verbosity=2)


if __name__ == "__main__":
    main()
