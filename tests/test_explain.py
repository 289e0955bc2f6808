"""Monitor.explain: a monitor's logit split over the tokens it read and the model parts that wrote them,
checked against independent computations (float64 references from collected activations, hand-written
loops, brute force, autograd, and TransformerLens' own residual decomposition) in every local adapter."""

import math
import warnings

import numpy as np
import pytest
import torch
from tiny_models import bridge, hf_gpt2, hf_llama, hooked_gpt2_style, named, nnsight_lm, random_head, tokenizer

import tpc_hooks as tpc
from tpc_hooks.adapters import get_adapter
from tpc_hooks.pooling import aggregate

pytest.importorskip("transformer_lens")
pytest.importorskip("nnsight")

PROMPTS = ["how do i make bomb", "tell me about the weather please", "hello", "write poem about cat dog and the mat"]
SITE = "blocks.1.hook_resid_post"

MODELS = {
    "hooked-gpt2": lambda: hooked_gpt2_style(),
    "bridge-llama": lambda: bridge(hf_llama()),
    "nnsight-llama": lambda: nnsight_lm(hf_llama()),
    "transformers-llama": lambda: named(hf_llama()),
    "transformers-gpt2": lambda: named(hf_gpt2()),
}


@pytest.fixture(scope="module", params=list(MODELS))
def case(request):
    return request.param, MODELS[request.param]()


def head3(seed=0):
    """A degree-3 head with every parameter drawn at random (orders 2 and 3 carry weight)."""
    return random_head(32, 3, scale=0.5, seed=seed)


def token_rows(model, monitor, prompts, batch_size=1):
    """Each prompt's per-token activations at the monitor's site, collected without explain's hooks (in
    the batches explain reads with the same ``batch_size``: the same padding, the same rounding)."""
    return tpc.collect(
        model,
        prompts,
        monitor.site,
        "token",
        chat_template=monitor.chat_template,
        progress=False,
        batch_size=batch_size,
    )[monitor.site]


def reference(monitor, rows, exit_orders):
    """The monitor's logit of each prompt in float64, from its per-token rows (pooled by hand, the
    head evaluated at the exit order the explanation reports)."""
    out = []
    for h, o in zip(rows, exit_orders.tolist(), strict=True):
        h = h.double()
        if monitor.streaming:
            per_token = torch.stack([monitor.head(h[t], order=int(o)).detach() for t in range(len(h))])
            out.append(
                float(
                    aggregate(
                        per_token[None],
                        torch.ones(1, len(h)),
                        monitor.aggregate,
                        monitor.alpha,
                        monitor.window,
                        monitor.skip,
                        monitor.top_k,
                    )[0, -1]
                )
            )
            continue
        z = {"mean": h.mean(0), "max": h.amax(0), "last": h[-1]}[monitor.pooling]
        out.append(float(monitor.head(z, order=int(o)).detach()))
    return torch.tensor(out, dtype=torch.float64)


def check_margins(ex):
    for b in range(len(ex)):
        tbc = ex.token_by_component[b]
        assert tbc.shape == (len(ex.token_ids[b]), len(ex.components))
        torch.testing.assert_close(tbc.sum(1), ex.by_token[b], rtol=0, atol=1e-10)
        torch.testing.assert_close(tbc.sum(0), ex.by_component[b], rtol=0, atol=1e-10)


def policy_kwargs(policy, mon, model):
    """The scoring policy of a case: the full polynomial, a fixed order, or a cascade whose exits lie
    between the rows' order-1 probabilities (two rows settle at order 1, two go on)."""
    if policy != "cascade":
        return {"full": {}, "order1": {"order": 1}, "order2": {"order": 2}}[policy]
    p = mon.score(model, PROMPTS, order=1, batch_size=3).probs.sort().values.tolist()
    return {"cascade": tpc.Cascade(mon.head, lower=(p[0] + p[1]) / 2, upper=(p[2] + p[3]) / 2)}


def check_sums(model, mon, policy):
    """The split's parts sum to the float64 logit, the logit is score()'s, and the margins hold."""
    kw = policy_kwargs(policy, mon, model)
    ex = mon.explain(model, PROMPTS, batch_size=3, **kw)
    res = mon.score(model, PROMPTS, batch_size=3, **kw)
    assert torch.equal(ex.logit, res.logits)  # the monitor's own score, bit for bit
    assert torch.equal(ex.exit_order, res.exit_order)
    ref = reference(mon, token_rows(model, mon, PROMPTS, 3), ex.exit_order)
    for b in range(len(PROMPTS)):
        assert math.isclose(float(ex.baseline[b] + ex.by_token[b].sum()), float(ref[b]), rel_tol=1e-9, abs_tol=1e-9)
    torch.testing.assert_close(ex.baseline + ex.by_component.sum(1), ref, rtol=1e-9, atol=1e-9)
    check_margins(ex)
    if policy == "cascade":  # the split follows each row's exit
        assert ex.exit_order.min() == 1 and ex.exit_order.max() > 1
    return ex


@pytest.mark.parametrize("pooling", ["mean", "max", "last"])
def test_parts_sum_to_the_float64_logit_in_every_adapter(case, pooling):
    """Every adapter, every pooling, under a cascade (rows exiting at orders 1, 2 and 3)."""
    name, model = case
    check_sums(model, tpc.Monitor(head3(), SITE, pooling=pooling), "cascade")


@pytest.mark.parametrize("pooling", ["mean", "max", "last"])
@pytest.mark.parametrize("policy", ["full", "order1", "order2"])
def test_parts_sum_to_the_float64_logit_at_every_order(pooling, policy):
    model = named(hf_llama())
    ex = check_sums(model, tpc.Monitor(head3(), SITE, pooling=pooling), policy)
    assert ex.exit_order.tolist() == [{"full": 3, "order1": 1, "order2": 2}[policy]] * len(PROMPTS)
    attr = ex.attribution
    torch.testing.assert_close(attr.logit, ex.logit, rtol=1e-5, atol=1e-5)  # the same rows by order and neuron
    if policy == "order1":
        assert (attr.by_order[:, 1:] == 0).all()


@pytest.mark.parametrize("aggregate_", ["mean", "max", "ema", "rolling", "sctopk"])
def test_a_per_token_monitor_splits_its_aggregate(case, aggregate_):
    name, model = case
    mon = tpc.Monitor(head3(), SITE, pooling="token", aggregate=aggregate_, window=3, alpha=0.3, skip=1, top_k=2)
    ex = mon.explain(model, PROMPTS, batch_size=3, order=2)
    res = mon.score(model, PROMPTS, order=2, batch_size=3)
    assert torch.equal(ex.logit, res.logits)
    ref = reference(mon, token_rows(model, mon, PROMPTS, 3), torch.full((len(PROMPTS),), 2))
    torch.testing.assert_close(ex.baseline + torch.stack([t.sum() for t in ex.by_token]), ref, rtol=1e-9, atol=1e-9)
    for b in range(len(PROMPTS)):
        assert float(ex.by_token[b][0]) == 0.0 and not bool(ex.pooled[b][0])  # the skipped token carries nothing
    check_margins(ex)
    assert ex.attribution is None


def test_the_order1_token_split_is_a_loop_over_positions():
    """A linear monitor with mean pooling: position t carries <h_t / T, w1 / scale>, written out by hand."""
    model = named(hf_llama())
    head = random_head(32, 1, scale=0.5)
    mon = tpc.Monitor(head, SITE, pooling="mean")
    ex = mon.explain(model, PROMPTS, batch_size=2)
    rows = token_rows(model, mon, PROMPTS, 2)
    w1 = head.linear.detach().double()
    scale, mean = head.scaler.scale.detach().double(), head.scaler.mean.detach().double()
    for b, h in enumerate(rows):
        T = len(h)
        want = []
        for t in range(T):
            v = 0.0
            for i in range(32):
                v += float(h[t, i]) / T * float(w1[i]) / float(scale[i])
            want.append(v)
        torch.testing.assert_close(ex.by_token[b], torch.tensor(want, dtype=torch.float64), rtol=1e-9, atol=1e-12)
        base = float(head.bias.detach()) - sum(float(mean[i] / scale[i] * w1[i]) for i in range(32))
        assert math.isclose(float(ex.baseline[b]), base, rel_tol=1e-12)


def euler_weights(head, z):
    """Independently of tpc-hooks' Euler code: per order, the term's gradient over its degree with respect
    to the (model-unit) pooled vector, from autograd through ``head.terms``; summed over orders."""
    z = z.detach().double().requires_grad_(True)
    terms = head.double().terms(z[None])[0]
    g = torch.zeros_like(z)
    for k in range(head.degree):
        (grad,) = torch.autograd.grad(terms[k], z, retain_graph=True)
        g += grad / (k + 1)
    head.float()
    return g


def test_max_pooling_matches_a_brute_force_assignment():
    """Each coordinate of the max-pooled vector goes to the position holding the maximum: by brute force
    over every (coordinate, position), against the gradients autograd gives."""
    model = named(hf_llama())
    head = head3(seed=1)
    mon = tpc.Monitor(head, SITE, pooling="max")
    ex = mon.explain(model, PROMPTS)
    for b, h in enumerate(token_rows(model, mon, PROMPTS, 8)):
        h = h.double()
        z = h.max(0).values
        g = euler_weights(head, z)
        want = torch.zeros(len(h), dtype=torch.float64)
        for i in range(h.shape[1]):
            for t in range(len(h)):
                if h[t, i] == z[i]:
                    want[t] += h[t, i] * g[i]
                    break
        torch.testing.assert_close(ex.by_token[b], want, rtol=1e-7, atol=1e-9)


def hooked_gpt2_of(hf):
    """A HookedTransformer with the weights of a Hugging Face GPT-2 (TransformerLens' own conversion)."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions.gpt2 import convert_gpt2_weights

    c = hf.config
    cfg = HookedTransformerConfig(
        d_model=c.n_embd,
        n_layers=c.n_layer,
        n_heads=c.n_head,
        d_head=c.n_embd // c.n_head,
        d_mlp=4 * c.n_embd,
        d_vocab=c.vocab_size,
        n_ctx=c.n_positions,
        act_fn="gelu_new",
        normalization_type="LN",
        eps=c.layer_norm_epsilon,
        positional_embedding_type="standard",
        default_prepend_bos=False,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ht = HookedTransformer(cfg, tokenizer=tokenizer())
    ht.load_state_dict(convert_gpt2_weights(hf, cfg), strict=False)
    return ht.eval()


@pytest.mark.parametrize("layer", [0, 2])
def test_components_match_transformer_lens_own_decomposition(layer):
    """By head, MLP and embedding: TransformerLens' get_full_resid_decomposition of the same residual
    stream, projected on the gradients autograd gives, pooled by hand."""
    model = hooked_gpt2_style()
    site = f"blocks.{layer}.hook_resid_post"
    head = head3(seed=2)
    mon = tpc.Monitor(head, site, pooling="mean")
    ex = mon.explain(model, PROMPTS, heads=True)
    ids, _ = get_adapter(model).tokenize(PROMPTS, chat_template=False, max_tokens=None)
    for b, row in enumerate(ids):
        _, cache = model.run_with_cache(torch.tensor([row]))
        stack, labels = cache.get_full_resid_decomposition(layer=layer + 1, expand_neurons=False, return_labels=True)
        parts = stack[:, 0].detach().double()  # [C, T, D]
        g = euler_weights(head, cache[site][0].double().mean(0))
        value = dict(zip(labels, (parts.mean(1) @ g).tolist(), strict=True))
        got = dict(zip(ex.components, ex.by_component[b].tolist(), strict=True))
        want = {"embed": value["embed"] + value["pos_embed"]}
        for li in range(layer + 1):
            for h in range(4):
                want[f"blocks.{li}.attn.{h}"] = value[f"L{li}H{h}"]
            want[f"blocks.{li}.mlp"] = value[f"{li}_mlp_out"]
        for k, v in want.items():
            assert math.isclose(got[k], v, rel_tol=1e-4, abs_tol=1e-5), k
        biases = sum(v for k, v in got.items() if k.endswith(".attn.bias"))
        assert math.isclose(biases, value["bias"], rel_tol=1e-4, abs_tol=1e-5)


def test_heads_through_a_norm_after_attention_in_a_hooked_transformer():
    """A HookedTransformer whose attention output is normalised before it is added (``ln1_post``, Gemma 2's
    block): the heads, each through that norm's scale of the pass, sum to attention's part."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    torch.manual_seed(5)
    cfg = HookedTransformerConfig(
        d_model=32,
        n_layers=2,
        n_heads=4,
        d_head=8,
        d_mlp=64,
        d_vocab=len(tokenizer()),
        n_ctx=64,
        act_fn="gelu",
        normalization_type="RMS",
        positional_embedding_type="rotary",
        rotary_dim=8,
        use_normalization_before_and_after=True,
        default_prepend_bos=False,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = HookedTransformer(cfg, tokenizer=tokenizer()).eval()
    with torch.no_grad():
        for block in model.blocks:
            block.ln1_post.w.normal_(1, 0.3)  # a weight of its own, not the identity
    mon = tpc.Monitor(head3(), SITE, pooling="mean")
    split, whole = mon.explain(model, PROMPTS, heads=True), mon.explain(model, PROMPTS)
    torch.testing.assert_close(split.baseline + split.by_component.sum(1), split.extra["reference_logit"])
    for li in range(2):
        heads = sum(
            split.by_component[:, i] for i, n in enumerate(split.components) if n.startswith(f"blocks.{li}.attn.")
        )
        attn = whole.by_component[:, whole.components.index(f"blocks.{li}.attn")]
        torch.testing.assert_close(heads, attn, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("heads", [False, True])
def test_hf_and_nnsight_parts_equal_transformer_lens_parts_of_the_same_weights(heads):
    hf = hf_gpt2()
    mon = tpc.Monitor(head3(seed=3), "blocks.2.hook_resid_post", pooling="mean")
    exs = {
        "hooked": mon.explain(hooked_gpt2_of(hf_gpt2()), PROMPTS, heads=heads),
        "transformers": mon.explain(named(hf), PROMPTS, heads=heads),
        "nnsight": mon.explain(nnsight_lm(hf_gpt2()), PROMPTS, heads=heads),
        "bridge": mon.explain(bridge(hf_gpt2()), PROMPTS, heads=heads),
    }
    ref = exs.pop("hooked")
    for name, ex in exs.items():
        assert ex.components == ref.components, name
        torch.testing.assert_close(ex.by_component, ref.by_component, rtol=1e-4, atol=1e-5, msg=name)
        for b in range(len(PROMPTS)):
            torch.testing.assert_close(ex.by_token[b], ref.by_token[b], rtol=1e-4, atol=1e-5, msg=name)


def test_batched_equals_unbatched(case):
    name, model = case
    mon = tpc.Monitor(head3(), SITE, pooling="mean")
    one = mon.explain(model, PROMPTS, batch_size=1, heads=True)
    many = mon.explain(model, PROMPTS, batch_size=4, heads=True)
    torch.testing.assert_close(many.by_component, one.by_component, rtol=1e-5, atol=1e-6)
    for b in range(len(PROMPTS)):
        torch.testing.assert_close(many.token_by_component[b], one.token_by_component[b], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("heads", [False, True])
def test_left_and_right_padding_give_the_same_parts(case, heads):
    name, model = case
    adapter = get_adapter(model)
    site = adapter.site(SITE)
    ids, _ = adapter.tokenize(PROMPTS, chat_template=False, max_tokens=None)
    w = torch.randn(len(ids), max(map(len, ids)), 32, dtype=torch.float64)
    got = {}
    for side in ("left", "right"):
        x, mask = tpc.adapters.pad(ids, 0, side)
        parts = adapter.forward_parts(x, mask, site, heads=heads)
        cols = []
        for b, row in enumerate(ids):
            n = len(row)
            at = slice(x.shape[1] - n, None) if side == "left" else slice(0, n)
            wb = torch.zeros(1, x.shape[1], 32, dtype=torch.float64)
            wb[0, at] = w[b, :n]
            single = parts.contributions(torch.cat([wb if j == b else torch.zeros_like(wb) for j in range(len(ids))]))
            cols.append(single[b, at])
        got[side] = cols
    for a, b in zip(got["left"], got["right"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_a_response_monitor_splits_the_answer_it_pools():
    model = named(hf_llama())
    mon = tpc.Monitor(head3(), SITE, pooling="mean", reads="answer")
    answers = ["the cat sat on the mat", "hello world", "write poem", "the dog"]
    ex = mon.explain(model, PROMPTS, responses=answers)
    assert torch.equal(ex.logit, mon.score(model, PROMPTS, responses=answers).logits)
    adapter = get_adapter(model)
    for b in range(len(PROMPTS)):
        n_prompt = len(adapter.tokenize([PROMPTS[b]], chat_template=False, max_tokens=None)[0][0])
        assert not ex.pooled[b][:n_prompt].any() and ex.pooled[b][n_prompt:].all()
        assert torch.equal(ex.by_token[b][:n_prompt], torch.zeros(n_prompt, dtype=torch.float64))
    check_margins(ex)


def test_every_family_sums_and_splits_its_blocks():
    """Every family the adapters support: parts sum to the site (exactly in float64) with and without
    heads, attention's part is what the block's attention added (its branch read alone), and the
    heads sum to it."""
    import families

    for fam in families.FAMILIES:
        model = families.build(fam)
        adapter = get_adapter(model, tokenizer=tokenizer())
        site = adapter.site("blocks.3.hook_resid_post")
        x, mask = tpc.adapters.pad([[2, 5, 6, 7, 8], [2, 9, 10]], 0, "right")
        whole = adapter.forward_parts(x, mask, site)
        split = adapter.forward_parts(x, mask, site, heads=True)
        acts = adapter.forward_sites(x, mask, [site])[site.name].double()
        w = torch.randn(*acts.shape, dtype=torch.float64)
        total = (acts * w).sum(-1)
        for parts in (whole, split):
            torch.testing.assert_close(parts.contributions(w).sum(-1), total, rtol=1e-9, atol=1e-9, msg=fam)
        a, s = whole.contributions(w), split.contributions(w)
        for li in range(4):
            heads_sum = sum(s[..., i] for i, n in enumerate(split.names) if n.startswith(f"blocks.{li}.attn."))
            attn = a[..., whole.names.index(f"blocks.{li}.attn")]
            torch.testing.assert_close(heads_sum, attn, rtol=1e-4, atol=1e-5, msg=f"{fam} layer {li}")


def test_bad_input_gets_a_clear_error():
    model = named(hf_llama())
    mon = tpc.Monitor(head3(), SITE, pooling="mean")
    with pytest.raises(tpc.TPCHooksError, match="batch_size"):
        mon.explain(model, PROMPTS, batch_size=0)
    with pytest.raises(tpc.TPCHooksError, match="d_model"):
        tpc.Monitor(random_head(16, 2), SITE).explain(model, PROMPTS)

    class Engine(tpc.adapters.Adapter):  # a serving engine's adapter: no local parts
        toolkit, engine, model_name = "vLLM", True, "/models/llama"
        d_model, n_layers, tokenizer = 32, 3, tokenizer()

    with pytest.raises(tpc.TPCHooksError, match="AutoModelForCausalLM.from_pretrained\\('/models/llama'\\)"):
        mon.explain(Engine(None), PROMPTS)


def test_a_prompt_past_max_tokens_is_cut_said_and_recorded():
    model = named(hf_llama())
    mon = tpc.Monitor(head3(), SITE, pooling="mean", max_tokens=4)
    with pytest.warns(UserWarning, match="1 of 2 prompts were longer than max_tokens=4"):
        ex = mon.explain(model, ["hello", "write poem about cat dog and the mat"])
    assert ex.truncated == [False, True] and len(ex.token_ids[1]) == 4
    assert torch.equal(ex.logit, mon.score(model, ["hello", "write poem about cat dog and the mat"]).logits)


def test_heads_on_an_attention_that_is_not_linear_per_head_is_refused():
    """A norm after attention that also centres (a LayerNorm): the heads' map is not a scale per position."""
    import families

    model = families.build("gemma3_text")
    for layer in model.model.layers:
        layer.post_attention_layernorm = torch.nn.LayerNorm(32)
    mon = tpc.Monitor(head3(), "blocks.2.hook_resid_post", pooling="mean")
    with pytest.raises(tpc.TPCHooksError, match="explain with heads=False"):
        mon.explain(model, PROMPTS, heads=True, tokenizer=tokenizer())
    ex = mon.explain(model, PROMPTS, tokenizer=tokenizer())  # the layer split still holds
    assert np.isfinite(ex.by_component.numpy()).all()


def sae_and_monitor(pooling="mean"):
    sae_lens = pytest.importorskip("sae_lens")
    torch.manual_seed(4)
    sae = sae_lens.StandardSAE(sae_lens.StandardSAEConfig(d_in=32, d_sae=64, apply_b_dec_to_input=True))
    with torch.no_grad():
        sae.b_enc.normal_(0, 0.3)
        sae.b_dec.normal_(0, 0.3)
    return sae, tpc.Monitor(random_head(64, 3, scale=0.5), SITE, pooling=pooling, sae=sae)


@pytest.mark.parametrize("pooling", ["mean", "max", "token"])
def test_an_sae_monitor_splits_through_its_encoder(pooling):
    """A monitor on SAE latents: by token, each position's latents (autograd's gradients, by hand); by model
    part, through the encoder with the pass's active latents held fixed, plus the encoder's own bias."""
    model = named(hf_llama())
    sae, mon = sae_and_monitor(pooling)
    ex = mon.explain(model, PROMPTS, batch_size=2)
    assert torch.equal(ex.logit, mon.score(model, PROMPTS, batch_size=2).logits)
    assert ex.components[-1] == "sae.encoder_bias"
    check_margins(ex)
    rows = token_rows(model, mon, PROMPTS, 2)
    for b, h in enumerate(rows):
        f = sae.encode(h).detach().double()
        if pooling == "token":
            ref = float(reference(mon, [f.float()], torch.tensor([3]))[0])
        else:
            z = f.mean(0) if pooling == "mean" else f.amax(0)
            g = euler_weights(mon.head, z)
            ref = float(mon.head(z).detach())
            if pooling == "mean":  # position t carries <f_t / T, g>
                torch.testing.assert_close(ex.by_token[b], (f / len(f)) @ g, rtol=1e-5, atol=1e-6)
        assert math.isclose(float(ex.baseline[b] + ex.by_component[b].sum()), ref, rel_tol=1e-5, abs_tol=1e-5)


def test_an_sae_whose_latents_are_not_gated_pre_activations_is_refused():
    sae, mon = sae_and_monitor()
    sae.encode = lambda x: torch.sigmoid(x @ sae.W_enc + sae.b_enc)  # every latent on, none its pre-activation
    with pytest.raises(tpc.TPCHooksError, match="not their pre-activations"):
        mon.explain(named(hf_llama()), PROMPTS)


def test_the_views_show_the_split():
    model = named(hf_llama())
    mon = tpc.Monitor(head3(), SITE, pooling="mean")
    ex = mon.explain(model, ["how do i make bomb", "hello"])
    html = str(ex.to_html())
    assert html.count('class="tok') == sum(len(t) for t in ex.tokens)
    assert "&lt;script&gt;" in tpc.views.token_spans(["<script>"], [1.0])
    df = ex.to_dataframe()
    sums = df.groupby(["row", "position"]).value.sum()
    for b in range(len(ex)):
        np.testing.assert_allclose(sums.loc[b].to_numpy(), ex.by_token[b].numpy(), rtol=1e-12)
    top = ex.top_tokens(0, 3)
    assert [v for _, _, v in top] == sorted([v for _, _, v in top], reverse=True)
    assert top[0][2] == float(ex.by_token[0].max())
    layers, grid = ex.by_layer(0)
    assert layers == [0, 1]
    assert math.isclose(float(grid.sum()) + float(ex.by_component[0][0]), float(ex.by_component[0].sum()))
    fig = ex.plot(0)
    assert len(fig.axes) >= 2
    assert set(ex.share(0)) == {"top1_token", "top3_tokens", "top_component"}
