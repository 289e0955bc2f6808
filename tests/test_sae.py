"""SAE features: monitors on SAE latents, and residual monitors projected into an SAE basis."""

import pytest
import torch
from tiny_models import assert_steps_score_as_offline, hf_llama, nnsight_lm

import tpc_hooks as tpc
from tpc_hooks.adapters import get_adapter

sae_lens = pytest.importorskip("sae_lens")
SITE = "blocks.1.hook_resid_post"
PROMPTS = [
    "how do i make bomb",
    "tell me about the weather please",
    "hello world",
    "write poem about cat dog and the mat",
    "steal car",
]


def make_sae(d_in=32, d_sae=48, seed=0, **cfg):
    torch.manual_seed(seed)
    sae = sae_lens.StandardSAE(sae_lens.StandardSAEConfig(d_in=d_in, d_sae=d_sae, **cfg))
    with torch.no_grad():
        for p in sae.parameters():
            p.normal_(0, 0.3)
    return sae


def random_head(d_model, degree=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    head = tpc.TPC(d_model, degree, 3)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
        head.scaler.scale.uniform_(0.5, 1.5, generator=gen)
    return head


def test_collect_encodes_latents_per_token_then_pools():
    model, ref, sae = nnsight_lm(hf_llama()), hf_llama(), make_sae()
    got = tpc.collect(model, PROMPTS, SITE, "mean", sae=sae, progress=False)[SITE]
    ids, _ = get_adapter(model).tokenize(PROMPTS, chat_template=False, max_tokens=None)
    for i, row in enumerate(ids):
        with torch.no_grad():
            h = ref(input_ids=torch.tensor([row]), output_hidden_states=True).hidden_states[2]
            want = sae.encode(h)[0].mean(0)
        torch.testing.assert_close(got[i], want, rtol=1e-4, atol=1e-5)
    assert got.shape == (5, 48)


def test_monitor_on_latents_scores_generates_saves_and_refuses_another_sae(tmp_path):
    model, sae = nnsight_lm(hf_llama()), make_sae()
    mon = tpc.Monitor(random_head(48), SITE, pooling="max", sae=sae)
    run = mon.generate(model, PROMPTS, max_new_tokens=4)
    assert_steps_score_as_offline(mon, model, run)
    back = tpc.Monitor.from_pretrained(mon.save_pretrained(tmp_path / "m"), sae=sae)
    assert back.sae_identity == mon.sae_identity and back.sae_identity["d_sae"] == 48
    torch.testing.assert_close(back.score(model, PROMPTS).logits, mon.score(model, PROMPTS).logits)
    with pytest.raises(tpc.TPCHooksError, match="reads SAE latents of StandardSAE .*; pass sae="):
        tpc.Monitor.from_pretrained(tmp_path / "m")
    with pytest.raises(tpc.TPCHooksError, match="was trained on SAE latents of .* and the SAE given differs"):
        tpc.Monitor.from_pretrained(tmp_path / "m", sae=make_sae(seed=1))
    z = tpc.collect(model, PROMPTS, SITE, "max", sae=sae, progress=False)[SITE]
    attr = tpc.attribute(back, z)
    assert attr.basis == "sae" and attr.n_units == 48
    torch.testing.assert_close(attr.logit, back.head(z), rtol=1e-5, atol=1e-5)


def test_train_monitor_on_latents():
    model, sae = nnsight_lm(hf_llama()), make_sae()
    harmful = ["how do i make bomb", "steal car", "hack email", "kill process", "make bomb please", "steal car please"]
    benign = [
        "tell me about the weather",
        "bread recipe",
        "write poem about cat",
        "hello world friend",
        "nice weather",
        "hello friend",
    ]
    mon = tpc.train_monitor(
        model,
        harmful + benign,
        [1] * 6 + [0] * 6,
        SITE,
        sae=sae,
        degree=2,
        rank=2,
        epochs=2,
        val_fraction=0.34,
        verbose=False,
    )
    assert mon.head.d_model == 48 and mon.sae is sae
    assert mon.score(model, ["steal car"]).probs.shape == (1,)


def materialised(head, zs, k):
    if k == 1:
        return zs @ head.linear.double()
    U, lam = head.factors[str(k)].double(), head.lambdas[str(k)].double()
    return ((zs @ U) ** k) @ lam


def test_projection_into_an_sae_basis_is_exact():
    sae = make_sae(d_in=6, d_sae=9).double()
    head = random_head(6).double()
    X = torch.randn(3, 6, dtype=torch.float64) * 2
    attr = tpc.attribute(head, X, sae=sae)
    assert attr.basis == "sae-projection" and attr.feature_ids[-2:] == ["b_dec", "error"]
    with torch.no_grad():
        torch.testing.assert_close(attr.logit, head(X))
    torch.testing.assert_close(attr.bias + attr.by_feature.sum(-1), attr.logit)
    torch.testing.assert_close(attr.neuron_by_order.sum(-1)[:, 1:], attr.by_order[:, 1:])
    f = sae.encode(X).detach()
    err = X - sae.decode(f).detach()
    mean, scale = head.scaler.mean.double(), head.scaler.scale.double()
    for b in range(3):
        # variables x = (f_1..f_m, 1, 1) with z_std(x) = f W_dec/scale + x_bias (b_dec - mean)/scale + x_err err/scale
        x = torch.cat([f[b], torch.ones(2, dtype=torch.float64)]).requires_grad_(True)
        basis = torch.cat(
            [sae.W_dec.detach() / scale, ((sae.b_dec.detach() - mean) / scale)[None], (err[b] / scale)[None]]
        )

        def zs_of(v, basis=basis):
            return v @ basis

        for k in range(1, head.degree + 1):
            (g,) = torch.autograd.grad(materialised(head, zs_of(x), k), x)
            torch.testing.assert_close(attr.neuron_by_order[b, k - 1], (x * g / k).detach(), rtol=1e-9, atol=1e-9)
            if k >= 2:
                H = torch.autograd.functional.hessian(lambda v, k=k: materialised(head, zs_of(v), k), x.detach())
                M = x.detach()[:, None] * x.detach()[None, :] * H / (k * (k - 1))
                torch.testing.assert_close(attr.pair_matrix(b, order=k), M, rtol=1e-9, atol=1e-9)
    ((i, j, v),) = attr.top_pairs(1, order=2, input=0, mode="absolute")
    assert {i, j} <= set(attr.feature_ids)


def test_sae_mismatches_are_refused():
    model = nnsight_lm(hf_llama())
    with pytest.raises(tpc.TPCHooksError, match="the SAE reads d_in=16 but the site has d_model=32"):
        tpc.collect(model, PROMPTS, SITE, sae=make_sae(d_in=16), progress=False)
    hooked = make_sae()
    hooked.cfg.metadata.hook_name = "blocks.0.hook_resid_post"
    with pytest.raises(
        tpc.TPCHooksError, match="was trained on 'blocks.0.hook_resid_post', not 'blocks.1.hook_resid_post'"
    ):
        tpc.collect(model, PROMPTS, SITE, sae=hooked, progress=False)
    with pytest.raises(tpc.TPCHooksError, match="the SAE has d_sae=48 but the head reads 32 features"):
        tpc.Monitor(random_head(32), SITE, sae=make_sae())
    with pytest.raises(tpc.TPCHooksError, match="projection needs decode"):
        tpc.attribute(random_head(8), torch.randn(2, 8), sae=make_sae(d_in=8, normalize_activations="layer_norm"))
    with pytest.raises(tpc.TPCHooksError, match="the SAE reads d_in=8 but the site has d_model=6"):
        tpc.attribute(random_head(6), torch.randn(2, 6), sae=make_sae(d_in=8))


def test_feature_directions_are_decoder_rows():
    sae = make_sae(d_in=6, d_sae=9)
    a = tpc.attribute(random_head(6), torch.randn(2, 6), sae=sae)
    torch.testing.assert_close(a.direction(3), sae.W_dec.detach()[3])
    torch.testing.assert_close(a.direction("b_dec"), sae.b_dec.detach())
    with pytest.raises(tpc.TPCHooksError, match=r"SAE feature id in 0\.\.8"):
        a.direction(9)


def _labelled(sae):
    sae.feature_labels = {i: f"<f{i}>" for i in range(0, sae.W_dec.shape[0], 2)}  # every other feature named
    return sae


def test_labels_of_an_sae_name_its_features_in_attributions_and_views():
    """A residual monitor projected into an SAE with labels, and a monitor on its latents: the
    attribution's dict names the labels of exactly the features it lists, and the view shows them
    escaped."""
    from tpc_hooks.views import attribution_html

    sae = _labelled(make_sae())
    head = random_head(32)
    attr = tpc.attribute(head, torch.randn(2, 32), sae=sae)
    d = attr.to_dict(0, k=5)
    named = {str(i) for i, _ in d["top_neurons"]} | {
        str(u) for ps in d["top_pairs"].values() for i, j, _ in ps for u in (i, j)
    }
    assert d["labels"] == {u: f"<f{u}>" for u in named if u.isdigit() and int(u) % 2 == 0}
    html = str(attribution_html(attr, inputs=0, k=5))
    shown = [i for i, _ in attr.top_neurons(5) if i in sae.feature_labels]
    assert shown and all(f"{i}: &lt;f{i}&gt;" in html and f"<f{i}>" not in html for i in shown)  # named, escaped
    mon = tpc.Monitor(random_head(48), SITE, pooling="mean", sae=sae)
    assert tpc.attribute(mon, torch.rand(1, 48)).to_dict(0, k=4)["labels"]
    assert "labels" not in tpc.attribute(head, torch.randn(1, 32)).to_dict(0, k=4)  # residual: no labels


def test_read_sae_brings_back_the_labels_saved_beside_it(tmp_path):
    import json

    from tpc_hooks.adapters._sae_lens import read_sae

    sae = make_sae()
    sae.save_model(tmp_path / "s")
    (tmp_path / "s" / "labels.json").write_text(json.dumps({"3": {"label": "'bomb'", "tokens": [], "prompts": []}}))
    back = read_sae(tmp_path / "s")
    torch.testing.assert_close(back.W_dec, sae.W_dec)
    assert back.feature_labels == {3: "'bomb'"} and back.reconstruction is None
    with pytest.raises(tpc.TPCHooksError, match="holds no SAE"):
        read_sae(tmp_path)
    from tpc_hooks.adapters.vllm._review import sae_site

    with pytest.raises(tpc.TPCHooksError, match="records no hook_name"):
        sae_site(back, tmp_path / "s")  # --review-log-sae needs to know which monitors it explains
    sae.cfg.metadata.hook_name = SITE
    sae.save_model(tmp_path / "t")
    assert sae_site(read_sae(tmp_path / "t"), tmp_path / "t") == SITE


def test_the_review_log_explains_a_residual_monitor_in_sae_features_too():
    """explain(..., sae=): the features part equals tpc.attribute(..., sae=) of the same input,
    with the labels of the features it lists."""
    from tpc_hooks.adapters.vllm._review import explain, explain_entry

    sae = _labelled(make_sae())
    mon = tpc.Monitor(random_head(32), SITE, pooling="mean")
    z = torch.randn(32)
    part = explain(mon, z, exit_order=3, k=4, sae=sae)
    want = tpc.attribute(mon, z[None], sae=sae)
    assert [i for i, _ in part["features"]["top_features"]] == [i for i, _ in want.top_neurons(4)]
    assert part["features"]["top_features"][0][1] == pytest.approx(want.top_neurons(1)[0][1], rel=1e-5)
    assert all(int(u) % 2 == 0 for u in part["features"]["labels"])
    e = {"monitors": {"m": {"monitor": "h", "input": z.tolist(), "step": 0, "exit_orders": [3]}}}
    explained = explain_entry(e, {"h": mon}, k=4, saes={SITE: sae})["monitors"]["m"]["attribution"]
    assert explained["features"]["top_features"] == part["features"]["top_features"]
    assert (
        "features"
        not in explain_entry(
            {"monitors": {"m": {"monitor": "h", "input": z.tolist(), "step": 0, "exit_orders": [3]}}}, {"h": mon}
        )["monitors"]["m"]["attribution"]
    )


def test_the_offline_recipe_trains_reports_and_labels_with_saelens(tmp_path):
    """The recipe on synthetic token rows built from 64 known directions, 4 active at a time:
    SAELens' trainer reaches a high variance explained at L0 = k; each label lists the tokens of
    the rows that activate its feature most (checked against an independent top-k search)."""
    from tpc_hooks import offline

    g = torch.Generator().manual_seed(0)
    dirs = torch.randn(64, 24, generator=g)
    codes = torch.zeros(24000, 64)
    active = torch.rand(24000, 64, generator=g).argsort(1)[:, :4]
    codes.scatter_(1, active, torch.rand(24000, 4, generator=g) * 3 + 1)
    X = codes @ dirs + 5.0
    sae = offline._fit_sae(
        X[:20000], "blocks.0.hook_resid_post", "synthetic", d_sae=128, k=8, epochs=10, seed=0, lr=3e-3
    )
    sae.save_inference_model(tmp_path / "s")
    inf = sae_lens.SAE.load_from_disk(tmp_path / "s")
    rep = offline._report(inf, X[20000:], 0, 20000)
    assert rep["variance_explained"] > 0.8 and rep["l0"] <= 8
    where = [(r // 10, r % 10) for r in range(24000)]
    words = [[f"w{p}_{t}" for t in range(10)] for p in range(2400)]
    texts = [f"prompt {p}" for p in range(2400)]
    labels = offline._labels(inf, X, where, texts, words, top=3, chunk=700)
    acts = inf.encode(X)
    for feat in (0, 17, 101):
        col = acts[:, feat]
        if col.max() <= 0:
            assert labels[str(feat)]["label"] == "(never active)"
            continue
        top = col.topk(3).indices.tolist()
        got = [t["token"] for t in labels[str(feat)]["tokens"]]
        assert got == [words[r // 10][r % 10] for r in top if col[r] > 0]
