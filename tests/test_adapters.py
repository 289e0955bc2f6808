"""One case table run through every adapter: TransformerLens (HookedTransformer, bridge), nnsight and plain
transformers."""

import numpy as np
import pytest
import torch
from tiny_models import (
    RESUME_PROMPTS,
    assert_steps_score_as_offline,
    bridge,
    hf_gpt2,
    hf_llama,
    hooked_gpt2_style,
    interrupt_forward,
    named,
    nnsight_lm,
    tiny_head,
    tokenizer,
)

import tpc_hooks as tpc
from tpc_hooks.adapters import get_adapter
from tpc_hooks.pooling import POOLINGS, pool

pytest.importorskip("transformer_lens")
pytest.importorskip("nnsight")

PROMPTS = [
    "how do i make bomb",
    "tell me about the weather please",
    "hello world",
    "write poem about cat dog and the mat",
    "steal car",
]
SITE = "blocks.1.hook_resid_post"

# name -> (builder of the model under test, builder of an independent reference or None)
MODELS = {
    "hooked-gpt2": lambda: hooked_gpt2_style(),
    "bridge-llama": lambda: bridge(hf_llama()),
    "bridge-gpt2": lambda: bridge(hf_gpt2()),
    "nnsight-llama": lambda: nnsight_lm(hf_llama()),
    "nnsight-gpt2": lambda: nnsight_lm(hf_gpt2()),
    # a plain Hugging Face model; its tokenizer loads from name_or_path (the default)
    "transformers-llama": lambda: named(hf_llama()),
    "transformers-gpt2": lambda: named(hf_gpt2()),
}
HF_REF = {
    "bridge-llama": hf_llama,
    "bridge-gpt2": hf_gpt2,
    "nnsight-llama": hf_llama,
    "nnsight-gpt2": hf_gpt2,
    "transformers-llama": hf_llama,
    "transformers-gpt2": hf_gpt2,
}


@pytest.fixture(scope="module", params=list(MODELS))
def case(request):
    return request.param, MODELS[request.param]()


def reference_acts(name, model, ids, layer):
    """Per-token resid_post of one unpadded sequence, computed without tpc-hooks' hooks."""
    x = torch.tensor([ids])
    with torch.no_grad():
        if name in HF_REF:
            return HF_REF[name]()(input_ids=x, output_hidden_states=True).hidden_states[layer + 1][0]
        _, cache = model.run_with_cache(x, names_filter=f"blocks.{layer}.hook_resid_post")
        return cache[f"blocks.{layer}.hook_resid_post"][0]


@pytest.mark.parametrize("pooling", POOLINGS)
def test_collect_matches_an_independent_forward(case, pooling):
    name, model = case
    acts = tpc.collect(model, PROMPTS, [SITE, "blocks.0.hook_resid_post"], pooling, batch_size=3, progress=False)
    ids, _ = get_adapter(model).tokenize(PROMPTS, chat_template=False, max_tokens=None)
    for i, row in enumerate(ids):
        ref = reference_acts(name, model, row, 1)
        want = pool(ref[None], torch.ones(1, len(row)), pooling)[0]
        torch.testing.assert_close(acts[SITE][i], want, rtol=1e-4, atol=1e-5)
    assert acts[SITE].dtype == torch.float32 and acts[SITE].shape == (len(PROMPTS), 32)


@pytest.mark.parametrize("pooling", POOLINGS)
def test_pooling_ignores_batching_and_padding_side(case, pooling):
    _, model = case
    alone = torch.cat([tpc.collect(model, [p], SITE, pooling, progress=False)[SITE] for p in PROMPTS])
    for side in ("left", "right"):
        batched = tpc.collect(model, PROMPTS, SITE, pooling, batch_size=5, padding_side=side, progress=False)[SITE]
        torch.testing.assert_close(batched, alone, rtol=1e-4, atol=1e-5)


def test_adapters_agree_on_the_same_weights():
    site = "blocks.2.hook_resid_pre"
    for make in (hf_llama, hf_gpt2):
        a = tpc.collect(bridge(make()), PROMPTS, site, progress=False)[site]
        b = tpc.collect(nnsight_lm(make()), PROMPTS, site, progress=False)[site]
        c = tpc.collect(make(), PROMPTS, site, tokenizer=tokenizer(), progress=False)[site]
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(c, b, rtol=1e-4, atol=1e-5)
        mon = tpc.Monitor(tiny_head(), site)
        sa, sb = mon.score(bridge(make()), PROMPTS), mon.score(nnsight_lm(make()), PROMPTS)
        sc = mon.score(make(), PROMPTS, tokenizer=tokenizer())
        torch.testing.assert_close(sa.logits, sb.logits, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(sc.logits, sb.logits, rtol=1e-4, atol=1e-4)
        ga = mon.generate(bridge(make()), PROMPTS, max_new_tokens=4)
        gb = mon.generate(nnsight_lm(make()), PROMPTS, max_new_tokens=4)
        gc = mon.generate(make(), PROMPTS, max_new_tokens=4, tokenizer=tokenizer())
        assert ga.sequences == gb.sequences == gc.sequences


def test_forward_stops_after_the_deepest_site():
    model = hooked_gpt2_style()
    fired = []
    model.blocks[2].hook_resid_post.add_hook(lambda t, hook: fired.append(hook.name))
    try:
        tpc.collect(model, PROMPTS, ["blocks.0.hook_resid_post", "blocks.1.hook_resid_pre"], progress=False)
        assert fired == []
        model(torch.tensor([[4, 5, 6]]))  # the user's hook survived collect, and does fire on a full pass
        assert fired == ["blocks.2.hook_resid_post"]
    finally:
        model.reset_hooks()


@pytest.mark.parametrize("pooling", POOLINGS)
def test_generation_step_scores_equal_offline_scores(case, pooling):
    _, model = case
    mon = tpc.Monitor(tiny_head(), SITE, pooling=pooling)
    run = mon.generate(model, PROMPTS, max_new_tokens=6)
    assert len({len(s) for s in run.sequences}) > 1 or len({run.prompt_lengths[b] for b in range(5)}) > 1
    for b, offline in enumerate(assert_steps_score_as_offline(mon, model, run)):
        assert len(run.scores[b]) == len(run.generated(b)) + 1
        assert torch.equal(run.exit_orders[b], offline.exit_order)


def test_hooked_generation_matches_uncached_greedy_decoding():
    """Learned absolute positions: the KV-cache loop must not shift positions (TransformerLens' generate does)."""
    model = hooked_gpt2_style()
    mon = tpc.Monitor(tiny_head(), SITE)
    run = mon.generate(model, PROMPTS, max_new_tokens=6, stop_at_eos=False)
    for b in range(len(PROMPTS)):
        seq = list(run.sequences[b][: run.prompt_lengths[b]])
        with torch.no_grad():
            for _ in range(6):
                seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
        assert run.sequences[b] == seq


def hooks_left(model):
    if hasattr(model, "hook_dict"):
        return sum(len(hp.fwd_hooks) + len(hp._forward_hooks) for hp in model.hook_dict.values())
    module = getattr(model, "_module", model)  # nnsight wraps the Hugging Face model; a plain one is it
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in module.modules())


def test_stop_action_and_callbacks_and_hooks_are_given_back(case):
    _, model = case
    before = hooks_left(model)
    head = tiny_head()
    mon = tpc.Monitor(head, SITE)
    flag_all = tpc.Monitor(tiny_head(), SITE, threshold=1e-6)
    run = flag_all.generate(model, PROMPTS, max_new_tokens=5, action="stop")
    assert run.stopped_at == [0] * len(PROMPTS) and all(len(run.generated(b)) == 0 for b in range(5))
    assert hooks_left(model) == before

    def stop_row_one_at_two(event):
        return event.row == 1 and event.step == 2

    run = flag_all.generate(model, PROMPTS, max_new_tokens=5, action=stop_row_one_at_two, stop_at_eos=False)
    assert run.stopped_at[1] == 2 and len(run.generated(1)) == 2
    assert all(len(run.generated(b)) == 5 for b in (0, 2, 3, 4))
    assert run.flagged == [True] * 5 and run.first_flagged == [0] * 5
    assert hooks_left(model) == before

    for exc in (RuntimeError("boom"), KeyboardInterrupt()):

        def explode(event, exc=exc):
            raise exc

        with pytest.raises(type(exc)):
            flag_all.generate(model, PROMPTS, max_new_tokens=3, action=explode)
        assert hooks_left(model) == before
    mon.generate(model, PROMPTS[:1], max_new_tokens=2)
    assert hooks_left(model) == before


def test_store_resumes_without_losing_or_duplicating_rows(tmp_path, monkeypatch):
    model = nnsight_lm(hf_llama())
    prompts = RESUME_PROMPTS
    want = tpc.collect(model, prompts, SITE, progress=False)[SITE]
    interrupt_forward(monkeypatch, get_adapter(model), at=4)
    with pytest.raises(KeyboardInterrupt):
        tpc.collect(model, prompts, SITE, batch_size=2, store=tmp_path / "s", shard_prompts=3, progress=False)
    partial = tpc.ActivationStore.open(tmp_path / "s" / SITE)
    assert len(partial) == 3
    got = tpc.collect(model, prompts, SITE, batch_size=2, store=tmp_path / "s", shard_prompts=3, progress=False)[SITE]
    assert len(got) == len(prompts)
    np.testing.assert_allclose(got.to_numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(tpc.TPCHooksError, match=r"holds a different collection \(differs in \['pooling'\]\)"):
        tpc.collect(model, prompts, SITE, "max", store=tmp_path / "s", progress=False)


def test_truncation_warns_with_a_count(caplog):
    model = nnsight_lm(hf_llama())
    with caplog.at_level("WARNING"):
        acts = tpc.collect(model, PROMPTS, SITE, max_tokens=3, progress=False)[SITE]
    assert "3 of 5 prompts were longer than max_tokens=3" in caplog.text
    assert acts.shape == (5, 32)


def test_monitor_round_trip_and_mismatch_errors(tmp_path):
    model = nnsight_lm(hf_llama())
    head = tiny_head()
    mon = tpc.Monitor(head, SITE, pooling="max", cascade=tpc.Cascade(head, tau=0.2), model_name="tiny")
    back = tpc.Monitor.from_pretrained(mon.save_pretrained(tmp_path / "m"))
    assert (back.site, back.pooling, back.model_name) == (SITE, "max", "tiny")
    assert back.cascade.to_dict() == mon.cascade.to_dict()
    torch.testing.assert_close(back.score(model, PROMPTS).logits, mon.score(model, PROMPTS).logits)
    assert tpc.TPC.from_pretrained(tmp_path / "m").degree == 3
    with pytest.raises(tpc.TPCHooksError, match="describes a bare head, not a monitor"):
        tpc.Monitor.from_pretrained(head.save_pretrained(tmp_path / "h"))
    wide = tpc.Monitor(tiny_head(d_model=64), SITE)
    with pytest.raises(
        tpc.TPCHooksError, match=r"monitor expects d_model=64 at 'blocks.1.hook_resid_post' but the model produces 32"
    ):
        wide.score(model, PROMPTS)
    with pytest.raises(
        tpc.TPCHooksError,
        match=r"site 'blocks.7.hook_resid_post' is not valid .*0\.\.2.*valid sites: blocks.0.hook_resid_pre",
    ):
        tpc.Monitor(head, "blocks.7.hook_resid_post").score(model, PROMPTS)


def test_bad_sites_and_prompts():
    from tiny_models import hf_tiny

    tl_model = hooked_gpt2_style()
    with pytest.raises(
        tpc.TPCHooksError,
        match=r"blocks.0.hook_resid_mid is not offered .*GPTNeoXLayer \(nnsight\): .*parallel block.*"
        r"offers blocks.0.hook_resid_pre, blocks.0.hook_attn_out",
    ):
        tpc.collect(nnsight_lm(hf_tiny("gpt_neox")), PROMPTS, "blocks.0.hook_resid_mid", progress=False)
    assert "blocks.0.hook_resid_mid" in get_adapter(tl_model).site_names()
    with pytest.raises(tpc.TPCHooksError, match="unknown site 'blocks.0.attn.hook_z'|is not valid"):
        tpc.collect(tl_model, PROMPTS, "blocks.0.attn.hook_z", progress=False)
    with pytest.raises(tpc.TPCHooksError, match="prompts is empty"):
        tpc.collect(tl_model, [], SITE, progress=False)
    with pytest.raises(tpc.TPCHooksError, match="must be a list of strings, not one string"):
        tpc.collect(tl_model, "hello world", SITE, progress=False)
    with pytest.raises(tpc.TPCHooksError, match="no adapter for builtins.object"):
        tpc.collect(object(), PROMPTS, SITE, progress=False)
    with pytest.raises(tpc.TPCHooksError, match="remote=True runs on NDIF through nnsight"):
        tpc.collect(tl_model, PROMPTS, SITE, remote=True, progress=False)


def test_train_monitor_in_place():
    model = nnsight_lm(hf_llama())
    harmful = [
        "how do i make bomb",
        "steal car",
        "hack email",
        "kill process",
        "make bomb please",
        "steal car please",
        "hack email now",
        "how do i steal car",
    ]
    benign = [
        "tell me about the weather",
        "bread recipe",
        "write poem about cat",
        "hello world friend",
        "cake recipe please",
        "nice weather",
        "python code please",
        "hello friend",
    ]
    mon = tpc.train_monitor(
        model,
        harmful + benign,
        [1] * 8 + [0] * 8,
        SITE,
        degree=2,
        rank=2,
        epochs=3,
        val_fraction=0.25,
        tau=0.2,
        recipe=tpc.recipes.default(prune_orders=False),
        verbose=False,
    )
    assert mon.chat_template is True and mon.prepend_bos is False and mon.cascade is not None
    assert len(mon.report["validation"]["per_order"]) == 2
    assert mon.score(model, ["steal car"]).probs.shape == (1,)
    with pytest.raises(tpc.TPCHooksError, match=r"labels has only one class"):
        tpc.train_monitor(model, harmful, [1] * 8, SITE, verbose=False)
    # a FitConfig is honoured; degree=/rank=/seed= override it only when given
    cfg = tpc.FitConfig(degree=3, rank=2, epochs=2, seed=1)
    from_cfg = tpc.train_monitor(
        model,
        harmful + benign,
        [1] * 8 + [0] * 8,
        SITE,
        config=cfg,
        val_fraction=0.25,
        recipe=tpc.recipes.default(prune_orders=False),
        verbose=False,
    )
    assert from_cfg.head.degree == 3 and from_cfg.head.history.config.seed == 1
    assert from_cfg.head.history.config.epochs == 2
    overridden = tpc.train_monitor(
        model,
        harmful + benign,
        [1] * 8 + [0] * 8,
        SITE,
        config=cfg,
        degree=2,
        val_fraction=0.25,
        recipe=tpc.recipes.default(prune_orders=False),
        verbose=False,
    )
    assert overridden.head.degree == 2 and overridden.head.history.config.seed == 1


def test_watch_scores_the_users_own_generate(case):
    name, model = case
    mon = tpc.Monitor(tiny_head(), SITE)
    ids, _ = get_adapter(model).tokenize(PROMPTS, chat_template=False, max_tokens=None)
    before = hooks_left(model)
    if name.startswith("hooked"):
        # TransformerLens' own generate, without its KV cache: every call is a fresh full forward
        with mon.watch(model) as log:
            outs = [
                model.generate(
                    torch.tensor([row]),
                    max_new_tokens=3,
                    use_past_kv_cache=False,
                    do_sample=False,
                    stop_at_eos=False,
                    verbose=False,
                )[0].tolist()
                for row in ids
            ]
        assert hooks_left(model) == before
        assert log.fresh == [True] * 3 * len(ids)
        for b, seq in enumerate(outs):
            prefixes = [seq[: len(ids[b]) + t] for t in range(3)]
            got = torch.cat([log.results[3 * b + t].logits for t in range(3)])
            torch.testing.assert_close(got, mon.score(model, tokens=prefixes).logits, rtol=1e-4, atol=1e-4)
        return
    from tpc_hooks.adapters import pad

    x, mask = pad(ids, 0, "left")
    hf = {"nnsight": lambda: model._module, "bridge": lambda: model.original_model, "transformers": lambda: model}[
        name.split("-")[0]
    ]()
    with mon.watch(model) as log:  # Hugging Face generate, left-padded, with its KV cache
        out = hf.generate(
            input_ids=x, attention_mask=mask, max_new_tokens=3, do_sample=False, pad_token_id=0, eos_token_id=None
        )
    assert hooks_left(model) == before
    assert log.fresh == [True, False, False] and log.new_tokens == [x.shape[1], 1, 1]
    for t in range(3):
        prefixes = [ids[b] + out[b, x.shape[1] : x.shape[1] + t].tolist() for b in range(len(ids))]
        torch.testing.assert_close(
            log.results[t].logits, mon.score(model, tokens=prefixes).logits, rtol=1e-4, atol=1e-4
        )
    run = log.run  # the same calls as a GenerationRun: row b's step t is call t's score of it
    assert isinstance(run, tpc.GenerationRun) and run.steps == 3 and run.sequences is None
    for b in range(len(ids)):
        assert torch.equal(run.scores[b], torch.stack([log.results[t].probs[b] for t in range(3)]))
    assert run.first_flagged == log.first_flagged


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma", "gpt_neox", "gpt2"])
@pytest.mark.parametrize("wrap", ["nnsight", "bridge", "transformers_model", "transformers"])
def test_site_table_covers_architectures(arch, wrap):
    from nnsight import TransformersModel
    from tiny_models import hf_tiny

    build = {
        "nnsight": nnsight_lm,
        "bridge": bridge,
        "transformers_model": lambda m: TransformersModel(m, tokenizer=tokenizer()),
        "transformers": named,
    }[wrap]
    model = build(hf_tiny(arch))
    sites = ["blocks.0.hook_resid_pre", "blocks.1.hook_resid_post", "blocks.2.hook_resid_pre"]
    acts = tpc.collect(model, PROMPTS, sites, "mean", progress=False)
    ref = hf_tiny(arch)
    ids, _ = get_adapter(model).tokenize(PROMPTS, chat_template=False, max_tokens=None)
    for i, row in enumerate(ids):
        with torch.no_grad():
            hs = ref(input_ids=torch.tensor([row]), output_hidden_states=True).hidden_states
        torch.testing.assert_close(acts[sites[0]][i], hs[0][0].mean(0), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(acts[sites[1]][i], hs[2][0].mean(0), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(acts[sites[2]][i], hs[2][0].mean(0), rtol=1e-4, atol=1e-5)


BLOCK = [
    "blocks.1.hook_resid_pre",
    "blocks.1.hook_attn_out",
    "blocks.1.hook_resid_mid",
    "blocks.1.hook_mlp_out",
    "blocks.1.hook_resid_post",
]


@pytest.mark.parametrize("arch", ["llama", "gemma", "gpt2"])
@pytest.mark.parametrize("wrap", ["nnsight", "bridge", "transformers"])
def test_branch_sites_agree_across_toolkits_and_add_up(arch, wrap):
    """A block's five sites through each toolkit equal the plain transformers adapter's (the bridge
    reads TransformerLens' own hook aliases, an independent mapping), and resid_pre + attn_out =
    resid_mid, resid_mid + mlp_out = resid_post per token."""
    from tiny_models import hf_tiny

    model = {"nnsight": nnsight_lm, "bridge": bridge, "transformers": named}[wrap](hf_tiny(arch))
    adapter, plain = get_adapter(model), get_adapter(named(hf_tiny(arch)))
    ids, mask = tpc.adapters.pad(adapter.tokenize(PROMPTS, chat_template=False, max_tokens=None)[0], 0, "right")
    got = adapter.forward_sites(ids, mask, [adapter.site(n) for n in BLOCK])
    want = plain.forward_sites(ids, mask, [plain.site(n) for n in BLOCK])
    keep = mask.bool()
    for name in BLOCK:
        torch.testing.assert_close(got[name][keep], want[name][keep], rtol=1e-4, atol=1e-5)
    pre, attn, mid, mlp, post = (got[n][keep] for n in BLOCK)
    torch.testing.assert_close(pre + attn, mid, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(mid + mlp, post, rtol=1e-5, atol=1e-6)


def test_branch_sites_are_refused_where_a_block_does_not_add_them_up():
    """A parallel block (GPT-NeoX) has no residual stream between attention and MLP (refused in
    every toolkit, its two branches offered: pre + attn_out + mlp_out = post); a block that scales
    each branch before adding it (Granite's residual_multiplier) adds neither module's output as
    it is: all three refused, naming what the block offers."""
    import transformers as tr
    from tiny_models import hf_tiny

    torch.manual_seed(0)
    granite = tr.GraniteForCausalLM(
        tr.GraniteConfig(
            vocab_size=len(tokenizer()),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            residual_multiplier=0.5,
            pad_token_id=0,
            bos_token_id=2,
            eos_token_id=3,
        )
    ).eval()
    neox = [named(hf_tiny("gpt_neox")), nnsight_lm(hf_tiny("gpt_neox")), bridge(hf_tiny("gpt_neox"))]
    for model in neox:  # attention and MLP each add their output; nothing lies between them
        adapter = get_adapter(model)
        with pytest.raises(
            tpc.TPCHooksError,
            match=r"blocks.1.hook_resid_mid is not offered .*offers blocks.1.hook_resid_pre, "
            r"blocks.1.hook_attn_out, blocks.1.hook_mlp_out, blocks.1.hook_resid_post$",
        ):
            adapter.site("blocks.1.hook_resid_mid")
        ids, mask = tpc.adapters.pad(adapter.tokenize(PROMPTS, chat_template=False, max_tokens=None)[0], 0, "right")
        got = adapter.forward_sites(ids, mask, [adapter.site(n) for n in BLOCK if "mid" not in n])
        pre, attn, mlp, post = (got[n][mask.bool()] for n in BLOCK if "mid" not in n)
        torch.testing.assert_close(pre + attn + mlp, post, rtol=1e-5, atol=1e-6)
    adapter = get_adapter(granite, tokenizer=tokenizer())
    for kind in ("hook_attn_out", "hook_resid_mid", "hook_mlp_out"):
        with pytest.raises(
            tpc.TPCHooksError,
            match=rf"blocks.1.{kind} is not offered .*GraniteDecoderLayer.*offers "
            r"blocks.1.hook_resid_pre, blocks.1.hook_resid_post$",
        ):
            adapter.site(f"blocks.1.{kind}")
    with pytest.raises(
        tpc.TPCHooksError, match="with remote=True the nnsight adapter reads hook_resid_pre and hook_resid_post"
    ):
        get_adapter(nnsight_lm(hf_llama()), remote=True).site("blocks.1.hook_resid_mid")


def test_remote_is_passed_to_nnsight_trace(monkeypatch):
    model = nnsight_lm(hf_llama())
    seen = []
    real = type(model).trace

    def spy(self, *args, **kwargs):
        seen.append(kwargs.get("remote"))
        kwargs["remote"] = False  # NDIF is not reachable from tests; the flag is what is checked
        return real(self, *args, **kwargs)

    monkeypatch.setattr(type(model), "trace", spy)
    tpc.collect(model, PROMPTS[:2], SITE, remote=True, progress=False)
    assert seen == [True]
    with pytest.raises(tpc.TPCHooksError, match="monitored generation runs locally"):
        tpc.Monitor(tiny_head(), SITE).generate(get_adapter(model, remote=True), PROMPTS[:1], max_new_tokens=1)


def test_score_policies():
    model = nnsight_lm(hf_llama())
    head = tiny_head()
    mon = tpc.Monitor(head, SITE)
    z = tpc.collect(model, PROMPTS, SITE, progress=False)[SITE]
    torch.testing.assert_close(mon.score(model, PROMPTS, order=2).logits, head(z, order=2), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mon.score(model, PROMPTS).logits, head(z), rtol=1e-5, atol=1e-5)
    own = tpc.Cascade(head, lower=0.3, upper=0.6)
    assert torch.equal(mon.score(model, PROMPTS, cascade=own).exit_order, own(z).exit_order)
    assert torch.equal(mon.score(model, PROMPTS, cascade=0.5).exit_order, torch.ones(5, dtype=torch.long))
    with pytest.raises(tpc.TPCHooksError, match="not both"):
        mon.score(model, PROMPTS, order=1, cascade=0.1)
    with pytest.raises(tpc.TPCHooksError, match="must wrap this monitor's head"):
        mon.score(model, PROMPTS, cascade=tpc.Cascade(tiny_head(seed=1)))


@pytest.mark.parametrize("pooling", POOLINGS)
def test_token_scores_equal_scores_of_each_prefix(pooling):
    model = nnsight_lm(hf_llama())
    mon = tpc.Monitor(tiny_head(), SITE, pooling=pooling)
    tokens, res = mon.token_scores(model, PROMPTS[3])
    ids, _ = get_adapter(model).tokenize([PROMPTS[3]], chat_template=False, max_tokens=None)
    assert len(tokens) == len(ids[0]) == len(res.logits)
    offline = mon.score(model, tokens=[ids[0][: t + 1] for t in range(len(ids[0]))])
    torch.testing.assert_close(res.logits, offline.logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["cache", "past_key_values", "past_kv_cache"])
def test_a_pass_is_fresh_when_its_kv_cache_is_empty_under_any_of_its_names(name):
    """The spy reads a forward's KV cache under the name each library version passes it
    (transformers >= 5.24: ``cache``; before: ``past_key_values``; TransformerLens: ``past_kv_cache``)."""
    from transformers import DynamicCache

    from tpc_hooks.activations._hf import InputSpy

    class Held:  # a cache holding 7 positions
        def get_seq_length(self):
            return 7

    spy = InputSpy()
    spy(None, (), {name: Held(), "attention_mask": torch.ones(2, 8, dtype=torch.long)})
    mask, fresh = spy.step(1, 2)
    assert not fresh and mask.shape == (2, 1)
    spy(None, (), {name: DynamicCache()})
    assert spy.step(3, 2)[1]  # an empty cache: a fresh call
    spy(None, (), {})
    assert spy.step(3, 2)[1]


def test_a_lazily_loaded_nnsight_model_checks_its_branch_sites_on_real_weights(tmp_path):
    """LanguageModel(path) holds meta weights until its first trace: the branch-site check
    dispatches it first, and what is collected is the saved model's own resid_mid."""
    from nnsight import LanguageModel

    hf_llama().save_pretrained(tmp_path)
    tokenizer().save_pretrained(tmp_path)
    lazy = LanguageModel(str(tmp_path), tokenizer=tokenizer())
    assert lazy.dispatched is False
    site = "blocks.1.hook_resid_mid"
    got = tpc.collect(lazy, PROMPTS, site, "mean", progress=False)[site]
    want = tpc.collect(named(hf_llama()), PROMPTS, site, "mean", progress=False)[site]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
