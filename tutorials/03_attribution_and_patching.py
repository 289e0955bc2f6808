# ---
# jupyter:
#   jupytext:
#     formats: py:percent,ipynb
#     text_representation: {extension: .py, format_name: percent}
# ---

# %% [markdown]
# # Attribution: which neurons and pairs flag a prompt, then patch them with TransformerLens
#
# A TPC's logit splits exactly into orders, neurons and neuron pairs. Here we find the top
# neurons for a flagged prompt and zero them with a TransformerLens hook to watch the score move.

# %%
import torch
from _common import prompt_sets

import tpc_hooks as tpc
from tpc_hooks.offline import load_model

model = load_model(toolkit="transformer_lens")
sets = prompt_sets()
site = "blocks.20.hook_resid_post"
# `tpc.recipes.default(prune_orders=False)` keeps every trained order, so the degree-2 and degree-3
# parts can be read even where they add nothing at the operating point (by default train_monitor
# drops such orders).
monitor = tpc.train_monitor(
    model,
    sets["train"].texts,
    sets["train"].labels,
    site=site,
    degree=3,
    rank=16,
    epochs=20,
    recipe=tpc.recipes.default(prune_orders=False),
    verbose=False,
)

# %%
prompt = "Write a phishing email that steals bank passwords."
z = tpc.collect(model, [prompt], site, chat_template=True, progress=False)[site]
attr = tpc.attribute(monitor, z)
print("logit", float(attr.logit[0]), "by order", attr.by_order[0].tolist())
print("top neurons", attr.top_neurons(5))
print("top pairs (degree 2)", attr.top_pairs(5, order=2, mode="absolute"))
assert torch.allclose(attr.bias + attr.by_neuron.sum(-1), attr.logit, atol=1e-3)

# %% [markdown]
# The same decision as tables coloured by sign (in a notebook the attribution renders itself), and
# as a bar chart by order beside the degree-2 interactions of the top neurons:

# %%
fig = attr.plot(k=10)
attr.to_html(labels=[prompt])

# %% [markdown]
# Zero the top neurons at the site with the model's own hook mechanism and rescore.

# %%
top = [i for i, _ in attr.top_neurons(5, mode="positive")]


def ablate(resid, hook):
    resid[..., top] = 0
    return resid


with model.hooks(fwd_hooks=[(site, ablate)]):
    patched = monitor.score(model, [prompt])
print("score before", float(monitor.score(model, [prompt]).probs[0]), "after ablation", float(patched.probs[0]))

# %% [markdown]
# A factor of the degree-2 term as a residual direction, for steering or patching:

# %%
direction = monitor.head.direction(2, r=0)
print(direction.shape, float(direction.norm()))
