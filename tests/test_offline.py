"""The packaged model's conversion into the cache, on a tiny stand-in (no GGUF is read)."""

import pytest
import transformers
from tiny_models import tokenizer

from tpc_hooks import offline


@pytest.fixture
def converts_to_tiny(tmp_path, monkeypatch):
    """``model_dir`` with the GGUF reader replaced by a tiny Llama: the cache's folder handling is real."""
    monkeypatch.setenv("TPC_HOOKS_CACHE", str(tmp_path))
    monkeypatch.setattr(offline, "gguf_path", lambda name: tmp_path / "packaged" / "model.gguf")
    cfg = transformers.LlamaConfig(
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        vocab_size=40,
    )
    tiny, tok = transformers.LlamaForCausalLM(cfg), tokenizer()
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: tok)
    return tiny, tok


def test_a_conversion_renames_its_folder_into_place_whole(tmp_path, monkeypatch, converts_to_tiny):
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: converts_to_tiny[0])
    out = offline.model_dir()
    assert out == tmp_path / offline.DEFAULT_MODEL and (out / "config.json").is_file()
    assert [p.name for p in tmp_path.iterdir() if p.is_dir() and p.name != "packaged"] == [out.name]  # no .partial
    assert offline.model_dir() == out  # converted once: found in the cache


def test_two_processes_converting_at_once_leave_the_first_whole_folder(tmp_path, monkeypatch, converts_to_tiny):
    """One that finds the model converted by another process meanwhile keeps that folder and removes its
    own (CI converts in two environments side by side)."""
    out = tmp_path / offline.DEFAULT_MODEL

    def the_other_finishes_first(*args, **kwargs):  # while this process dequantises, another renames its folder in
        for part in converts_to_tiny:
            part.save_pretrained(out)
        (out / "by").write_text("the other process")
        return converts_to_tiny[0]

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", the_other_finishes_first)
    assert offline.model_dir() == out
    assert (out / "by").read_text() == "the other process"
    assert [p.name for p in tmp_path.iterdir() if p.is_dir() and p.name != "packaged"] == [out.name]  # no .partial


def test_each_sae_recipe_is_its_own_cached_sae(tmp_path, monkeypatch):
    """The quick recipe (fewer epochs) and another seed train SAEs of their own; the default's loads again."""
    from tpc_hooks import adapters

    monkeypatch.setenv("TPC_HOOKS_CACHE", str(tmp_path))
    trained = []

    def train(path, site, model, **recipe):
        trained.append((recipe["epochs"], recipe["seed"]))
        path.mkdir(parents=True)
        (path / "report.json").write_text("{}")

    monkeypatch.setattr(offline, "_train", train)
    monkeypatch.setattr(adapters, "read_sae", lambda path: path)
    default, quick = offline.load_sae(), offline.load_sae(epochs=offline.QUICK_SAE_EPOCHS)
    seeded, again = offline.load_sae(seed=1), offline.load_sae()
    assert len({default, quick, seeded}) == 3 and again == default
    assert trained == [(16, 0), (offline.QUICK_SAE_EPOCHS, 0), (16, 1)]
