import numpy as np
import pytest

import tpc_hooks as tpc
from tpc_hooks import ActivationStore


def test_append_read_and_reopen(tmp_path):
    rows = np.arange(70, dtype=np.float32).reshape(14, 5)
    st = ActivationStore.create(tmp_path / "s", d_model=5, meta={"site": "blocks.0.hook_resid_post"})
    for a, b in [(0, 3), (3, 10), (10, 14)]:
        st.append(rows[a:b], meta={"done": b})
    back = ActivationStore.open(tmp_path / "s")
    assert len(back) == 14 and back.d_model == 5
    assert back.meta == {"site": "blocks.0.hook_resid_post", "done": 14}
    np.testing.assert_array_equal(back.to_numpy(), rows)
    np.testing.assert_array_equal(back.read(2, 11), rows[2:11])
    chunks = list(back.iter_chunks(4))
    assert [s for s, _ in chunks] == [0, 4, 8, 12]
    np.testing.assert_array_equal(np.concatenate([c for _, c in chunks]), rows)


def test_interrupted_append_loses_and_duplicates_nothing(tmp_path):
    st = ActivationStore.create(tmp_path / "s", d_model=3)
    st.append(np.ones((2, 3)))
    # a crash after the shard was renamed but before the manifest was rewritten
    np.save(tmp_path / "s" / "shard-000001.npy", np.full((5, 3), 9.0, np.float32))
    (tmp_path / "s" / ".shard-000002.npy.x.tmp").write_bytes(b"partial")
    again = ActivationStore.open(tmp_path / "s")
    assert len(again) == 2
    again.append(np.zeros((4, 3)))
    final = ActivationStore.open(tmp_path / "s")
    assert len(final) == 6
    np.testing.assert_array_equal(final.to_numpy(), np.r_[np.ones((2, 3)), np.zeros((4, 3))])


def test_store_errors(tmp_path):
    st = ActivationStore.create(tmp_path / "s", d_model=3)
    with pytest.raises(tpc.TPCHooksError, match=r"rows must have shape \[n, 3\]; got \(2, 4\)"):
        st.append(np.ones((2, 4)))
    with pytest.raises(tpc.TPCHooksError, match="rows contain NaN/inf"):
        st.append(np.full((1, 3), np.nan))
    with pytest.raises(tpc.TPCHooksError, match="already holds an activation store"):
        ActivationStore.create(tmp_path / "s", d_model=3)
    with pytest.raises(tpc.TPCHooksError, match="holds activations with d_model=3, not 4"):
        ActivationStore.create(tmp_path / "s", d_model=4, exist_ok=True)
    with pytest.raises(tpc.TPCHooksError, match="is not an activation store"):
        ActivationStore.open(tmp_path / "nothing")
    st.append(np.ones((1, 3)))
    (tmp_path / "s" / "shard-000000.npy").unlink()
    with pytest.raises(tpc.TPCHooksError, match="shard-000000.npy is listed in .* but missing"):
        ActivationStore.open(tmp_path / "s")


def test_a_resume_with_another_shard_size_and_another_site_completes_every_site(tmp_path, monkeypatch):
    """Interrupted at a prompt that is no multiple of the new shard size, resumed with a second site:
    every site holds every prompt once, equal to an uninterrupted collection."""
    from tiny_models import RESUME_PROMPTS, hf_llama, interrupt_forward, nnsight_lm

    from tpc_hooks.adapters import get_adapter

    model = nnsight_lm(hf_llama())
    prompts = RESUME_PROMPTS * 6  # 60 prompts
    sites = ["blocks.1.hook_resid_post", "blocks.0.hook_resid_post"]
    want = tpc.collect(model, prompts, sites, progress=False)
    with monkeypatch.context() as m:
        interrupt_forward(m, get_adapter(model), at=5)
        with pytest.raises(KeyboardInterrupt):
            tpc.collect(model, prompts, sites[0], batch_size=4, store=tmp_path / "s", shard_prompts=4, progress=False)
    assert tpc.ActivationStore.open(tmp_path / "s" / sites[0]).meta["done"] == 16
    got = tpc.collect(model, prompts, sites, batch_size=4, store=tmp_path / "s", shard_prompts=12, progress=False)
    for s in sites:
        assert len(got[s]) == len(prompts) and got[s].meta["done"] == len(prompts)
        np.testing.assert_allclose(got[s].to_numpy(), want[s].numpy(), rtol=1e-5, atol=1e-6)


def test_reopening_a_store_to_write_removes_what_an_interrupted_append_left(tmp_path):
    st = tpc.ActivationStore.create(tmp_path / "s", 4)
    st.append(np.ones((3, 4)))
    (tmp_path / "s" / ".shard-000001.npy.abc.tmp").write_bytes(b"partial")  # killed mid-write
    (tmp_path / "s" / ".manifest.xyz.tmp").write_text("{")
    np.save(tmp_path / "s" / "shard-000001.npy", np.zeros((2, 4), np.float32))  # written, never listed
    assert len(tpc.ActivationStore.open(tmp_path / "s")) == 3  # reading leaves them
    again = tpc.ActivationStore.create(tmp_path / "s", 4, exist_ok=True)
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == ["manifest.json", "shard-000000.npy"]
    again.append(np.zeros((2, 4)))
    assert len(tpc.ActivationStore.open(tmp_path / "s")) == 5
