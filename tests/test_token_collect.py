"""Per-token collection, ``tpc.collect(..., pooling="token")``, in memory and into resumable stores.

Independent computations: each prompt run alone through ``Adapter.forward_sites`` (no batch, no
padding) and, for the plain Hugging Face model, its own ``output_hidden_states``; the pooled
rows of ``collect(pooling="mean"|"last"|"max")`` against the token rows pooled by hand."""

import json

import numpy as np
import pytest
import torch
from tiny_models import RESUME_PROMPTS, hf_llama, hooked_gpt2_style, interrupt_forward, named, nnsight_lm

import tpc_hooks as tpc
from tpc_hooks.adapters import get_adapter

SITE = "blocks.1.hook_resid_post"
SITES = [SITE, "blocks.0.hook_resid_post"]
PROMPTS = [
    "how do i make bomb",
    "tell me about the weather please",
    "hello world",
    "write poem about cat dog and the mat",
    "steal car",
    "the cat sat on the mat",
]
MODELS = {
    "hooked-gpt2": hooked_gpt2_style,
    "nnsight-llama": lambda: nnsight_lm(hf_llama()),
    "transformers-llama": lambda: named(hf_llama()),
}


@pytest.fixture(scope="module", params=list(MODELS))
def model(request):
    return MODELS[request.param]()


def alone(model, prompt, site, chat_template):
    """One prompt's per-token activations from a forward pass of that prompt alone (no padding)."""
    adapter = get_adapter(model)
    (ids,), _ = adapter.tokenize([prompt], chat_template=chat_template, max_tokens=None)
    with torch.no_grad():
        out = adapter.forward_sites(
            torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long), [adapter.site(site)]
        )
    return out[site][0].float()


@pytest.mark.parametrize("chat_template", [False, True])
def test_token_rows_equal_each_prompt_run_alone(model, chat_template):
    acts = tpc.collect(model, PROMPTS, SITES, "token", batch_size=4, chat_template=chat_template, progress=False)
    ids, _ = get_adapter(model).tokenize(PROMPTS, chat_template=chat_template, max_tokens=None)
    assert set(acts) == set(SITES)
    for site in SITES:
        assert len(acts[site]) == len(PROMPTS)
        for i, rows in enumerate(acts[site]):
            assert rows.dtype == torch.float32 and rows.shape == (len(ids[i]), 32)
            torch.testing.assert_close(rows, alone(model, PROMPTS[i], site, chat_template), rtol=1e-4, atol=1e-5)


def test_token_rows_equal_the_hf_models_own_hidden_states():
    ref = hf_llama()
    acts = tpc.collect(named(hf_llama()), PROMPTS, SITE, "token", batch_size=3, progress=False)[SITE]
    ids, _ = get_adapter(named(hf_llama())).tokenize(PROMPTS, chat_template=False, max_tokens=None)
    for i, row in enumerate(ids):
        with torch.no_grad():
            want = ref(input_ids=torch.tensor([row]), output_hidden_states=True).hidden_states[2][0]
        torch.testing.assert_close(acts[i], want, rtol=1e-4, atol=1e-5)


def test_padding_side_and_batch_size_do_not_change_the_rows(model):
    base = tpc.collect(model, PROMPTS, SITE, "token", batch_size=1, progress=False)[SITE]
    for side in ("left", "right"):
        for bs in (2, len(PROMPTS)):
            got = tpc.collect(model, PROMPTS, SITE, "token", batch_size=bs, padding_side=side, progress=False)[SITE]
            assert [g.shape for g in got] == [b.shape for b in base]
            for g, b in zip(got, base, strict=True):
                torch.testing.assert_close(g, b, rtol=1e-4, atol=1e-5)


def test_pooled_collection_is_the_token_rows_pooled(model):
    rows = tpc.collect(model, PROMPTS, SITE, "token", batch_size=3, progress=False)[SITE]
    by_hand = {
        "mean": torch.stack([r.mean(0) for r in rows]),
        "last": torch.stack([r[-1] for r in rows]),
        "max": torch.stack([r.max(0).values for r in rows]),
    }
    for pooling, want in by_hand.items():
        got = tpc.collect(model, PROMPTS, SITE, pooling, batch_size=3, progress=False)[SITE]
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_token_ids_in_place_of_prompts():
    model = named(hf_llama())
    ids, _ = get_adapter(model).tokenize(PROMPTS, chat_template=True, max_tokens=None)
    want = tpc.collect(model, PROMPTS, SITE, "token", chat_template=True, progress=False)[SITE]
    got = tpc.collect(model, tokens=ids, sites=SITE, pooling="token", max_tokens=2, progress=False)[SITE]  # as given
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    pooled = tpc.collect(model, tokens=[torch.tensor(i) for i in ids], sites=SITE, pooling="mean", progress=False)[SITE]
    torch.testing.assert_close(pooled, torch.stack([w.mean(0) for w in want]), rtol=1e-5, atol=1e-6)


def test_token_ids_into_a_store(tmp_path):
    model = named(hf_llama())
    ids, _ = get_adapter(model).tokenize(PROMPTS, chat_template=True, max_tokens=None)
    want = tpc.collect(model, tokens=ids, sites=SITE, pooling="token", progress=False)[SITE]
    st = tpc.collect(
        model, tokens=ids, sites=SITE, pooling="token", store=tmp_path / "s", shard_prompts=4, progress=False
    )[SITE]
    assert st.meta["fixed_prefix"] is None and "tokens_sha256" in st.meta and st.meta["chat_template"] is None
    for g, w in zip(st.sequences(), want, strict=True):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-6, atol=1e-6)
    with pytest.raises(tpc.TPCHooksError, match=r"differs in \['tokens_sha256'\]"):
        tpc.collect(model, tokens=ids[::-1], sites=SITE, pooling="token", store=tmp_path / "s", progress=False)


def test_sae_latents_per_token():
    sae_lens = pytest.importorskip("sae_lens")
    torch.manual_seed(0)
    sae = sae_lens.StandardSAE(sae_lens.StandardSAEConfig(d_in=32, d_sae=48))
    with torch.no_grad():
        for p in sae.parameters():
            p.normal_(0, 0.3)
    model = nnsight_lm(hf_llama())
    rows = tpc.collect(model, PROMPTS, SITE, "token", progress=False)[SITE]
    latents = tpc.collect(model, PROMPTS, SITE, "token", sae=sae, progress=False)[SITE]
    for r, z in zip(rows, latents, strict=True):
        assert z.shape == (r.shape[0], 48)
        with torch.no_grad():
            torch.testing.assert_close(z, sae.encode(r), rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------- stores of sequences
def test_store_round_trip_records_token_rows_and_the_fixed_prefix(tmp_path):
    model = nnsight_lm(hf_llama())
    want = tpc.collect(model, PROMPTS, SITES, "token", chat_template=True, progress=False)
    stores = tpc.collect(
        model,
        PROMPTS,
        SITES,
        "token",
        chat_template=True,
        store=tmp_path / "s",
        shard_prompts=4,
        batch_size=3,
        progress=False,
    )
    skip = get_adapter(model).fixed_prefix(chat_template=True)
    assert skip == 1  # the tiny chat template's "<s>"
    for site in SITES:
        for st in (stores[site], tpc.ActivationStore.open(tmp_path / "s" / site)):
            assert st.holds_sequences and st.n_sequences == len(PROMPTS) and len(st) == sum(len(w) for w in want[site])
            assert st.meta["pooling"] == "token" and st.meta["fixed_prefix"] == skip and st.meta["done"] == len(PROMPTS)
            assert st.lengths().tolist() == [len(w) for w in want[site]]
            seqs = st.sequences()
            assert len(seqs) == len(PROMPTS)
            for s, w in zip(seqs, want[site], strict=True):
                np.testing.assert_allclose(s, w.numpy(), rtol=1e-5, atol=1e-6)
            assert [s.shape for s in st.sequences(2, 5)] == [tuple(w.shape) for w in want[site][2:5]]
            assert st.sequences(3, 3) == []
    manifest = json.loads((tmp_path / "s" / SITE / "manifest.json").read_text())
    assert [s["sequences"] for s in manifest["shards"]] == [4, 2]
    assert all((tmp_path / "s" / SITE / s["lengths"]).is_file() for s in manifest["shards"])
    again = tpc.collect(model, PROMPTS, SITES, "token", chat_template=True, store=tmp_path / "s", progress=False)
    assert again[SITE].n_sequences == len(PROMPTS)  # complete: nothing recomputed, nothing added


def test_store_resumes_after_an_interruption_without_duplicates(tmp_path, monkeypatch):
    model = nnsight_lm(hf_llama())
    prompts = RESUME_PROMPTS
    want = tpc.collect(model, prompts, SITE, "token", progress=False)[SITE]
    interrupt_forward(monkeypatch, get_adapter(model), at=4)
    with pytest.raises(KeyboardInterrupt):
        tpc.collect(model, prompts, SITE, "token", batch_size=2, store=tmp_path / "s", shard_prompts=3, progress=False)
    partial = tpc.ActivationStore.open(tmp_path / "s" / SITE)
    assert partial.n_sequences == 3 and partial.meta["done"] == 3
    # a crash after the next shard and its lengths were renamed into place, before the manifest was rewritten
    root = tmp_path / "s" / SITE
    np.save(root / "shard-000001.npy", np.full((5, 32), 9.0, np.float32))
    np.save(root / "shard-000001.lengths.npy", np.array([5]))
    (root / ".shard-000002.npy.x.tmp").write_bytes(b"partial")
    assert tpc.ActivationStore.open(root).n_sequences == 3
    got = tpc.collect(
        model, prompts, SITE, "token", batch_size=2, store=tmp_path / "s", shard_prompts=3, progress=False
    )[SITE]
    assert got.n_sequences == len(prompts) and len(got) == sum(len(w) for w in want)
    for g, w in zip(tpc.ActivationStore.open(root).sequences(), want, strict=True):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-5, atol=1e-6)


def test_store_of_sequences_errors(tmp_path):
    model = nnsight_lm(hf_llama())
    tpc.collect(model, PROMPTS[:2], SITE, "mean", store=tmp_path / "pooled", progress=False)
    with pytest.raises(tpc.TPCHooksError, match=r"holds pooled rows \(one per prompt\), not per-token sequences"):
        tpc.collect(model, PROMPTS[:2], SITE, "token", store=tmp_path / "pooled", progress=False)
    tpc.collect(model, PROMPTS[:2], SITE, "token", store=tmp_path / "tok", progress=False)
    assert tpc.ActivationStore.open(tmp_path / "tok" / SITE).meta["fixed_prefix"] == 1  # BOS
    with pytest.raises(
        tpc.TPCHooksError,
        match=r"holds a different collection \(differs in \['fixed_prefix', "
        r"'prepend_bos'\]\)",
    ):
        tpc.collect(model, PROMPTS[:2], SITE, "token", prepend_bos=False, store=tmp_path / "tok", progress=False)
    with pytest.raises(
        tpc.TPCHooksError, match=r"pooling must be one of \['mean', 'last', 'max', 'token'\]; got 'tokens'"
    ):
        tpc.collect(model, PROMPTS, SITE, "tokens", progress=False)
    with pytest.raises(tpc.TPCHooksError, match="pass prompts .* or tokens .*, exactly one"):
        tpc.collect(model, PROMPTS, SITE, "token", tokens=[[1, 2]], progress=False)
    with pytest.raises(tpc.TPCHooksError, match="tokens must be a non-empty list of non-empty token id lists"):
        tpc.collect(model, tokens=[[1], []], sites=SITE, pooling="token", progress=False)
    with pytest.raises(tpc.TPCHooksError, match="prompts is empty"):
        tpc.collect(model, [], SITE, "token", progress=False)
    with pytest.raises(tpc.TPCHooksError, match="site 'blocks.9.hook_resid_post' is not valid"):
        tpc.collect(model, PROMPTS, "blocks.9.hook_resid_post", "token", progress=False)

    st = tpc.ActivationStore.create(tmp_path / "seq", d_model=3, sequences=True)
    with pytest.raises(tpc.TPCHooksError, match=r"holds sequences: append\(rows, lengths=\[...\]\) needs"):
        st.append(np.ones((2, 3)))
    with pytest.raises(
        tpc.TPCHooksError, match="lengths must be positive and sum to the 2 rows appended; got 2 lengths summing to 3"
    ):
        st.append(np.ones((2, 3)), lengths=[1, 2])
    with pytest.raises(tpc.TPCHooksError, match="lengths must be positive"):
        st.append(np.ones((2, 3)), lengths=[2, 0])
    with pytest.raises(tpc.TPCHooksError, match=r"sequences \[0, 1\) are outside this store's 0 sequences"):
        st.sequences(0, 1)
    rows = tpc.ActivationStore.create(tmp_path / "rows", d_model=3)
    with pytest.raises(tpc.TPCHooksError, match="holds plain rows, not sequences; append rows without lengths="):
        rows.append(np.ones((2, 3)), lengths=[2])
    with pytest.raises(
        tpc.TPCHooksError, match=r"holds plain rows \(one per prompt\), not sequences: it has no sequences"
    ):
        rows.sequences()
    st.append(np.ones((3, 3)), lengths=[3])
    (tmp_path / "seq" / "shard-000000.lengths.npy").unlink()
    with pytest.raises(tpc.TPCHooksError, match="shard-000000.lengths.npy is listed in .* but missing"):
        tpc.ActivationStore.open(tmp_path / "seq")
