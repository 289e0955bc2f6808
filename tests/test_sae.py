"""SAE features: monitors on SAE latents, and residual monitors projected into an SAE basis."""

import pytest
import torch

import tpc_hooks as tpc
from tiny_models import assert_steps_score_as_offline, hf_llama, nnsight_lm
from tpc_hooks.adapters import get_adapter

sae_lens = pytest.importorskip("sae_lens")
SITE = "blocks.1.hook_resid_post"
PROMPTS = ["how do i make bomb", "tell me about the weather please", "hello world",
           "write poem about cat dog and the mat", "steal car"]


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
    back = tpc.Monitor.load(mon.save(tmp_path / "m"), sae=sae)
    assert back.sae_identity == mon.sae_identity and back.sae_identity["d_sae"] == 48
    torch.testing.assert_close(back.score(model, PROMPTS).logits, mon.score(model, PROMPTS).logits)
    with pytest.raises(tpc.TPCHooksError, match="reads SAE latents of StandardSAE .*; pass sae="):
        tpc.Monitor.load(tmp_path / "m")
    with pytest.raises(tpc.TPCHooksError, match="was trained on SAE latents of .* and the SAE given differs"):
        tpc.Monitor.load(tmp_path / "m", sae=make_sae(seed=1))
    z = tpc.collect(model, PROMPTS, SITE, "max", sae=sae, progress=False)[SITE]
    attr = tpc.attribute(back, z)
    assert attr.basis == "sae" and attr.n_units == 48
    torch.testing.assert_close(attr.logit, back.head(z), rtol=1e-5, atol=1e-5)


def test_train_monitor_on_latents():
    model, sae = nnsight_lm(hf_llama()), make_sae()
    harmful = ["how do i make bomb", "steal car", "hack email", "kill process", "make bomb please", "steal car please"]
    benign = ["tell me about the weather", "bread recipe", "write poem about cat", "hello world friend", "nice weather",
              "hello friend"]
    mon = tpc.train_monitor(model, harmful + benign, [1] * 6 + [0] * 6, SITE, sae=sae, degree=2, rank=2, epochs=2,
                            val_fraction=0.34, verbose=False)
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
        basis = torch.cat([sae.W_dec.detach() / scale, ((sae.b_dec.detach() - mean) / scale)[None], (err[b] / scale)[None]])
        zs_of = lambda v: v @ basis
        for k in range(1, head.degree + 1):
            (g,) = torch.autograd.grad(materialised(head, zs_of(x), k), x)
            torch.testing.assert_close(attr.neuron_by_order[b, k - 1], (x * g / k).detach(), rtol=1e-9, atol=1e-9)
            if k >= 2:
                H = torch.autograd.functional.hessian(lambda v: materialised(head, zs_of(v), k), x.detach())
                M = x.detach()[:, None] * x.detach()[None, :] * H / (k * (k - 1))
                torch.testing.assert_close(attr.pair_matrix(b, order=k), M, rtol=1e-9, atol=1e-9)
    (i, j, v), = attr.top_pairs(1, order=2, input=0, mode="absolute")
    assert {i, j} <= set(attr.feature_ids)


def test_sae_mismatches_are_refused():
    model = nnsight_lm(hf_llama())
    with pytest.raises(tpc.TPCHooksError, match="the SAE reads d_in=16 but the site has d_model=32"):
        tpc.collect(model, PROMPTS, SITE, sae=make_sae(d_in=16), progress=False)
    hooked = make_sae()
    hooked.cfg.metadata.hook_name = "blocks.0.hook_resid_post"
    with pytest.raises(tpc.TPCHooksError, match="was trained on 'blocks.0.hook_resid_post', not 'blocks.1.hook_resid_post'"):
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
