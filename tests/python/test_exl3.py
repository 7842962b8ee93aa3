"""The Python module (import exl3) on the committed tiny-draft model: tokenizer, model logits against the
transformers fixture, generation through the Generator (greedy, batched, streamed, sampled, stopped, cancelled),
chat templates, and errors. Standard library only; run with PYTHONPATH=<build>/python (ctest sets it).

    PYTHONPATH=build/release/python python3 tests/python/test_exl3.py [-k pattern]
"""

import array
import gc
import json
import os
import struct
import tempfile
import threading
import unittest

import exl3

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "tests", "models", "tiny-draft")
GOLDEN = os.path.join(ROOT, "tests", "fixtures", "golden", "tiny_draft.safetensors")
DEVICE = os.environ.get("EXL3_TEST_DEVICE", "cpu")  # "cuda" on a GPU machine


def read_safetensors(path):
    """{name: (shape, flat list)} for the F32 / I32 tensors of a safetensors file."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a = array.array({"F32": "f", "I32": "i"}[t["dtype"]])
        begin, end = t["data_offsets"]
        a.frombytes(blob[8 + n + begin : 8 + n + end])
        out[name] = (t["shape"], a.tolist())
    return out


_model = None
_tok = None


def model():
    global _model
    if _model is None:
        # On CUDA a batch's rows only equal each row alone with batch-invariant kernels (the CPU always is).
        _model = exl3.Model(MODEL, device=DEVICE, threads=int(os.environ.get("EXL3_THREADS", "2")),
                            batch_invariant=DEVICE != "cpu")
    return _model


def tokenizer():
    global _tok
    if _tok is None:
        _tok = exl3.Tokenizer(MODEL)
    return _tok


class TokenizerTest(unittest.TestCase):
    def test_round_trip_and_specials(self):
        tok = tokenizer()
        text = "Hello, world! Ünïcödé and emoji \U0001f600 too."
        ids = tok.encode(text)
        self.assertEqual(ids[0], tok.bos_id)  # tokenizer_config.json asks for BOS
        self.assertEqual(tok.decode(ids, skip_special_tokens=True), text)
        self.assertEqual(tok.encode(text, add_special_tokens=False), ids[1:])
        self.assertEqual(tok.bos_token, "<|begin_of_text|>")
        self.assertEqual(tok.token_to_id(tok.bos_token), tok.bos_id)
        self.assertEqual(tok.id_to_token(tok.bos_id), tok.bos_token)
        self.assertIsNone(tok.token_to_id("no such token, surely"))
        self.assertIsNone(tok.id_to_token(10**9))
        self.assertTrue(tok.is_special(tok.bos_id))
        self.assertIn(tok.eos_id, tok.eos_ids)
        # Special tokens written in the text: parsed by default, plain text when parse_special is off.
        im_end = tok.token_to_id("<|im_end|>")
        self.assertEqual(tok.encode("<|im_end|>", add_special_tokens=False), [im_end])
        self.assertNotEqual(tok.encode("<|im_end|>", add_special_tokens=False, parse_special=False), [im_end])
        self.assertGreater(tok.vocab_size, 1000)

    def test_chat_template(self):
        tok = tokenizer()
        self.assertIn("default", tok.chat_template_names)
        self.assertIn("im_start", tok.chat_template())
        text = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
        self.assertEqual(
            text,
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n",
        )
        text = exl3.apply_chat_template(
            tok, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
            add_generation_prompt=False)
        self.assertEqual(text, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n")
        with self.assertRaises(exl3.NotFoundError):
            tok.apply_chat_template([{"role": "user", "content": "Hi"}], template="no-such-template")

    def test_errors(self):
        with self.assertRaises(exl3.Error) as e:
            exl3.Tokenizer("/nonexistent/dir")
        self.assertIn("/nonexistent/dir", str(e.exception))
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "tokenizer.json"), "w") as f:
                f.write("{not json")
            with self.assertRaises(exl3.InvalidArgumentError) as e:
                exl3.Tokenizer(d)
            self.assertIsInstance(e.exception, ValueError)
        with self.assertRaises(UnicodeEncodeError):  # a lone surrogate is not UTF-8
            tokenizer().encode("bad \ud800 text")
        with self.assertRaises(exl3.InvalidArgumentError):
            tokenizer().decode([2**40])


class ModelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.golden = read_safetensors(GOLDEN)

    def test_info(self):
        m = model()
        info = m.info
        self.assertEqual(info["architecture"], "LlamaForCausalLM")
        self.assertEqual(info["num_layers"], 4)
        self.assertEqual(info["hidden_size"], 256)
        self.assertEqual(m.vocab_size, info["vocab_size"])
        self.assertEqual(m.context_length, 2048)
        self.assertTrue(m.device.startswith(DEVICE))
        self.assertIn("LlamaForCausalLM", repr(m))

    def check_logits(self, seq_name):
        m = model()
        _, tokens = self.golden[seq_name + ".tokens"]
        (kept, vocab), ref = self.golden[seq_name + ".logits"]
        seq = m.new_sequence()
        logits = m.forward(seq, tokens, all_logits=True)
        self.assertEqual(logits.shape, (len(tokens), vocab))
        self.assertEqual(len(seq), len(tokens))
        view = memoryview(logits)
        self.assertEqual(view.shape, (len(tokens), vocab))
        self.assertEqual(view.format, "f")
        self.assertTrue(view.readonly)
        worst = 0.0
        for r in range(kept):
            ours = logits[len(tokens) - kept + r]
            want = ref[r * vocab : (r + 1) * vocab]
            max_ref = max(abs(x) for x in want)
            max_diff = max(abs(a - b) for a, b in zip(ours, want))
            worst = max(worst, max_diff / max_ref)
        tol = 1e-4 if DEVICE == "cpu" else 2e-2
        self.assertLessEqual(worst, tol, f"{seq_name}: worst relative logit error {worst:.2e}")

    def test_logits_match_transformers(self):
        self.check_logits("seq0")
        self.check_logits("seq1")

    def test_forward_in_pieces_equals_whole(self):
        m = model()
        _, tokens = self.golden["seq0.tokens"]
        whole = m.forward(m.new_sequence(), tokens)
        seq = m.new_sequence()
        m.forward(seq, tokens[:10])
        last = m.forward(seq, tokens[10:])
        self.assertEqual(last.shape, (1, m.vocab_size))
        self.assertEqual(last.argmax(), whole.argmax())
        diff = max(abs(a - b) for a, b in zip(last[0], whole[-1]))
        self.assertLess(diff, 1e-3)
        seq.reset()
        self.assertEqual(seq.length, 0)

    def test_greedy_matches_transformers(self):
        _, prompt = self.golden["greedy.prompt"]
        _, want = self.golden["greedy.tokens"]
        self.assertEqual(model().generate_greedy(prompt, len(want)), want)

    def test_errors(self):
        m = model()
        with self.assertRaises(exl3.Error) as e:
            exl3.Model("/nonexistent/model")
        self.assertIn("/nonexistent/model", str(e.exception))
        with self.assertRaises(exl3.InvalidArgumentError):
            m.forward(m.new_sequence(), [m.vocab_size + 5])
        with self.assertRaises(exl3.InvalidArgumentError):
            m.forward(m.new_sequence(), [-1])
        with self.assertRaises(exl3.InvalidArgumentError):
            m.forward(m.new_sequence(), [2**40])
        with self.assertRaises(exl3.OutOfRangeError):
            m.forward(m.new_sequence(max_length=4), [1, 2, 3, 4, 5])
        with self.assertRaises(exl3.InvalidArgumentError):
            exl3.Model(MODEL, threads=100000)
        with self.assertRaises(TypeError):
            exl3.Model(MODEL, "cpu")  # options are keywords
        with tempfile.TemporaryDirectory() as d:  # a truncated checkpoint
            for name in os.listdir(MODEL):
                src = os.path.join(MODEL, name)
                with open(src, "rb") as f:
                    data = f.read()
                if name.endswith(".safetensors"):
                    data = data[: len(data) // 2]
                with open(os.path.join(d, name), "wb") as f:
                    f.write(data)
            with self.assertRaises(exl3.InvalidArgumentError) as e:
                exl3.Model(d)
            self.assertIn("safetensors", str(e.exception))

    def test_memory_plan(self):
        # The GPU memory plan needs no GPU when a budget is given (docs/memory.md).
        p = exl3.plan_memory(MODEL, gpu_memory=1.0, context_length=1024, kv_bits=8, cache_tokens=4096)
        self.assertTrue(p["fits"], p["table"])
        self.assertEqual((p["context_length"], p["cache_tokens"]), (1024, 4096))
        self.assertEqual(p["kv_bytes_per_token"], 4 * 2 * 2 * 72)
        self.assertEqual(p["gpu_total"], sum(i["bytes"] for i in p["gpu"]))
        self.assertIn("KV cache", p["table"])
        small = exl3.plan_memory(MODEL, gpu_memory=0.05)
        self.assertFalse(small["fits"])
        self.assertGreater(small["short_by"], 0)
        self.assertTrue(any(s.startswith("--gpu-memory") for s in small["suggestions"]), small["suggestions"])
        # A load whose plan does not fit is refused before a GPU is touched.
        with self.assertRaises(exl3.OutOfRangeError) as e:
            exl3.Model(MODEL, device="cuda", gpu_memory=0.05)
        self.assertIn("more than the budget", str(e.exception))
        with self.assertRaises(exl3.InvalidArgumentError):
            exl3.Model(MODEL, offload_mode="gpu")
        with self.assertRaises(exl3.InvalidArgumentError):
            exl3.plan_memory(MODEL, gpu_memory=-1.0)
        m = model()
        if DEVICE != "cpu":
            self.assertTrue(m.memory_plan["fits"])
            self.assertEqual(m.info["cache_tokens"], m.memory_plan["cache_tokens"])

    def test_sequences_keep_their_model_alive(self):
        m = exl3.Model(MODEL, device=DEVICE, threads=2)
        seq = m.new_sequence()
        del m
        gc.collect()
        self.assertEqual(seq.length, 0)  # still usable: the model lives while its sequence does

    def test_threads_run_while_the_model_does(self):
        # forward releases the GIL: two Python threads run two sequences at once and get what one alone gets.
        m = model()
        _, tokens = self.golden["seq1.tokens"]
        alone = m.forward(m.new_sequence(), tokens).argmax()
        results = []

        def work():
            results.append(m.forward(m.new_sequence(), tokens).argmax())

        threads = [threading.Thread(target=work) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(results, [alone, alone])


class GeneratorTest(unittest.TestCase):
    def gen(self, **kw):
        return exl3.Generator(model(), tokenizer(), **kw)

    def test_greedy_equals_the_model_and_text_decodes_tokens(self):
        g = self.gen()
        prompt = tokenizer().encode("Once upon a time")
        c = g.generate(prompt, max_new_tokens=24, ignore_eos=True)
        self.assertEqual(c.tokens, model().generate_greedy(prompt, 24))
        self.assertEqual(c.text, tokenizer().decode(c.tokens, skip_special_tokens=True))
        self.assertEqual(c.finish_reason, "length")
        self.assertEqual(c.generated_tokens, 24)
        self.assertEqual(c.prompt_tokens, len(prompt))
        # A text prompt is tokenized as encode() does (BOS added).
        self.assertEqual(g.generate("Once upon a time", max_new_tokens=24, ignore_eos=True).tokens, c.tokens)

    def test_a_batch_equals_each_alone(self):
        prompts = ["The cat", "In the beginning there was", "1, 2, 3,"]
        alone = [self.gen().generate(p, max_new_tokens=16, ignore_eos=True).text for p in prompts]
        together = self.gen().generate(prompts, max_new_tokens=16, ignore_eos=True)
        self.assertEqual([c.text for c in together], alone)
        self.assertEqual(self.gen().generate([], max_new_tokens=4), [])

    def test_stream_concatenates_to_generate(self):
        g = self.gen()
        prompt = "The sun rose over the hills, and the birds began to sing. " * 6  # a few full KV pages
        whole = g.generate(prompt, max_new_tokens=20, ignore_eos=True)
        parts = list(g.stream(prompt, max_new_tokens=20, ignore_eos=True))
        self.assertEqual("".join(u.text for u in parts), whole.text)
        self.assertEqual(parts[-1].finish_reason, "length")
        self.assertTrue(all(u.finish_reason is None for u in parts[:-1]))
        self.assertGreater(parts[-1].cached_tokens, 0)  # the second run's prompt came from the prefix cache
        self.assertFalse(g.has_work)

    def test_sampling_is_seeded(self):
        g = self.gen()
        kw = dict(max_new_tokens=24, temperature=1.0, top_p=0.95, top_k=50, min_p=0.01, seed=1234, ignore_eos=True)
        a = g.generate("Tell me", **kw).tokens
        b = g.generate("Tell me", **kw).tokens
        self.assertEqual(a, b)
        others = [g.generate("Tell me", **dict(kw, seed=s)).tokens for s in (1, 2, 3)]
        self.assertTrue(any(o != a for o in others))
        # The rest of the chain accepts its settings.
        c = g.generate("Tell me", max_new_tokens=8, temperature=0.7, repetition_penalty=1.1, presence_penalty=0.5,
                       frequency_penalty=0.5, dry_multiplier=0.8, xtc_probability=0.5, typical_p=0.9,
                       logit_bias={5: -100.0}, banned_tokens=[6, 7], seed=7)
        self.assertNotIn(6, c.tokens)
        self.assertNotIn(7, c.tokens)

    def test_stop_strings_and_ids(self):
        g = self.gen()
        free = g.generate("Once upon a time", max_new_tokens=32, ignore_eos=True)
        self.assertGreater(len(free.text), 4)
        stop = free.text[len(free.text) // 2 : len(free.text) // 2 + 3]
        c = g.generate("Once upon a time", max_new_tokens=32, ignore_eos=True, stop=stop)
        self.assertEqual(c.finish_reason, "stop")
        self.assertEqual(c.text, free.text[: free.text.index(stop)])
        c = g.generate("Once upon a time", max_new_tokens=32, ignore_eos=True, stop_ids=[free.tokens[3]])
        self.assertEqual(c.finish_reason, "stop")
        self.assertEqual(c.tokens, free.tokens[: free.tokens.index(free.tokens[3])])

    def test_json_mode(self):
        # The output is one JSON object (or, cut by max_new_tokens, the start of one), greedy and sampled.
        for kw in (dict(), dict(temperature=0.8, seed=3)):
            c = self.gen().generate("A lighthouse, as JSON:", max_new_tokens=160, json=True, **kw)
            if c.finish_reason == "stop":
                self.assertIsInstance(json.loads(c.text), dict)
            else:
                self.assertEqual(c.finish_reason, "length")
                self.assertRegex(c.text, r"^\s*\{")
        with self.assertRaises(Exception):
            exl3.Generator(model()).generate([1, 2, 3], max_new_tokens=4, json=True)  # no tokenizer: no token texts

    def test_json_schema(self):
        # The output is one value of the schema (a dict, or its JSON text); a schema it cannot be held to is refused.
        schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                                    "tags": {"type": "array", "items": {"enum": ["a", "b"]}}},
                  "required": ["name", "tags"]}
        for s in (schema, json.dumps(schema)):
            c = self.gen().generate("A lighthouse, as JSON:", max_new_tokens=300, json_schema=s)
            if c.finish_reason == "stop":
                v = json.loads(c.text)
                self.assertEqual(list(v), ["name", "tags"])
                self.assertTrue(set(v["tags"]) <= {"a", "b"})
            else:
                self.assertEqual(c.finish_reason, "length")
        with self.assertRaises(exl3.InvalidArgumentError):
            self.gen().generate("x", max_new_tokens=4, json_schema={"type": "object", "minProperties": 1})
        with self.assertRaises(exl3.InvalidArgumentError):
            self.gen().generate("x", max_new_tokens=4, json_schema=3)

    def test_speculative_decoding_keeps_the_output(self):
        prompt = "The sun rose over the hills, and the birds began to sing. " * 3
        kw = dict(max_new_tokens=40, ignore_eos=True)
        plain = self.gen().generate(prompt, **kw)
        ngram = self.gen(draft_tokens=4).generate(prompt, **kw)
        # The model as its own draft: the greedy proposals are the model's own picks.
        draft = exl3.Model(MODEL, device=DEVICE, threads=int(os.environ.get("EXL3_THREADS", "2")),
                           batch_invariant=DEVICE != "cpu")
        drafted = self.gen(draft_model=draft, draft_tokens=3).generate(prompt, **kw)
        for c in (ngram, drafted):
            self.assertEqual(len(c.tokens), 40)
            self.assertGreater(c.draft_tokens, 0)
            self.assertLessEqual(c.accepted_tokens, c.draft_tokens)
            if DEVICE == "cpu":  # on CUDA a step of several rows may round a near-tie the other way
                self.assertEqual(c.tokens, plain.tokens)
        self.assertGreater(drafted.accepted_tokens, 0)
        self.assertEqual(plain.draft_tokens, 0)
        with self.assertRaises(exl3.InvalidArgumentError):
            self.gen(draft_tokens=-1)
        with self.assertRaises(exl3.InvalidArgumentError):
            self.gen(draft_tokens=2, ngram_min=3, ngram_max=2)

    def test_logprobs(self):
        c = self.gen().generate("The", max_new_tokens=6, ignore_eos=True, logprobs=3)
        self.assertEqual(len(c.logprobs), 6)
        self.assertEqual(len(c.top_logprobs), 6)
        for tok, lp, top in zip(c.tokens, c.logprobs, c.top_logprobs):
            self.assertEqual(len(top), 3)
            self.assertEqual(top[0][0], tok)  # greedy: the chosen token is the most likely
            self.assertAlmostEqual(top[0][1], lp, places=5)
            self.assertLessEqual(lp, 0.0)

    def test_breaking_a_stream_cancels_it(self):
        g = self.gen()
        other = g.submit("Another job", max_new_tokens=3, ignore_eos=True)
        for u in g.stream("Once", max_new_tokens=500, ignore_eos=True):
            break
        # The stream's job is gone; the other job's updates wait for step().
        updates = []
        while g.has_work:
            updates += g.step()
        self.assertEqual({u.job for u in updates}, {other})
        self.assertEqual(sum(len(u.tokens) for u in updates), 3)
        self.assertEqual(g._g.live_sequences, 0)

    def test_step_interleaves_jobs(self):
        g = self.gen()
        a = g.submit("First", max_new_tokens=5, ignore_eos=True)
        b = g.submit(tokenizer().encode("Second"), max_new_tokens=7, ignore_eos=True)
        counts = {a: 0, b: 0}
        finished = {}
        for u in g:
            counts[u.job] += len(u.tokens)
            if u.finish_reason:
                finished[u.job] = u.finish_reason
        self.assertEqual(counts, {a: 5, b: 7})
        self.assertEqual(finished, {a: "length", b: "length"})
        with self.assertRaises(exl3.NotFoundError):
            g.cancel(a)  # already finished

    def test_chat(self):
        g = self.gen()
        c = g.chat([{"role": "user", "content": "Hi"}], max_new_tokens=8)
        self.assertIn(c.finish_reason, ("eos", "length"))
        text = tokenizer().apply_chat_template([{"role": "user", "content": "Hi"}])
        ids = tokenizer().encode(text, add_special_tokens=False)
        self.assertEqual(c.tokens, g.generate(ids, max_new_tokens=8).tokens)
        with self.assertRaises(exl3.InvalidArgumentError):
            exl3.Generator(model()).chat([{"role": "user", "content": "Hi"}])

    def test_a_failed_job_raises_its_error(self):
        # A KV cache of one 128-token sequence: two jobs of ~105 tokens each overflow it, and the newest one fails.
        small = exl3.Model(MODEL, device=DEVICE, threads=2, context_length=128, cache_tokens=128)
        g = exl3.Generator(small, tokenizer())
        with self.assertRaises(exl3.OutOfRangeError) as e:
            g.generate(["Once upon a time", "In a land far away"], max_new_tokens=100, ignore_eos=True)
        self.assertIn("KV cache", str(e.exception))
        self.assertFalse(g.has_work)

    def test_bad_requests(self):
        g = self.gen()
        with self.assertRaises(TypeError):
            g.submit("x", no_such_option=1)
        with self.assertRaises(TypeError):
            g.submit("x", temperature="hot")
        with self.assertRaises(TypeError):
            g.submit(b"bytes")
        for bad in (dict(temperature=-1.0), dict(top_p=0.0), dict(top_p=float("nan")), dict(max_new_tokens=0),
                    dict(logit_bias={10**7: 1.0}), dict(logprobs=1000), dict(seed=-1)):
            with self.assertRaises(exl3.InvalidArgumentError, msg=str(bad)) as e:
                g.submit("x", **bad)
            self.assertIsInstance(e.exception, ValueError)
        with self.assertRaises(exl3.InvalidArgumentError):
            g.submit([])
        with self.assertRaises(exl3.Error):  # longer than the context
            g.submit([5] * 5000)
        with self.assertRaises(exl3.InvalidArgumentError):  # no tokenizer: ids only
            exl3.Generator(model()).submit("text")
        self.assertFalse(g.has_work)
        self.assertIn("temperature", exl3.request_keywords())


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                     "required": ["city"]}}},
    {"type": "function", "function": {"name": "now", "description": "The local time"}},
]


class ToolCallsTest(unittest.TestCase):
    """Generator.chat(tools=...) and exl3.parse_tool_calls: the server's parser. A tiny model seldom writes a call of
    its own, so the parsing is checked on fixed replies, and chat on the real model for what reaches the template."""

    def test_parse_tool_calls(self):
        content, calls = exl3.parse_tool_calls(
            'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
            '<tool_call>{"name": "now"}</tool_call>')
        self.assertEqual(content, "Let me look.")
        self.assertEqual([(c["name"], c["arguments"]) for c in calls], [("get_weather", {"city": "Paris"}),
                                                                         ("now", {})])
        self.assertTrue(all(c["id"].startswith("call_") for c in calls))
        self.assertNotEqual(calls[0]["id"], calls[1]["id"])
        content, calls = exl3.parse_tool_calls('{"name": "now", "parameters": {}}', "llama3")
        self.assertEqual((content, [c["name"] for c in calls]), ("", ["now"]))
        content, calls = exl3.parse_tool_calls('[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}', "mistral-args")
        self.assertEqual([c["arguments"] for c in calls], [{"city": "Rome"}])
        self.assertEqual(len(calls[0]["id"]), 9)  # Mistral's templates check the length
        for text in ("no calls here", "<tool_call>{not json}</tool_call>", '<tool_call>{"name": "cut'):
            self.assertEqual(exl3.parse_tool_calls(text), (text, []))  # not a call: the text as it is
        with self.assertRaises(exl3.InvalidArgumentError) as e:
            exl3.parse_tool_calls("x", "gpt")
        self.assertIn("'gpt' is not one of", str(e.exception))

    def test_tool_call_format(self):
        self.assertEqual(tokenizer().tool_call_format(), "hermes")  # ChatML with <tool_call>, as Qwen's
        with self.assertRaises(exl3.NotFoundError):
            tokenizer().tool_call_format("no-such-template")

    def test_chat_with_tools(self):
        g = exl3.Generator(model(), tokenizer())
        messages = [{"role": "user", "content": "What is the weather in Paris?"}]
        c = g.chat(messages, tools=TOOLS, max_new_tokens=12)
        # The tools reach the template as apply_chat_template (and the server) gives them: the same prompt.
        prompt = tokenizer().apply_chat_template(messages, tools=TOOLS)
        self.assertIn("<tools>\n" + "\n".join(json.dumps(t) for t in TOOLS) + "\n</tools>", prompt)
        ids = tokenizer().encode(prompt, add_special_tokens=False)
        self.assertEqual(c.tokens, g.generate(ids, max_new_tokens=12).tokens)
        # The reply read by the parser: its calls, and its text outside them (all of it when there is none).
        content, calls = exl3.parse_tool_calls(c.text)
        self.assertEqual(c.content, content)
        self.assertEqual([(x["name"], x["arguments"]) for x in c.tool_calls],
                         [(x["name"], x["arguments"]) for x in calls])  # ids aside: they are random
        if not calls:
            self.assertEqual(c.content, c.text)
        # No tools, or an empty list: the plain template, content is the text.
        plain = g.chat(messages, max_new_tokens=12)
        self.assertEqual((plain.content, plain.tool_calls), (plain.text, []))
        self.assertEqual(g.chat(messages, tools=[], max_new_tokens=12).tokens, plain.tokens)
        self.assertNotEqual(ids, tokenizer().encode(tokenizer().apply_chat_template(messages), add_special_tokens=False))
        # generate() leaves content unset: it reads no template.
        self.assertIsNone(g.generate("Hi", max_new_tokens=2).content)

    def test_choices_hold_the_output(self):
        # The Generator's choices (what tool_choice "required" generates under): the output is one literal and then a
        # value its schema admits, the job ending when that closes -- sampled on the model's device.
        g = exl3.Generator(model(), tokenizer())
        city = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}}, "required": ["city"],
                "additionalProperties": False}
        choices = [{"literal": '{"name": "get_weather", "arguments": ', "json_schema": city},
                   {"literal": '{"name": "now", "arguments": ', "json_schema": {"type": "object",
                                                                            "additionalProperties": False}}]
        for seed in range(4):
            c = g.generate("The keeper wrote:", max_new_tokens=60, choices=choices, temperature=1.0, seed=seed)
            self.assertEqual(c.finish_reason, "stop", c.text)
            call = json.loads(c.text + "}")
            self.assertIn(call["name"], ("get_weather", "now"))
            self.assertEqual(list(call["arguments"]), ["city"] if call["name"] == "get_weather" else [])
        with self.assertRaises(exl3.InvalidArgumentError):
            g.submit("x", choices=[{"literal": "a"}])
        with self.assertRaises(exl3.InvalidArgumentError):
            g.submit("x", choices_trigger="<tool_call>")  # without choices
        self.assertFalse(g.has_work)

    def test_bad_tools(self):
        g = exl3.Generator(model(), tokenizer())
        messages = [{"role": "user", "content": "Hi"}]
        for bad, message in (({"function": {"name": "f"}}, "'tools' must be a list"),
                             ([{"type": "function"}], "every tool needs a 'function' object with a string 'name'"),
                             (["get_weather"], "every tool needs")):
            with self.assertRaises(exl3.InvalidArgumentError, msg=str(bad)) as e:
                g.chat(messages, tools=bad)
            self.assertIn(message, str(e.exception))
        with self.assertRaises(TypeError):  # not JSON at all
            g.chat(messages, tools=[{"type": "function", "function": {"name": object()}}])
        self.assertFalse(g.has_work)


class ReasoningTest(unittest.TestCase):
    """Generator.chat with a template that opens a reasoning block (QwQ's, on the tiny model's tokenizer): the reply's
    reasoning apart from its content, and max_reasoning_tokens closing the block so that an answer follows."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        for name in ("tokenizer.json", "tokenizer_config.json"):
            with open(os.path.join(MODEL, name), "rb") as f, open(os.path.join(cls.dir.name, name), "wb") as out:
                out.write(f.read())
        config_path = os.path.join(cls.dir.name, "tokenizer_config.json")
        with open(config_path) as f:
            config = json.load(f)
        with open(os.path.join(ROOT, "tests", "fixtures", "chat", "templates", "Qwen-QwQ-32B.jinja")) as f:
            config["chat_template"] = f.read()
        with open(config_path, "w") as f:
            json.dump(config, f)
        cls.tok = exl3.Tokenizer(cls.dir.name)

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def test_reply_format(self):
        self.assertEqual(self.tok.reply_format(), {"tools": "hermes", "reasoning": "tags", "reasoning_open": "<think>",
                                                   "reasoning_close": "</think>"})
        self.assertEqual(tokenizer().reply_format()["reasoning"], "none")

    def test_chat_splits_reasoning_and_keeps_the_budget(self):
        g = exl3.Generator(model(), self.tok)
        messages = [{"role": "user", "content": "Hi"}]
        c = g.chat(messages, max_new_tokens=16, max_reasoning_tokens=4, ignore_eos=True)
        self.assertEqual(c.reasoning_tokens, 4)
        self.assertTrue(c.reasoning)
        self.assertNotIn("</think>", c.reasoning + c.content)
        self.assertIn("</think>", c.text)  # the reply as written: reasoning, the closing the budget placed, answer
        # Without a budget the tiny model never closes the block: all reasoning, no content.
        free = g.chat(messages, max_new_tokens=8, ignore_eos=True)
        self.assertEqual((free.content, free.reasoning_tokens), ("", 8))
        # A model without reasoning markers refuses a budget; the low-level keyword checks its fields.
        with self.assertRaises(exl3.InvalidArgumentError):
            exl3.Generator(model(), tokenizer()).chat(messages, max_reasoning_tokens=3)
        with self.assertRaises(exl3.InvalidArgumentError):
            g.submit("x", reasoning={"open": "<think>", "close": "</think>", "max_tokens": -3})
        with self.assertRaises(TypeError):
            g.submit("x", reasoning={"opne": "<think>"})
        self.assertFalse(g.has_work)


if __name__ == "__main__":
    unittest.main(verbosity=2)
