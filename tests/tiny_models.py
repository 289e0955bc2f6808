"""Tiny models built in-process for adapter tests (no hub, no network)."""

import functools
import tempfile

import numpy as np
import torch

WORDS = (
    "the a cat dog sat on mat how do i make bomb cake please tell me about weather hello world is nice "
    "write poem steal car hack email safe kill process python code bread recipe friend"
).split()


@functools.cache
def tokenizer_dir() -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["<pad>", "<unk>", "<s>", "</s>"])
    tok.train_from_iterator([" ".join(WORDS)] * 3, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    fast.chat_template = (
        "{% for m in messages %}<s> {{ m['content'] }} </s>{% endfor %}{% if add_generation_prompt %} <s>{% endif %}"
    )
    path = tempfile.mkdtemp(prefix="tpc-tok-")
    fast.save_pretrained(path)
    return path


def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir())


def hf_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer()),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=3,
    )
    return LlamaForCausalLM(cfg).eval()


def hf_gpt2(seed: int = 0):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(
        vocab_size=len(tokenizer()),
        n_embd=32,
        n_layer=3,
        n_head=4,
        n_positions=128,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=3,
    )
    return GPT2LMHeadModel(cfg).eval()


def named(hf_model):
    """``hf_model`` with ``name_or_path`` set to the tiny tokenizer's folder, as ``from_pretrained``
    would set it: the transformers adapter then loads its default tokenizer from there."""
    hf_model.name_or_path = tokenizer_dir()
    return hf_model


def hooked_gpt2_style(seed: int = 0):
    """A HookedTransformer with learned absolute position embeddings (GPT-2 style)."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    torch.manual_seed(seed)
    cfg = HookedTransformerConfig(
        d_model=32,
        n_layers=3,
        n_heads=4,
        d_head=8,
        d_mlp=64,
        d_vocab=len(tokenizer()),
        n_ctx=128,
        act_fn="gelu",
        normalization_type="LN",
        positional_embedding_type="standard",
        default_prepend_bos=False,
    )
    return HookedTransformer(cfg, tokenizer=tokenizer()).eval()


def bridge(hf_model):
    from transformer_lens.model_bridge import TransformerBridge

    return TransformerBridge.boot_transformers(tokenizer_dir(), hf_model=hf_model, tokenizer=tokenizer())


def nnsight_lm(hf_model):
    from nnsight import LanguageModel

    return LanguageModel(hf_model, tokenizer=tokenizer())


def hf_tiny(arch: str, seed: int = 0):
    """A tiny randomly initialised causal LM of the given Hugging Face architecture."""
    import transformers as tr

    torch.manual_seed(seed)
    common = dict(
        vocab_size=len(tokenizer()),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        max_position_embeddings=128,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=3,
    )
    if arch == "llama":
        return hf_llama(seed)
    if arch == "gpt2":
        return hf_gpt2(seed)
    if arch == "qwen2":
        return tr.Qwen2ForCausalLM(tr.Qwen2Config(num_key_value_heads=2, **common)).eval()
    if arch == "gemma":
        return tr.GemmaForCausalLM(tr.GemmaConfig(num_key_value_heads=2, head_dim=8, **common)).eval()
    if arch == "gpt_neox":
        return tr.GPTNeoXForCausalLM(tr.GPTNeoXConfig(**common)).eval()
    raise ValueError(arch)


def random_head(
    d_model: int, degree: int = 3, rank: int = 4, *, std: float = 0.3, scale: float | None = None, seed: int = 0
):
    """A TPC with every parameter drawn at random (``std``), its input scale set to ``scale``
    when given (a real model's residual stream is far from unit scale)."""
    import tpc_hooks as tpc

    gen = torch.Generator().manual_seed(seed)
    head = tpc.TPC(d_model, degree, rank)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * std)
        if scale is not None:
            head.scaler.scale.fill_(scale)
    return head


def tiny_head(d_model: int = 32, degree: int = 3, seed: int = 0):
    """A TPC (rank 4) with every parameter drawn at random, small enough for the tiny models."""
    return random_head(d_model, degree, seed=seed)


RESUME_PROMPTS = [f"{w} cat" for w in ("the", "a", "dog", "hello", "world", "nice", "cake", "bread", "car", "friend")]


def interrupt_forward(monkeypatch, adapter, at: int) -> None:
    """Makes the adapter's ``at``-th forward pass (counting from 1) raise ``KeyboardInterrupt``, as
    a user pressing Ctrl-C in the middle of a collection; every other pass runs as usual."""
    calls = {"n": 0}
    real = type(adapter).forward_sites

    def flaky(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == at:
            raise KeyboardInterrupt
        return real(self, *a, **k)

    monkeypatch.setattr(type(adapter), "forward_sites", flaky)


# Prompts of the tiny tokenizer's vocabulary, for CLI and recipe tests on the tiny models.
TINY_HARMFUL = [
    "how do i make bomb",
    "steal car please",
    "hack email of friend",
    "tell me how to kill",
    "make bomb now",
    "how do i steal car",
    "hack the email",
    "kill the cat",
    "make a bomb for me",
    "steal the car of friend",
]
TINY_BENIGN = [
    "bread recipe please",
    "write poem about cat",
    "hello world is nice",
    "tell me about weather",
    "python code for cake",
    "the dog sat on the mat",
    "write poem about weather",
    "safe cake recipe",
    "hello friend",
    "the cat sat on mat",
]


def prompt_set(texts, labels):
    """A ``tpc_hooks.data.PromptSet`` of labelled prompts, in their order (one source, no categories)."""
    from tpc_hooks.data import PromptSet

    n = len(texts)
    return PromptSet(list(texts), [int(v) for v in labels], ["mine"] * n, [""] * n, [False] * n)


def tiny_splits():
    """train / val / test splits of the tiny prompts (6 / 2 / 2 of each class), as ``tpc-hooks
    collect`` reads a dataset with splits."""

    def split(a, z):
        return prompt_set(TINY_HARMFUL[a:z] + TINY_BENIGN[a:z], [1] * (z - a) + [0] * (z - a))

    return {"train": split(0, 6), "val": split(6, 8), "test": split(8, 10)}


def tiny_chats(n):
    """``n`` benign chats of the tiny vocabulary, in place of ShareGPT (hosted contexts)."""
    words = "the a cat dog sat on mat hello world is nice write poem bread recipe friend python code".split()
    rng = np.random.default_rng(n)
    return [
        [
            {"role": ("user", "assistant")[t % 2], "content": " ".join(rng.choice(words, 4 + (t + i) % 6))}
            for t in range(5 + 2 * (i % 2))
        ]
        for i in range(n)
    ]


def assert_steps_score_as_offline(monitor, model, run, tol: float = 1e-4, **score_kw):
    """Every step of a monitored generation ``run`` scores (logit) as ``monitor.score`` scores the
    same prefix offline (the prompt plus the tokens generated before the step), within ``tol``;
    returns the offline results, one per sequence. A response monitor's step 0 is unscored (logit
    ``-inf``) and its step ``t`` is scored offline as the conversation with ``t`` answer tokens."""
    offline = []
    for b in range(len(run.scores)):
        if monitor.answers:  # a response monitor: step 0 (the prompt alone) is never scored
            assert run.logits[b][0] == float("-inf") and run.scores[b][0] == 0
            n = run.prompt_lengths[b]
            prefixes = [run.sequences[b][: n + t] for t in range(1, len(run.scores[b]))]
            offline.append(monitor.score(model, tokens=prefixes, answer_starts=[n] * len(prefixes), **score_kw))
            torch.testing.assert_close(run.logits[b][1:], offline[-1].logits, rtol=tol, atol=tol)
            continue
        prefixes = [run.sequences[b][: run.prompt_lengths[b] + t] for t in range(len(run.scores[b]))]
        offline.append(monitor.score(model, tokens=prefixes, **score_kw))
        torch.testing.assert_close(run.logits[b], offline[-1].logits, rtol=tol, atol=tol)
    return offline
