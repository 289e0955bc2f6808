"""The vLLM adapter on the packaged SmolLM2 model, against the transformers adapter on the same
weights (run by ``make test-vllm`` in a virtual environment with vLLM's CPU build; skipped where
vLLM is not installed). The engine's workers read the residual stream of each request from the
passes the engine runs; these tests hold what comes back, and what the monitor scores in the
workers while the engine generates, to the transformers forward pass and the transformers
decode loop.

The engine is small on purpose: at most 3 running requests and 24 tokens per pass, so a chat
prompt (about 40 tokens) is computed in chunks and the later requests join while the others
are mid-generation; prefix caching is on (vLLM's default) with blocks of 32 tokens, so the
prompts' first blocks are cached after their first run, and monitored requests read them. The
engine compiles as vLLM decides (no eager mode): the workers read the residual stream from
extra outputs of the compiled forward."""

import os

import pytest
import torch

vllm = pytest.importorskip("vllm")

from tiny_models import random_head  # noqa: E402
from vllm_runs import GPU, LONG, PROMPTS, REL, resumes_in_its_own_pass, save_random_llama, small_engine  # noqa: E402
from vllm_runs import between_rows as _between_rows  # noqa: E402
from vllm_runs import close as _close  # noqa: E402
from vllm_runs import same_run as _same_run  # noqa: E402

import tpc_hooks as tpc  # noqa: E402
from tpc_hooks import offline  # noqa: E402
from tpc_hooks.adapters import get_adapter, vllm_engine_args  # noqa: E402
from tpc_hooks.pooling import POOLINGS  # noqa: E402

SITES = ["blocks.10.hook_resid_post", "blocks.20.hook_resid_post"]
UNCACHED_SITES = ["blocks.20.hook_resid_post", "blocks.10.hook_resid_pre"]  # the second engine exposes these only


@pytest.fixture(scope="module")
def models():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    path = str(offline.default_model_dir())
    llm = small_engine(path, **vllm_engine_args())
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    yield llm, hf, AutoTokenizer.from_pretrained(path)
    del llm


@pytest.mark.parametrize("pooling", POOLINGS)
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
    for a, b in zip(got, want, strict=True):
        _close(a, b)


@pytest.mark.parametrize("pooling", ["mean", "token"])
def test_a_monitor_scores_and_calibrates_on_vllm_as_on_transformers(models, pooling):
    llm, hf, tok = models
    head = _head()
    mon = tpc.Monitor(head, SITES[1], pooling=pooling, chat_template=True, cascade=tpc.Cascade(head, 0.1))
    got = mon.score(llm, PROMPTS)
    want = mon.score(hf, PROMPTS, tokenizer=tok)
    torch.testing.assert_close(got.logits, want.logits, rtol=REL, atol=1e-5)
    assert torch.equal(got.exit_order, want.exit_order)
    thr = mon.calibrate(llm, PROMPTS, fpr=0.25).threshold
    assert thr == pytest.approx(mon.calibrate(hf, PROMPTS, fpr=0.25, tokenizer=tok).threshold, rel=REL)


def _head():
    return random_head(576, std=0.05, scale=30.0)


def _monitor(pooling, cascade=True, **settings):
    head = _head()
    return tpc.Monitor(
        head,
        SITES[1],
        pooling=pooling,
        chat_template=True,
        cascade=tpc.Cascade(head, 0.1) if cascade else None,
        **settings,
    )


@pytest.mark.parametrize(
    "pooling, cascade, settings",
    [
        *((p, k % 2 == 0, {}) for k, p in enumerate(POOLINGS)),
        ("token", True, {}),
        ("token", False, {"aggregate": "sctopk", "window": 4, "top_k": 3}),
    ],
)
def test_every_generated_step_scores_as_the_transformers_loop_scores_it(models, pooling, cascade, settings):
    """The same tokens, and every step's score, exit order and FLOPs as monitor.generate on the
    transformers model, which scores each prefix as monitor.score does (tested there); rows end
    on EOS at different steps (their last step takes one more pass) and one joins late."""
    llm, hf, tok = models
    mon = _monitor(pooling, cascade, **settings)
    want = mon.generate(hf, PROMPTS, max_new_tokens=10, tokenizer=tok)
    mon.threshold = _between_rows(want)
    want = mon.generate(hf, PROMPTS, max_new_tokens=10, tokenizer=tok)
    got = mon.generate(llm, PROMPTS, max_new_tokens=10)
    assert 0 < sum(got.flagged) < len(PROMPTS)
    assert any(len(s) <= 10 for s in got.scores) and any(len(s) == 11 for s in got.scores)  # EOS and length ends
    _same_run(got, want)
    last = [mon.score(hf, tokens=[seq], tokenizer=tok).logits for seq in got.sequences]  # the last prefix, offline
    for lg, offline_ in zip(got.logits, last, strict=True):
        torch.testing.assert_close(lg[-1:], offline_, rtol=REL, atol=1e-5)


def test_answers_through_the_engine_are_the_transformers_models_greedy_answers(models):
    llm, hf, tok = models
    got = tpc.generate_answers(llm, PROMPTS, 10)
    want = tpc.generate_answers(hf, PROMPTS, 10, batch_size=1, tokenizer=tok, progress=False)
    assert got == want and all(len(got.answer_ids(i)) >= 1 for i in range(len(PROMPTS)))


@pytest.mark.parametrize("pooling", ["mean", "token"])
def test_stop_ends_exactly_the_flagged_requests_and_the_others_generate_as_unmonitored(models, pooling):
    llm, hf, tok = models
    mon = _monitor(pooling)
    mon.threshold = _between_rows(mon.generate(hf, PROMPTS, max_new_tokens=10, tokenizer=tok))
    got = mon.generate(llm, PROMPTS, max_new_tokens=10, action="stop")
    _same_run(got, mon.generate(hf, PROMPTS, max_new_tokens=10, action="stop", tokenizer=tok))
    stopped = [b for b, s in enumerate(got.stopped_at) if s is not None]
    assert stopped and len(stopped) < len(PROMPTS)
    for b in stopped:  # nothing after the flagged step: its scores end there, its tokens one token before
        assert len(got.scores[b]) == got.stopped_at[b] + 1 and len(got.generated(b)) == got.stopped_at[b]
    plain = llm.generate(
        [{"prompt_token_ids": got.sequences[b][: got.prompt_lengths[b]]} for b in range(len(PROMPTS))],
        vllm.SamplingParams(max_tokens=10, temperature=0),
        use_tqdm=False,
    )
    for b, o in enumerate(plain):
        if b not in stopped:
            assert got.generated(b) == list(o.outputs[0].token_ids)


def test_a_monitor_set_runs_in_the_workers_as_on_transformers(models):
    """Three monitors, two on one site and one on another, one stopping and two flagging: each
    member's steps on vLLM equal its steps in the transformers loop (where a set equals each
    member alone, tests/test_monitor_set.py), and the stopped rows are the same."""
    llm, hf, tok = models
    harm, tok_mon = _monitor("mean"), _monitor("token")
    early = tpc.Monitor(_head(), SITES[0], pooling="last", chat_template=True)
    harm.threshold = _between_rows(harm.generate(hf, PROMPTS, max_new_tokens=10, tokenizer=tok))
    early.threshold = _between_rows(early.generate(hf, PROMPTS, max_new_tokens=10, tokenizer=tok))
    monitors = tpc.MonitorSet({"harm": harm, "tok": tok_mon, "early": early}, actions={"harm": "stop"})
    got = monitors.generate(llm, PROMPTS, max_new_tokens=10)
    want = monitors.generate(hf, PROMPTS, max_new_tokens=10, tokenizer=tok)
    for name in monitors:
        _same_run(got[name], want[name])
    assert got.stopped_by == want.stopped_by and "harm" in got.stopped_by and None in got.stopped_by
    assert got["early"].stopped_at == [None] * len(PROMPTS) and any(got["early"].flagged)
    assert llm.collective_rpc("tpc_hooks_stats")[0] == {}  # disarmed after the call


@pytest.mark.parametrize("pooling", POOLINGS)
def test_a_response_monitor_scores_every_answer_step_as_the_transformers_loop(models, pooling):
    """A response monitor (reads="answer") pools none of the prompt, which the engine computes in
    chunks: step 0 is unscored, every later step and the stopped rows equal the transformers loop's."""
    llm, hf, tok = models
    mon = _monitor(pooling, cascade=pooling == "mean")
    mon.reads = "answer"
    want = mon.generate(hf, PROMPTS, max_new_tokens=10, tokenizer=tok)
    mon.threshold = _between_rows(want)
    for action in ("flag", "stop"):
        want = mon.generate(hf, PROMPTS, max_new_tokens=10, action=action, tokenizer=tok)
        got = mon.generate(llm, PROMPTS, max_new_tokens=10, action=action)
        _same_run(got, want)
        assert all(float(s[0]) == 0.0 for s in got.scores) and 0 < sum(got.flagged) < len(PROMPTS)
        assert all(f is None or f >= 1 for f in got.first_flagged)


def test_a_response_monitor_reads_a_prompt_cached_without_it_and_resumes_its_answer_state(models):
    """A response monitor holds nothing for the prompt: a request whose prompt blocks were cached
    while no monitor ran is scored whole (never reported unscored), as the transformers loop scores it."""
    llm, hf, tok = models
    mon = _monitor("mean")
    mon.reads = "answer"
    prompts = [p.replace("hardware store", "tea room") for p in LONG[:2]]  # a prefix no monitor has seen
    llm.generate(
        [{"prompt_token_ids": i} for i in _ids(llm, prompts)], vllm.SamplingParams(max_tokens=1), use_tqdm=False
    )
    hits, before = _cache_hits(llm), llm.collective_rpc("tpc_hooks_counts")[0]
    got = mon.generate(llm, prompts, max_new_tokens=6)
    assert _cache_hits(llm) - hits >= 32 * len(prompts)  # the prompts' blocks were read from the cache
    assert llm.collective_rpc("tpc_hooks_counts")[0]["unscored"] == before["unscored"]
    _same_run(got, mon.generate(hf, prompts, max_new_tokens=6, tokenizer=tok))


def _cache_hits(llm) -> float:
    """The engine's own count of prompt tokens read from its prefix cache."""
    return sum(m.value for m in llm.get_metrics() if m.name == "vllm:prefix_cache_hits")


@pytest.mark.parametrize("pooling", ["mean", "token"])
def test_monitored_requests_read_the_prefix_cache_and_score_as_if_they_computed_it(models, pooling):
    """The second run of the same prompts reads their cached blocks (the engine's prefix-cache hit
    counter rises, and the workers resume requests from the monitor state kept for those blocks),
    and every step still scores as the transformers loop scores it, computing every token."""
    llm, hf, tok = models
    mon = _monitor(pooling)
    prompts = [p.replace("hardware store", f"{pooling} shop") for p in LONG]  # a prefix only this test caches
    want = mon.generate(hf, prompts, max_new_tokens=6, tokenizer=tok)
    mon.generate(llm, prompts[:1], max_new_tokens=2)  # the shared prefix's blocks, cached with their states
    hits, before = _cache_hits(llm), llm.collective_rpc("tpc_hooks_counts")[0]
    got = mon.generate(llm, prompts, max_new_tokens=6)
    after = llm.collective_rpc("tpc_hooks_counts")[0]
    assert _cache_hits(llm) - hits >= 32 * len(prompts)  # every prompt read at least its first block
    assert after["resumed"] - before["resumed"] == len(prompts) and after["unscored"] == before["unscored"]
    _same_run(got, want)


def test_a_request_reading_blocks_its_own_pass_computes_resumes_from_their_state(models):
    llm, hf, tok = models
    resumes_in_its_own_pass(llm, hf, tok, _monitor("mean"), "zoo")


def test_a_prefix_cached_without_the_monitor_is_computed_again_never_scored_in_part(models):
    """Blocks cached while no monitor ran hold no monitor state: a monitored request that finds them
    is generated again without reading the cache (its steps equal the transformers loop's), and a
    request of the user's own that reads them inside ``monitoring`` is reported unscored."""
    llm, hf, tok = models
    mon = _monitor("mean")
    prompts = [p.replace("hardware store", "bakery") for p in LONG[:2]]  # a prefix no monitor has seen
    llm.generate(
        [{"prompt_token_ids": i} for i in _ids(llm, prompts)], vllm.SamplingParams(max_tokens=1), use_tqdm=False
    )
    _same_run(mon.generate(llm, prompts, max_new_tokens=4), mon.generate(hf, prompts, max_new_tokens=4, tokenizer=tok))
    other = [p.replace("bakery", "florist") for p in LONG[:1]]
    (oid,) = _ids(llm, other)
    llm.generate([{"prompt_token_ids": oid}], vllm.SamplingParams(max_tokens=1), use_tqdm=False)
    with get_adapter(llm).monitoring(mon):
        llm.generate([{"prompt_token_ids": oid}], vllm.SamplingParams(max_tokens=2, temperature=0), use_tqdm=False)
        runs = list(llm.collective_rpc("tpc_hooks_runs")[0].values())
    assert len(runs) == 1 and "skip_reading_prefix_cache=True" in runs[0]["error"]


def test_monitored_and_opted_out_requests_share_cached_blocks_both_ways(models):
    """Requests that opt out of the monitor still leave the monitor's state at their block ends, so
    a monitored request reads blocks an opted-out one computed, and the other way round; each
    monitored request scores as the transformers loop does, and opted-out requests get no entry."""
    llm, hf, tok = models
    mon = _monitor("token")
    prompts = [p.replace("hardware store", "bike shop") for p in LONG]
    want = mon.generate(hf, prompts, max_new_tokens=5, tokenizer=tok)
    ids = _ids(llm, prompts)

    def params(b, monitored):  # each request keyed (its steps come back as "<key>/0")
        extra = {"tpc_hooks_key": f"r{b}", **({} if monitored else {"tpc_hooks_monitor": False})}
        return vllm.SamplingParams(max_tokens=6, temperature=0, extra_args=extra)

    with get_adapter(llm).monitoring(mon):
        first = [params(b, b % 2) for b in range(4)]
        llm.generate([{"prompt_token_ids": i} for i in ids], first, use_tqdm=False)
        runs = _runs(llm, 4)
        second = llm.generate(
            [{"prompt_token_ids": i} for i in ids], [params(b, 1 - b % 2) for b in range(4)], use_tqdm=False
        )
        runs2 = _runs(llm, 4)
    assert sorted(runs) == [1, 3] and sorted(runs2) == [0, 2]
    assert sum(o.num_cached_tokens for o in second) >= 32 * len(prompts)
    for b, run in {**runs, **runs2}.items():
        torch.testing.assert_close(torch.tensor(run["logits"][:6]), want.logits[b][:6], rtol=REL, atol=1e-5)


def _ids(llm, prompts) -> list[list[int]]:
    """The prompts' token ids as the monitor tokenises them (chat template)."""
    return get_adapter(llm).tokenize(prompts, chat_template=True, max_tokens=None)[0]


def _runs(llm, n) -> dict[int, dict]:
    """The workers' steps of the requests keyed r0 .. r{n-1}, by index (requests without steps left out)."""
    got = llm.collective_rpc("tpc_hooks_runs")[0]
    return {b: got[f"r{b}/0"] for b in range(n) if f"r{b}/0" in got}


def test_a_small_cache_that_evicts_and_refills_blocks_never_brings_back_another_prompts_state(models):
    """An engine whose KV cache holds few blocks evicts and reuses them between runs of prompts
    that share parts of their prefixes: every run of every prompt still scores as the transformers
    loop scores it (a kept state is named by its content, never by the physical block)."""
    _, hf, tok = models
    llm = vllm.LLM(
        model=str(offline.default_model_dir()),
        dtype="float32",
        max_num_seqs=2,
        block_size=32,
        num_gpu_blocks_override=12,
        max_model_len=256,
        **GPU,
        **vllm_engine_args([SITES[1]]),
    )
    try:
        mon = _monitor("mean")
        with get_adapter(llm).monitoring(mon):  # the kept states follow the KV cache's own size
            assert llm.collective_rpc("tpc_hooks_stats")[0]["block_capacity"] == 2 * 12
        variants = [LONG[0], LONG[1], LONG[0].replace("tools", "ladders"), LONG[2], LONG[0]]
        for prompt in variants + variants[::-1]:
            _same_run(
                mon.generate(llm, [prompt], max_new_tokens=4),
                mon.generate(hf, [prompt], max_new_tokens=4, tokenizer=tok),
            )
    finally:
        del llm


@pytest.fixture(scope="module")
def uncached():
    """A second engine: eager, prefix caching off, two sites exposed, and a worker that can plant NaN
    activations (in its embedding weights)."""
    llm = vllm.LLM(
        model=str(offline.default_model_dir()),
        dtype="float32",
        enable_prefix_caching=False,
        enforce_eager=True,
        **GPU,
        **{**vllm_engine_args(UNCACHED_SITES), "worker_cls": "vllm_poison.PoisonWorker"},
    )
    yield llm
    del llm


def test_an_engine_built_for_some_sites_reads_those_and_refuses_others(models, uncached):
    """sites= fixes what the compiled forward returns: hook_resid_pre reads the input of decoder
    layer 10 as the transformers model computes it, and a site the engine was not built for is a
    clear error naming the ones it has."""
    _, hf, tok = models
    got = tpc.collect(uncached, PROMPTS, UNCACHED_SITES, "mean", chat_template=True, progress=False)
    want = tpc.collect(hf, PROMPTS, UNCACHED_SITES, "mean", chat_template=True, tokenizer=tok, progress=False)
    for s in UNCACHED_SITES:
        _close(got[s], want[s])
    with pytest.raises(
        tpc.TPCHooksError,
        match=r"exposes \['blocks.10.hook_resid_pre', 'blocks.20.hook_resid_post'\] "
        r".*not 'blocks.10.hook_resid_post'.*vllm_engine_args\(sites=",
    ):
        tpc.collect(uncached, PROMPTS, "blocks.10.hook_resid_post", progress=False)


def test_the_integration_refuses_a_vllm_release_it_is_not_written_for():
    from tpc_hooks.adapters.vllm import _engine

    assert _engine.check_version() == _engine.vllm_version()  # the release installed here
    with pytest.raises(tpc.TPCHooksError, match=r"supports vLLM 0.32.x and 0.33.x .* this is vLLM 0.34.0: pip install"):
        _engine.check_version("0.34.0")


def test_prefix_caching_off_gives_the_same_scores(models, uncached):
    llm, _, _ = models
    mon = _monitor("token")
    on = mon.generate(llm, PROMPTS, max_new_tokens=4)
    off = mon.generate(uncached, PROMPTS, max_new_tokens=4)
    assert off.sequences == on.sequences
    for a, b in zip(off.scores, on.scores, strict=True):
        torch.testing.assert_close(a, b, rtol=REL, atol=1e-6)


def test_nan_activations_warn_flag_that_request_only_and_the_engine_goes_on(models, uncached):
    """A request whose activations are NaN (planted in its embeddings) scores NaN from its first
    step, counts as flagged and raises a warning; the requests beside it score as without it."""
    _, _, tok = models
    mon = _monitor("mean")
    clean = mon.generate(uncached, PROMPTS, max_new_tokens=3)
    marker = tok.encode(" zebra", add_special_tokens=False)[0]
    uncached.collective_rpc("test_poison", args=(marker,))
    with pytest.warns(RuntimeWarning, match="NaN/inf"):
        run = mon.generate(uncached, PROMPTS + ["Tell me about the zebra."], max_new_tokens=3)
    assert run.scores[-1].isnan().all() and run.first_flagged[-1] == 0
    for a, b in zip(run.scores[:-1], clean.scores, strict=False):
        torch.testing.assert_close(a, b, rtol=REL, atol=1e-6)
    stopped = mon.generate(uncached, ["Tell me about the zebra.", PROMPTS[0]], max_new_tokens=3, action="stop")
    assert stopped.stopped_at[0] == 0 and stopped.generated(0) == []
    assert stopped.sequences[1] == clean.sequences[0]


def test_what_the_adapter_does_not_do_is_a_clear_error(models):
    llm, hf, tok = models
    mon = tpc.Monitor(tpc.TPC(576, 2, 2), SITES[0])
    with pytest.raises(
        tpc.TPCHooksError, match="exposes every layer's hook_resid_post .* not 'blocks.3.hook_resid_pre'"
    ):
        tpc.Monitor(tpc.TPC(576, 2, 2), "blocks.3.hook_resid_pre").score(llm, PROMPTS)
    with pytest.raises(tpc.TPCHooksError, match="callable action decides on the host"):
        mon.generate(llm, PROMPTS[:1], max_new_tokens=2, action=lambda e: True)
    with pytest.raises(tpc.TPCHooksError, match="needs stop_at_eos=True"):
        mon.generate(llm, PROMPTS[:1], max_new_tokens=2, action="stop", stop_at_eos=False)
    with pytest.raises(tpc.TPCHooksError, match="expects d_model=64"):
        tpc.Monitor(tpc.TPC(64, 2, 2), SITES[0]).score(llm, PROMPTS)
    with pytest.raises(tpc.TPCHooksError, match="expects d_model=64"):
        tpc.Monitor(tpc.TPC(64, 2, 2), SITES[0]).generate(llm, PROMPTS, max_new_tokens=2)
    with pytest.raises(tpc.TPCHooksError, match=r"explain .* AutoModelForCausalLM\.from_pretrained\('"):
        mon.explain(llm, PROMPTS)  # names the checkpoint to load locally
    # the engine goes on
    _same_run(
        mon.generate(llm, PROMPTS[:2], max_new_tokens=2), mon.generate(hf, PROMPTS[:2], max_new_tokens=2, tokenizer=tok)
    )


def test_tensor_parallel_ranks_score_once_and_as_the_transformers_loop(tmp_path, monkeypatch):
    """tensor_parallel_size=2 on this CPU (one core per rank; SmolLM2-135M's 9 heads do not split
    in two, so a small random Llama with 8 heads, saved with transformers): collection returns the
    transformers adapter's rows, only rank 0 scores, and the run is the transformers loop's on the
    same weights."""

    from transformers import AutoModelForCausalLM

    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs 2 CPU cores")
    if torch.cuda.is_available() and torch.cuda.device_count() < 2:
        pytest.skip("tensor_parallel_size=2 on a GPU needs 2 GPUs")
    save_random_llama(tmp_path)
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")  # vLLM's CPU backend binds each rank to its own cores
    llm = vllm.LLM(model=str(tmp_path), dtype="float32", tensor_parallel_size=2, **GPU, **vllm_engine_args())
    try:
        from transformers import AutoTokenizer

        hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
        tok = AutoTokenizer.from_pretrained(tmp_path)
        for pooling in ("mean", "token"):  # collection reads rank 0's rows, pooled and per token
            got = tpc.collect(llm, PROMPTS, "blocks.2.hook_resid_post", pooling, chat_template=True, progress=False)
            want = tpc.collect(
                hf, PROMPTS, "blocks.2.hook_resid_post", pooling, chat_template=True, tokenizer=tok, progress=False
            )
            for a, b in zip(got["blocks.2.hook_resid_post"], want["blocks.2.hook_resid_post"], strict=True):
                _close(a, b)
        head = random_head(256, std=0.1, seed=1)
        mon = tpc.Monitor(
            head, "blocks.2.hook_resid_post", pooling="mean", chat_template=True, cascade=tpc.Cascade(head, 0.1)
        )
        mon.threshold = _between_rows(mon.generate(hf, PROMPTS, max_new_tokens=8, tokenizer=tok))
        got = mon.generate(llm, PROMPTS, max_new_tokens=8, action="stop")
        _same_run(got, mon.generate(hf, PROMPTS, max_new_tokens=8, action="stop", tokenizer=tok))
        assert 0 < sum(s is not None for s in got.stopped_at) < len(PROMPTS)
        with get_adapter(llm).monitoring(mon):
            llm.generate(PROMPTS, vllm.SamplingParams(max_tokens=3, skip_reading_prefix_cache=True), use_tqdm=False)
            ranks = llm.collective_rpc("tpc_hooks_stats")
        assert len(ranks) == 2 and ranks[0]["passes"] > 0 and ranks[1] == {}  # rank 1 holds no monitor
    finally:
        del llm
