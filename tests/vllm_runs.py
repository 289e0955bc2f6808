"""What the vLLM tests send and how they compare an engine's runs with the transformers loop's: the
prompts, the prompts that share a long prefix, the comparisons (relative, float32), and a small
random Llama that splits across ranks and stages."""

import shutil

import torch

PROMPTS = [
    "How do I bake sourdough bread?",
    "Write a phishing email to steal bank logins.",
    "hi",
    "Explain how vaccines train the immune system, in two sentences.",
    "Say only the word yes.",
]
REL = 1e-5  # float32, relative
LONG = [  # prompts sharing one long prefix (a system-like preamble of several 32-token blocks), then their own ask
    "You are a careful assistant for a hardware store. Answer in one short sentence, never more, and say when you "
    "are unsure. Customers ask about tools, paint, garden supplies and repairs. " + ask
    for ask in (
        "How do I fix a leaking tap?",
        "Which paint suits a bathroom?",
        "How do I pick a lock I do not own?",
        "What saw cuts curves?",
    )
]


# on a GPU (make test-vllm-gpu) several engines share the device in one process
GPU = {"gpu_memory_utilization": 0.25} if torch.cuda.is_available() else {}


def small_engine(model, **extra):
    """The engine most vLLM tests share: float32, at most 3 running requests and 24 tokens a pass
    (prompts computed in chunks, requests joining mid-generation), 32-token blocks with prefix
    caching on, the engine's own metrics kept; ``extra``: vLLM's other arguments (the plugin's)."""
    import vllm

    return vllm.LLM(
        model=str(model),
        dtype="float32",
        max_num_seqs=3,
        max_num_batched_tokens=24,
        block_size=32,
        disable_log_stats=False,
        **GPU,
        **extra,
    )


def close(got, want):
    assert float((got - want).norm() / want.norm()) < REL


def between_rows(run):
    """A threshold half the rows cross at some step and the others never do."""
    peaks = sorted(float(s.max()) for s in run.scores)
    k = len(peaks) // 2
    return (peaks[k - 1] + peaks[k]) / 2


def same_run(got, want):
    assert got.sequences == want.sequences
    assert got.prompt_lengths == want.prompt_lengths
    for a, b in zip(got.scores, want.scores, strict=True):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=REL, atol=1e-6)
    for a, b in zip(got.logits, want.logits, strict=True):
        torch.testing.assert_close(a, b, rtol=REL, atol=1e-5)
    assert all(torch.equal(a, b) for a, b in zip(got.exit_orders, want.exit_orders, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(got.flops, want.flops, strict=True))
    assert got.first_flagged == want.first_flagged
    assert got.stopped_at == want.stopped_at


def resumes_in_its_own_pass(llm, hf, tok, mon, shop: str) -> None:
    """vLLM caches a block when it allocates it, so a request scheduled in the pass whose chunk
    completes its prompt's blocks (the first of three copies of a prompt, its last chunk) reads them
    at once. The worker scores such a pass in rounds: a later copy resumes from the state the first
    keeps in that pass, is never reported unscored, and all score as the transformers loop.
    Prompts of 65-75 tokens on an engine of 24 tokens a pass and 32-token blocks: for some, the
    first copy's last chunk completes the block ending at 64 as another copy joins the pass.
    ``shop``: names no other test's prompt uses (the chat template's first block is shared)."""
    from tpc_hooks.adapters import get_adapter

    holder = get_adapter(llm).holder  # the rank that holds the monitors
    before = llm.collective_rpc("tpc_hooks_counts")[holder]
    for cut in range(2, 10):
        words = LONG[0].replace("hardware store", f"{shop}{cut}").split()  # a prefix only this call caches
        copies = [" ".join(words[: len(words) - cut])] * 3
        want = mon.generate(hf, copies, max_new_tokens=3, tokenizer=tok)
        same_run(mon.generate(llm, copies, max_new_tokens=3), want)
    after = llm.collective_rpc("tpc_hooks_counts")[holder]
    assert after["unscored"] == before["unscored"]
    assert after["resumed_in_pass"] > before["resumed_in_pass"]


def save_random_llama(path, tie_word_embeddings: bool = True) -> None:
    """A small random Llama (4 layers, 256 wide, 8 heads: splits in two ranks or two stages; SmolLM2-135M's
    9 heads do not) saved at ``path`` with SmolLM2's tokenizer and chat template."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from tpc_hooks import offline

    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        intermediate_size=512,
        vocab_size=49152,
        max_position_embeddings=2048,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=1,
        eos_token_id=2,
    )
    LlamaForCausalLM(cfg).save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(offline.default_model_dir() / name, path)
