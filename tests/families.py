"""Tiny random checkpoints of the model families people monitor, built in-process from each
family's own transformers config (no hub, no network): the paper's four (Gemma 3, multimodal and
text-only; Qwen3-MoE; Llama 3.x; gpt-oss) and this year's (Gemma 4, Qwen 3.5, Llama 4, Mistral 3,
DeepSeek V3 with MLA, OLMo 3, Granite, SmolLM3, and the hybrids Qwen3-Next and Granite 4 with
linear-attention or state-space layers).

Each builder returns ``(model, decoder_config)``: the causal-LM (or conditional-generation)
class a user loads, eval mode, float32, with the tiny tokenizer's vocabulary, and the config of
its text decoder. Sizes are the smallest each family accepts; every family has 4 decoder layers
(sliding-window, MoE and hybrid patterns need a few to show).
"""

import torch
from tiny_models import tokenizer

LAYERS = 4
D = 32


def _common(**extra):
    # head_dim 32: the smallest vLLM's CPU attention takes (the same checkpoints run there)
    return dict(
        vocab_size=len(tokenizer()),
        hidden_size=D,
        intermediate_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=256,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=3,
        **extra,
    )


def _moe(**extra):
    return dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, **extra)


def _vision(cls, **extra):
    return cls(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=28,
        patch_size=14,
        **extra,
    )


def llama():
    import transformers as tr

    return tr.LlamaForCausalLM(tr.LlamaConfig(**_common()))


def qwen3_moe():
    import transformers as tr

    return tr.Qwen3MoeForCausalLM(tr.Qwen3MoeConfig(**_common(**_moe(decoder_sparse_step=1))))


def gemma3_text():
    import transformers as tr

    return tr.Gemma3ForCausalLM(
        tr.Gemma3TextConfig(**_common(sliding_window=4, sliding_window_pattern=2, layer_types=None))
    )


def gemma3():
    """The multimodal checkpoint (``Gemma3ForConditionalGeneration``): the text decoder sits under
    ``model.language_model`` and its layer count in ``config.text_config``."""
    import transformers as tr

    text = tr.Gemma3TextConfig(**_common(sliding_window=4))
    cfg = tr.Gemma3Config(
        text_config=text.to_dict(),
        vision_config=_vision(tr.SiglipVisionConfig).to_dict(),
        mm_tokens_per_image=4,
        image_token_index=len(tokenizer()) - 1,
    )
    return tr.Gemma3ForConditionalGeneration(cfg)


def gpt_oss():
    import transformers as tr

    c = _common(num_local_experts=4, num_experts_per_tok=2, sliding_window=4)
    return tr.GptOssForCausalLM(tr.GptOssConfig(**c))


def gemma4():
    import transformers as tr

    return tr.Gemma4ForCausalLM(tr.Gemma4TextConfig(**_common(sliding_window=4)))


def qwen3_5():
    import transformers as tr

    return tr.Qwen3_5ForCausalLM(
        tr.Qwen3_5TextConfig(
            **_common(
                linear_num_key_heads=2,
                linear_num_value_heads=2,
                linear_key_head_dim=8,
                linear_value_head_dim=8,
                full_attention_interval=2,
            )
        )
    )


def llama4():
    import transformers as tr

    return tr.Llama4ForCausalLM(
        tr.Llama4TextConfig(
            **_common(
                intermediate_size_mlp=64,
                num_local_experts=2,
                num_experts_per_tok=1,
                interleave_moe_layer_step=2,
                attention_chunk_size=32,
            )
        )
    )  # vLLM: a multiple of its CPU block size


def mistral3():
    """The multimodal checkpoint (``Mistral3ForConditionalGeneration``, a Pixtral vision tower)."""
    import transformers as tr

    cfg = tr.Mistral3Config(
        text_config=tr.MistralConfig(**_common()).to_dict(),
        vision_config=tr.PixtralVisionConfig(
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            head_dim=8,
            image_size=28,
            patch_size=14,
        ).to_dict(),
        image_token_index=len(tokenizer()) - 1,
    )
    return tr.Mistral3ForConditionalGeneration(cfg)


def deepseek_v3():
    import transformers as tr

    c = {
        **_common(
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            first_k_dense_replace=1,
            n_group=1,
            topk_group=1,
            q_lora_rank=16,
            qk_nope_head_dim=16,
            v_head_dim=32,
            topk_method="noaux_tc",
            # MLA's latent as wide as DeepSeek's own (512 + 64): the only shape vLLM's CPU MLA takes
            kv_lora_rank=512,
            qk_rope_head_dim=64,
        ),
        "num_key_value_heads": 2,
    }
    del c["head_dim"]
    return tr.DeepseekV3ForCausalLM(tr.DeepseekV3Config(**c))


def olmo3():
    import transformers as tr

    return tr.Olmo3ForCausalLM(tr.Olmo3Config(**_common(sliding_window=4)))


def granite():
    import transformers as tr

    return tr.GraniteForCausalLM(tr.GraniteConfig(**_common()))


def smollm3():
    import transformers as tr

    return tr.SmolLM3ForCausalLM(tr.SmolLM3Config(**_common()))


def qwen3_next():
    import transformers as tr

    return tr.Qwen3NextForCausalLM(
        tr.Qwen3NextConfig(
            **_common(
                **_moe(),
                linear_num_key_heads=2,
                linear_num_value_heads=2,
                linear_key_head_dim=8,
                linear_value_head_dim=8,
                full_attention_interval=2,
                shared_expert_intermediate_size=32,
            )
        )
    )


def granite4_hybrid():
    import transformers as tr

    c = _common(
        layer_types=["mamba", "attention"] * (LAYERS // 2),
        mamba_n_heads=2,
        mamba_d_head=32,
        mamba_d_state=8,
        mamba_n_groups=1,
        mamba_expand=2,
        mamba_chunk_size=8,
        num_local_experts=0,
    )
    c.update(num_attention_heads=1, num_key_value_heads=1)  # its head_dim is hidden / heads: 32, as vLLM's CPU takes
    return tr.GraniteMoeHybridForCausalLM(tr.GraniteMoeHybridConfig(**c))


# family -> builder; the order of the docs' table
FAMILIES = {
    "llama": llama,
    "qwen3_moe": qwen3_moe,
    "gemma3_text": gemma3_text,
    "gemma3": gemma3,
    "gpt_oss": gpt_oss,
    "gemma4": gemma4,
    "qwen3_5": qwen3_5,
    "llama4": llama4,
    "mistral3": mistral3,
    "deepseek_v3": deepseek_v3,
    "olmo3": olmo3,
    "granite": granite,
    "smollm3": smollm3,
    "qwen3_next": qwen3_next,
    "granite4_hybrid": granite4_hybrid,
}


def build(family: str, seed: int = 0):
    """A tiny random checkpoint of ``family`` (eval mode, float32, the same weights for a seed)."""
    torch.manual_seed(seed)
    model = FAMILIES[family]().eval()
    model.config.architectures = [type(model).__name__]  # as a saved checkpoint's config.json names it
    model.name_or_path = __import__("tiny_models").tokenizer_dir()
    return model


def vllm_engine(path, **kw):
    """A small ``vllm.LLM`` on the checkpoint saved at ``path`` (float32, 4 sequences, 128 tokens, 32-token
    blocks), with ``kw`` (e.g. ``vllm_engine_args(...)``). TPC_TEST_VLLM_MEMORY: the share of the machine's
    memory (a GPU's, under ``make test-vllm-gpu``) the engine reserves; vLLM's default 0.92 on a CPU fails
    to start beside another memory-hungry job."""
    import os

    import vllm

    memory = float(os.environ.get("TPC_TEST_VLLM_MEMORY", "0.25" if torch.cuda.is_available() else "0.92"))
    return vllm.LLM(
        model=str(path),
        dtype="float32",
        max_num_seqs=4,
        max_model_len=128,
        block_size=32,
        seed=0,
        gpu_memory_utilization=memory,
        **kw,
    )
