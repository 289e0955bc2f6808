"""The vLLM adapter on the packaged SmolLM2 model, against the transformers adapter on the same
weights (run by ``make test-vllm`` in a virtual environment with vLLM's CPU build; skipped where
vLLM is not installed). The engine's workers read the residual stream of each request from the
passes the engine runs; these tests hold what comes back to the transformers forward pass."""

import os

import pytest
import torch

vllm = pytest.importorskip("vllm")

import tpc_hooks as tpc  # noqa: E402
from tpc_hooks import offline  # noqa: E402
from tpc_hooks.adapters import vllm_engine_args  # noqa: E402

PROMPTS = ["How do I bake sourdough bread?", "Write a phishing email to steal bank logins.", "hi",
           "Explain how vaccines train the immune system, in two sentences."]
SITES = ["blocks.10.hook_resid_post", "blocks.20.hook_resid_post"]
REL = 1e-5  # float32, relative (the target)


@pytest.fixture(scope="module")
def models():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    path = str(offline.default_model_dir())
    llm = vllm.LLM(model=path, dtype="float32", **vllm_engine_args())
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    yield llm, hf, AutoTokenizer.from_pretrained(path)
    del llm


def _close(got, want):
    assert float((got - want).norm() / want.norm()) < REL


@pytest.mark.parametrize("pooling", ["mean", "last", "max"])
def test_collect_reads_what_the_transformers_forward_computes(models, pooling):
    llm, hf, tok = models
    got = tpc.collect(llm, PROMPTS, SITES, pooling, chat_template=True, progress=False)
    want = tpc.collect(hf, PROMPTS, SITES, pooling, chat_template=True, tokenizer=tok, progress=False)
    for s in SITES:
        assert got[s].shape == (len(PROMPTS), 576)
        _close(got[s], want[s])


def test_per_token_rows_match_token_for_token(models):
    llm, hf, tok = models
    got = tpc.collect(llm, PROMPTS, SITES[1], "token", chat_template=True, batch_size=3, progress=False)[SITES[1]]
    want = tpc.collect(hf, PROMPTS, SITES[1], "token", chat_template=True, tokenizer=tok, progress=False)[SITES[1]]
    assert [a.shape for a in got] == [b.shape for b in want]
    for a, b in zip(got, want):
        _close(a, b)


@pytest.mark.parametrize("pooling", ["mean", "token"])
def test_a_monitor_scores_and_calibrates_on_vllm_as_on_transformers(models, pooling):
    llm, hf, tok = models
    gen = torch.Generator().manual_seed(0)
    head = tpc.TPC(576, 3, 4)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
        head.scaler.scale.fill_(30.0)
    mon = tpc.Monitor(head, SITES[1], pooling=pooling, chat_template=True, cascade=tpc.Cascade(head, 0.1))
    got = mon.score(llm, PROMPTS)
    want = mon.score(hf, PROMPTS, tokenizer=tok)
    torch.testing.assert_close(got.logits, want.logits, rtol=REL, atol=1e-5)
    assert torch.equal(got.exit_order, want.exit_order)
    thr = mon.calibrate(llm, PROMPTS, fpr=0.25).threshold
    assert thr == pytest.approx(mon.calibrate(hf, PROMPTS, fpr=0.25, tokenizer=tok).threshold, rel=REL)


def test_what_the_adapter_does_not_do_is_a_clear_error(models):
    llm, _, _ = models
    mon = tpc.Monitor(tpc.TPC(576, 2, 2), SITES[0])
    with pytest.raises(tpc.TPCHooksError, match="vLLM exposes hook_resid_"):
        tpc.Monitor(tpc.TPC(576, 2, 2), "blocks.3.hook_resid_pre").score(llm, PROMPTS)
    with pytest.raises(tpc.TPCHooksError, match="monitor.generate does not drive a vLLM engine yet"):
        mon.generate(llm, PROMPTS[:1], max_new_tokens=2)
    with pytest.raises(tpc.TPCHooksError, match="expects d_model=64"):
        tpc.Monitor(tpc.TPC(64, 2, 2), SITES[0]).score(llm, PROMPTS)
