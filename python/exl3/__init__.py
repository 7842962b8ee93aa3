"""exl3.cpp from Python: load EXL3 and Hugging Face models, tokenize, run them and generate text.

    import exl3
    model = exl3.Model("tests/models/tiny-draft")              # device="cuda" on a GPU
    tok = exl3.Tokenizer("tests/models/tiny-draft")
    gen = exl3.Generator(model, tok)
    print(gen.generate("The capital of France is", max_new_tokens=16).text)

The engine is the same one the `exl3` program and server run: the Generator batches every job submitted to it
(continuous batching, prefix caching), samples with the full chain (temperature, top-k/p, min-p, typical, XTC,
penalties, DRY, logit bias, seed) and streams text. Every failure raises an exl3.Error subclass with a message
that says what and where.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Optional, Sequence as _Seq, Union

from . import _exl3
from ._exl3 import (
    Error,
    InternalError,
    InvalidArgumentError,
    IoError,
    JobUpdate,
    Logits,
    Model,
    NotFoundError,
    OutOfRangeError,
    Sequence,
    Tokenizer,
    UnsupportedError,
    plan_memory,
)

__all__ = [
    "Completion",
    "Error",
    "Generator",
    "InternalError",
    "InvalidArgumentError",
    "IoError",
    "JobUpdate",
    "Logits",
    "Model",
    "NotFoundError",
    "OutOfRangeError",
    "Sequence",
    "Tokenizer",
    "plan_memory",
    "UnsupportedError",
    "apply_chat_template",
    "parse_tool_calls",
]

Prompt = Union[str, _Seq[int]]


def apply_chat_template(
    tokenizer: Tokenizer,
    messages: list,
    *,
    add_generation_prompt: bool = True,
    tools: Optional[list] = None,
    documents: Optional[list] = None,
    template: str = "default",
    **kwargs,
) -> str:
    """Renders messages with the tokenizer's chat template, as transformers' apply_chat_template(tokenize=False)
    does (the same Jinja semantics, byte for byte). Extra keyword arguments (enable_thinking=False, ...) become
    template variables. Tokenize the result with add_special_tokens=False."""
    ctx = {
        "messages": messages,
        "tools": tools,
        "documents": documents,
        "add_generation_prompt": add_generation_prompt,
    }
    ctx.update(kwargs)
    return tokenizer._render_chat(json.dumps(ctx, ensure_ascii=False), template)


Tokenizer.apply_chat_template = (  # type: ignore[attr-defined]
    lambda self, messages, **kw: apply_chat_template(self, messages, **kw)
)


def parse_tool_calls(text: str, format: str = "hermes") -> tuple:
    """Splits a model's reply into its text and the tool calls in it, as `exl3 serve` does: returns
    (content, tool_calls), tool_calls a list of {"id", "name", "arguments"} (arguments a dict). format is how the
    model writes calls: 'hermes' (<tool_call>...</tool_call>: Qwen, Hermes), 'llama3', 'mistral', 'mistral-args',
    'granite' (<|tool_call|>[...]), 'command-r' (<|START_ACTION|>[...]<|END_ACTION|>), 'command-r-plus'
    (Action: ```json [...]```), 'seed' (Seed-OSS's <seed:tool_call><function=...> form), 'qwen3-coder'
    (<tool_call><function=...>), 'glm' (<arg_key> / <arg_value>), 'harmony' (gpt-oss's commentary channel) or
    'gemma' ([name(key=value)] Python calls);
    Tokenizer.tool_call_format() says which its chat template teaches. A call whose JSON is malformed, or that the
    reply ends inside, stays in the content."""
    content, calls = _exl3._parse_tool_calls(text, format)
    return content, [{"id": i, "name": n, "arguments": json.loads(a)} for i, n, a in calls]


@dataclass
class Completion:
    """One finished job: its text and tokens, why it ended, and (when asked) the logprobs of each token.
    Generator.chat also fills content (the text outside any tool calls) and, with tools, tool_calls."""

    text: str = ""
    tokens: list = field(default_factory=list)
    finish_reason: Optional[str] = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    draft_tokens: int = 0  # speculative decoding: tokens proposed
    accepted_tokens: int = 0  # and of them, kept
    logprobs: list = field(default_factory=list)
    top_logprobs: list = field(default_factory=list)
    content: Optional[str] = None  # chat: the reply's text outside its reasoning and tool calls
    tool_calls: list = field(default_factory=list)  # chat with tools: [{"id", "name", "arguments": dict}]
    reasoning: Optional[str] = None  # chat, a model that reasons: what it wrote before its answer
    reasoning_tokens: int = 0  # tokens drawn inside reasoning


class Generator:
    """Continuous batching over one model: submit jobs at any time, step, read each job's updates.

    Keyword arguments of submit / generate / stream: max_new_tokens, stop (a string or a list), stop_ids,
    ignore_eos, skip_special_tokens, logprobs (None, 0 for the chosen token's, n for the top n as well),
    add_special_tokens (for text prompts), json (JSON mode: the output is one JSON object; needs the tokenizer),
    json_schema (a dict or its JSON text: the output is one value the schema admits; README "Structured output"), and
    the sampler's fields: temperature (0: greedy), top_k, top_p, min_p,
    typical_p, repetition_penalty, presence_penalty, frequency_penalty, penalty_window, dry_multiplier, dry_base,
    dry_allowed_length, dry_penalty_window, dry_sequence_breakers, xtc_threshold, xtc_probability, logit_bias
    ({token: bias}), banned_tokens, seed.

    Speculative decoding: draft_tokens > 0 proposes that many tokens a step for every decoding job -- from
    draft_model (a smaller Model with the same tokenizer, greedy) or, without one, from the job's own text (n-gram
    lookup of its last ngram_max..ngram_min tokens) -- and keeps those the model's own sampler draws. Outputs are
    plain decoding's (on CUDA up to the rounding of a several-row step at a near-tie); a step yields up to
    draft_tokens + 1 tokens.
    """

    def __init__(
        self,
        model: Model,
        tokenizer: Optional[Tokenizer] = None,
        *,
        max_batch_tokens: int = 256,
        prefill_chunk: int = 128,
        max_active_jobs: int = 32,
        cap_to_context: bool = True,
        device_sampling: bool = True,
        draft_model: Optional[Model] = None,
        draft_tokens: int = 0,
        ngram_min: int = 1,
        ngram_max: int = 3,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.draft_model = draft_model
        self._g = _exl3._Generator(
            model,
            tokenizer,
            max_batch_tokens=max_batch_tokens,
            prefill_chunk=prefill_chunk,
            max_active_jobs=max_active_jobs,
            cap_to_context=cap_to_context,
            device_sampling=device_sampling,
            draft_model=draft_model,
            draft_tokens=draft_tokens,
            ngram_min=ngram_min,
            ngram_max=ngram_max,
        )
        self._held: list = []  # updates stepped while waiting on other jobs, for the next step()

    def submit(self, prompt: Prompt, **kwargs) -> int:
        """Queues a job (text, or token ids); returns its id."""
        return self._g.submit(prompt, **kwargs)

    def cancel(self, job: int) -> None:
        """The job ends with finish_reason 'cancelled' at the next step."""
        self._g.cancel(job)

    def step(self) -> list:
        """One batched forward pass over every running job; the updates it produced (JobUpdate)."""
        held, self._held = self._held, []
        return held + self._g.step()

    @property
    def has_work(self) -> bool:
        return bool(self._held) or self._g.has_work

    def _updates_of(self, jobs: set) -> Iterator[JobUpdate]:
        # Steps until every job in `jobs` has finished; other jobs' updates wait for the next step().
        left = set(jobs)
        while left:
            mine = []
            held = []
            for u in self.step():
                (mine if u.job in left else held).append(u)
            self._held.extend(held)
            for u in mine:
                if u.finish_reason is not None:
                    left.discard(u.job)
                yield u

    def _cancel(self, jobs: set) -> None:
        # Cancels the jobs of a generate() / stream() that ends early and steps until they are gone, so that
        # nothing of theirs is left behind (their updates are dropped; other jobs' wait for the next step()).
        left = set()
        for j in jobs:
            try:
                self._g.cancel(j)
                left.add(j)
            except NotFoundError:
                pass
        for _ in self._updates_of(left):
            pass

    def stream(self, prompt: Prompt, **kwargs) -> Iterator[JobUpdate]:
        """Submits one job and yields its updates as they come (u.text is the new text). Breaking out of the loop
        cancels the job."""
        job = self.submit(prompt, **kwargs)
        finished = False
        try:
            for u in self._updates_of({job}):
                finished = u.finish_reason is not None
                yield u
        finally:
            if not finished:
                self._cancel({job})

    def generate(self, prompt: Union[Prompt, list], **kwargs) -> Union[Completion, list]:
        """Runs a prompt to the end and returns its Completion; a list of prompts runs as one batch and returns a
        list. A job that fails raises its error."""
        many = isinstance(prompt, list) and (len(prompt) == 0 or not isinstance(prompt[0], int))
        prompts = prompt if many else [prompt]
        jobs = [self.submit(p, **kwargs) for p in prompts]
        done = {j: Completion() for j in jobs}
        try:
            for u in self._updates_of(set(jobs)):
                c = done[u.job]
                c.text += u.text
                c.tokens += u.tokens
                c.logprobs += u.logprobs
                c.top_logprobs += u.top_logprobs
                c.prompt_tokens = u.prompt_tokens
                c.cached_tokens = u.cached_tokens
                c.generated_tokens = u.generated_tokens
                c.draft_tokens = u.draft_tokens
                c.accepted_tokens = u.accepted_tokens
                c.reasoning_tokens = u.reasoning_tokens
                if u.finish_reason is not None:
                    c.finish_reason = u.finish_reason
                    if u.finish_reason == "error":
                        raise u.exception
        except BaseException:
            self._cancel({j for j in jobs if done[j].finish_reason is None})
            raise
        out = [done[j] for j in jobs]
        return out if many else out[0]

    def chat(self, messages: list, *, tools: Optional[list] = None, template_kwargs: Optional[dict] = None,
             max_reasoning_tokens: Optional[int] = None, **kwargs) -> Completion:
        """Renders the conversation with the tokenizer's chat template (add_generation_prompt) and generates the
        assistant's reply. tools: an OpenAI tools list ([{"type": "function", "function": {"name", "description",
        "parameters"}}]), given to the template as `exl3 serve` gives a request's; the reply is then parsed as the
        server parses it: Completion.tool_calls lists its calls ({"id", "name", "arguments": dict}) and
        Completion.content its text outside them (Completion.text stays the reply as written). A model that reasons
        (<think> ... </think>, Harmony's analysis channel; Tokenizer.reply_format says) has its reasoning in
        Completion.reasoning, apart from the content; max_reasoning_tokens closes a reasoning block after that many
        tokens so that the answer follows. template_kwargs: extra template variables (enable_thinking=False, ...)."""
        if self.tokenizer is None:
            raise InvalidArgumentError("Generator.chat needs the Generator to have a tokenizer")
        template_kwargs = dict(template_kwargs or {})
        template = template_kwargs.get("template", "default")
        if tools is not None:
            _exl3._check_tools(json.dumps(tools, ensure_ascii=False))
            tools = tools or None  # an empty list offers no tools, as in the server
        fmt = self.tokenizer.reply_format(template)
        markers = list(_exl3._tool_call_markers(fmt["tools"])) if tools else []
        if fmt["reasoning"] == "harmony":
            markers += list(_exl3._tool_call_markers("harmony"))
        markers += [m for m in (fmt["reasoning_open"], fmt["reasoning_close"]) if m]
        # The markers must reach the parser where the tokenizer makes them special tokens (Llama, Mistral, gpt-oss).
        special = [self.tokenizer.token_to_id(m) for m in markers]
        if any(i is not None and self.tokenizer.is_special(i) for i in special):
            if kwargs.get("skip_special_tokens") is None:  # unless the caller chose
                kwargs["skip_special_tokens"] = False
        text = apply_chat_template(self.tokenizer, messages, tools=tools, **template_kwargs)
        budget = -1 if max_reasoning_tokens is None else max_reasoning_tokens
        reasoning = _exl3._reasoning_settings(fmt, text, budget)
        if reasoning:
            kwargs["reasoning"] = reasoning
        elif budget >= 0:
            raise InvalidArgumentError("max_reasoning_tokens: this model's chat template shows no reasoning markers")
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        c = self.generate(ids, **kwargs)
        if tools or reasoning:
            c.reasoning, c.content, calls = _exl3._parse_reply(
                fmt, c.text, bool(reasoning.get("starts_inside", False)),
                json.dumps(tools, ensure_ascii=False) if tools else "null")
            c.tool_calls = [{"id": i, "name": n, "arguments": json.loads(a)} for i, n, a in calls]
            c.reasoning = c.reasoning or None
        else:
            c.content = c.text
        return c

    def __iter__(self) -> Iterator[JobUpdate]:
        """Steps until no job is left, yielding every update."""
        while self.has_work:
            yield from self.step()


def request_keywords() -> Iterable[str]:
    """The keyword arguments submit / generate / stream accept."""
    return sorted(_exl3._request_keywords())
