#!/usr/bin/env python3
"""Random-weight HF checkpoints with the shapes of real models, for benchmarks (no download: shapes only).

Weights are normal(0, 0.02) (norms 1.0) in bf16, written as HF safetensors shards, generated on the GPU when there
is one. The values do not matter for speed as long as they are not zeros (zeros can run faster than real data).

With --exl3-bits K the decoder linears are EXL3 instead (exl3-format.md): random trellis words (every bit pattern is
a valid code), K bits per weight, the head at --head-bits, random signs x scales in suh/svh, the codebook marker of
--codebook. This is the reference implementation's benchmark setup ("random trellis"): decoding costs the same
whatever the codes are. A fractional K (2.25) mixes the two whole bit widths around it per tensor, each tensor taking
the one that keeps the running average over all decoder weights closest to K, as a converter's bit allocation would.

Usage: make_random_model.py --shape llama3-8b|llama3-70b|qwen2.5-7b|llama3-1b|gemma3-12b|gemma3-27b|
                                    mistral-small-24b|phi4-14b|qwen3-30b-a3b|mixtral-8x7b|qwen3-moe-tiny|gpt-oss-20b|
                                    gpt-oss-tiny|qwen3.5-27b|qwen3-next-80b-a3b|qwen3-next-tiny
                            --out DIR [--layers N] [--set KEY=JSON ...]
                            [--exl3-bits K --head-bits 6 --codebook mul1|mcg|3inst]
"""
import argparse
import json
import math
import os

import torch
from safetensors.torch import save_file

SHAPES = {
    "llama3-8b": dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=4096,
                      intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                      vocab_size=128256, rms_norm_eps=1e-5, max_position_embeddings=131072,
                      rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                                           high_freq_factor=4.0, original_max_position_embeddings=8192),
                      tie_word_embeddings=False, bos_token_id=128000, eos_token_id=128001),
    # The largest that fits a 24 GB card (issue 46) and tensor parallelism's proof shape (issue 47):
    # Llama-3.1-70B's shape (80 layers, 64 heads of 128, 8 kv heads).
    "llama3-70b": dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=8192,
                       intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                       vocab_size=128256, rms_norm_eps=1e-5, max_position_embeddings=131072,
                       rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                                            high_freq_factor=4.0, original_max_position_embeddings=8192),
                       tie_word_embeddings=False, bos_token_id=128000, eos_token_id=128001),
    "qwen2.5-7b": dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=3584,
                       intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                       vocab_size=152064, rms_norm_eps=1e-6, max_position_embeddings=32768,
                       rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
                       tie_word_embeddings=False, bos_token_id=151643, eos_token_id=151645),
    "llama3-1b": dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=2048,
                      intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                      head_dim=64, vocab_size=128256, rms_norm_eps=1e-5, max_position_embeddings=131072,
                      rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=32.0, low_freq_factor=1.0,
                                           high_freq_factor=4.0, original_max_position_embeddings=8192),
                      tie_word_embeddings=True, bos_token_id=128000, eos_token_id=128001),
    # The families' speed shapes (issue 41): Gemma 3 (sandwich norms, q/k norms, 5 local : 1 global, GeGLU, head_dim
    # 256, a 262k vocabulary), Mistral Small 3 (Mistral's layer, wide), Phi-4 (Phi-3's layer).
    "gemma3-12b": dict(architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", hidden_size=3840,
                       intermediate_size=15360, num_hidden_layers=48, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=256, vocab_size=262208, rms_norm_eps=1e-6, max_position_embeddings=131072,
                       query_pre_attn_scalar=256, sliding_window=1024, hidden_activation="gelu_pytorch_tanh",
                       rope_parameters={"full_attention": dict(rope_type="linear", rope_theta=1e6, factor=8.0),
                                        "sliding_attention": dict(rope_type="default", rope_theta=1e4)},
                       tie_word_embeddings=True, bos_token_id=2, eos_token_id=1),
    "gemma3-27b": dict(architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", hidden_size=5376,
                       intermediate_size=21504, num_hidden_layers=62, num_attention_heads=32, num_key_value_heads=16,
                       head_dim=128, vocab_size=262208, rms_norm_eps=1e-6, max_position_embeddings=131072,
                       query_pre_attn_scalar=168, sliding_window=1024, hidden_activation="gelu_pytorch_tanh",
                       rope_parameters={"full_attention": dict(rope_type="linear", rope_theta=1e6, factor=8.0),
                                        "sliding_attention": dict(rope_type="default", rope_theta=1e4)},
                       tie_word_embeddings=True, bos_token_id=2, eos_token_id=1),
    "mistral-small-24b": dict(architectures=["MistralForCausalLM"], model_type="mistral", hidden_size=5120,
                              intermediate_size=32768, num_hidden_layers=40, num_attention_heads=32,
                              num_key_value_heads=8, head_dim=128, vocab_size=131072, rms_norm_eps=1e-5,
                              max_position_embeddings=32768, sliding_window=None,
                              rope_parameters=dict(rope_type="default", rope_theta=100000000.0),
                              tie_word_embeddings=False, bos_token_id=1, eos_token_id=2),
    "phi4-14b": dict(architectures=["Phi3ForCausalLM"], model_type="phi3", hidden_size=5120, intermediate_size=17920,
                     num_hidden_layers=40, num_attention_heads=40, num_key_value_heads=10, vocab_size=100352,
                     rms_norm_eps=1e-5, max_position_embeddings=16384, sliding_window=None,
                     rope_parameters=dict(rope_type="default", rope_theta=250000.0),
                     tie_word_embeddings=False, bos_token_id=100257, eos_token_id=100265),
    # Mixtures of experts (issue 42): Qwen3-30B-A3B (128 experts, 8 a token, q/k norms), Mixtral 8x7B (8 experts, 2 a
    # token), and a tiny Qwen3-MoE for the CUDA-vs-CPU test of EXL3 experts.
    "qwen3-30b-a3b": dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", hidden_size=2048,
                          intermediate_size=6144, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
                          norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], num_hidden_layers=48,
                          num_attention_heads=32, num_key_value_heads=4, head_dim=128, vocab_size=151936,
                          rms_norm_eps=1e-6, max_position_embeddings=40960,
                          rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
                          tie_word_embeddings=False, bos_token_id=151643, eos_token_id=151645),
    "mixtral-8x7b": dict(architectures=["MixtralForCausalLM"], model_type="mixtral", hidden_size=4096,
                         intermediate_size=14336, num_local_experts=8, num_experts_per_tok=2, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, vocab_size=32000, rms_norm_eps=1e-5,
                         max_position_embeddings=32768, sliding_window=None,
                         rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2),
    "qwen3-moe-tiny": dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", hidden_size=256,
                           intermediate_size=512, moe_intermediate_size=128, num_experts=16, num_experts_per_tok=4,
                           norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1], num_hidden_layers=3,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=1024,
                           rms_norm_eps=1e-6, max_position_embeddings=4096,
                           rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
                           tie_word_embeddings=False, bos_token_id=0, eos_token_id=1),
    # gpt-oss-20b (the Hub's config): attention sinks, q/k/v/o biases, every other layer windowed over 128 positions,
    # YaRN x32; 32 biased experts as wide as the model, four a token, the clamped SwiGLU. Written with each expert
    # apart (mlp.experts.{e}.gate_proj ...: the EXL3 files' layout), not as the Hub's MXFP4 batch tensors.
    "gpt-oss-20b": dict(architectures=["GptOssForCausalLM"], model_type="gpt_oss", hidden_size=2880,
                        intermediate_size=2880, num_local_experts=32, num_experts_per_tok=4, num_hidden_layers=24,
                        num_attention_heads=64, num_key_value_heads=8, head_dim=64, vocab_size=201088,
                        rms_norm_eps=1e-5, max_position_embeddings=131072, sliding_window=128,
                        layer_types=["sliding_attention", "full_attention"] * 12, attention_bias=True,
                        swiglu_limit=7.0,
                        rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=32.0, beta_fast=32.0,
                                             beta_slow=1.0, truncate=False, original_max_position_embeddings=4096),
                        tie_word_embeddings=False, bos_token_id=199998, eos_token_id=200002),
    # A tiny gpt-oss for the CUDA-vs-CPU test of its EXL3 experts on the grouped kernels (biases, the clamped SwiGLU).
    "gpt-oss-tiny": dict(architectures=["GptOssForCausalLM"], model_type="gpt_oss", hidden_size=256,
                         intermediate_size=256, num_local_experts=8, num_experts_per_tok=2, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=1024,
                         rms_norm_eps=1e-5, max_position_embeddings=4096, sliding_window=128,
                         layer_types=["sliding_attention", "full_attention"], attention_bias=True, swiglu_limit=7.0,
                         rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=32.0, beta_fast=32.0,
                                              beta_slow=1.0, truncate=False, original_max_position_embeddings=4096),
                         tie_word_embeddings=False, bos_token_id=0, eos_token_id=1),
    # Hybrids (issue 45): Gated DeltaNet layers, three of every four, beside gated full attention. Qwen3.5-27B (dense)
    # and Qwen3-Next-80B-A3B (512 experts, 10 a token, a gated shared expert); a tiny Qwen3-Next for CUDA-vs-CPU tests.
    "qwen3.5-27b": dict(architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text", hidden_size=5120,
                        intermediate_size=17408, num_hidden_layers=64, num_attention_heads=24, num_key_value_heads=4,
                        head_dim=256, vocab_size=248320, rms_norm_eps=1e-6, max_position_embeddings=262144,
                        linear_num_key_heads=16, linear_num_value_heads=48, linear_key_head_dim=128,
                        linear_value_head_dim=128, linear_conv_kernel_dim=4, full_attention_interval=4,
                        partial_rotary_factor=0.25,
                        rope_parameters=dict(rope_type="default", rope_theta=10000000.0, partial_rotary_factor=0.25),
                        tie_word_embeddings=False, eos_token_id=248046),
    "qwen3-next-80b-a3b": dict(architectures=["Qwen3NextForCausalLM"], model_type="qwen3_next", hidden_size=2048,
                               intermediate_size=5120, num_hidden_layers=48, num_attention_heads=16,
                               num_key_value_heads=2, head_dim=256, vocab_size=151936, rms_norm_eps=1e-6,
                               max_position_embeddings=262144, linear_num_key_heads=16, linear_num_value_heads=32,
                               linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
                               full_attention_interval=4, num_experts=512, num_experts_per_tok=10,
                               moe_intermediate_size=512, shared_expert_intermediate_size=512, norm_topk_prob=True,
                               decoder_sparse_step=1, mlp_only_layers=[], partial_rotary_factor=0.25,
                               rope_parameters=dict(rope_type="default", rope_theta=10000000.0,
                                                    partial_rotary_factor=0.25),
                               tie_word_embeddings=False, bos_token_id=151643, eos_token_id=151645),
    "qwen3-next-tiny": dict(architectures=["Qwen3NextForCausalLM"], model_type="qwen3_next", hidden_size=256,
                            intermediate_size=512, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=64, vocab_size=1024, rms_norm_eps=1e-6, max_position_embeddings=4096,
                            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=128,
                            linear_value_head_dim=128, linear_conv_kernel_dim=4, full_attention_interval=2,
                            num_experts=16, num_experts_per_tok=4, moe_intermediate_size=128,
                            shared_expert_intermediate_size=128, norm_topk_prob=True, decoder_sparse_step=1,
                            mlp_only_layers=[1], partial_rotary_factor=0.25,
                            rope_parameters=dict(rope_type="default", rope_theta=10000000.0, partial_rotary_factor=0.25),
                            tie_word_embeddings=False, bos_token_id=0, eos_token_id=1),
}

HYBRID_TYPES = ("qwen3_next", "qwen3_5_text")
# Linears the reference implementation keeps unquantized in its EXL3 files (a Gated DeltaNet layer's b / a gates).
UNQUANTIZED = ("in_proj_ba.weight", "in_proj_b.weight", "in_proj_a.weight")


def is_linear_layer(cfg, i):
    if cfg["model_type"] not in HYBRID_TYPES:
        return False
    return (i + 1) % cfg["full_attention_interval"] != 0


def linear_attn_of(cfg, p):
    """A Gated DeltaNet layer's tensors: Qwen3-Next's fused projections (grouped by key head) or Qwen3.5's."""
    H = cfg["hidden_size"]
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    kd, vd = nk * cfg["linear_key_head_dim"], nv * cfg["linear_value_head_dim"]
    cd = 2 * kd + vd
    a = p + "linear_attn."
    if cfg["model_type"] == "qwen3_next":
        out = [(a + "in_proj_qkvz.weight", (cd + vd, H)), (a + "in_proj_ba.weight", (2 * nv, H))]
    else:
        out = [(a + "in_proj_qkv.weight", (cd, H)), (a + "in_proj_z.weight", (vd, H)),
               (a + "in_proj_b.weight", (nv, H)), (a + "in_proj_a.weight", (nv, H))]
    return out + [(a + "conv1d.weight", (cd, 1, cfg["linear_conv_kernel_dim"])), (a + "A_log", (nv,)),
                  (a + "dt_bias", (nv,)), (a + "norm.weight", (cfg["linear_value_head_dim"],)),
                  (a + "out_proj.weight", (H, vd))]


def mlp_of(cfg, i, p):
    """The MLP tensors of layer i (prefix p): dense, or a mixture of experts' router and experts."""
    H, I = cfg["hidden_size"], cfg["intermediate_size"]
    E = cfg.get("num_experts", cfg.get("num_local_experts", 0))
    if not E or i in cfg.get("mlp_only_layers", []):
        return [(p + "mlp.gate_proj.weight", (I, H)), (p + "mlp.up_proj.weight", (I, H)),
                (p + "mlp.down_proj.weight", (H, I))]
    mixtral, gpt_oss = cfg["model_type"] == "mixtral", cfg["model_type"] == "gpt_oss"
    Ie = I if mixtral or gpt_oss else cfg["moe_intermediate_size"]
    m = p + ("block_sparse_moe." if mixtral else "mlp.")
    names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    if gpt_oss:  # the router and every expert linear biased
        out = [(m + "router.weight", (E, H)), (m + "router.bias", (E,))]
    else:
        out = [(m + "gate.weight", (E, H))]
    for e in range(E):
        for n, shape in ((names[0], (Ie, H)), (names[1], (Ie, H)), (names[2], (H, Ie))):
            out.append((f"{m}experts.{e}.{n}.weight", shape))
            if gpt_oss:
                out.append((f"{m}experts.{e}.{n}.bias", (shape[0],)))
    S = cfg.get("shared_expert_intermediate_size", 0) if cfg["model_type"] == "qwen3_next" else 0
    if S:  # a shared expert behind a sigmoid gate
        out += [(m + "shared_expert.gate_proj.weight", (S, H)), (m + "shared_expert.up_proj.weight", (S, H)),
                (m + "shared_expert.down_proj.weight", (H, S)), (m + "shared_expert_gate.weight", (1, H))]
    return out


def tensors_of(cfg):
    H, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = cfg.get("head_dim", H // cfg["num_attention_heads"])
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    bias = cfg["model_type"] in ("qwen2", "gpt_oss")
    gpt_oss = cfg["model_type"] == "gpt_oss"
    yield "model.embed_tokens.weight", (V, H)
    gemma = cfg["model_type"].startswith("gemma")
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (H,)
        yield p + "post_attention_layernorm.weight", (H,)
        if gemma:
            yield p + "pre_feedforward_layernorm.weight", (H,)
            yield p + "post_feedforward_layernorm.weight", (H,)
        if is_linear_layer(cfg, i):
            yield from linear_attn_of(cfg, p)
            yield from mlp_of(cfg, i, p)
            continue
        if gemma or cfg["model_type"] in ("qwen3_moe",) + HYBRID_TYPES:
            yield p + "self_attn.q_norm.weight", (hd,)
            yield p + "self_attn.k_norm.weight", (hd,)
        gate = 2 if cfg["model_type"] in HYBRID_TYPES else 1  # q_proj also yields the output gate
        for name, shape in (("q_proj", (gate * q, H)), ("k_proj", (kv, H)), ("v_proj", (kv, H)), ("o_proj", (H, q))):
            yield p + "self_attn." + name + ".weight", shape
            if bias and (name != "o_proj" or gpt_oss):
                yield p + "self_attn." + name + ".bias", (shape[0],)
        if gpt_oss:
            yield p + "self_attn.sinks", (cfg["num_attention_heads"],)
        yield from mlp_of(cfg, i, p)
    yield "model.norm.weight", (H,)
    if not cfg.get("tie_word_embeddings") or cfg.get("quantization_config"):  # EXL3 files quantize a tied head too
        yield "lm_head.weight", (V, H)


MARKERS = {"mul1": 0x83DCD12D, "mcg": 0xCBAC1FED}


def exl3_linear(prefix, out_f, in_f, K, codebook, g, dev, bias):
    """The tensors of one EXL3 linear `prefix` for an HF weight [out_f, in_f]."""
    pad = lambda v: (v + 127) // 128 * 128
    k, n = pad(in_f), pad(out_f)
    t = {prefix + ".trellis": torch.randint(-32768, 32768, (k // 16, n // 16, 16 * K), generator=g, device=dev,
                                            dtype=torch.int32).to(torch.int16)}

    def signs(m, scale):
        s = torch.where(torch.rand(m, generator=g, device=dev) < 0.5, -1.0, 1.0)
        return (s * scale * (0.5 + torch.rand(m, generator=g, device=dev))).to(torch.float16)

    t[prefix + ".suh"] = signs(in_f, 1.0)
    t[prefix + ".svh"] = signs(out_f, 0.02 / 1.24)
    if codebook in MARKERS:
        v = MARKERS[codebook]
        t[prefix + "." + codebook] = torch.tensor(v - (1 << 32) if v >= 1 << 31 else v, dtype=torch.int32)
    if bias:  # not zeros: a test comparing two backends must see them added
        t[prefix + ".bias"] = (torch.randn(out_f, generator=g, device=dev) * 0.1).to(torch.float16)
    return {name: v.cpu() for name, v in t.items()}


class BitSchedule:
    """K for each decoder linear: the whole width around `target` that keeps the running average closest to it."""

    def __init__(self, target):
        self.target, self.bits, self.weights = target, 0.0, 0

    def pick(self, weights):
        lo = math.floor(self.target)
        if lo == self.target:
            return int(lo)
        avg = lambda k: (self.bits + k * weights) / (self.weights + weights)
        k = min((lo, lo + 1), key=lambda k: abs(avg(k) - self.target))
        self.bits += k * weights
        self.weights += weights
        return int(k)

    def average(self):
        return self.bits / self.weights if self.weights else self.target


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", required=True, choices=sorted(SHAPES))
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--shard-gb", type=float, default=4.0)
    ap.add_argument("--exl3-bits", type=float, default=0,
                    help="EXL3 decoder linears at K bits per weight (1..8; fractional: a mix of the two around it)")
    ap.add_argument("--head-bits", type=int, default=6)
    ap.add_argument("--codebook", default="mul1", choices=["mul1", "mcg", "3inst"])
    ap.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                    help="override a config.json key of the shape, e.g. moe_intermediate_size=256")
    a = ap.parse_args()
    cfg = dict(SHAPES[a.shape])
    if a.layers:
        cfg["num_hidden_layers"] = a.layers
    for kv in a.set:
        key, sep, value = kv.partition("=")
        if not sep or key not in cfg:
            ap.error(f"--set {kv}: KEY=JSON with a key of the shape's config ({', '.join(sorted(cfg))})")
        cfg[key] = json.loads(value)
    cfg["dtype"] = "bfloat16"
    os.makedirs(a.out, exist_ok=True)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(0)
    shard, shard_bytes, shards, weight_map = {}, 0, [], {}

    def flush():
        nonlocal shard, shard_bytes
        if shard:
            name = f"model-{len(shards) + 1:05d}.safetensors"
            save_file(shard, os.path.join(a.out, name), metadata={"format": "pt"})
            shards.append(name)
            for k in shard:
                weight_map[k] = name
            shard, shard_bytes = {}, 0

    schedule = BitSchedule(a.exl3_bits)
    if a.exl3_bits:
        cfg["quantization_config"] = {"quant_method": "exl3", "version": "1.4.1", "bits": float(a.exl3_bits),
                                      "head_bits": a.head_bits, "calibration": {"rows": 0, "cols": 0},
                                      "out_scales": "always", "codebook": a.codebook}
    for name, shape in tensors_of(cfg):
        linear = name.endswith(("proj.weight", ".w1.weight", ".w2.weight", ".w3.weight")) or name == "lm_head.weight"
        linear = linear and not name.endswith(UNQUANTIZED)
        if a.exl3_bits and (linear or name.endswith("proj.bias")):
            if name.endswith(".bias"):
                continue  # written with its linear
            prefix = name[: -len(".weight")]
            K = a.head_bits if name == "lm_head.weight" else schedule.pick(shape[0] * shape[1])
            has_bias = (cfg["model_type"] == "qwen2" and any(x in name for x in ("q_proj", "k_proj", "v_proj"))) or (
                cfg["model_type"] == "gpt_oss" and name != "lm_head.weight")
            part = exl3_linear(prefix, shape[0], shape[1], K, a.codebook, g, dev, has_bias)
            shard.update(part)
            shard_bytes += sum(v.numel() * v.element_size() for v in part.values())
            if shard_bytes >= a.shard_gb * 2**30:
                flush()
            continue
        if name.endswith("norm.weight"):
            t = torch.ones(shape, dtype=torch.bfloat16, device=dev)
        else:
            t = (torch.randn(shape, generator=g, device=dev) * 0.02).to(torch.bfloat16)
        shard[name] = t.cpu()
        shard_bytes += t.numel() * 2
        if shard_bytes >= a.shard_gb * 2**30:
            flush()
    flush()
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    bits = f", decoder {schedule.average():.3f} bits per weight" if a.exl3_bits else ""
    print(f"{a.shape}: {len(weight_map)} tensors in {len(shards)} shards under {a.out}{bits}", flush=True)


if __name__ == "__main__":
    main()
