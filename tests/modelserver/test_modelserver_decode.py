"""The fast decode path gives the same tokens as transformers' forward, and its helpers are exact.

A tiny random Llama (built from a config, no download) checks the hand-written step bit for bit against
`LlamaForCausalLM.forward` in well under a second, across the 64-position point where the CPU attention kernel
changes its matrix-multiply routine. The slow tests repeat the comparison through `Engine.generate` on the
real SmolLM2: greedy and seeded sampling, with and without grammars, must produce the same token ids on both
paths. No timing is asserted anywhere: speed lives in `bench/model.py`.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import xgrammar as xgr

from runtime.modelserver.engine import TextAssembler, allowed_token_ids

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from runtime.modelserver.decoder import HFSession, LlamaDecoder, supported  # noqa: E402


def _tiny_llama(**overrides: Any) -> Any:
    config = transformers.LlamaConfig(
        vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True,
        attn_implementation="sdpa", **overrides,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()


@pytest.fixture(scope="module")
def tiny() -> Any:
    return _tiny_llama()


@pytest.mark.parametrize("prompt_len", [1, 9, 70])
def test_fast_steps_give_transformers_logits_bit_for_bit(tiny: Any, prompt_len: int) -> None:
    decoder = LlamaDecoder.build(tiny)
    assert decoder is not None  # the self-check passed on this machine
    prompt = [(7 * i + 3) % 320 for i in range(prompt_len)]
    steps = 80  # from 1 to 80 positions: both sides of the 64-position switch inside the attention kernel
    hf = HFSession(tiny, prompt, steps + 1)
    fast = decoder.session(prompt, steps + 1)
    with torch.inference_mode():
        for step in range(steps):
            expected = hf.logits()
            ids = torch.arange(step % 5, 320, 3)
            if step:  # a partial head first (it must not need the full one), then the full head
                assert torch.equal(fast.logits_of(ids), expected[ids]), step
            assert torch.equal(fast.logits(), expected), step
            token = int(torch.argmax(expected))
            hf.advance(token)
            fast.advance(token)


def test_models_the_step_does_not_reimplement_fall_back_to_the_transformers_loop() -> None:
    model = _tiny_llama(attention_bias=True)
    assert supported(model) == "biases"
    assert LlamaDecoder.build(model) is None


def test_allowed_token_ids_read_the_bitmask_as_xgrammar_applies_it() -> None:
    vocab = ["a", "b", "ab", "{", "}", '"', "x", "1", "12", "<eos>"] + [f"t{i}" for i in range(60)]
    info = xgr.TokenizerInfo(vocab, stop_token_ids=[9])
    compiled = xgr.GrammarCompiler(info).compile_grammar('root ::= "{" [ab1]+ "}"')
    matcher = xgr.GrammarMatcher(compiled)
    bitmask = xgr.allocate_token_bitmask(1, len(vocab))
    for text in ["", "{", "{a", "{a}"]:
        if text:
            assert matcher.accept_string(text[-1])
        matcher.fill_next_token_bitmask(bitmask)
        logits = torch.zeros(1, len(vocab))
        xgr.apply_token_bitmask_inplace(logits, bitmask)
        expected = torch.nonzero(logits[0] == 0).view(-1)
        ids = allowed_token_ids(bitmask, len(vocab))
        assert ids is not None and torch.equal(ids, expected), text
        assert allowed_token_ids(bitmask, len(vocab), limit=len(expected) - 1) is None


class _ByteTokenizer:
    """Byte-level like SmolLM2's: one byte per id, ids >= 256 special (skipped), UTF-8 decoded leniently."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class _LeadingSpaceTokenizer:
    """SentencePiece-like: each id is a word with a leading space, and a decode strips the first one."""

    words = ("hello", "wörld", "a", "b", "END", "é")

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(" " + self.words[i] for i in ids).removeprefix(" ")


class _ContextTokenizer:
    """A decode that is not prefix-stable (the assembler must notice and fall back to decoding everything)."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        text = "".join(chr(97 + i) for i in ids)
        return text.upper() if len(ids) % 2 else text


@pytest.mark.parametrize(
    ("tokenizer", "ids"),
    [
        (_ByteTokenizer(), [*"naïve 日本語 — ok 🎉!".encode(), 300, *"é".encode()]),
        (_ByteTokenizer(), [0xE6, 0x97, 0xA5, 0x80, 0x41, 0xF0, 0x9F]),  # stray byte, emoji cut at the end
        (_LeadingSpaceTokenizer(), [0, 1, 2, 5, 3, 4, 0]),
    ],
)
def test_incremental_text_assembly_equals_decoding_everything(tokenizer: Any, ids: list[int]) -> None:
    asm = TextAssembler(tokenizer, [])
    pieces = [asm.add(i) for i in ids]
    pieces.append(asm.flush())
    assert "".join(pieces) == tokenizer.decode(ids)
    for n in range(1, len(ids) + 1):  # at every point, the text it works on is the full decode
        asm = TextAssembler(tokenizer, [])
        for i in ids[:n]:
            asm.add(i)
        assert asm._text() == tokenizer.decode(ids[:n])


def test_a_decoder_the_window_cannot_reproduce_switches_the_assembler_to_whole_decodes() -> None:
    tokenizer = _ContextTokenizer()
    asm = TextAssembler(tokenizer, [])
    for n in range(5):
        asm.add(n)
        assert asm._text() == tokenizer.decode(list(range(n + 1)))
    assert asm._whole


def test_incremental_assembly_still_cuts_at_stop_strings() -> None:
    asm = TextAssembler(_LeadingSpaceTokenizer(), [" END"])
    out = [asm.add(i) for i in [0, 2, 4, 1]]
    assert "".join(out) == "hello a" and asm.stopped


# -- the real model: same token ids through Engine.generate on both paths ------------------------------------


@pytest.fixture(scope="module")
def engines() -> tuple[Any, Any]:
    from runtime.modelserver.engine import Engine
    from runtime.modelserver.weights import load_model

    loaded = load_model(threads=1)
    return Engine(loaded, decode="hf"), Engine(loaded)


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"enum": ["get_weather", "read_file"]},
        "arguments": {
            "type": "object",
            "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 30}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "arguments"],
    "additionalProperties": False,
}
EBNF = r"""
root ::= "<tool_call>" "{\"name\": \"" name "\", \"arguments\": {\"city\": \"" city "\"}}</tool_call>"
name ::= "get_weather" | "read_file"
city ::= [a-zA-Z ]{1,30}
"""
SYSTEM = "You are a function-calling assistant. Tools: get_weather(city), read_file(path). Call one."


@pytest.mark.slow
@pytest.mark.parametrize(
    ("prompt", "constraint", "sampling"),
    [
        ("Write a long story about a lighthouse keeper.", None, {"ignore_eos": True}),
        ("What's the weather in Paris right now?", ("json", SCHEMA), {}),
        ("Is it raining in Oslo?", ("grammar", EBNF), {}),
        ("List three colours, one per line.", None, {"stop": ["\n"]}),
        ("Tell me a joke.", None, {"temperature": 0.8, "top_p": 0.9, "seed": 7}),
        ("Weather in Rome?", ("json", SCHEMA), {"temperature": 0.7, "seed": 3}),
    ],
)
def test_fast_path_emits_the_same_tokens_as_the_transformers_loop(
    engines: tuple[Any, Any], prompt: str, constraint: tuple[str, Any] | None, sampling: dict[str, Any]
) -> None:
    from runtime.modelserver.engine import SamplingParams
    from runtime.modelserver.grammar import Constraint

    hf, fast = engines
    assert fast.decode_path == "fast" and hf.decode_path == "hf"
    ids = fast.render_prompt([{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}])
    results = []
    for engine in (hf, fast):
        grammar = None
        if constraint is not None:
            kind, value = constraint
            grammar = engine.grammars.compile(
                Constraint(kind, json.dumps(value) if kind == "json" else value)
            )
        params = SamplingParams(max_tokens=48, temperature=sampling.get("temperature", 0.0), **{
            k: v for k, v in sampling.items() if k != "temperature"
        })
        deltas = list(engine.generate(ids, params, grammar))
        results.append(
            (list(engine.stats.token_ids), "".join(d.text for d in deltas), deltas[-1].finish_reason)
        )
    assert results[0] == results[1]
    assert results[1][0]  # something was generated
