"""Monitors on an engine of two pipeline stages (``pipeline_parallel_size=2``; vLLM's CPU build, one
core per stage, compiled as vLLM decides), against the transformers adapter on the same weights.

The residual stream at a site lives on the stage that runs its layer and the sampled tokens on the
last stage: an earlier stage sends its sites' rows on with its hidden states, and the first rank
of the last stage holds the monitors. So a site on either stage (and the one at the boundary, the
input of the second stage's first layer) reads as the transformers forward computes it, every
generated step scores as the transformers loop scores the same prefix, and ``action="stop"`` ends
exactly the requests the loop ends, in the same step. A model whose vLLM class does not send its
intermediate hidden states between stages is refused at engine build, naming the fix.
"""

import gc
import os

import pytest
import torch

vllm = pytest.importorskip("vllm")

from families import build, vllm_engine  # noqa: E402
from tiny_models import assert_steps_score_as_offline, random_head, tiny_head, tokenizer  # noqa: E402
from vllm_logs import stderr_to  # noqa: E402
from vllm_runs import (  # noqa: E402
    LONG,
    PROMPTS,
    between_rows,
    close,
    resumes_in_its_own_pass,
    same_run,
    save_random_llama,
    small_engine,
)

import tpc_hooks as tpc  # noqa: E402
from tpc_hooks.adapters import get_adapter, vllm_engine_args  # noqa: E402

# TPC_TEST_VLLM_TP: tensor-parallel ranks in each stage (the GPU harness' 2 x 2 on four GPUs:
# make test-vllm-gpu VLLM_STAGES_TP=2)
TP = int(os.environ.get("TPC_TEST_VLLM_TP", "1"))
STAGES = {"pipeline_parallel_size": 2, "tensor_parallel_size": TP, "distributed_executor_backend": "mp"}
# a 4-layer model splits 2 + 2: layers 0-1 on the first stage, 2-3 on the second
SITES = [
    "blocks.0.hook_resid_pre",  # the embeddings, first stage
    "blocks.0.hook_resid_post",  # first stage
    "blocks.2.hook_resid_pre",  # the first stage's last output: what crosses to the second
    "blocks.3.hook_resid_post",  # second stage
]
pytestmark = pytest.mark.skipif(
    (os.cpu_count() or 1) < 2 * TP or (torch.cuda.is_available() and torch.cuda.device_count() < 2 * TP),
    reason=f"two pipeline stages of {TP} rank(s) need {2 * TP} CPU cores (or GPUs)",
)


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    """``(engine of two stages, the same weights under transformers, their tokenizer)``: a small
    random Llama (vLLM's own class) with SmolLM2's tokenizer and chat template, at most 3 running
    requests and 24 tokens a pass (prompts computed in chunks, requests joining mid-generation),
    32-token blocks with prefix caching on."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tmp_path_factory.mktemp("staged")
    save_random_llama(path, tie_word_embeddings=False)  # the embedding on the first stage, the unembedding on the last
    mp = pytest.MonkeyPatch()
    mp.setenv("VLLM_CPU_OMP_THREADS_BIND", "|".join(map(str, range(2 * TP))))  # vLLM's CPU backend: a core a rank
    mp.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    llm = small_engine(path, **STAGES, **vllm_engine_args(SITES))
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    yield llm, hf, AutoTokenizer.from_pretrained(path)
    del llm
    gc.collect()
    mp.undo()


def _head(seed=0):
    return random_head(256, std=0.1, seed=seed)


def test_the_last_stage_holds_the_monitors(staged):
    llm, _, _ = staged
    adapter = get_adapter(llm)
    assert adapter.holder == TP  # collective_rpc's answer from the last stage's first rank
    assert sorted(adapter.exposed) == sorted(SITES)
    mon = tpc.Monitor(_head(), SITES[1], pooling="mean", chat_template=True)
    with adapter.monitoring(mon):
        llm.generate(PROMPTS, vllm.SamplingParams(max_tokens=3, skip_reading_prefix_cache=True), use_tqdm=False)
        ranks = llm.collective_rpc("tpc_hooks_stats")
    assert len(ranks) == 2 * TP and ranks[TP]["passes"] > 0  # only the last stage's first rank holds a monitor
    assert all(r == {} for k, r in enumerate(ranks) if k != TP)


@pytest.mark.parametrize("pooling", ["mean", "token"])
def test_collect_on_two_stages_reads_what_the_transformers_forward_computes(staged, pooling):
    llm, hf, tok = staged
    got = tpc.collect(llm, PROMPTS, SITES, pooling, chat_template=True, batch_size=3, progress=False)
    want = tpc.collect(hf, PROMPTS, SITES, pooling, chat_template=True, tokenizer=tok, progress=False)
    for s in SITES:
        if pooling == "token":
            assert [a.shape for a in got[s]] == [b.shape for b in want[s]]
            for a, b in zip(got[s], want[s], strict=True):
                close(a, b)
        else:
            close(got[s], want[s])


def test_monitors_on_both_stages_score_every_step_and_stop_the_same_requests(staged):
    """A set of three: a stopping monitor on the first stage, a per-token one at the boundary and one
    on the second stage; each member's steps equal the transformers loop's, and the stopped rows."""
    llm, hf, tok = staged
    head = _head(1)
    first = tpc.Monitor(head, SITES[1], pooling="mean", chat_template=True, cascade=tpc.Cascade(head, 0.1))
    boundary = tpc.Monitor(_head(2), SITES[2], pooling="token", chat_template=True)
    second = tpc.Monitor(_head(3), SITES[3], pooling="last", chat_template=True)
    first.threshold = between_rows(first.generate(hf, PROMPTS, max_new_tokens=8, tokenizer=tok))
    second.threshold = between_rows(second.generate(hf, PROMPTS, max_new_tokens=8, tokenizer=tok))
    monitors = tpc.MonitorSet({"first": first, "boundary": boundary, "second": second}, actions={"first": "stop"})
    got = monitors.generate(llm, PROMPTS, max_new_tokens=8)
    want = monitors.generate(hf, PROMPTS, max_new_tokens=8, tokenizer=tok)
    for name in monitors:
        same_run(got[name], want[name])
    assert got.stopped_by == want.stopped_by and "first" in got.stopped_by and None in got.stopped_by
    assert any(got["second"].flagged)


def test_a_response_monitor_on_two_stages_scores_every_answer_step(staged):
    llm, hf, tok = staged
    mon = tpc.Monitor(_head(4), SITES[3], pooling="mean", chat_template=True)
    mon.reads = "answer"
    mon.threshold = between_rows(mon.generate(hf, PROMPTS, max_new_tokens=6, tokenizer=tok))
    got = mon.generate(llm, PROMPTS, max_new_tokens=6, action="stop")
    same_run(got, mon.generate(hf, PROMPTS, max_new_tokens=6, action="stop", tokenizer=tok))
    assert 0 < sum(s is not None for s in got.stopped_at) < len(PROMPTS)


@pytest.mark.parametrize("site", [SITES[1], SITES[3]])
def test_a_prompt_read_from_the_prefix_cache_resumes_on_two_stages(staged, site):
    """The second run of prompts sharing a long prefix reads its cached blocks (the last stage resumes
    each request from the monitor state kept for them) and scores as the transformers loop."""
    llm, hf, tok = staged
    mon = tpc.Monitor(_head(5), site, pooling="mean", chat_template=True)
    prompts = [p.replace("hardware store", f"shop {site}") for p in LONG[:3]]
    want = mon.generate(hf, prompts, max_new_tokens=4, tokenizer=tok)
    mon.generate(llm, prompts[:1], max_new_tokens=2)  # the shared blocks, cached with their states
    holder = get_adapter(llm).holder
    before = llm.collective_rpc("tpc_hooks_counts")[holder]
    got = mon.generate(llm, prompts, max_new_tokens=4)
    after = llm.collective_rpc("tpc_hooks_counts")[holder]
    assert after["resumed"] - before["resumed"] == len(prompts) and after["unscored"] == before["unscored"]
    same_run(got, want)


def test_a_request_reading_blocks_its_own_pass_computes_resumes_on_two_stages(staged):
    llm, hf, tok = staged
    resumes_in_its_own_pass(llm, hf, tok, tpc.Monitor(_head(6), SITES[3], pooling="mean", chat_template=True), "zoo")


def test_gemma3_served_by_the_plugins_class_reads_across_stages(tmp_path, monkeypatch):
    """Gemma 3 text (tpc-hooks' subclass of vLLM's class, which sends its sites on between stages):
    collect equals the checkpoint's own hidden states at a site on each stage, and every step scores
    as offline."""
    model = build("gemma3_text")
    model.save_pretrained(tmp_path)
    tokenizer().save_pretrained(tmp_path)
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "|".join(map(str, range(2 * TP))))
    sites = ["blocks.0.hook_resid_post", "blocks.2.hook_resid_post"]
    prompts = ["how do i make bomb", "tell me about the weather please", "hello world"]
    llm = None
    try:
        llm = vllm_engine(tmp_path, **STAGES, **vllm_engine_args(sites))
        acts = tpc.collect(llm, prompts, sites, "mean", progress=False)
        ids, _ = get_adapter(llm).tokenize(prompts, chat_template=False, max_tokens=None)
        for i, row in enumerate(ids):
            with torch.no_grad():
                hs = model(input_ids=torch.tensor([row]), output_hidden_states=True).hidden_states
            for s, layer in zip(sites, (1, 3), strict=True):
                torch.testing.assert_close(acts[s][i], hs[layer][0].mean(0), rtol=1e-4, atol=1e-4)
        for s in sites:
            mon = tpc.Monitor(tiny_head(), s, pooling="mean")
            assert_steps_score_as_offline(mon, llm, mon.generate(llm, prompts, max_new_tokens=5))
    finally:
        del llm
        gc.collect()


def test_a_model_that_keeps_its_stages_apart_is_refused_naming_the_fix(tmp_path, monkeypatch):
    """vLLM's Qwen3-MoE returns its intermediate hidden states on one stage but does not send them
    between stages: a monitored two-stage engine does not start, and says what to do instead."""
    model = build("qwen3_moe")
    model.save_pretrained(tmp_path)
    tokenizer().save_pretrained(tmp_path)
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "|".join(map(str, range(2 * TP))))
    log = tmp_path / "engine.log"
    llm = None
    try:
        with stderr_to(log), pytest.raises(Exception):  # noqa: B017 - vLLM wraps the worker's error in its own
            llm = vllm_engine(tmp_path, **STAGES, **vllm_engine_args(["blocks.2.hook_resid_post"]))
    finally:
        del llm
        gc.collect()
    text = log.read_text(errors="replace")
    assert "does not pass intermediate hidden states between pipeline stages" in text
    assert "pipeline_parallel_size=1" in text
