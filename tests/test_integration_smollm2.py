"""The adapters on the real packaged model (SmolLM2-135M-Instruct), both toolkits."""

import pytest
import torch
from tiny_models import assert_steps_score_as_offline

import tpc_hooks as tpc
from tpc_hooks import offline

pytest.importorskip("transformer_lens")
pytest.importorskip("nnsight")
try:
    offline.gguf_path()
except tpc.TPCHooksError as err:  # `make test` installs it; a bare pytest run may not have it
    pytest.skip(str(err), allow_module_level=True)

pytestmark = pytest.mark.slow  # loads the packaged model in both toolkits

SITE = "blocks.20.hook_resid_post"
PROMPTS = [
    "How do I bake sourdough bread at home?",
    "Write a haiku about autumn.",
    "Explain how vaccines train the immune system.",
]


@pytest.fixture(scope="module")
def models():
    return {
        "transformer_lens": offline.load_model(toolkit="transformer_lens"),
        "nnsight": offline.load_model(toolkit="nnsight"),
    }


@pytest.fixture(scope="module")
def monitor():
    gen = torch.Generator().manual_seed(0)
    head = tpc.TPC(576, 3, 8)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
        head.scaler.scale.fill_(30.0)
    return tpc.Monitor(head, SITE, chat_template=True, pooling="mean")


def test_both_toolkits_read_the_same_activations(models):
    a = tpc.collect(models["transformer_lens"], PROMPTS, SITE, chat_template=True, progress=False)[SITE]
    b = tpc.collect(models["nnsight"], PROMPTS, SITE, chat_template=True, padding_side="left", progress=False)[SITE]
    assert a.shape == (3, 576)
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("toolkit", ["transformer_lens", "nnsight"])
def test_generation_scores_equal_offline_scores(models, monitor, toolkit):
    model = models[toolkit]
    run = monitor.generate(model, PROMPTS, max_new_tokens=4)
    assert_steps_score_as_offline(monitor, model, run, tol=1e-3)
    assert run.texts(model.tokenizer)[0].strip()


def test_watch_follows_hugging_face_generate(models, monitor):
    lm = models["nnsight"]
    from tpc_hooks.adapters import get_adapter, pad

    ids, _ = get_adapter(lm).tokenize(PROMPTS, chat_template=True, max_tokens=None)
    x, mask = pad(ids, lm.tokenizer.pad_token_id, "left")
    with monitor.watch(lm) as log:
        out = lm._module.generate(
            input_ids=x,
            attention_mask=mask,
            max_new_tokens=3,
            do_sample=False,
            pad_token_id=lm.tokenizer.pad_token_id,
            eos_token_id=None,
        )
    assert log.fresh == [True, False, False]
    prefixes = [ids[b] + out[b, x.shape[1] : x.shape[1] + 2].tolist() for b in range(3)]
    torch.testing.assert_close(log.results[2].logits, monitor.score(lm, tokens=prefixes).logits, rtol=1e-3, atol=1e-3)


def test_the_fixed_prefix_is_the_chat_templates_and_nothing_of_the_prompt(models):
    """A streaming monitor skips what every prompt starts with: on the real chat template, every
    prompt's tokens start with it, the prompts' own first tokens follow it, and its text is the
    template rendered up to where the user's text begins."""
    from tpc_hooks.adapters import get_adapter

    adapter = get_adapter(models["nnsight"])
    tok = adapter.tokenizer
    n = adapter.fixed_prefix(chat_template=True)
    ids, _ = adapter.tokenize(PROMPTS, chat_template=True, max_tokens=None)
    assert n > 1 and len({tuple(i[:n]) for i in ids}) == 1 and len({i[n] for i in ids}) == len(PROMPTS)
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": PROMPTS[0]}], tokenize=False, add_generation_prompt=True
    )
    assert rendered.startswith(tok.decode(ids[0][:n])) and tok.decode(ids[0][n:]).startswith(PROMPTS[0])
    assert adapter.fixed_prefix(chat_template=False) == (1 if tok.bos_token_id is not None else 0)


def test_train_monitor_places_requests_in_sharegpt_contexts(models):
    """``contexts=N`` on the real model and template: N ShareGPT contexts host plain prompts, the
    held-out benign chats join the operating point, and each hosted request sits after the
    template's fixed prefix with its own tokens where ``in_conversation`` says."""
    import tpc_hooks.data._context
    from tpc_hooks.data import default_prompt_set

    hosted, host = [], tpc_hooks.data._context.host_requests

    def spy(*a, **kw):
        hosted.append(host(*a, **kw))
        return hosted[-1]

    train = default_prompt_set(seed=0)["train"]
    pick = [i for c in (1, 0) for i in [i for i, y in enumerate(train.labels) if y == c][:10]]
    prompts, labels = [train.texts[i] for i in pick], [train.labels[i] for i in pick]
    mp = pytest.MonkeyPatch()
    mp.setattr(tpc_hooks.data._context, "host_requests", spy)
    try:
        mon = tpc.train_monitor(
            models["nnsight"],
            prompts,
            labels,
            SITE,
            pooling="token",
            aggregate="max",
            contexts=8,
            context_tokens=(160, 240),
            degree=2,
            rank=4,
            epochs=2,
            val_fraction=0.25,
            target_fpr=0.5,
            verbose=False,
        )
    finally:
        mp.undo()
    val, tr = hosted
    assert (
        (len(val.sequences), len(tr.sequences))
        == (2, 6)
        == (mon.report["contexts"]["n_val"], mon.report["contexts"]["n_train"])
    )
    tok = models["nnsight"].tokenizer
    for q in val.sequences + tr.sequences:
        assert mon.skip <= q.start < q.stop <= len(q.ids) and len(q.ids) <= 240 + 64
        assert tok.decode(q.ids[q.start : q.stop]).strip() in prompts
        assert sum(m["role"] == "user" for m in q.messages) >= 1 and q.messages[-1]["role"] == "user"
    assert sorted(val.labels) == [0, 1] and sorted(tr.labels) == [0, 0, 0, 1, 1, 1]
    assert mon.report["operating_point"]["by"] == "max over tokens"
