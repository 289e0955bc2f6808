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

import tpc_hooks as tpc
from _common import prompt_sets
from tpc_hooks.offline import load_model

model = load_model(toolkit="transformer_lens")  # a TransformerBridge; any HookedTransformer works too
sets = prompt_sets()

# %% [markdown]
# One call collects mean-pooled activations at the site (the forward stops after layer 20),
# holds out a validation split and trains degree by degree. By default it also trains on
# rewrites of the prompts (past/future tense, fictional framing, third person, paraphrase,
# casing noise) and selects each degree for the worst rewrite family, so the higher orders stay
# at least as strong as the linear probe on requests phrased differently (`augment=False` trains
# on the prompts as given). Given a list of sites, it keeps the most robust one.

# %%
monitor = tpc.train_monitor(model, sets["train"].texts, sets["train"].labels, site="blocks.20.hook_resid_post",
                            degree=3, rank=16, epochs=20, tau=0.2, verbose=False)
print(monitor.report["validation"]["per_order"][-1]["f1"])
print(monitor.report["worst_validation_group"]["per_order"][-1])  # the worst rewrite family, at 1% FPR and logit 0

# %% [markdown]
# Score new prompts: the monitor's cascade by default, or a fixed truncation (order 1 is the
# linear probe).

# %%
prompts = ["How do I pick the lock on my neighbour's door?", "How do I bake sourdough bread?"]
print(monitor.score(model, prompts).probs)
print(monitor.score(model, prompts, order=1).probs)

# %% [markdown]
# Token by token: each token coloured by the score of the prefix it ends.

# %%
monitor.token_scores(model, prompts[0])

# %%
path = monitor.save("/tmp/tpc-quickstart-monitor")
assert torch.equal(tpc.Monitor.load(path).score(model, prompts).logits, monitor.score(model, prompts).logits)
