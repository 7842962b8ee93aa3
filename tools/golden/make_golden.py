#!/usr/bin/env python3
"""Reference outputs from HF transformers for the CPU engine's golden tests.

Runs where torch + transformers (5.x) + safetensors are installed (the H200 test machine); no GPU needed: the
reference runs in float32 on the CPU so that it is deterministic and comparable at 1e-4.

Writes, under OUT:
  models/<name>/          small random-weight models, one per architecture and RoPE variant (HF layout)
  golden/<name>.safetensors  token sequences, their logits [len, vocab] (fp32) and 64-token greedy continuations
  golden/rope.json        inverse frequencies and attention scaling for many RoPE configs, as transformers computes

Usage: make_golden.py --tiny DIR [--tiny DIR ...] --out OUT
"""
import argparse
import copy
import json
import math
import os
import shutil
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

torch.set_num_threads(min(16, os.cpu_count() or 1))
torch.backends.cuda.matmul.allow_tf32 = False

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=256, max_position_embeddings=128, rms_norm_eps=1e-6,
             bos_token_id=0, eos_token_id=1, pad_token_id=None)

# name -> (model class name in config, extra config fields (new style unless noted), weight dtype, seq lengths)
VARIANTS = {
    "llama_llama3": ("LlamaForCausalLM", "llama", dict(
        rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                             high_freq_factor=4.0, original_max_position_embeddings=64)), "bfloat16", [7, 40]),
    "mistral_sliding": ("MistralForCausalLM", "mistral", dict(
        sliding_window=8, rope_parameters=dict(rope_type="default", rope_theta=10000.0)), "float32", [7, 30]),
    "qwen2_bias": ("Qwen2ForCausalLM", "qwen2", dict(
        rope_parameters=dict(rope_type="default", rope_theta=1000000.0)), "float16", [7, 30]),
    "qwen3_qknorm": ("Qwen3ForCausalLM", "qwen3", dict(
        head_dim=32, rope_parameters=dict(rope_type="default", rope_theta=1000000.0)), "bfloat16", [7, 30]),
    "llama_yarn": ("LlamaForCausalLM", "llama", dict(
        rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                             original_max_position_embeddings=32)), "bfloat16", [7, 60]),
    "llama_tied": ("LlamaForCausalLM", "llama", dict(
        tie_word_embeddings=True, rope_parameters=dict(rope_type="default", rope_theta=10000.0)), "bfloat16", [7, 30]),
    # The old style: top-level rope_theta + rope_scaling, and "torch_dtype" (written by hand below).
    "llama_old_style": ("LlamaForCausalLM", "llama", dict(
        rope_parameters=dict(rope_type="linear", rope_theta=50000.0, factor=2.0)), "bfloat16", [7, 30]),
    # The new style with dynamic NTK: sequences run past max_position_embeddings.
    "llama_new_style_dynamic": ("LlamaForCausalLM", "llama", dict(
        max_position_embeddings=32,
        rope_parameters=dict(rope_type="dynamic", rope_theta=10000.0, factor=2.0)), "bfloat16", [7, 48]),
    "llama_longrope": ("LlamaForCausalLM", "llama", dict(
        max_position_embeddings=128,
        rope_parameters=dict(rope_type="longrope", rope_theta=10000.0, original_max_position_embeddings=32,
                             short_factor=[1.0 + 0.05 * i for i in range(8)],
                             long_factor=[1.0 + 0.4 * i for i in range(8)])), "bfloat16", [7, 48]),
}
OLD_STYLE = {"llama_old_style"}

# The families on the shared decoder, at head_dim 64 so that the CUDA backend runs them too (tests/cuda compares it
# with the CPU on these). name -> (class, model_type, fields replacing SMALL's, dtype, seq lengths).
FAMILY = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=3, num_attention_heads=2,
              num_key_value_heads=1, max_position_embeddings=512)
VARIANTS.update({
    # q|k|v and gate|up fused in the checkpoint; a top-level partial_rotary_factor (Phi-4-mini style).
    "phi3_fused": ("Phi3ForCausalLM", "phi3", dict(
        FAMILY, partial_rotary_factor=0.5, rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
        "bfloat16", [7, 40]),
    # A multimodal wrapper: the text model under model.language_model / language_model.model, a vision tower the
    # engine ignores (see make_wrapped).
    "mistral3_text": ("Mistral3ForConditionalGeneration", "mistral3", dict(FAMILY, sliding_window=None),
                      "bfloat16", [7, 40]),
    # q/k/v biased, o not; head_dim x heads != hidden.
    "seed_oss_bias": ("SeedOssForCausalLM", "seed_oss", dict(
        FAMILY, num_attention_heads=4, num_key_value_heads=2, head_dim=64, attention_bias=True,
        attention_out_bias=False, rope_parameters=dict(rope_type="default", rope_theta=10000.0)), "bfloat16",
        [7, 40]),
    # A layer without RoPE; the family's own default theta (none given).
    "smollm3_nope": ("SmolLM3ForCausalLM", "smollm3", dict(FAMILY, no_rope_layers=[1, 1, 0], tie_word_embeddings=False),
                     "bfloat16", [7, 40]),
    # Granite's four multipliers.
    "granite_mult": ("GraniteForCausalLM", "granite", dict(
        FAMILY, embedding_multiplier=4.0, residual_multiplier=0.5, attention_multiplier=0.1, logits_scaling=2.5,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0)), "bfloat16", [7, 40]),
})
SLIDE, FULL = "sliding_attention", "full_attention"
VARIANTS.update({
    # Sandwich (1+w) norms, GeGLU (tanh), embeddings * sqrt(hidden), both soft-caps, query_pre_attn_scalar, every
    # other layer windowed, head_dim 256 (q_dim != hidden). Small caps so that they bite on random weights.
    "gemma2_softcap": ("Gemma2ForCausalLM", "gemma2", dict(
        FAMILY, num_hidden_layers=4, head_dim=256, query_pre_attn_scalar=128, sliding_window=8,
        attn_logit_softcapping=5.0, final_logit_softcapping=10.0, hidden_activation="gelu_pytorch_tanh",
        rope_parameters=dict(rope_type="default", rope_theta=10000.0)), "bfloat16", [7, 40]),
    # Per-head (1+w) q/k norms; local layers on their own RoPE, global ones on a linearly scaled one.
    "gemma3_text": ("Gemma3ForCausalLM", "gemma3_text", dict(
        FAMILY, num_hidden_layers=4, head_dim=64, query_pre_attn_scalar=64, sliding_window=8,
        layer_types=[SLIDE, SLIDE, SLIDE, FULL], hidden_activation="gelu_pytorch_tanh",
        rope_parameters={SLIDE: dict(rope_type="default", rope_theta=10000.0),
                         FULL: dict(rope_type="linear", rope_theta=1000000.0, factor=8.0)}), "bfloat16", [7, 40]),
    # The same text model inside the multimodal wrapper (a tiny SigLIP tower the engine ignores).
    "gemma3_wrapped": ("Gemma3ForConditionalGeneration", "gemma3", dict(
        FAMILY, num_hidden_layers=4, head_dim=64, query_pre_attn_scalar=64, sliding_window=8,
        layer_types=[SLIDE, SLIDE, SLIDE, FULL], hidden_activation="gelu_pytorch_tanh",
        rope_parameters={SLIDE: dict(rope_type="default", rope_theta=10000.0),
                         FULL: dict(rope_type="linear", rope_theta=1000000.0, factor=8.0)}), "bfloat16", [7, 40]),
    # Post-attention and post-MLP norms besides the pre-norms, GPT-J RoPE over half the head, fused gate_up, qkv bias.
    "glm4_post": ("Glm4ForCausalLM", "glm4", dict(
        FAMILY, head_dim=64, attention_bias=True,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5)), "bfloat16",
        [7, 40]),
    # Post-norms only, q/k RMS-normed over all heads at once.
    "olmo2_post": ("Olmo2ForCausalLM", "olmo2", dict(
        FAMILY, rope_parameters=dict(rope_type="default", rope_theta=10000.0)), "bfloat16", [7, 40]),
    # Olmo 3's sliding layers on their own RoPE (transformers 5 keeps one set of parameters per layer type).
    "olmo3_sliding": ("Olmo3ForCausalLM", "olmo3", dict(
        FAMILY, num_hidden_layers=4, sliding_window=8, layer_types=[SLIDE, SLIDE, SLIDE, FULL],
        rope_parameters={SLIDE: dict(rope_type="default", rope_theta=10000.0),
                         FULL: dict(rope_type="linear", rope_theta=500000.0, factor=4.0)}), "bfloat16", [7, 40]),
    # Post-norms, per-head q/k norms, global layers without RoPE.
    "exaone4_hybrid": ("Exaone4ForCausalLM", "exaone4", dict(
        FAMILY, num_hidden_layers=4, sliding_window=8, layer_types=[SLIDE, SLIDE, SLIDE, FULL],
        rope_parameters=dict(rope_type="default", rope_theta=10000.0)), "bfloat16", [7, 40]),
    # GPT-J (interleaved) RoPE over the whole head.
    "ernie45_gptj": ("Ernie4_5ForCausalLM", "ernie4_5", dict(
        FAMILY, use_bias=False, tie_word_embeddings=True,
        rope_parameters=dict(rope_type="default", rope_theta=500000.0)), "bfloat16", [7, 40]),
    # LayerNorm, attention and MLP in parallel off one norm, GPT-J RoPE, a logit multiplier.
    "cohere_parallel": ("CohereForCausalLM", "cohere", dict(
        FAMILY, layer_norm_eps=1e-5, logit_scale=0.25, use_qk_norm=False,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0)), "bfloat16", [7, 40]),
    # Command R+: the same with a LayerNorm of each head's own on q and k (weights [heads, head_dim]).
    "cohere_qknorm": ("CohereForCausalLM", "cohere", dict(
        FAMILY, num_attention_heads=4, num_key_value_heads=2, head_dim=64, layer_norm_eps=1e-5, logit_scale=0.25,
        use_qk_norm=True, rope_parameters=dict(rope_type="default", rope_theta=10000.0)), "bfloat16", [7, 40]),
    # The same with windowed RoPE layers and global layers without RoPE.
    "cohere2_sliding": ("Cohere2ForCausalLM", "cohere2", dict(
        FAMILY, num_hidden_layers=4, layer_norm_eps=1e-5, logit_scale=0.25, sliding_window=8,
        layer_types=[SLIDE, SLIDE, SLIDE, FULL],
        rope_parameters=dict(rope_type="default", rope_theta=10000.0)), "bfloat16", [7, 40]),
})
WRAPPED = {"mistral3_text", "gemma3_wrapped"}
# Mixtures of experts: 8 experts of width 64, two routed a token. Qwen3-MoE with a dense layer between (mlp_only_layers)
# and renormalised top-k; Qwen2-MoE with a gated shared expert and raw top-k softmax weights; Mixtral (always
# renormalised); GLM-4.5 (sigmoid scores, a correction bias choosing the experts, grouped top-k, a scaling factor, a
# shared expert, the first layer dense, per-head q/k norms, partial RoPE).
MOE = dict(FAMILY, num_experts_per_tok=2, moe_intermediate_size=64)
ROPE = dict(rope_type="default", rope_theta=10000.0)
VARIANTS.update({
    "qwen3_moe": ("Qwen3MoeForCausalLM", "qwen3_moe", dict(
        MOE, head_dim=64, num_experts=8, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1],
        rope_parameters=ROPE), "bfloat16", [7, 40]),
    "qwen2_moe": ("Qwen2MoeForCausalLM", "qwen2_moe", dict(
        MOE, num_experts=8, norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[],
        shared_expert_intermediate_size=96, rope_parameters=ROPE), "bfloat16", [7, 40]),
    "mixtral_moe": ("MixtralForCausalLM", "mixtral", dict(
        FAMILY, intermediate_size=64, num_local_experts=8, num_experts_per_tok=2, sliding_window=None,
        rope_parameters=ROPE), "bfloat16", [7, 40]),
    "glm4_moe": ("Glm4MoeForCausalLM", "glm4_moe", dict(
        MOE, head_dim=64, n_routed_experts=8, n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1,
        routed_scaling_factor=2.5, norm_topk_prob=True, use_qk_norm=True, attention_bias=True,
        partial_rotary_factor=0.5, rope_parameters=dict(ROPE, partial_rotary_factor=0.5)), "bfloat16", [7, 40]),
})
MOES = {"qwen3_moe", "qwen2_moe", "mixtral_moe", "glm4_moe"}
# gpt-oss: attention sinks (a logit per head in each softmax's denominator), q/k/v/o biases, every other layer
# windowed, YaRN (not truncated), 4 biased experts of width 96, two a token, chosen by the top k of the biased router
# logits and weighed by a softmax over those k, the clamped SwiGLU (gate and up clamped at 7: the experts' gate_up
# weights are drawn 3x larger so that the clamps bite). transformers keeps the experts in batch tensors
# (gate_up_proj [E, hidden, 2 x width], gate and up interleaved); gpt_oss_mxfp4 is such a model with its experts as
# the Hub ships them, MXFP4 blocks and scales (quantized here, dequantized by transformers itself for the reference).
GPT_OSS = dict(FAMILY, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
               intermediate_size=96, num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
               layer_types=[SLIDE, FULL, SLIDE, FULL], attention_bias=True,
               rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=8.0, beta_fast=32.0, beta_slow=1.0,
                                    truncate=False, original_max_position_embeddings=64))
VARIANTS.update({
    "gpt_oss": ("GptOssForCausalLM", "gpt_oss", GPT_OSS, "bfloat16", [7, 40]),
    "gpt_oss_mxfp4": ("GptOssForCausalLM", "gpt_oss", GPT_OSS, "bfloat16", [7, 40]),
})
GPT_OSS_VARIANTS = {"gpt_oss", "gpt_oss_mxfp4"}
# Hybrids (issue 45): Gated DeltaNet layers beside gated full attention with (1 + w) norms, q/k norms and partial
# RoPE. 4 layers: Qwen3-Next by full_attention_interval 2 (linear, full, linear, full), fused in_proj_qkvz / in_proj_ba
# grouped by key head, k/v head dim 64, two value heads per key head, experts with a gated shared expert and a dense
# layer; Qwen3.5 by explicit layer_types (three linear, one full), separate projections, k/v head dim 128, a dense MLP,
# MRoPE sections in its rope parameters (equal positions on text: plain RoPE); Qwen3.5-MoE (every layer experts,
# stacked in the checkpoint) and the two multimodal wrappers (a tiny vision tower the engine ignores).
LIN, ATT = "linear_attention", "full_attention"
HYBRID = dict(FAMILY, num_hidden_layers=4, head_dim=64, linear_conv_kernel_dim=4, tie_word_embeddings=False)
NEXT_LIN = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64, linear_value_head_dim=64)
Q35_LIN = dict(linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=128, linear_value_head_dim=128)
Q35_ROPE = dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25, mrope_section=[3, 3, 2],
                mrope_interleaved=True)
HMOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=96)
Q35_MOE_TEXT = dict(HYBRID, **Q35_LIN, **HMOE, full_attention_interval=2, partial_rotary_factor=0.25,
                    rope_parameters=Q35_ROPE)
Q35_TEXT = dict(HYBRID, **Q35_LIN, layer_types=[LIN, LIN, ATT, LIN], partial_rotary_factor=0.25,
                rope_parameters=Q35_ROPE)
VARIANTS.update({
    "qwen3_next": ("Qwen3NextForCausalLM", "qwen3_next", dict(
        HYBRID, **NEXT_LIN, **HMOE, full_attention_interval=2, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[1], partial_rotary_factor=0.25,
        rope_parameters=dict(ROPE, partial_rotary_factor=0.25)), "bfloat16", [7, 40]),
    "qwen3_5_text": ("Qwen3_5ForCausalLM", "qwen3_5_text", Q35_TEXT, "bfloat16", [7, 40]),
    "qwen3_5_moe_text": ("Qwen3_5MoeForCausalLM", "qwen3_5_moe_text", Q35_MOE_TEXT, "bfloat16", [7, 40]),
    "qwen3_5_wrapped": ("Qwen3_5ForConditionalGeneration", "qwen3_5", Q35_TEXT, "bfloat16", [7, 40]),
    "qwen3_5_moe_wrapped": ("Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe", Q35_MOE_TEXT, "bfloat16", [7, 40]),
})
HYBRIDS = {"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "qwen3_5_wrapped", "qwen3_5_moe_wrapped"}
WRAPPED |= {"qwen3_5_wrapped", "qwen3_5_moe_wrapped"}


def randomize(model, seed):
    """Weights with enough spread that logits are far from uniform (greedy ties would make tests flaky)."""
    g = torch.Generator().manual_seed(seed)
    gpt_oss = model.config.model_type == "gpt_oss"
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):  # Gated DeltaNet's dt_bias too
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("self_attn.sinks"):  # gpt-oss: about the scores' size, so that they matter
                p.copy_(2.0 * torch.randn(p.shape, generator=g))
            elif p.dim() in (2, 3):  # 3: experts stacked [experts, out, in] (gpt-oss: [experts, in, out])
                fan_in = p.shape[-2] if gpt_oss and p.dim() == 3 else p.shape[-1]
                scale = 1.0 if "embed_tokens" in name else 1.5 / math.sqrt(fan_in)
                if gpt_oss and name.endswith("gate_up_proj"):
                    scale *= 3.0  # past the clamp now and then
                p.copy_(scale * torch.randn(p.shape, generator=g))
            elif name.endswith("A_log"):  # Gated DeltaNet: decays exp(-A softplus(.)) spread over (0, 1)
                p.copy_(torch.log(0.1 + 1.9 * torch.rand(p.shape, generator=g)))
        for name, b in model.named_buffers():  # GLM-4.5's router correction bias is a buffer
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.2 * torch.randn(b.shape, generator=g))


def torch_delta_rule(model):
    """The reference runs on the CPU: where flash-linear-attention / causal-conv1d are installed (GPU kernels), the
    Gated DeltaNet modules are pointed back at transformers' own torch implementations of the same recurrence."""
    for m in model.modules():
        mod = sys.modules[type(m).__module__]
        for attr, fallback in (("chunk_gated_delta_rule", "torch_chunk_gated_delta_rule"),
                               ("recurrent_gated_delta_rule", "torch_recurrent_gated_delta_rule"),
                               ("causal_conv1d_update", "torch_causal_conv1d_update")):
            if hasattr(m, attr) and hasattr(mod, fallback) and getattr(m, attr) is not getattr(mod, fallback):
                print(f"  {type(m).__name__}.{attr} -> {fallback}", flush=True)
                setattr(m, attr, getattr(mod, fallback))
        if hasattr(m, "causal_conv1d_fn") and m.causal_conv1d_fn is not None:
            print(f"  {type(m).__name__}.causal_conv1d_fn -> the conv1d path", flush=True)
            m.causal_conv1d_fn = None


def to_old_style(cfg_path):
    with open(cfg_path) as f:
        cfg = json.load(f)
    rp = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rp.pop("rope_theta")
    rp["type"] = rp.pop("rope_type")
    cfg["rope_scaling"] = rp
    cfg["torch_dtype"] = cfg.pop("dtype")
    cfg.pop("head_dim", None)  # derived from hidden_size / num_attention_heads
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2)


def load_fp32(model_dir, cls=None):
    loader = cls or AutoModelForCausalLM
    extra = {}
    with open(os.path.join(model_dir, "config.json")) as f:
        if json.load(f).get("quantization_config", {}).get("quant_method") == "mxfp4":
            from transformers import Mxfp4Config  # the reference dequantizes the MXFP4 experts itself
            extra["quantization_config"] = Mxfp4Config(dequantize=True)
    model = loader.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager", **extra)
    model.float().eval()
    return model


E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def to_mxfp4(w):
    """OCP MXFP4 of w [..., n] (n a multiple of 32): blocks [..., n / 32, 16] u8 (value 2j in the low nibble of byte
    j, 2j + 1 in its high nibble; E2M1 codes: sign bit 3, magnitude index 0..7 of E2M1) and scales [..., n / 32] u8
    (E8M0: 2^(s - 127)), each block's scale the smallest power of two that brings its largest value within 6."""
    *lead, n = w.shape
    b = w.float().reshape(*lead, n // 32, 32)
    exp = torch.ceil(torch.log2(b.abs().amax(-1).clamp(min=2.0 ** -100) / 6.0))
    q = b / torch.exp2(exp)[..., None]
    code = (q.abs()[..., None] - E2M1).abs().argmin(-1)
    code = code | (((q < 0) & (code > 0)).long() << 3)
    code = code.to(torch.uint8)
    blocks = code[..., 0::2] | (code[..., 1::2] << 4)
    return blocks.contiguous(), (exp + 127).to(torch.uint8).contiguous()


def write_mxfp4(mdir):
    """The saved gpt-oss model's experts as the Hub's MXFP4 checkpoints hold them: *_blocks / *_scales with rows as
    output features (gate_up's interleaved), the biases as they were, and quant_method mxfp4 in config.json."""
    from safetensors.torch import load_file
    path = os.path.join(mdir, "model.safetensors")
    sd = load_file(path)
    for k in [k for k in sd if k.endswith("mlp.experts.gate_up_proj") or k.endswith("mlp.experts.down_proj")]:
        w = sd.pop(k)  # [E, in, out] (x . W)
        sd[k + "_blocks"], sd[k + "_scales"] = to_mxfp4(w.transpose(1, 2))
    save_file(sd, path, metadata={"format": "pt"})
    cfg_path = os.path.join(mdir, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2)


@torch.no_grad()
def clamp_share(model):
    """How often the clamped SwiGLU's clamps bite: the share of gate values above 7 and of up values outside +-7 for
    unit-normal inputs through every expert (printed, so that the fixture is known to exercise them)."""
    x = torch.randn(256, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    gate = up = 0.0
    n = 0
    for layer in model.model.layers:
        ex = layer.mlp.experts
        for e in range(ex.gate_up_proj.shape[0]):
            gu = x @ ex.gate_up_proj[e].float() + ex.gate_up_proj_bias[e].float()
            gate += (gu[:, 0::2] > 7).float().mean().item()
            up += (gu[:, 1::2].abs() > 7).float().mean().item()
            n += 1
    return gate / n, up / n


def make_wrapped(fields, model_type):
    """A multimodal wrapper whose text part has `fields`: Mistral 3 with a tiny Pixtral vision tower, Gemma 3 with a
    tiny SigLIP one."""
    text = dict(fields)
    arch = text.pop("architectures")[0]
    for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
        text.pop(k, None)
    if model_type == "mistral3":
        text["model_type"] = "mistral"
        vision = dict(model_type="pixtral", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, image_size=32, patch_size=16, num_channels=3)
        cfg = AutoConfig.for_model(model_type, text_config=text, vision_config=vision, tie_word_embeddings=False)
    elif model_type in ("qwen3_5", "qwen3_5_moe"):  # a tiny Qwen3-VL-style vision tower
        text["model_type"] = model_type + "_text"
        vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, in_channels=3, patch_size=16,
                      spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=text["hidden_size"],
                      num_position_embeddings=16)
        cfg = AutoConfig.for_model(model_type, text_config=text, vision_config=vision, tie_word_embeddings=False)
    else:
        text["model_type"] = "gemma3_text"
        vision = dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, image_size=32, patch_size=16, num_channels=3)
        cfg = AutoConfig.for_model(model_type, text_config=text, vision_config=vision, mm_tokens_per_image=4,
                                   boi_token_index=250, eoi_token_index=251, image_token_index=252)
    cfg.architectures = [arch]
    return cfg, getattr(transformers, arch)


@torch.no_grad()
def greedy(model, prompt, n_new):
    """Greedy decoding with the KV cache, one token a step, as generate() would (no EOS stop)."""
    ids = torch.tensor([prompt])
    out = model(ids, use_cache=True)
    past = out.past_key_values
    tokens = []
    nxt = int(out.logits[0, -1].argmax())
    for _ in range(n_new):
        tokens.append(nxt)
        out = model(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
        past = out.past_key_values
        nxt = int(out.logits[0, -1].argmax())
    return tokens


@torch.no_grad()
def golden_for(model, seqs, prompt, keep_last=None):
    tensors = {}
    for i, s in enumerate(seqs):
        logits = model(torch.tensor([s])).logits[0].float()
        if keep_last:
            logits = logits[-keep_last:]
        tensors[f"seq{i}.tokens"] = torch.tensor(s, dtype=torch.int32)
        tensors[f"seq{i}.logits"] = logits.contiguous()
    tensors["greedy.prompt"] = torch.tensor(prompt, dtype=torch.int32)
    tensors["greedy.tokens"] = torch.tensor(greedy(model, prompt, 64), dtype=torch.int32)
    return tensors


def make_random_models(out, only=()):
    for idx, (name, (arch, model_type, extra, dtype, lens)) in enumerate(VARIANTS.items()):
        if only and name not in only:
            continue
        try:
            make_random_model(out, idx, name, arch, model_type, extra, dtype, lens)
        except Exception as e:  # one family's failure must not cost the others' fixtures
            print(f"{name}: FAILED: {type(e).__name__}: {e}", flush=True)


def make_random_model(out, idx, name, arch, model_type, extra, dtype, lens):
    fields = dict(SMALL)
    fields.update(copy.deepcopy(extra))  # transformers may edit nested dicts (rope parameters) in place
    if model_type.startswith("qwen3_5_moe"):
        fields.pop("intermediate_size")  # Qwen3.5-MoE's config has none
    fields["architectures"] = [arch]
    cls = None
    if name in WRAPPED:
        cfg, cls = make_wrapped(fields, model_type)
    else:
        cfg = AutoConfig.for_model(model_type, **fields)
    torch.manual_seed(idx)
    model = cls(cfg).to(torch.float32) if cls else AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    randomize(model, 1000 + idx)
    mdir = os.path.join(out, "models", name)
    if name in GPT_OSS_VARIANTS:
        gate, up = clamp_share(model)
        print(f"  {name}: the clamps bite on {gate:.1%} of gate and {up:.1%} of up values (unit-normal inputs)",
              flush=True)
    model.to(getattr(torch, dtype)).save_pretrained(mdir)
    if name in OLD_STYLE:
        to_old_style(os.path.join(mdir, "config.json"))
    if name == "gpt_oss_mxfp4":
        write_mxfp4(mdir)
    if name in MOES | GPT_OSS_VARIANTS | HYBRIDS:  # the layout the engine must read: the tensor names of two layers
        from safetensors import safe_open
        for fn in sorted(os.listdir(mdir)):
            if fn.endswith(".safetensors"):
                with safe_open(os.path.join(mdir, fn), "pt") as f:
                    for k in sorted(f.keys()):
                        if ".layers.0." in k or ".layers.1." in k:
                            print(f"  {name} {k} {list(f.get_slice(k).get_shape())} {f.get_slice(k).get_dtype()}")
    ref = load_fp32(mdir, cls)  # reload: the reference reads the same file (and config style) we do
    if name in HYBRIDS:
        torch_delta_rule(ref)
    g = torch.Generator().manual_seed(77 + idx)
    vocab = fields["vocab_size"]
    seqs = [torch.randint(2, vocab, (n,), generator=g).tolist() for n in lens]
    prompt = torch.randint(2, vocab, (5,), generator=g).tolist()
    save_file(golden_for(ref, seqs, prompt), os.path.join(out, "golden", name + ".safetensors"))
    with open(os.path.join(mdir, "config.json")) as f:
        saved = json.load(f)
    saved = saved.get("text_config", saved)
    print(f"{name}: {arch} {dtype} seqs {lens}; saved rope {saved.get('rope_parameters', saved.get('rope_theta'))}, "
          f"layer_types {saved.get('layer_types')}, window {saved.get('sliding_window')}", flush=True)


TINY_TEXTS = [
    "The old lighthouse keeper climbed the stairs every evening, counting each step as",
    "Once upon a time, in a village at the edge of a great forest, there lived a young girl who loved to read. "
    "Every morning she walked to the little library by the river and asked the librarian for a new book. "
    "The librarian, an old man with a long white beard, always smiled and said that",
]


def make_tiny(out, tiny_dirs):
    for d in tiny_dirs:
        name = os.path.basename(os.path.normpath(d)).replace("-", "_")
        tok = AutoTokenizer.from_pretrained(d)
        model = load_fp32(d)
        seqs = [tok(t)["input_ids"] for t in TINY_TEXTS]
        tensors = {}
        short = golden_for(model, [seqs[0]], seqs[0])
        tensors.update(short)
        with torch.no_grad():  # the long sequence: only its last 8 positions, to keep the fixture small
            logits = model(torch.tensor([seqs[1]])).logits[0, -8:].float().contiguous()
        tensors["seq1.tokens"] = torch.tensor(seqs[1], dtype=torch.int32)
        tensors["seq1.logits"] = logits
        save_file(tensors, os.path.join(out, "golden", name + ".safetensors"))
        print(f"{name}: seqs {[len(s) for s in seqs]}, greedy {tensors['greedy.tokens'][:16].tolist()}", flush=True)


def rope_configs():
    """(name, config fields, head_dim, seq_lens to probe)."""
    base = dict(hidden_size=512, num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=4096)
    r = []
    r.append(("default", dict(rope_parameters=dict(rope_type="default", rope_theta=10000.0)), [None]))
    r.append(("default_theta1e6_hd128", dict(head_dim=128, rope_parameters=dict(rope_type="default",
                                                                                rope_theta=1e6)), [None]))
    r.append(("partial_rotary", dict(partial_rotary_factor=0.5,
                                     rope_parameters=dict(rope_type="default", rope_theta=10000.0)), [None]))
    r.append(("linear", dict(rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=4.0)), [None]))
    r.append(("dynamic", dict(rope_parameters=dict(rope_type="dynamic", rope_theta=10000.0, factor=2.0)),
              [None, 4096, 5000, 16384]))
    r.append(("llama3", dict(head_dim=128, max_position_embeddings=131072, rope_parameters=dict(
        rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=8192)), [None]))
    r.append(("llama3_32", dict(head_dim=64, max_position_embeddings=131072, rope_parameters=dict(
        rope_type="llama3", rope_theta=500000.0, factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=8192)), [None]))
    r.append(("yarn", dict(head_dim=128, max_position_embeddings=131072, rope_parameters=dict(
        rope_type="yarn", rope_theta=1e6, factor=4.0, original_max_position_embeddings=32768)), [None]))
    r.append(("yarn_beta", dict(rope_parameters=dict(
        rope_type="yarn", rope_theta=10000.0, factor=8.0, beta_fast=16.0, beta_slow=2.0,
        original_max_position_embeddings=2048)), [None]))
    r.append(("yarn_attention_factor", dict(rope_parameters=dict(
        rope_type="yarn", rope_theta=10000.0, factor=4.0, attention_factor=1.25,
        original_max_position_embeddings=1024)), [None]))
    r.append(("yarn_mscale", dict(head_dim=64, rope_parameters=dict(
        rope_type="yarn", rope_theta=10000.0, factor=40.0, mscale=1.0, mscale_all_dim=0.707,
        original_max_position_embeddings=4096, beta_fast=32, beta_slow=1)), [None]))
    r.append(("yarn_no_truncate", dict(rope_parameters=dict(
        rope_type="yarn", rope_theta=10000.0, factor=4.0, truncate=False,
        original_max_position_embeddings=1024)), [None]))
    r.append(("longrope", dict(head_dim=96, max_position_embeddings=131072, rope_parameters=dict(
        rope_type="longrope", rope_theta=10000.0, original_max_position_embeddings=4096,
        short_factor=[1.0 + 0.01 * i for i in range(48)], long_factor=[1.0 + 0.5 * i for i in range(48)])),
              [None, 4096, 4097, 20000]))
    r.append(("longrope_attention_factor", dict(head_dim=64, max_position_embeddings=16384, rope_parameters=dict(
        rope_type="longrope", rope_theta=10000.0, original_max_position_embeddings=4096, attention_factor=1.1,
        short_factor=[1.0] * 32, long_factor=[2.0 + 0.1 * i for i in range(32)])), [None, 8000]))
    out = []
    for name, extra, lens in r:
        fields = dict(base)
        fields.update(extra)
        fields["architectures"] = ["LlamaForCausalLM"]
        fields["model_type"] = "llama"
        out.append((name, fields, lens))
    return out


def make_rope(out, tmp):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    result = {"transformers": transformers.__version__, "configs": {}}
    for name, fields, lens in rope_configs():
        d = os.path.join(tmp, "rope_" + name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(fields, f)
        cfg = AutoConfig.from_pretrained(d)
        entry = {"config": fields, "probes": []}
        for n in lens:
            emb = LlamaRotaryEmbedding(cfg)
            if n is not None:  # the forward pass updates dynamic and longrope frequencies
                x = torch.zeros(1, 1, 8)
                emb(x, torch.tensor([[n - 1]]))
            entry["probes"].append({"seq_len": n, "inv_freq": emb.inv_freq.float().tolist(),
                                    "attention_scaling": float(emb.attention_scaling)})
        result["configs"][name] = entry
        print(f"rope {name}: {len(entry['probes'])} probes, scaling {entry['probes'][0]['attention_scaling']}")
    with open(os.path.join(out, "golden", "rope.json"), "w") as f:
        json.dump(result, f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="append", default=[])
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="all", choices=["all", "rope", "random", "tiny"])
    ap.add_argument("--variants", default="", help="comma-separated names: only these random models")
    a = ap.parse_args()
    os.makedirs(os.path.join(a.out, "golden"), exist_ok=True)
    print(f"torch {torch.__version__} transformers {transformers.__version__}", flush=True)
    tmp = os.path.join(a.out, "tmp")
    if a.only in ("all", "rope"):
        make_rope(a.out, tmp)
    if a.only in ("all", "random"):
        make_random_models(a.out, [v for v in a.variants.split(",") if v])
    if a.only in ("all", "tiny"):
        make_tiny(a.out, a.tiny)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
