#!/usr/bin/env python3
"""The exl3 program driven as a user drives it: `exl3 chat` through a pseudo-terminal, `exl3 run`, `exl3 ppl` and
`exl3 bench --jobs` output, and bad inputs (each must fail with a message on stderr and a non-zero exit code, never a crash).

Usage: cli_test.py --exl3 PATH [--shared DIR] [unittest arguments, e.g. a test class name]. Runs from the repository
root (it uses tests/models/tiny-draft and tests/fixtures/ppl/sample.txt; the tool tests use DIR/models/tiny-target,
EXL3_SHARED_DIR overriding DIR, when it is there, else tiny-draft, which has the same ChatML-with-tools template).
Python standard library only.
"""
import json
import os
import pty
import select
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

EXL3 = None
DRAFT = "tests/models/tiny-draft"
TARGET = None  # the shared tiny-target when found (main), else DRAFT
SAMPLE = "tests/fixtures/ppl/sample.txt"
TIMEOUT = 30


def exl3(*args, stdin=b""):
    """Runs exl3 with args (str or bytes); returns (returncode, stdout bytes, stderr str)."""
    p = subprocess.run([EXL3, *args], input=stdin, capture_output=True, timeout=TIMEOUT)
    return p.returncode, p.stdout, p.stderr.decode("utf-8", "replace")


class PtySession:
    """A child process on a pseudo-terminal: stdin, stdout and stderr all go through it, as in a terminal."""

    def __init__(self, argv):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            try:
                os.execv(argv[0], argv)
            finally:
                os._exit(127)
        self.buf = b""

    def read_until(self, marker, timeout=TIMEOUT):
        """Reads until `marker` appears after what was consumed so far; returns the text before it."""
        deadline = time.time() + timeout
        while marker not in self.buf:
            left = deadline - time.time()
            if left <= 0:
                raise AssertionError(f"timed out waiting for {marker!r}; got {self.buf!r}")
            r, _, _ = select.select([self.fd], [], [], left)
            if not r:
                continue
            try:
                chunk = os.read(self.fd, 4096)
            except OSError:  # EIO: the child closed the terminal
                chunk = b""
            if not chunk:
                raise AssertionError(f"the program ended while waiting for {marker!r}; got {self.buf!r}")
            self.buf += chunk
        before, _, self.buf = self.buf.partition(marker)
        return before

    def send(self, line):
        os.write(self.fd, line.encode() + b"\n")

    def wait(self, timeout=TIMEOUT):
        """Drains the terminal until the child exits; returns its exit status (negative: killed by a signal)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                os.close(self.fd)
                return os.waitstatus_to_exitcode(status)
            r, _, _ = select.select([self.fd], [], [], 0.1)
            if r:
                try:
                    self.buf += os.read(self.fd, 4096)
                except OSError:
                    pass
        os.kill(self.pid, 9)
        raise AssertionError("the program did not exit")


class RunTest(unittest.TestCase):
    def test_greedy_is_deterministic_and_stdout_is_only_the_text(self):
        args = ("run", "-m", DRAFT, "-p", "Once upon a time", "-n", "20", "--temperature", "0")
        rc1, out1, err1 = exl3(*args)
        rc2, out2, _ = exl3(*args)
        self.assertEqual((rc1, rc2), (0, 0), err1)
        self.assertEqual(out1, out2)
        self.assertTrue(out1.strip(), "no text generated")
        self.assertNotIn(b"[exl3", out1)  # logs go to stderr
        self.assertIn("tok/s", err1)

    def test_max_tokens_caps_the_output(self):
        rc, out, err = exl3("run", "-m", DRAFT, "-p", "Once upon a time", "-n", "5", "--ids", "--ignore-eos")
        self.assertEqual(rc, 0, err)
        self.assertEqual(len(out.split()), 5)
        rc, out, err = exl3("run", "-m", DRAFT, "-p", "Once upon a time", "-n", "0")
        self.assertEqual(rc, 0, err)
        self.assertEqual(out.strip(), b"")

    def test_kv_cache_options(self):
        # A quantized, small shared cache: still generates; 8-bit KV keeps tiny-draft's greedy text for a few tokens.
        base = ("run", "-m", DRAFT, "-p", "Once upon a time", "-n", "6", "--ids", "--ignore-eos")
        rc, out, err = exl3(*base)
        self.assertEqual(rc, 0, err)
        rc, out8, err = exl3(*base, "--kv-bits", "8", "--cache-tokens", "256")
        self.assertEqual(rc, 0, err)
        self.assertEqual(len(out8.split()), 6)
        self.assertEqual(out8.split()[:2], out.split()[:2])
        rc, _, err = exl3(*base, "--cache-tokens", "-5")
        self.assertNotEqual(rc, 0)
        self.assertIn("cache-tokens", err)
        rc, outi, err = exl3(*base, "--batch-invariant")  # the CPU is batch-invariant anyway: the same tokens
        self.assertEqual(rc, 0, err)
        self.assertEqual(outi, out)
        rc, out, err = exl3("serve", "--help")
        self.assertEqual(rc, 0, err)
        for flag in (b"--kv-bits", b"--cache-tokens", b"--batch-invariant"):
            self.assertIn(flag, out)

    def test_speculative_decoding_keeps_the_text(self):
        base = ("run", "-m", DRAFT, "-p", "The cat sat on the mat. The cat sat on the mat. The", "-n", "24",
                "--ignore-eos", "-t", "2")
        rc, plain, err = exl3(*base)
        self.assertEqual(rc, 0, err)
        rc, ngram, err = exl3(*base, "--ngram", "--draft-tokens", "3")
        self.assertEqual(rc, 0, err)
        self.assertEqual(ngram, plain)
        self.assertIn("speculative decoding (n-gram):", err)
        rc, drafted, err = exl3(*base, "--draft-model", DRAFT)  # the model as its own draft
        self.assertEqual(rc, 0, err)
        self.assertEqual(drafted, plain)
        self.assertIn("speculative decoding (draft model):", err)
        # The draft takes the model's cache settings too (quantized, sized): the text is still the model's own.
        cache = ("--kv-bits", "8", "--cache-tokens", "512")
        rc, plain8, err = exl3(*base, *cache)
        self.assertEqual(rc, 0, err)
        rc, drafted8, err = exl3(*base, *cache, "--draft-model", DRAFT)
        self.assertEqual(rc, 0, err)
        self.assertEqual(drafted8, plain8)
        for args, expect in ((("--ngram", "--draft-model", DRAFT), "exclude"), (("--draft-tokens", "0"), "draft-tokens"),
                             (("--draft-model", "/nonexistent"), "draft model"), (("--ngram-min", "0"), "ngram-min")):
            rc, _, err = exl3(*base, *args)
            self.assertGreater(rc, 0, args)
            self.assertIn(expect, err, args)

    def test_json_mode(self):
        rc, out, err = exl3("run", "-m", DRAFT, "-p", "A lighthouse, as JSON:", "-n", "160", "--json", "-t", "2")
        self.assertEqual(rc, 0, err)
        text = out.decode("utf-8").rstrip("\n")
        if "stop: stop" in err:  # the object closed
            self.assertIsInstance(json.loads(text), dict)
        else:
            self.assertIn("stop: length", err)
            self.assertRegex(text, r"^\s*\{")

    def test_json_schema(self):
        schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                                    "rooms": {"type": "integer"}}, "required": ["name", "rooms"],
                  "additionalProperties": False}
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "schema.json")
            with open(path, "w") as f:
                json.dump(schema, f)
            rc, out, err = exl3("run", "-m", DRAFT, "-p", "A lighthouse, as JSON:", "-n", "300", "--json-schema", path,
                                "-t", "2")
            self.assertEqual(rc, 0, err)
            text = out.decode("utf-8").rstrip("\n")
            if "stop: stop" in err:  # the object closed
                v = json.loads(text)
                self.assertEqual(list(v), ["name", "rooms"])
                self.assertIsInstance(v["rooms"], int)
            else:
                self.assertIn("stop: length", err)
                self.assertRegex(text, r"^\s*\{")
            # A schema the output cannot be held to is refused before the model loads, naming the keyword.
            with open(path, "w") as f:
                json.dump({"type": "object", "properties": {"d": {"type": "string", "format": "date"}}}, f)
            rc, out, err = exl3("run", "-m", DRAFT, "-p", "x", "--json-schema", path)
            self.assertNotEqual(rc, 0)
            self.assertIn("'format' is not supported", err)
            rc, out, err = exl3("run", "-m", DRAFT, "-p", "x", "--json-schema", os.path.join(d, "missing.json"))
            self.assertNotEqual(rc, 0)
            self.assertIn("cannot open", err)

    def test_quiet_leaves_stderr_empty(self):
        rc, out, err = exl3("-q", "run", "-m", DRAFT, "-p", "Hello", "-n", "4")
        self.assertEqual(rc, 0, err)
        self.assertEqual(err, "")
        # The program's options after the command as well.
        rc, out, err = exl3("run", "-q", "-m", DRAFT, "-p", "Hello", "-n", "4")
        self.assertEqual(rc, 0, err)
        self.assertEqual(err, "")


class ChatTest(unittest.TestCase):
    ARGS = ["chat", "-m", DRAFT, "-n", "16", "--temperature", "0"]

    def test_two_turns_through_a_pseudo_terminal(self):
        s = PtySession([EXL3, *self.ARGS])
        s.read_until(b"> ")  # the prompt marker: stdin is a terminal
        replies = []
        for line in ("Hello there", "Tell me a story"):
            s.send(line)
            s.read_until(line.encode() + b"\r\n")  # the terminal's echo of what was typed
            replies.append(s.read_until(b"> ").replace(b"\r\n", b"\n"))
        s.send("/exit")
        self.assertEqual(s.wait(), 0)
        self.assertEqual(len(replies), 2)
        for r in replies:
            self.assertTrue(r.endswith(b"\n"), r)
            self.assertTrue(r.strip(), "an empty reply")
        # The same conversation through pipes prints exactly the two replies, one per line, and no prompt marker.
        rc, out, err = exl3(*self.ARGS, stdin=b"Hello there\nTell me a story\n")
        self.assertEqual(rc, 0, err)
        self.assertEqual(out, b"".join(replies))

    def test_the_cache_is_reused_and_reset_starts_over(self):
        rc, out, err = exl3("-v", *self.ARGS, stdin=b"Hello there\nTell me a story\n/reset\nHello there\n/exit\n"
                                                    b"never read\n")
        self.assertEqual(rc, 0, err)
        lines = out.decode().split("\n")
        self.assertEqual(len(lines), 4, out)  # three replies and the empty tail after the last newline
        self.assertEqual(lines[0], lines[2])  # after /reset the same greedy conversation again
        logged = [l.split("chat: prompt ")[1] for l in err.splitlines() if "reused from the cache" in l]
        prompt = [int(l.split()[0]) for l in logged]
        reused = [int(l.split(", ")[1].split()[0]) for l in logged]
        self.assertEqual(len(reused), 3, err)
        self.assertEqual(reused[0], 0)
        self.assertGreater(reused[1], 0)  # the second turn extends the first: only the new tokens are prefilled
        self.assertGreater(prompt[1] - reused[1], 0)  # the last prompt token is always computed
        # /reset clears the conversation, not the cache: the same first turn again finds its pages (prefix caching),
        # and the reply is the same.
        self.assertEqual(prompt[2], prompt[0])
        self.assertLess(reused[2], prompt[2])
        self.assertIn("conversation cleared", err)

    def test_system_prompt_and_end_of_input(self):
        rc, out, err = exl3(*self.ARGS, "--system", "You are a pirate.", stdin=b"Hello\n")
        self.assertEqual(rc, 0, err)
        self.assertEqual(out.count(b"\n"), 1)
        rc, out, err = exl3(*self.ARGS, stdin=b"")
        self.assertEqual((rc, out), (0, b""), err)


class PplTest(unittest.TestCase):
    def test_json(self):
        rc, out, err = exl3("ppl", "-m", DRAFT, "-f", SAMPLE, "--ctx", "64", "--json")
        self.assertEqual(rc, 0, err)
        j = json.loads(out)  # exactly one JSON document on stdout
        for key in ("perplexity", "nll", "tokens", "ctx", "stride", "windows", "model", "file", "seconds"):
            self.assertIn(key, j)
        self.assertEqual((j["ctx"], j["stride"]), (64, 64))
        self.assertGreater(j["perplexity"], 1.0)
        self.assertIn("window", err)  # progress on stderr

    def test_plain(self):
        rc, out, err = exl3("-q", "ppl", "-m", DRAFT, "-f", SAMPLE, "--ctx", "64", "--max-tokens", "100")
        self.assertEqual(rc, 0, err)
        self.assertTrue(out.startswith(b"perplexity "), out)
        self.assertEqual(out.count(b"\n"), 1)
        self.assertEqual(err, "")

    def test_help_states_the_protocol(self):
        rc, out, _ = exl3("ppl", "--help")
        self.assertEqual(rc, 0)
        self.assertIn(b"Protocol", out)
        self.assertIn(b"BOS", out)


class MemoryTest(unittest.TestCase):
    """The GPU memory plan (docs/memory.md): `exl3 inspect --memory` with a budget needs no GPU, and a load whose plan
    does not fit is refused before anything is allocated (also here, without a GPU)."""

    def plan(self, *args):
        return exl3("inspect", "--memory", DRAFT, *args)

    def test_table(self):
        rc, out, err = self.plan("--gpu-memory", "1")
        self.assertEqual(rc, 0, err)
        text = out.decode()
        self.assertIn("GPU memory plan for cuda:0", text)
        self.assertIn("budget 1.00 GiB", text)
        for row in ("layers: unquantized linears", "layers: norms", "head", "KV cache", "step buffers and workspaces",
                    "CUDA context, kernels, cuBLAS", "total", "in host memory instead", "embeddings"):
            self.assertIn(row, text)
        # tiny-draft: 4 layers x 2 kv heads x 128 values x 2 bytes a token; the cache takes what is left, up to 64
        # contexts of 2048.
        self.assertIn("fits: context 2048, KV cache 131072 tokens (2048 B a token)", text)

    def test_json(self):
        rc, out, err = self.plan("--gpu-memory", "1", "-c", "1024", "--kv-bits", "8", "--cache-tokens", "4096",
                                 "--json")
        self.assertEqual(rc, 0, err)
        p = json.loads(out)
        self.assertTrue(p["fits"])
        self.assertEqual((p["context_length"], p["cache_tokens"], p["kv_bits_k"], p["kv_bits_v"]), (1024, 4096, 8, 8))
        self.assertEqual(p["kv_bytes_per_token"], 4 * 2 * 2 * 72)  # 64 code bytes + 2 groups x 4 a vector
        self.assertEqual(p["gpu_total"], sum(i["bytes"] for i in p["gpu"]))
        kv = [i for i in p["gpu"] if i["name"] == "KV cache"][0]
        self.assertEqual(kv["bytes"], 4096 * p["kv_bytes_per_token"])
        self.assertEqual([i["name"] for i in p["host"]], ["embeddings"])

    def test_budget_too_small(self):
        rc, out, err = self.plan("--gpu-memory", "0.05")
        self.assertEqual(rc, 1)
        self.assertIn("does not fit", out.decode())
        self.assertIn("MiB more than the budget of 0.05 GiB", err)
        self.assertIn("It would fit with", err)
        self.assertIn("--gpu-memory 0.8", err)

    def test_context_larger_than_fits(self):
        rc, out, err = self.plan("--gpu-memory", "1", "-c", "400000")
        self.assertEqual(rc, 1, err)
        self.assertIn("-c ", err)
        self.assertIn("--kv-bits", err)

    def test_load_refused_before_any_allocation(self):
        # The same refusal from the load itself, before a GPU is even asked for: it works without one.
        rc, out, err = exl3("run", "-m", DRAFT, "--tokens", "1,2,3", "-n", "4", "--device", "cuda",
                            "--gpu-memory", "0.05")
        self.assertEqual(rc, 1, err)
        self.assertIn("MiB more than the budget", err)
        self.assertIn("GPU memory plan for cuda:0", err)  # the table in the load log

    def test_no_budget(self):
        rc, out, err = self.plan()
        if rc != 0:  # no GPU here to ask what is free
            self.assertIn("--gpu-memory", err)

    def test_bad_flags(self):
        for args, expect in ((("--offload-layers", "some"), "--offload-layers"),
                             (("--offload-mode", "gpu"), "--offload-mode"),
                             (("--gpu-memory", "-1"), "--gpu-memory"),
                             (("--max-step-tokens", "-5"), "--max-step-tokens")):
            rc, out, err = self.plan(*args)
            self.assertGreater(rc, 0, args)
            self.assertIn(expect, err, args)


class BenchTest(unittest.TestCase):
    """`exl3 bench --jobs`: the generator benchmark, at sizes that take a second on the CPU."""

    ARGS = ["bench", "-m", DRAFT, "-t", "2", "--jobs", "1,3", "--job-prompt", "24", "--job-gen", "6",
            "--job-chunk", "16", "--job-warmup", "0"]

    def test_json(self):
        rc, out, err = exl3(*self.ARGS, "--kv-bits-k", "8", "--kv-bits-v", "4", "--json")
        self.assertEqual(rc, 0, err)
        j = json.loads(out)  # exactly one JSON document on stdout
        for key in ("model", "device", "bandwidth_gb_s", "kv_bits_k", "kv_bits_v", "kv_bytes_per_token_layer",
                    "cache_tokens", "job_prompt", "job_gen", "jobs"):
            self.assertIn(key, j)
        self.assertEqual((j["kv_bits_k"], j["kv_bits_v"]), (8, 4))  # the KV flags apply to this mode too
        self.assertGreaterEqual(j["cache_tokens"], 3 * (24 + 6))
        self.assertEqual([r["jobs"] for r in j["jobs"]], [1, 3])
        for r in j["jobs"]:
            n = r["jobs"]
            self.assertEqual(r["generated_tokens"], n * 6)
            self.assertEqual(r["prompt_tokens"], n * 24)
            for key in ("wall_seconds", "gen_tok_s", "prefill_tok_s", "job_decode_tok_s_mean", "roofline_tok_s",
                        "bytes_per_step", "throughput_ratio"):
                self.assertGreater(r[key], 0, key)
            t = r["ttft_ms"]
            self.assertTrue(0 < t["p50"] <= t["p95"] <= t["max"] <= 1e3 * r["wall_seconds"], t)
            self.assertEqual(r["ratio_base_jobs"], 1)
            self.assertGreater(r["max_batch_tokens"], n)
            self.assertEqual(r["prefill_chunk"], 16)
        self.assertEqual(j["jobs"][0]["throughput_ratio"], 1.0)
        # The roofline: N sequences share one read of the weights, so three decode faster than one.
        self.assertGreater(j["jobs"][1]["roofline_tok_s"], j["jobs"][0]["roofline_tok_s"])
        self.assertIn("bench: 3 jobs", err)  # progress on stderr

    def test_check_rows(self):
        rc, out, err = exl3("-q", "bench", "-m", DRAFT, "-t", "2", "-p", "8", "-b", "1,2", "-c", "16", "-g", "4",
                            "--check-rows", "1,3")
        self.assertEqual(rc, 0, err)
        rows = [l for l in out.decode().splitlines() if l.startswith("| 1 | 16 | 3 |") or l.startswith("| 2 | 16 | 3 |")]
        self.assertEqual(len(rows), 2, out)
        rc, out, err = exl3("bench", "-m", DRAFT, "-t", "2", "-p", "8", "-c", "16", "-g", "4", "--check-rows", "1,3",
                            "--json")
        self.assertEqual(rc, 0, err)
        self.assertEqual([(r["batch"], r["rows"]) for r in json.loads(out)["check"]], [(1, 3)])
        rc, _, err = exl3("bench", "-m", DRAFT, "--check-rows", "34")
        self.assertGreater(rc, 0)
        self.assertIn("check-rows", err)

    def test_plain_table(self):
        rc, out, err = exl3("-q", *self.ARGS)
        self.assertEqual(rc, 0, err)
        text = out.decode()
        self.assertIn("| jobs | batch tokens | wall | gen tok/s | vs 1 job |", text)
        self.assertIn("decode roofline", text)
        rows = [l for l in text.splitlines() if l.startswith("| 1 |") or l.startswith("| 3 |")]
        self.assertEqual(len(rows), 2, text)
        self.assertEqual(err, "")

    def test_bad_values(self):
        for args, expect in ((("--jobs", "1,x"), "--jobs"), (("--jobs", "0"), "--jobs"),
                             (("--jobs", "4", "--job-batch-tokens", "4"), "--job-batch-tokens"),
                             (("--jobs", "1", "--job-gen", "0"), "--job-gen"),
                             (("-b", "1000", "-c", "10000000"), "too large"),
                             (("--jobs", "1", "--job-prompt", "2000000000", "--job-gen", "2000000000"), "too large")):
            rc, _, err = exl3("bench", "-m", DRAFT, *args)
            self.assertGreater(rc, 0, args)
            self.assertIn(expect, err, args)


class ErrorTest(unittest.TestCase):
    def fails(self, *args, expect, stdin=b""):
        rc, out, err = exl3(*args, stdin=stdin)
        self.assertGreater(rc, 0, f"{args}: exit {rc} (negative: a signal)\n{err}")
        self.assertIn(expect, err, args)
        for crash in ("terminate called", "Segmentation", "Assertion", "AddressSanitizer", "runtime error"):
            self.assertNotIn(crash, err)
        return err

    def test_missing_model(self):
        for cmd in (("run", "-p", "hi"), ("chat",), ("ppl", "-f", SAMPLE)):
            self.fails(cmd[0], "-m", "/nonexistent/model", *cmd[1:], expect=f"exl3 {cmd[0]}:")

    def test_prompt_longer_than_the_context(self):
        self.fails("run", "-m", DRAFT, "-p", "word " * 3000, expect="does not fit the context")
        self.fails("run", "-m", DRAFT, "-c", "16", "-p", "word " * 40, expect="does not fit the context")

    def test_invalid_sampling(self):
        for flag, value, what in (("--top-p", "0", "top_p"), ("--temperature", "-1", "temperature"),
                                  ("--min-p", "1.5", "min_p"), ("--top-k", "-3", "top_k"),
                                  ("--temperature", "nan", "temperature")):
            self.fails("run", "-m", DRAFT, "-p", "hi", flag, value, expect=what)
            self.fails("chat", "-m", DRAFT, flag, value, expect=what)
        self.fails("run", "-m", DRAFT, "-p", "hi", "--top-p", "abc", expect="top-p")
        self.fails("run", "-m", DRAFT, "-p", "hi", "-n", "-1", expect="-n")

    def test_absurd_thread_and_queue_counts(self):
        # Each once aborted the process (std::system_error from thread creation) instead of saying what is wrong.
        for cmd in (("run", "-p", "hi"), ("chat",), ("ppl", "-f", SAMPLE), ("bench", "-p", "8", "-b", "1")):
            for n in ("100000", "-2"):
                self.fails(cmd[0], "-m", DRAFT, *cmd[1:], "-t", n, expect="--threads")
        self.fails("serve", "-m", DRAFT, "--port", "0", "--max-queue", "200000", expect="--max-queue")
        self.fails("serve", "-m", DRAFT, "--port", "0", "--max-body-mb", "99999999999", expect="--max-body-mb")

    def test_serve_model_flags(self):
        # Nothing to serve, a models directory that is not there, switching without one, negative seconds: each is
        # said before anything loads.
        self.fails("serve", "--port", "0", expect="--models-dir")
        self.fails("serve", "--port", "0", "--models-dir", "/nonexistent/models", expect="not a directory")
        self.fails("serve", "-m", DRAFT, "--port", "0", "--model-switch", expect="--model-switch needs --models-dir")
        self.fails("serve", "-m", DRAFT, "--port", "0", "--idle-unload", "-1", expect="--idle-unload")
        self.fails("serve", "-m", "/nonexistent/model", "--port", "0", expect="nonexistent")

    def test_non_utf8_prompt(self):
        self.fails(b"run", b"-m", DRAFT.encode(), b"-p", b"caf\xe9 \xff", expect="UTF-8")

    def test_bad_device(self):
        self.fails("run", "-m", DRAFT, "-p", "hi", "--device", "tpu", expect="device")

    def test_ppl_inputs(self):
        self.fails("ppl", "-m", DRAFT, "-f", "/nonexistent/text.txt", expect="cannot open")
        self.fails("ppl", "-m", DRAFT, "-f", "tests", expect="directory")
        self.fails("ppl", "-m", DRAFT, "-f", SAMPLE, "--stride", "600", expect="--stride")
        self.fails("ppl", "-m", DRAFT, "-f", SAMPLE, "--ctx", "0", expect="--ctx")
        self.fails("ppl", "-m", DRAFT, "-f", SAMPLE, "--ctx", "4096", expect="context")
        with tempfile.TemporaryDirectory() as d:
            bad = os.path.join(d, "bad.txt")
            with open(bad, "wb") as f:
                f.write(b"fine text, then \xc3\x28 broken")
            self.fails("ppl", "-m", DRAFT, "-f", bad, expect="UTF-8")
            empty = os.path.join(d, "empty.txt")
            open(empty, "wb").close()
            self.fails("ppl", "-m", DRAFT, "-f", empty, expect="nothing to score")

    def test_convert_flags(self):
        # Said before anything is read: a shard size out of range (once shifted into bytes unchecked), a recipe step
        # that does not exist.
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "out")
            for v in ("0", "-5", "9223372036854775807"):
                self.fails("convert", "-i", DRAFT, "-o", out, "-b", "4", "--shard-size", v, expect="--shard-size")
            self.fails("convert", "-i", DRAFT, "-o", out, "-b", "4", "--recipe", "refit,bogus",
                       expect="unknown recipe step 'bogus'")
            self.fails("convert", "-i", DRAFT, "-o", out, "-b", "4", "--recipe", "refit,asym=lots",
                       expect="asym=A takes a number")
            # The asymmetric calibration's weight out of range, and beside the sequential stages: refused up front.
            self.fails("convert", "-i", DRAFT, "-o", out, "-b", "4", "--recipe", "asym=9", expect="asym 9")
            self.fails("convert", "-i", DRAFT, "-o", out, "-b", "4", "--recipe", "asym,sequential",
                       expect="do not combine")
            self.assertFalse(os.path.exists(out))

    def test_chat_without_a_template(self):
        with tempfile.TemporaryDirectory() as d:
            for name in os.listdir(DRAFT):
                if name != "tokenizer_config.json":
                    os.symlink(os.path.abspath(os.path.join(DRAFT, name)), os.path.join(d, name))
            with open(os.path.join(DRAFT, "tokenizer_config.json")) as f:
                cfg = json.load(f)
            cfg.pop("chat_template", None)
            with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
                json.dump(cfg, f)
            self.fails("chat", "-m", d, expect="no chat template")
            cfg["chat_template"] = "{% for m in messages %}{{ m.content }"
            with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
                json.dump(cfg, f)
            self.fails("chat", "-m", d, expect="line 1")
            # A template that fails while rendering: the turn is reported and dropped, the session goes on.
            cfg["chat_template"] = "{{ raise_exception('no user messages here') }}"
            with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
                json.dump(cfg, f)
            rc, out, err = exl3("chat", "-m", d, stdin=b"hello\n")
            self.assertEqual(rc, 0, err)
            self.assertIn("no user messages here", err)


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city",
                                      "parameters": {"type": "object",
                                                     "properties": {"city": {"type": "string", "maxLength": 16}},
                                                     "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "now", "description": "The local time"}},
]


class ToolsTest(unittest.TestCase):
    """`exl3 chat --tools`: the tools reach the template as the server passes them, and calls in the replies are
    printed as `tool_call: {"name", "arguments"}` lines. The real model rarely calls a tool by itself; --tool-choice
    NAME makes every reply a call (its arguments drawn under the tool's schema), which makes the parsing path
    deterministic without a mock. The parser's formats on fixed text: tests/chat/tool_calls_test.cpp."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.tools = os.path.join(self.dir.name, "tools.json")
        with open(self.tools, "w") as f:
            json.dump(TOOLS, f)
        self.args = ["chat", "-m", TARGET, "--temperature", "0", "-t", "2"]

    def tearDown(self):
        self.dir.cleanup()

    def write(self, name, data):
        path = os.path.join(self.dir.name, name)
        with open(path, "wb") as f:
            f.write(data)
        return path

    def test_the_prompt_offers_the_tools(self):
        rc, out, err = exl3(*self.args, "-n", "4", "--tools", self.tools, "--show-prompt",
                            stdin=b"What is the weather in Paris?\n")
        self.assertEqual(rc, 0, err)
        prompt = err.split("--- prompt ---\n", 1)[1].split("\n--- end of prompt ---", 1)[0]
        # Qwen-style ChatML: each tool as tojson writes it (json.dumps), in the file's key order, inside <tools>.
        listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in TOOLS)
        self.assertIn("<tools>\n" + listed + "\n</tools>", prompt)
        self.assertTrue(prompt.endswith("<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n"
                                        "<|im_start|>assistant\n"), prompt)
        self.assertIn("tool calls as hermes", err)
        self.assertNotIn(b"<tools>", out)  # the prompt goes to stderr; stdout is only the reply
        # Without --tools (or with an empty list, or --tool-choice none) the same template offers none.
        empty = self.write("empty.json", b"[]")
        for extra in ((), ("--tools", empty), ("--tools", self.tools, "--tool-choice", "none")):
            rc, _, err = exl3(*self.args, "-n", "4", "--show-prompt", *extra, stdin=b"Hi\n")
            self.assertEqual(rc, 0, err)
            self.assertIn("--- prompt ---\n<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n", err)
            self.assertNotIn("<tools>", err)

    def test_a_named_tool_is_called_every_turn(self):
        args = (*self.args, "-n", "48", "--tools", self.tools, "--tool-choice", "get_weather")
        rc, out, err = exl3(*args, stdin=b"What is the weather in Paris?\nAnd in Rome?\n")
        self.assertEqual(rc, 0, err)
        lines = out.decode("utf-8").splitlines()
        self.assertEqual(len(lines), 2, out)  # one call a turn, nothing else
        for line in lines:
            self.assertTrue(line.startswith("tool_call: "), line)
            call = json.loads(line[len("tool_call: "):])
            self.assertEqual(list(call), ["name", "arguments"])
            self.assertEqual(call["name"], "get_weather")
            self.assertEqual(list(call["arguments"]), ["city"])  # held to the tool's schema
            self.assertIsInstance(call["arguments"]["city"], str)
            self.assertLessEqual(len(call["arguments"]["city"]), 16)
        rc, again, _ = exl3(*args, stdin=b"What is the weather in Paris?\nAnd in Rome?\n")
        self.assertEqual((rc, again), (0, out))  # greedy: the same calls
        # A tool without parameters: its arguments are an empty object.
        rc, out, err = exl3(*self.args, "-n", "48", "--tools", self.tools, "--tool-choice", "now",
                            stdin=b"What time is it?\n")
        self.assertEqual(rc, 0, err)
        self.assertEqual(out, b'tool_call: {"name":"now","arguments":{}}\n')
        # A reply cut off (-n) inside its call made no call: it is printed as the text it is, opening included.
        rc, out, err = exl3(*self.args, "-n", "2", "--tools", self.tools, "--tool-choice", "get_weather",
                            stdin=b"What is the weather in Paris?\n")
        self.assertEqual(rc, 0, err)
        self.assertTrue(out.startswith(b'<tool_call>\n{"name": "get_weather", "arguments": '), out)
        self.assertNotIn(b"tool_call: ", out)

    def test_auto_and_required_print_text_as_without_tools(self):
        # auto: the model decides; a reply without a call is its text and a newline, as without --tools.
        rc, out, err = exl3(*self.args, "-n", "24", "--tools", self.tools, stdin=b"Hello there\n")
        self.assertEqual(rc, 0, err)
        self.assertTrue(out.endswith(b"\n") and out.strip(), out)
        # required: the reply is a call of one of the tools, held to its schema (a reply cut off inside it is the
        # text it is).
        rc, out, err = exl3(*self.args, "-n", "200", "--tools", self.tools, "--tool-choice", "required",
                            stdin=b"Weather?\nAnd the time?\n")
        self.assertEqual(rc, 0, err)
        lines = out.decode("utf-8").splitlines()
        self.assertEqual(len(lines), 2, out)
        for line in lines:
            call = json.loads(line[len("tool_call: "):])
            self.assertIn(call["name"], ("get_weather", "now"), line)
            self.assertEqual(list(call["arguments"]), ["city"] if call["name"] == "get_weather" else [], line)

    def test_bad_tool_files(self):
        cases = (
            (("--tools", os.path.join(self.dir.name, "missing.json")), "cannot open"),
            (("--tools", self.dir.name), "directory"),
            (("--tools", self.write("bad.json", b'[{"type": "function",')), "is not valid JSON: parse error at line 1"),
            (("--tools", self.write("bin.json", b"\xff\xfe[")), "is not valid JSON"),
            (("--tools", self.write("obj.json", b'{"tools": []}')), "must hold a list of tools"),
            (("--tools", self.write("noname.json", b'[{"type": "function", "function": {"description": "x"}}]')),
             "every tool needs a 'function' object with a string 'name'"),
            (("--tools", self.write("str.json", b'["get_weather"]')), "every tool needs"),
            (("--tool-choice", "get_weather"), "--tool-choice needs --tools"),
            (("--tools", self.tools, "--tool-choice", "fly"), "names the function 'fly', which is not in"),
            (("--tools", self.tools, "--tool-format", "gpt"), "--tool-format 'gpt' is not one of"),
        )
        for args, expect in cases:
            rc, out, err = exl3(*self.args, *args, stdin=b"Hi\n")
            self.assertGreater(rc, 0, f"{args}: exit {rc} (negative: a signal)\n{err}")
            self.assertIn(expect, err, args)
            self.assertEqual(out, b"", args)
            for crash in ("terminate called", "Segmentation", "Assertion", "AddressSanitizer", "runtime error"):
                self.assertNotIn(crash, err)


class ReasoningTest(unittest.TestCase):
    """`exl3 chat` with a model whose template opens a reasoning block (QwQ's, on the tiny model): the reasoning goes
    to stderr between [reasoning] lines, the answer to stdout; --max-reasoning-tokens closes the block."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        model = os.path.join(self.dir.name, "model")
        os.mkdir(model)
        for name in os.listdir(TARGET):
            if name != "tokenizer_config.json":
                os.symlink(os.path.abspath(os.path.join(TARGET, name)), os.path.join(model, name))
        with open(os.path.join(TARGET, "tokenizer_config.json")) as f:
            config = json.load(f)
        with open("tests/fixtures/chat/templates/Qwen-QwQ-32B.jinja") as f:
            config["chat_template"] = f.read()
        with open(os.path.join(model, "tokenizer_config.json"), "w") as f:
            json.dump(config, f)
        self.args = ["chat", "-m", model, "--temperature", "0", "-t", "2"]

    def tearDown(self):
        self.dir.cleanup()

    def test_reasoning_on_stderr_answer_on_stdout(self):
        rc, out, err = exl3(*self.args, "-n", "16", "--max-reasoning-tokens", "4", stdin=b"Hello\n")
        self.assertEqual(rc, 0, err)
        self.assertIn("reasoning tags", err)
        self.assertIn("[reasoning]\n", err)
        self.assertIn("[/reasoning]\n", err)
        self.assertTrue(out.strip(), out)
        self.assertNotIn(b"</think>", out)
        self.assertNotIn(b"[reasoning]", out)
        # No budget: the tiny model never closes the block, so all of the reply is reasoning.
        rc, out, err = exl3(*self.args, "-n", "8", stdin=b"Hello\n")
        self.assertEqual(rc, 0, err)
        self.assertEqual(out, b"\n")
        for bad in (("--max-reasoning-tokens", "-5"), ("--chat-template-kwargs", "[1]")):
            rc, out, err = exl3(*self.args, *bad, stdin=b"Hi\n")
            self.assertGreater(rc, 0, err)
            self.assertEqual(out, b"")


def main():
    global EXL3, TARGET
    argv = sys.argv[1:]
    if len(argv) < 2 or argv[0] != "--exl3":
        sys.exit("usage: cli_test.py --exl3 PATH [--shared DIR] [unittest args]")
    EXL3 = os.path.abspath(argv[1])
    if not os.access(EXL3, os.X_OK):
        sys.exit(f"{EXL3}: not an executable")
    argv = argv[2:]
    shared = None
    if len(argv) >= 2 and argv[0] == "--shared":
        shared, argv = argv[1], argv[2:]
    shared = os.environ.get("EXL3_SHARED_DIR") or shared
    target = os.path.join(shared, "models", "tiny-target") if shared else None
    TARGET = target if target and os.path.isfile(os.path.join(target, "config.json")) else DRAFT
    unittest.main(argv=[sys.argv[0], *argv], verbosity=2)


if __name__ == "__main__":
    main()
