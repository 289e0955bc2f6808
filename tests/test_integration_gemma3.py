"""The paper's family on a real checkpoint: the packaged Gemma-3-270M (base, 18 layers, d_model
640, loaded through transformers' GGUF reader as ``Gemma3ForCausalLM``), in every adapter that
loads it: plain transformers, nnsight and TransformerLens' TransformerBridge."""

import pytest
import torch
from tiny_models import assert_steps_score_as_offline, random_head

import tpc_hooks as tpc
from tpc_hooks import offline
from tpc_hooks.adapters import get_adapter

pytest.importorskip("transformer_lens")
pytest.importorskip("nnsight")
try:
    offline.gguf_path("gemma-3-270m")
except tpc.TPCHooksError as err:  # `make install` installs the four parts; a bare pytest run may not have them
    pytest.skip(str(err), allow_module_level=True)

pytestmark = pytest.mark.slow  # loads a real model in three toolkits

NAME = "gemma-3-270m"
SITE = "blocks.12.hook_resid_post"
PROMPTS = [
    "How do I bake sourdough bread at home?",
    "Write a haiku about autumn.",
    "Explain how vaccines train the immune system.",
]
TOOLKITS = ("transformers", "nnsight", "transformer_lens")


@pytest.fixture(scope="module")
def models():
    return {t: offline.load_model(NAME, toolkit=t) for t in TOOLKITS}


@pytest.fixture(scope="module")
def reference():
    """The model's own hidden states (``output_hidden_states``), one unpadded prompt at a time."""
    hf, _ = offline.load_hf(NAME)
    return hf


@pytest.fixture(scope="module")
def monitor():
    return tpc.Monitor(random_head(640, 3, 8, std=0.05, scale=30.0), SITE, chat_template=False, pooling="mean")


def test_the_packaged_checkpoint_is_gemma_3(models):
    adapter = get_adapter(models["transformers"])
    assert type(models["transformers"]).__name__ == "Gemma3ForCausalLM"
    assert (adapter.n_layers, adapter.d_model) == (18, 640)
    assert not getattr(adapter.tokenizer, "chat_template", None)  # a base model: prompts are read as they are


@pytest.mark.parametrize("toolkit", TOOLKITS)
def test_collect_reads_the_models_own_hidden_states(models, reference, toolkit):
    model = models[toolkit]
    acts = tpc.collect(model, PROMPTS, [SITE, "blocks.0.hook_resid_pre"], "mean", batch_size=3, progress=False)
    ids, _ = get_adapter(model).tokenize(PROMPTS, chat_template=False, max_tokens=None)
    for i, row in enumerate(ids):
        with torch.no_grad():
            hs = reference(input_ids=torch.tensor([row]), output_hidden_states=True).hidden_states
        torch.testing.assert_close(acts[SITE][i], hs[13][0].mean(0), rtol=1e-4, atol=1e-3)
        torch.testing.assert_close(acts["blocks.0.hook_resid_pre"][i], hs[0][0].mean(0), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("toolkit", TOOLKITS)
def test_the_sites_inside_a_block_add_up_to_the_models_own_hidden_states(models, reference, toolkit):
    """Gemma 3 normalises each branch before adding it: hook_attn_out and hook_mlp_out are those
    norms' outputs, and hs[L] + attn_out = resid_mid, resid_mid + mlp_out = hs[L + 1]."""
    model, layer = models[toolkit], 7
    sites = [f"blocks.{layer}.hook_attn_out", f"blocks.{layer}.hook_resid_mid", f"blocks.{layer}.hook_mlp_out"]
    adapter = get_adapter(model)
    row = adapter.tokenize(PROMPTS[:1], chat_template=False, max_tokens=None)[0][0]
    got = adapter.forward_sites(
        torch.tensor([row]), torch.ones(1, len(row), dtype=torch.long), [adapter.site(s) for s in sites]
    )
    attn, mid, mlp = (got[s][0] for s in sites)
    with torch.no_grad():
        hs = reference(input_ids=torch.tensor([row]), output_hidden_states=True).hidden_states
    scale = float(hs[layer + 1].abs().max())
    torch.testing.assert_close(hs[layer][0] + attn, mid, rtol=1e-4, atol=1e-5 * scale)
    torch.testing.assert_close(mid + mlp, hs[layer + 1][0], rtol=1e-4, atol=1e-5 * scale)


@pytest.mark.parametrize("toolkit", TOOLKITS)
def test_generation_scores_equal_offline_scores(models, monitor, toolkit):
    model = models[toolkit]
    run = monitor.generate(model, PROMPTS, max_new_tokens=4)
    assert_steps_score_as_offline(monitor, model, run, tol=1e-3)
    assert run.texts(get_adapter(model).tokenizer)[0].strip()


def test_a_split_gguf_is_joined_once_whole_and_a_missing_part_names_its_install(tmp_path, monkeypatch):
    """The parts are joined in order into the cache (the join equals the parts end to end); a
    packaged model whose part is not installed says which package and how to install it."""
    monkeypatch.setenv("TPC_HOOKS_CACHE", str(tmp_path))
    joined = offline.gguf_path(NAME)
    spec = offline.PACKAGED[NAME]
    parts = [offline._part(pkg, file, spec.install) for pkg, file in spec.parts]
    assert joined.parent == tmp_path / "gguf" and joined.stat().st_size == sum(p.stat().st_size for p in parts)
    with open(joined, "rb") as f:
        for p in parts:  # each part, byte for byte, where the join puts it
            data = p.read_bytes()
            assert f.read(len(data)) == data
    assert offline.gguf_path(NAME) == joined  # whole already: not joined again
    broken = offline.Packaged("x.gguf", (("no_such_package_part1", "x"),), "pip install no-such-package", "")
    monkeypatch.setitem(offline.PACKAGED, "broken", broken)
    with pytest.raises(
        tpc.TPCHooksError, match=r"needs the 'no-such-package-part1' package: pip install no-such-package"
    ):
        offline.gguf_path("broken")
    with pytest.raises(
        tpc.TPCHooksError,
        match=r"no packaged model named 'nope'; packaged: \['SmolLM2-135M-Instruct', "
        r"'broken', 'gemma-3-270m'\]",
    ):
        offline.model_dir("nope")
