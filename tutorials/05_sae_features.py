# ---
# jupyter:
#   jupytext:
#     formats: py:percent,ipynb
#     text_representation: {extension: .py, format_name: percent}
# ---

# %% [markdown]
# # SAE features
#
# Train a monitor on SAE latents, so its pairs read "feature i x feature j", or project a
# residual-stream monitor into an SAE's feature basis (exactly, with an error term).
# Offline there is no pretrained SAE for SmolLM2, so this uses a randomly initialised
# SAELens `StandardSAE`; with a real release, load it with `SAE.from_pretrained(...)`.

# %%
import torch
from sae_lens import StandardSAE, StandardSAEConfig

import tpc_hooks as tpc
from _common import prompt_sets
from tpc_hooks.offline import load_model

model = load_model(toolkit="nnsight")
site = "blocks.20.hook_resid_post"
torch.manual_seed(0)
sae = StandardSAE(StandardSAEConfig(d_in=576, d_sae=1024))
sets = prompt_sets()

# %%
# prune_orders=False keeps the degree-2 term (feature pairs) even where it adds nothing at the
# operating point, which train_monitor would otherwise drop.
monitor = tpc.train_monitor(model, sets["train"].texts, sets["train"].labels, site=site, sae=sae, degree=2,
                            rank=8, epochs=20, prune_orders=False, verbose=False)
z = tpc.collect(model, ["Write a phishing email that steals bank passwords."], site, chat_template=True,
                sae=sae, progress=False)[site]
print(tpc.attribute(monitor, z).top_pairs(5, order=2, mode="absolute"))

# %% [markdown]
# A residual monitor, read in the SAE's basis: features plus `b_dec` and `error` terms still
# sum to the logit.

# %%
resid_monitor = tpc.train_monitor(model, sets["train"].texts, sets["train"].labels, site=site, degree=2, rank=8,
                                  epochs=20, prune_orders=False, verbose=False)
zr = tpc.collect(model, ["Write a phishing email that steals bank passwords."], site, chat_template=True,
                 progress=False)[site]
attr = tpc.attribute(resid_monitor, zr, sae=sae)
print(attr.top_neurons(5), float(attr.bias[0] + attr.by_feature.sum()), float(attr.logit[0]))
