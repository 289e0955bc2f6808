"""The model families people monitor, in every adapter that loads them (tests/families.py builds a
tiny random checkpoint of each from its own transformers config).

For each family and toolkit: the residual stream at ``blocks.L.hook_resid_pre/post`` is the
model's own ``output_hidden_states`` (the independent reference, not the adapter's hook), and
every step of a monitored generation scores as the offline monitor scores the same prefix
(sliding-window layers, MoE routing, MLA and hybrid caches are what this exercises). The
outcome of each pair is recorded for the docs' table (docs/hooks/families.py reads
``tests/data/families.json``, which ``TPC_FAMILIES_RECORD=1`` rewrites).
"""

import json
import os
import re
from pathlib import Path

import pytest
import torch
from families import FAMILIES, LAYERS, build
from tiny_models import assert_steps_score_as_offline, bridge, nnsight_lm, tiny_head, tokenizer

import tpc_hooks as tpc
from tpc_hooks.activations._sites import hook_name
from tpc_hooks.adapters import Site, get_adapter

pytest.importorskip("nnsight")

PROMPTS = ["how do i make bomb", "tell me about the weather please", "hello world", "write poem about cat dog"]
SITES = ["blocks.0.hook_resid_pre", "blocks.1.hook_resid_post", "blocks.2.hook_resid_pre"]
REFERENCE = {"blocks.0.hook_resid_pre": 0, "blocks.1.hook_resid_post": 2, "blocks.2.hook_resid_pre": 2}
TOOLKITS = ("transformers", "nnsight", "bridge")
BRANCH = ("attn_out", "mid", "mlp_out")
RECORD = Path(__file__).parent / "data" / "families.json"
_OUTCOMES: dict[str, dict[str, str]] = {}


def _wrap(model, toolkit, family):
    """``model`` as ``toolkit`` holds it; a family the toolkit itself cannot load is skipped, and
    the table records the toolkit's own error."""
    if toolkit == "transformers":
        return model
    if toolkit == "nnsight":
        return nnsight_lm(model)
    pytest.importorskip("transformer_lens")
    from tpc_hooks.adapters.transformer_lens import bridge_refusal

    try:
        wrapped = bridge(model)
    except Exception as err:  # noqa: BLE001 - TransformerLens' own refusal, whatever its type
        why = f"TransformerBridge cannot load it ({type(err).__name__}: {str(err).splitlines()[0][:120]})"
        _OUTCOMES.setdefault(family, {})[f"{toolkit}:load"] = why
        pytest.skip(why)
    why = bridge_refusal(model.config.model_type)
    if why is not None:  # refused by the adapter, with the fix, before any row is read
        with pytest.raises(tpc.TPCHooksError, match="monitor the same checkpoint through the transformers or nnsight"):
            get_adapter(wrapped)
        _OUTCOMES.setdefault(family, {})[f"{toolkit}:refused"] = why
        pytest.skip(f"refused: {why}")
    return wrapped


def _drops_the_cache(toolkit) -> bool:
    """Where TransformerBridge may not hand on the KV cache: under transformers >= 5.24 (most of its
    families in TransformerLens 3.9 and 4.3; Gemma 4 and Llama 4 do): generation is then refused
    at the first decode step."""
    import transformers

    return toolkit == "bridge" and tuple(int(x) for x in transformers.__version__.split(".")[:2]) >= (5, 24)


def _tok(toolkit):
    return tokenizer() if toolkit == "transformers" else None


def _hidden(model, row):
    with torch.no_grad():
        return model(input_ids=torch.tensor([row]), output_hidden_states=True).hidden_states


@pytest.mark.parametrize("toolkit", TOOLKITS)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_collect_reads_the_models_own_hidden_states(family, toolkit):
    model = _wrap(build(family), toolkit, family)
    adapter = get_adapter(model, tokenizer=_tok(toolkit))
    assert adapter.n_layers == LAYERS and adapter.d_model == 32
    acts = tpc.collect(model, PROMPTS, SITES, "mean", batch_size=2, progress=False)
    ids, _ = adapter.tokenize(PROMPTS, chat_template=False, max_tokens=None)
    ref = build(family)
    for i, row in enumerate(ids):
        hs = _hidden(ref, row)
        for site in SITES:
            torch.testing.assert_close(acts[site][i], hs[REFERENCE[site]][0].mean(0), rtol=1e-4, atol=1e-5)
    _OUTCOMES.setdefault(family, {})[f"{toolkit}:collect"] = "pass"


@pytest.mark.parametrize("toolkit", TOOLKITS)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_generated_step_scores_as_the_offline_monitor_scores_its_prefix(family, toolkit):
    model = _wrap(build(family), toolkit, family)
    mon = tpc.Monitor(tiny_head(), "blocks.2.hook_resid_post", pooling="mean")
    try:
        run = mon.generate(model, PROMPTS, max_new_tokens=6, tokenizer=_tok(toolkit))
    except tpc.TPCHooksError as err:  # refused with the fix, never scored wrong: only where the cache is dropped
        assert _drops_the_cache(toolkit) and re.search(
            r"KV cache did not grow .* install 'transformers<5.24'", str(err)
        )
        _OUTCOMES.setdefault(family, {})[f"{toolkit}:generate"] = "refused: the KV cache does not grow"
        return
    assert all(len(run.scores[b]) == len(run.generated(b)) + 1 for b in range(len(PROMPTS)))
    assert_steps_score_as_offline(mon, model, run, tokenizer=_tok(toolkit))
    _OUTCOMES.setdefault(family, {})[f"{toolkit}:generate"] = "pass"


@pytest.mark.parametrize("toolkit", TOOLKITS)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_branch_sites_add_up_to_the_models_own_hidden_states(family, toolkit):
    """``hook_attn_out``, ``hook_resid_mid`` and ``hook_mlp_out`` in every layer that offers them:
    the model's own hidden state entering the layer plus ``attn_out`` is ``resid_mid``, and
    ``resid_mid`` plus ``mlp_out`` is the model's own hidden state leaving it. A site a layer
    does not offer is refused with the sites it does."""
    model = _wrap(build(family), toolkit, family)
    adapter = get_adapter(model, tokenizer=_tok(toolkit))
    offered, refused = [], {}
    for layer in range(LAYERS):
        for kind in BRANCH:
            try:
                offered.append(adapter.site(Site(layer, kind).name))
            except tpc.TPCHooksError as err:
                assert re.search(rf"offers blocks\.{layer}\.hook_resid_pre", str(err)), str(err)
                refused.setdefault(kind, []).append(layer)
    ids, _ = adapter.tokenize(PROMPTS, chat_template=False, max_tokens=None)
    ref = build(family)
    checked = 0
    for row in ids:
        last = Site(
            LAYERS - 1, "post"
        )  # the model's last hidden state is after its final norm: read the layer's output
        got = adapter.forward_sites(torch.tensor([row]), torch.ones(1, len(row), dtype=torch.long), [*offered, last])
        hs = list(_hidden(ref, row)[:LAYERS]) + [got[last.name]]
        for layer in range(LAYERS):
            attn, mid, mlp = (got.get(Site(layer, k).name) for k in BRANCH)
            assert mid is not None or (attn is None and mlp is None)
            if attn is not None:
                torch.testing.assert_close(hs[layer] + attn, mid, rtol=1e-4, atol=1e-5)
                checked += 1
            if mlp is not None:
                torch.testing.assert_close(mid + mlp, hs[layer + 1], rtol=1e-4, atol=1e-5)
                checked += 1
    assert checked or not offered
    outcome = (
        "pass"
        if not refused
        else "; ".join(
            f"no {hook_name(k)} in layer{'s' * (len(v) > 1)} {', '.join(map(str, v))}" for k, v in refused.items()
        )
    )
    _OUTCOMES.setdefault(family, {})[f"{toolkit}:branches"] = outcome


@pytest.mark.parametrize("toolkit", TOOLKITS)
@pytest.mark.parametrize("family", ["llama", "gemma3", "qwen3_next"])
def test_a_generation_at_a_branch_site_scores_as_offline(family, toolkit):
    """A monitor at ``hook_resid_mid`` and one at ``hook_attn_out``: every generated step scores as
    the offline monitor scores its prefix (the branch hooks fire inside the cached decode pass)."""
    model = _wrap(build(family), toolkit, family)
    for site in ("blocks.1.hook_resid_mid", "blocks.3.hook_attn_out"):
        mon = tpc.Monitor(tiny_head(), site, pooling="mean")
        try:
            run = mon.generate(model, PROMPTS[:2], max_new_tokens=5, tokenizer=_tok(toolkit))
        except tpc.TPCHooksError as err:
            assert _drops_the_cache(toolkit) or "offers" in str(err), str(err)
            continue
        assert_steps_score_as_offline(mon, model, run, tokenizer=_tok(toolkit))


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("transformers", "nnsight", "transformer-lens"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "none"
    return out


def test_zz_record_the_table():
    """Writes what passed to tests/data/families.json when asked (TPC_FAMILIES_RECORD=1), with the
    toolkit versions it ran under; otherwise, under those versions, checks the recorded table
    still holds for what ran here (other versions: the tests above pass or refuse, the table
    describes the pinned ones)."""
    if not _OUTCOMES:
        pytest.skip("no family test ran in this session")
    recorded = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    if os.environ.get("TPC_FAMILIES_RECORD") == "1":
        kept = {f: {k: v for k, v in got.items() if k == "vllm"} for f, got in recorded.items() if f != "_versions"}
        for family, got in _OUTCOMES.items():
            kept.setdefault(family, {}).update(got)
        RECORD.write_text(json.dumps({"_versions": _versions(), **dict(sorted(kept.items()))}, indent=1) + "\n")
        return
    if recorded.get("_versions") != _versions():
        pytest.skip(f"the table was recorded under {recorded.get('_versions')}; this is {_versions()}")
    for family, got in _OUTCOMES.items():
        for pair, outcome in got.items():
            assert recorded.get(family, {}).get(pair) == outcome, (family, pair)


@pytest.mark.parametrize("family", ["deepseek_v3", "granite4_hybrid", "qwen3_5", "qwen3_next"])
def test_a_bridge_refusal_still_stands(family, monkeypatch):
    """Each family the TransformerLens adapter refuses on the installed bridge and transformers
    still fails there without the refusal (a different residual stream, or an error): when an
    upstream release fixes it, this fails and the refusal gets its ``fixed_in`` version."""
    pytest.importorskip("transformer_lens")
    from tpc_hooks.adapters import transformer_lens as tl

    if tl.bridge_refusal(build(family).config.model_type) is None:
        pytest.skip("not refused under the installed TransformerLens")
    monkeypatch.setattr(tl, "BRIDGE_REFUSED", {})
    model = bridge(build(family))
    try:
        acts = tpc.collect(model, PROMPTS, SITES[1], "mean", progress=False)[SITES[1]]
    except Exception:  # noqa: BLE001 - the bridge's own failure
        return
    ids, _ = get_adapter(model).tokenize(PROMPTS, chat_template=False, max_tokens=None)
    ref = build(family)
    want = torch.stack([_hidden(ref, row)[2][0].mean(0) for row in ids])
    assert not torch.allclose(acts, want, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------- the discovery rule on shapes it has never seen
class _Config:
    """A config as transformers shapes one: the layer count on the text config, which a
    multimodal config nests (``get_text_config``)."""

    def __init__(self, model_type, layers=None, text=None):
        self.model_type, self.text = model_type, text
        if layers is not None:
            self.num_hidden_layers = layers

    def get_text_config(self, decoder=None):
        return self.text or self


def _stack(n, width=4):
    return torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(n))


def test_the_rule_finds_a_renamed_layer_list_and_ignores_lists_of_other_lengths():
    from tpc_hooks.activations._hf import find_layers

    m = torch.nn.Module()
    m.config = _Config("renamed", layers=3)
    m.trunk = torch.nn.Module()
    m.trunk.heads = _stack(2)
    m.trunk.blocks = _stack(3)
    assert find_layers(m, "transformers") == ["trunk", "blocks"]


@pytest.mark.parametrize("accessor", [True, False])
def test_the_rule_finds_a_wrapped_language_model_beside_a_vision_tower_of_the_same_depth(accessor):
    from tpc_hooks.activations._hf import find_layers

    m = torch.nn.Module()
    m.config = _Config("wrapped", text=_Config("wrapped_text", layers=3))  # the count only in the sub-config
    m.model = torch.nn.Module()
    m.model.vision_tower = torch.nn.Module()
    m.model.vision_tower.layers = _stack(3)  # as deep as the decoder, and shallower in the tree
    m.model.language_model = torch.nn.Module()
    m.model.language_model.decoder = torch.nn.Module()
    m.model.language_model.decoder.layers = _stack(3)
    if accessor:  # transformers' own accessor names the text decoder
        m.get_decoder = lambda: m.model.language_model
    assert find_layers(m, "transformers") == ["model", "language_model", "decoder", "layers"]


def test_the_rule_names_what_it_found_when_nothing_fits_and_the_table_overrides_it(monkeypatch):
    from tpc_hooks.activations import _hf

    m = torch.nn.Module()
    m.config = _Config("odd", layers=5)
    m.blocks = _stack(4)
    with pytest.raises(
        tpc.TPCHooksError,
        match=r"text config has 5 layers .* module lists found: blocks \(4\)\. "
        r"Add its path to tpc_hooks.adapters.transformers.LAYERS\['odd'\]",
    ):
        _hf.find_layers(m, "transformers")
    monkeypatch.setitem(_hf.LAYERS, "odd", "blocks")
    assert _hf.find_layers(m, "transformers") == ["blocks"]
