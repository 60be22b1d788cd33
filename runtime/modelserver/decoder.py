"""A hand-written Llama decode step over the loaded weights, bit-for-bit equal to transformers' forward.

Why it exists: one greedy token through `LlamaForCausalLM.forward` cost 50–60 ms on one thread of the 2-core
box, and a profile put about 85 % of it inside `aten::mm`, not in Python: the step is bound by streaming the
270 MB of bf16 weights, and oneDNN's matmul reads a plain row-major weight at only 4–8 GB/s. Packing each
weight once into oneDNN's blocked layout (`mkldnn._reorder_linear_weight`, what inductor's freezing pass
does) and calling its inner product (`mkldnn._linear_pointwise`) reads the same weights at 12–18 GB/s and,
measured, gives *identical* bits; q/k/v and gate/up are stacked so each layer makes four products, not
seven. The rest of HF's per-step cost (module calls, cache bookkeeping, rotary recomputation, a fresh tensor
for every intermediate) is removed as well: rotary tables are computed once by the model's own rotary module,
the KV cache is one tensor preallocated per request and written in place, and the elementwise ops write into
scratch buffers. The price is a second copy of the weights in memory (about 250 MB for SmolLM2-135M), since
HF's modules still run the prefill.

Why not something faster: every op here is the op transformers runs, on the same values in the same order,
so the logits are bitwise those of the HF path (greedy output is token-identical, and seeded sampling draws
the same tokens). A different matmul kernel, int8 weights, a fused attention, or `torch.compile` (measured:
56 s to compile HF's step, no faster, and different bits) would all change the numbers. Attention stays
`scaled_dot_product_attention` with HF's arguments for the same reason, although its CPU kernel costs about
1 µs per cached position per layer (packing the GQA heads into the query axis runs it 3–7x faster but
changes the bits at some lengths). Prefill stays with HF: it runs once per request, and the first token's
logits are then HF's by construction.

Trust but verify: `LlamaDecoder.build` runs a few steps of both paths on a fixed prompt and returns None
unless the logits match exactly, so another CPU, torch or oneDNN build falls back to the HF loop instead of
silently changing outputs. Partial heads (logits for only the tokens a grammar allows) get the same check.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("runtime.modelserver")

# A grammar that allows at most this share of the vocabulary gets its logits from a gathered slice of the
# head instead of all 49k rows: gathering costs about as much per row as the packed product, so the crossover
# is well above this.
PARTIAL_HEAD_MAX_SHARE = 0.25


def _pack(weight: Any) -> Any:
    """The weight in oneDNN's blocked layout for a batch of one (what `_linear_pointwise` reads fastest)."""
    import torch

    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), 1)


def _plain(weight: Any) -> Any:
    return weight.detach().contiguous()


def _linear_fn(packed: bool) -> Any:
    """`linear(x, w)` for weights from `_pack`: oneDNN's packed inner product, or plain `F.linear`."""
    import torch

    if packed:
        op = torch.ops.mkldnn._linear_pointwise.default

        def linear(x: Any, w: Any) -> Any:
            return op(x, w, None, "none", [], "")

        return linear
    return torch.nn.functional.linear


def supported(model: Any) -> str | None:
    """Why this decoder cannot run `model` (None when it can): it reimplements exactly one architecture."""
    config = model.config
    rope = getattr(config, "rope_parameters", None) or {"rope_type": "default"}
    checks = [
        (getattr(config, "model_type", None) == "llama", "not a Llama model"),
        (not getattr(config, "attention_bias", False) and not getattr(config, "mlp_bias", False), "biases"),
        (getattr(config, "hidden_act", None) == "silu", "activation is not silu"),
        (rope.get("rope_type", "default") == "default", "scaled rotary embeddings"),
        (getattr(config, "pretraining_tp", 1) == 1, "tensor-parallel slicing"),
        (getattr(config, "_attn_implementation", None) == "sdpa", "attention is not sdpa"),
        (str(next(model.parameters()).device) == "cpu", "not on the CPU"),
    ]
    for ok, why in checks:
        if not ok:
            return why
    return None


@dataclass
class _Layer:
    attn_norm: Any
    qkv: Any  # q, k and v projections stacked: one product instead of three, same bits per output row
    out: Any
    mlp_norm: Any
    gate_up: Any  # gate and up projections stacked
    down: Any


class LlamaDecoder:
    """The packed weights and precomputed tables of one loaded model; `session()` decodes one request.

    Read-only once built: each session owns its KV cache and scratch buffers (allocated once per request,
    never per step), so sessions do not interfere.
    """

    def __init__(self, model: Any, *, pack: bool = True) -> None:
        import torch

        config = model.config
        self.model = model
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(config.num_key_value_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)
        self.hidden = int(config.hidden_size)
        self.intermediate = int(config.intermediate_size)
        self.eps = float(config.rms_norm_eps)
        self.context_length = int(getattr(config, "max_position_embeddings", 2048))
        self.scale = self.head_dim**-0.5
        self.packed = pack
        pack_fn = _pack if pack else _plain
        self.linear = _linear_fn(pack)
        inner = model.model
        self.layers = []
        for layer in inner.layers:
            a, m = layer.self_attn, layer.mlp
            self.layers.append(
                _Layer(
                    attn_norm=layer.input_layernorm.weight.detach(),
                    qkv=pack_fn(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])),
                    out=pack_fn(a.o_proj.weight),
                    mlp_norm=layer.post_attention_layernorm.weight.detach(),
                    gate_up=pack_fn(torch.cat([m.gate_proj.weight, m.up_proj.weight])),
                    down=pack_fn(m.down_proj.weight),
                )
            )
        self.final_norm = inner.norm.weight.detach()
        self.embed = inner.embed_tokens.weight.detach()
        self.head_plain = model.lm_head.weight.detach()  # rows gathered for partial heads
        self.head = pack_fn(model.lm_head.weight)
        self.vocab = int(self.head_plain.shape[0])
        self.dtype = self.embed.dtype
        with torch.inference_mode():
            # The model's own rotary module, asked once for every position: the values a decode step gets.
            positions = torch.arange(self.context_length).unsqueeze(0)
            cos, sin = inner.rotary_emb(self.embed[:1].unsqueeze(0), positions)
            half = self.head_dim // 2
            self.cos = cos[0].contiguous()
            # rotate_half(x) * sin == roll(x, half) * sin', with sin' the sin with its first half negated:
            # (-x2) * s1 and x2 * (-s1) are the same float, so the rotation needs no negation per step.
            self.sin_rolled = torch.cat((-sin[0, :, :half], sin[0, :, half:]), dim=-1).contiguous()
        self.partial_head = True

    @classmethod
    def build(cls, model: Any) -> LlamaDecoder | None:
        """A decoder for `model` that has been checked to reproduce its logits, or None (use the HF loop)."""
        why = supported(model)
        if why is not None:
            log.info("fast decode off: %s", why)
            return None
        started = time.perf_counter()
        for pack in (True, False):  # packed weights are the speed; plain ones still save HF's overhead
            try:
                decoder = cls(model, pack=pack)
                mismatch = decoder.self_check()
            except Exception as e:  # e.g. a torch build without the mkldnn ops
                mismatch = f"{type(e).__name__}: {e}"
            if mismatch is None:
                log.info(
                    "fast decode on (%s weights, checked against transformers in %.2f s)",
                    "packed" if pack else "plain", time.perf_counter() - started,
                )
                return decoder
            log.warning("fast decode with %s weights off: %s", "packed" if pack else "plain", mismatch)
        return None

    def self_check(self, steps: int = 3) -> str | None:
        """Compare `steps` decode steps against HF's forward; the first difference, or None when identical."""
        import torch

        prompt = [int(t) % self.vocab for t in range(1, 9)]
        hf = HFSession(self.model, prompt, steps + 1)
        fast = self.session(prompt, steps + 1)
        with torch.inference_mode():
            expected = hf.logits()
            if not torch.equal(expected, fast.logits()):
                return "prefill logits differ"
            for i in range(steps):
                token = int(torch.argmax(expected))
                hf.advance(token)
                fast.advance(token)
                expected = hf.logits()
                # a wide slice and a handful of rows: oneDNN may pick different kernels for the two
                few = sorted({i, (100 + i) % self.vocab, (5000 + i) % self.vocab})
                ids = torch.arange(i, self.vocab, 7 + i) if i % 2 == 0 else torch.tensor(few)
                if self.partial_head and not torch.equal(fast.logits_of(ids), expected[ids]):
                    self.partial_head = False
                    log.info("partial heads off: a gathered slice of the head gives different bits")
                if not torch.equal(expected, fast.logits()):
                    return f"decode step {i + 1}: logits differ from transformers' forward"
        return None

    def session(self, prompt_ids: list[int], max_new: int) -> FastSession:
        """A request's decoding state: prefill of `prompt_ids` and room for `max_new` more positions."""
        return FastSession(self, prompt_ids, max_new)


class FastSession:
    """One request on `LlamaDecoder`: HF prefill copied into a preallocated cache, then hand-written steps.

    `logits()` is computed lazily after `advance`, so a grammar that allows few tokens can ask for just those
    rows with `logits_of(ids)` and skip the 49k-row head.
    """

    def __init__(self, decoder: LlamaDecoder, prompt_ids: list[int], max_new: int) -> None:
        import torch
        from transformers import DynamicCache

        d = decoder
        self.d = d
        n_prompt = len(prompt_ids)
        capacity = min(n_prompt + max_new, d.context_length)
        self.pos = n_prompt  # where the next token's key and value go
        # One tensor for the whole cache: [layer][k|v][kv head][position][dim], written in place each step.
        self.cache = torch.empty(len(d.layers), 2, d.kv_heads, capacity, d.head_dim, dtype=d.dtype)
        qk_rows = d.heads + d.kv_heads
        half = d.head_dim // 2
        self._x = torch.empty(1, d.hidden, dtype=d.dtype)  # the residual stream
        self._h32 = torch.empty(1, d.hidden)  # RMSNorm works in float32, as HF's does
        self._sq = torch.empty(1, d.hidden)
        self._var = torch.empty(1, 1)
        # 0-dim float32 operands: the same float arithmetic as Python scalars, without wrapping one per op
        self._width = torch.tensor(float(d.hidden))
        self._eps = torch.tensor(d.eps)
        self._h = torch.empty(1, d.hidden, dtype=d.dtype)
        rot_a = torch.empty(qk_rows, d.head_dim, dtype=d.dtype)
        rot_b = torch.empty(qk_rows, d.head_dim, dtype=d.dtype)
        # views made once: slicing costs about as much as the tiny ops themselves
        self._rot = (rot_a, rot_b[:, :half], rot_b[:, half:], rot_a[: d.heads], rot_b[: d.heads],
                     rot_a[d.heads :], rot_b[d.heads :])
        self._q = torch.empty(1, d.heads, 1, d.head_dim, dtype=d.dtype)
        self._logits = torch.empty(d.vocab)
        self._fresh = False  # whether self._logits holds the current position's logits
        self._layers = [
            (lay.attn_norm, lay.qkv, lay.out, lay.mlp_norm, lay.gate_up, lay.down, self.cache[i, 0],
             self.cache[i, 1])
            for i, lay in enumerate(d.layers)
        ]
        with torch.inference_mode():
            cache: Any = DynamicCache(config=d.model.config)
            out = d.model(
                input_ids=torch.tensor([prompt_ids]), past_key_values=cache, use_cache=True, logits_to_keep=1
            )
            self._logits.copy_(out.logits[0, -1])
            self._fresh = True
            for i, layer in enumerate(cache.layers):
                self.cache[i, 0, :, :n_prompt] = layer.keys[0]
                self.cache[i, 1, :, :n_prompt] = layer.values[0]

    def _norm(self, x: Any, weight: Any) -> Any:
        """HF's LlamaRMSNorm op for op (float32 variance, cast back, times the weight), in scratch buffers."""
        import torch

        h32, sq, var = self._h32, self._sq, self._var
        h32.copy_(x)
        torch.mul(h32, h32, out=sq)  # pow(2) is x * x for an exponent of 2
        torch.sum(sq, -1, keepdim=True, out=var).div_(self._width)  # what mean() does on the CPU
        var.add_(self._eps).rsqrt_()
        h32.mul_(var)
        self._h.copy_(h32)
        return torch.mul(weight, self._h, out=self._h)

    def advance(self, token: int) -> None:
        """Run `token` through the layers at the next position; its logits come from `logits()`."""
        import torch
        import torch.nn.functional as F

        d = self.d
        pos = self.pos
        if pos >= self.cache.shape[3]:
            raise RuntimeError("the KV cache is full (prompt + max_tokens)")
        linear, sdpa, norm, silu = d.linear, F.scaled_dot_product_attention, self._norm, F.silu
        mul, add = torch.mul, torch.add
        heads, kv_heads, head_dim, half, scale = d.heads, d.kv_heads, d.head_dim, d.head_dim // 2, d.scale
        qk_width = (heads + kv_heads) * head_dim
        qk_shape, v_shape = (heads + kv_heads, head_dim), (kv_heads, head_dim)
        inter = d.intermediate
        cos, sin = d.cos[pos], d.sin_rolled[pos]
        sin_lo, sin_hi = sin[:half], sin[half:]
        rot_a, rot_b_lo, rot_b_hi, rot_a_q, rot_b_q, rot_a_k, rot_b_k = self._rot
        q = self._q
        q3 = q.view(heads, head_dim)
        n = pos + 1
        with torch.inference_mode():
            x = self._x
            x.copy_(d.embed[token])
            for attn_norm, w_qkv, w_out, mlp_norm, w_gate_up, w_down, keys, values in self._layers:
                qkv = linear(norm(x, attn_norm), w_qkv)[0]
                qk = qkv[:qk_width].view(qk_shape)
                # q * cos + rotate_half(q) * sin, for the query and key heads at once
                mul(qk, cos, out=rot_a)
                mul(qk[:, half:], sin_lo, out=rot_b_lo)
                mul(qk[:, :half], sin_hi, out=rot_b_hi)
                add(rot_a_q, rot_b_q, out=q3)
                add(rot_a_k, rot_b_k, out=keys[:, pos])
                values[:, pos].copy_(qkv[qk_width:].view(v_shape))
                attn = sdpa(q, keys[None, :, :n], values[None, :, :n], dropout_p=0.0, scale=scale,
                            is_causal=False, enable_gqa=True)
                x.add_(linear(attn.view(1, -1), w_out))
                gate_up = linear(norm(x, mlp_norm), w_gate_up)
                gate = silu(gate_up[:, :inter], inplace=True)
                x.add_(linear(gate.mul_(gate_up[:, inter:]), w_down))
            norm(x, d.final_norm)  # leaves the normed state in self._h for the head
        self.pos = n
        self._fresh = False

    def logits(self) -> Any:
        """Float32 logits over the whole vocabulary at the current position (a buffer reused each step)."""
        import torch

        if not self._fresh:
            with torch.inference_mode():
                self._logits.copy_(self.d.linear(self._h, self.d.head)[0])
            self._fresh = True
        return self._logits

    def logits_of(self, ids: Any) -> Any:
        """Float32 logits of the ids `ids` only (an ascending int64 tensor): the values of `logits()[ids]`."""
        import torch
        import torch.nn.functional as F

        if self._fresh or not self.d.partial_head:
            return self.logits()[ids]
        with torch.inference_mode():
            rows = torch.index_select(self.d.head_plain, 0, ids)
            return F.linear(self._h, rows)[0].float()


class HFSession:
    """The reference: transformers' forward per token with a `DynamicCache` (the bench's baseline)."""

    def __init__(self, model: Any, prompt_ids: list[int], max_new: int) -> None:
        import torch
        from transformers import DynamicCache

        self.model = model
        with torch.inference_mode():
            self.cache = DynamicCache(config=model.config)
            out = model(
                input_ids=torch.tensor([prompt_ids]), past_key_values=self.cache, use_cache=True,
                logits_to_keep=1,
            )
            self._logits = out.logits[0, -1].float()

    def advance(self, token: int) -> None:
        import torch

        with torch.inference_mode():
            out = self.model(input_ids=torch.tensor([[token]]), past_key_values=self.cache, use_cache=True)
            self._logits = out.logits[0, -1].float()

    def logits(self) -> Any:
        return self._logits

    def logits_of(self, ids: Any) -> Any:
        return self._logits[ids]
