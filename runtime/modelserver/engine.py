"""The decode loop: prompt rendering, a forward per token with a KV cache, the xgrammar mask, sampling, stops.

We run our own loop instead of `model.generate` because the server needs to stop between any two tokens
(client disconnect, stop strings, the grammar terminating), stream text as it is produced, and measure the
mask's cost per token; with `generate` each of these is a callback fighting its control flow. The loop is
single-sequence on purpose: the 135M model on 2 cores is bound by the per-token forward, and the worker queue
(`generation.py`) runs one request at a time so no state is ever shared between requests.

The forward itself is `decoder.FastSession` (packed weights, a preallocated KV cache, a hand-written Llama
step that reproduces transformers' logits bit for bit, about twice as fast on one thread) or, when that is
unavailable or fails its start-up check, `decoder.HFSession` (transformers' forward with a `DynamicCache`).
When a grammar allows only a small part of the vocabulary, only those rows of the output head are computed.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from runtime.modelserver.decoder import PARTIAL_HEAD_MAX_SHARE, HFSession, LlamaDecoder
from runtime.modelserver.grammar import GrammarCache
from runtime.modelserver.protocol import RequestError
from runtime.modelserver.weights import LoadedModel


@dataclass
class SamplingParams:
    """How to pick tokens. temperature 0 means greedy (argmax), which is deterministic for a given build."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False  # vLLM's option: run to max_tokens (benchmarks); a grammar's end still stops


@dataclass
class Delta:
    """A piece of output text; the last one of a generation carries `finish_reason` and the token counts."""

    text: str
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass
class DecodeStats:
    """Timings of the most recent generation, for the bench and logs (not part of the HTTP API)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    mask_seconds: float = 0.0
    first_token_seconds: float = 0.0
    token_ids: list[int] = field(default_factory=list)  # the completion's tokens (stop token excluded)


class TextAssembler:
    """Turns a growing list of token ids into text deltas, holding back what a stop string might still claim.

    The text is the decode of the whole id list (so multi-byte characters split across tokens stay intact; an
    incomplete one shows up as U+FFFD at the end and is held until it completes), but it is built
    incrementally: only the ids since the last clean character boundary, plus one token of context, are
    decoded per token (the offsets scheme of vLLM's detokenizer). Decoding the whole list each time cost
    O(n) per token, 100–200 µs per token at a few hundred tokens.
    """

    def __init__(self, tokenizer: Any, stops: list[str]) -> None:
        self._tok = tokenizer
        self._stops = stops
        self.ids: list[int] = []
        self._sent = 0
        self.stopped = False
        self._done = ""  # decoded text of ids[:_read], ending on a character boundary
        self._prefix = 0  # ids[_prefix:_read] is context for decoding what follows _read
        self._read = 0
        self._whole = False  # set for a tokenizer whose decode of a window disagrees with its context

    def _text(self) -> str:
        """The decode of all ids so far, from the committed text and a decode of the last few ids."""
        ids = self.ids
        if self._whole:
            return str(self._tok.decode(ids, skip_special_tokens=True))
        context = self._tok.decode(ids[self._prefix : self._read], skip_special_tokens=True)
        fresh = self._tok.decode(ids[self._prefix :], skip_special_tokens=True)
        if not fresh.startswith(context):
            self._whole = True
            return self._text()
        tail = fresh[len(context) :]
        if tail and not tail.endswith("\ufffd"):  # a clean boundary: commit and move the window up
            self._done += tail
            self._prefix, self._read = self._read, len(ids)
            return self._done
        return self._done + tail

    def _holdback(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
        best = 0
        for s in self._stops:
            for n in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:n]):
                    best = max(best, n)
                    break
        return best

    def add(self, token: int) -> str:
        """Append a token; return the text that is now safe to send (may be empty)."""
        self.ids.append(token)
        text = self._text()
        for s in self._stops:
            i = text.find(s, max(0, self._sent - len(s)))
            if i != -1:
                self.stopped = True
                return self._emit(text[:i])
        if text.endswith("\ufffd"):
            return ""
        return self._emit(text[: len(text) - self._holdback(text)])

    def flush(self) -> str:
        """The held-back rest at the end of a generation that did not hit a stop string."""
        if self.stopped:
            return ""
        return self._emit(self._text())

    def _emit(self, upto: str) -> str:
        out = upto[self._sent :]
        self._sent = max(self._sent, len(upto))
        return out


@functools.cache
def _bit_shifts() -> Any:
    import torch

    return torch.arange(32, dtype=torch.int32)


def allowed_token_ids(bitmask: Any, vocab_size: int, limit: int | None = None) -> Any | None:
    """The token ids a filled xgrammar bitmask allows, ascending (int64), or None when there are none or
    more than `limit`. Bit `t % 32` of 32-bit word `t // 32` is token t, as `apply_token_bitmask_inplace`
    reads it."""
    import torch

    bits = torch.bitwise_and(torch.bitwise_right_shift(bitmask[0].unsqueeze(1), _bit_shifts()), 1)
    flat = bits.view(-1)[:vocab_size]
    count = int(flat.sum())
    if count == 0 or (limit is not None and count > limit):
        return None
    return torch.nonzero(flat).view(-1)


def _normalise_messages(messages: list[dict[str, Any]], template: str) -> list[dict[str, Any]]:
    """Make OpenAI-shaped messages renderable by a plain ChatML template.

    Content parts are joined to text and `None` content becomes "". If the template knows nothing of
    `tool_calls`, an assistant's calls are written into its content in the hermes `<tool_call>` form, which is
    what a model prompted with tools in its system message is expected to produce.
    """
    out = []
    for m in messages:
        m = dict(m)
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        content = content or ""
        calls = m.get("tool_calls")
        if calls and "tool_calls" not in template:
            rendered = []
            for c in calls:
                fn = c.get("function", c)
                args = fn.get("arguments", {})
                if isinstance(args, str):
                    try:
                        args = json.loads(args)
                    except json.JSONDecodeError:
                        pass
                call = json.dumps({"name": fn.get("name"), "arguments": args}, ensure_ascii=False)
                rendered.append(f"<tool_call>\n{call}\n</tool_call>")
            content = "\n".join([content, *rendered]) if content else "\n".join(rendered)
        m["content"] = content
        out.append(m)
    return out


class Engine:
    """A loaded model plus everything needed to serve one request at a time.

    Not thread-safe for `generate`: the worker queue guarantees a single caller. `render_prompt` and
    `compile` are safe from any thread.
    """

    def __init__(self, loaded: LoadedModel, *, default_max_tokens: int = 512,
                 any_whitespace: bool = False, decode: str = "fast") -> None:
        """`decode` is "fast" (`decoder.LlamaDecoder`, checked against HF at start; HF's loop if the check
        fails or the model is not a plain Llama) or "hf" (transformers' forward per token, the reference)."""
        import torch
        import xgrammar as xgr

        if decode not in ("fast", "hf"):
            raise ValueError(f"decode must be 'fast' or 'hf', not {decode!r}")
        self.loaded = loaded
        self.tokenizer = loaded.tokenizer
        self.model = loaded.model
        self.context_length = loaded.context_length
        self.default_max_tokens = default_max_tokens
        self.tokenizer_info = xgr.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=loaded.vocab_size)
        self.grammars = GrammarCache(self.tokenizer_info, any_whitespace=any_whitespace)
        self.stop_token_ids = set(self.tokenizer_info.stop_token_ids)
        if self.tokenizer.eos_token_id is not None:
            self.stop_token_ids.add(int(self.tokenizer.eos_token_id))
        self._template: str = self.tokenizer.chat_template or ""
        self.stats = DecodeStats()
        self._stop_ids = torch.tensor(sorted(self.stop_token_ids), dtype=torch.long)
        # One bitmask for every request (generation is single-threaded); fill_next_token_bitmask rewrites it.
        self._bitmask = xgr.allocate_token_bitmask(1, self.tokenizer_info.vocab_size)
        started = time.perf_counter()
        self.decoder = LlamaDecoder.build(self.model) if decode == "fast" else None
        self.decoder_seconds = time.perf_counter() - started
        self.decode_path = "hf" if self.decoder is None else ("fast" if self.decoder.packed else "fast-plain")

    # -- request preparation (any thread) -------------------------------------------------------------
    def render_prompt(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        """Token ids of the chat prompt, rendered with the model's own template (from the GGUF)."""
        kwargs: dict[str, Any] = {}
        if tools and "tools" in self._template:
            kwargs["tools"] = tools
        msgs = _normalise_messages(messages, self._template)
        try:
            text = self.tokenizer.apply_chat_template(
                msgs, tokenize=False, add_generation_prompt=True, **kwargs
            )
        except Exception as e:  # jinja errors on malformed messages are the client's
            raise RequestError(f"messages could not be rendered with the chat template: {e}") from None
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def token_budget(self, prompt_len: int, requested: int | None) -> int:
        """max_tokens for this request, or a 400 when the prompt (plus an explicit max_tokens) cannot fit."""
        room = self.context_length - prompt_len
        if room <= 0:
            raise RequestError(
                f"the prompt is {prompt_len} tokens, over the context length of {self.context_length}",
                param="messages",
            )
        if requested is not None:
            if requested > room:
                raise RequestError(
                    f"prompt ({prompt_len} tokens) + max_tokens ({requested}) exceeds the context length "
                    f"of {self.context_length}",
                    param="max_tokens",
                )
            return requested
        return min(room, self.default_max_tokens)

    # -- decoding (the worker thread only) ------------------------------------------------------------
    def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        grammar: Any | None = None,
        cancelled: threading.Event | None = None,
    ) -> Iterator[Delta]:
        """Yield text deltas until a stop token, a stop string, the grammar's end or `max_tokens`.

        When `cancelled` is set the loop ends before the next forward and yields nothing more.
        """
        import torch
        import xgrammar as xgr

        cancelled = cancelled or threading.Event()
        stats = DecodeStats(prompt_tokens=len(prompt_ids))
        self.stats = stats
        matcher: xgr.GrammarMatcher | None = None
        bitmask = self._bitmask
        if grammar is not None:
            matcher = xgr.GrammarMatcher(grammar)
        rng = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        text = TextAssembler(self.tokenizer, params.stop)
        stats.token_ids = text.ids
        finish = "length"
        started = time.perf_counter()
        session: Any = (
            HFSession(self.model, prompt_ids, params.max_tokens)
            if self.decoder is None
            else self.decoder.session(prompt_ids, params.max_tokens)
        )
        stats.prefill_seconds = time.perf_counter() - started
        vocab = self.loaded.vocab_size
        partial = self.decoder is not None and self.decoder.partial_head
        partial_limit = int(vocab * PARTIAL_HEAD_MAX_SHARE)
        with torch.inference_mode():
            for step in range(params.max_tokens):
                if cancelled.is_set():
                    return
                if matcher is None:
                    logits = session.logits()
                    if params.ignore_eos:
                        logits[self._stop_ids] = float("-inf")
                    token = self._pick(logits, params, rng)
                else:
                    t = time.perf_counter()
                    matcher.fill_next_token_bitmask(bitmask)
                    allowed = allowed_token_ids(bitmask, vocab, partial_limit) if partial else None
                    stats.mask_seconds += time.perf_counter() - t
                    if allowed is not None:  # few tokens allowed: their logits only, not the whole head
                        sub = session.logits_of(allowed)
                        if params.temperature == 0.0:
                            token = int(allowed[int(torch.argmax(sub))])  # first max in id order, as argmax
                        else:
                            logits = torch.full((vocab,), float("-inf"))
                            logits[allowed] = sub
                            token = self._pick(logits, params, rng)
                    else:
                        logits = session.logits()
                        t = time.perf_counter()
                        xgr.apply_token_bitmask_inplace(logits.unsqueeze(0), bitmask)
                        stats.mask_seconds += time.perf_counter() - t
                        token = self._pick(logits, params, rng)
                if step == 0:
                    stats.first_token_seconds = time.perf_counter() - started
                if matcher is not None:
                    t = time.perf_counter()
                    accepted = matcher.accept_token(token)
                    stats.mask_seconds += time.perf_counter() - t
                    if not accepted:  # cannot happen with a correct mask; fail loudly rather than emit junk
                        raise RuntimeError(f"grammar rejected token {token} that its own mask allowed")
                if token in self.stop_token_ids:
                    finish = "stop"
                    break
                stats.completion_tokens += 1
                delta = text.add(token)
                if delta:
                    yield Delta(delta)
                if text.stopped or (matcher is not None and matcher.is_terminated()):
                    finish = "stop"
                    break
                if step + 1 < params.max_tokens:
                    session.advance(token)
        stats.decode_seconds = time.perf_counter() - started - stats.prefill_seconds
        yield Delta(
            text.flush(),
            finish_reason=finish,
            prompt_tokens=len(prompt_ids),
            completion_tokens=stats.completion_tokens,
        )

    @staticmethod
    def _pick(logits: Any, params: SamplingParams, rng: Any) -> int:
        import torch

        if params.temperature == 0.0:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits / params.temperature, dim=-1)
        if params.top_p < 1.0:
            sorted_p, order = torch.sort(probs, descending=True)
            keep = torch.cumsum(sorted_p, dim=-1) - sorted_p < params.top_p  # always keeps the top token
            sorted_p = torch.where(keep, sorted_p, torch.zeros_like(sorted_p))
            choice = torch.multinomial(sorted_p, 1, generator=rng)
            return int(order[choice])
        return int(torch.multinomial(probs, 1, generator=rng))
