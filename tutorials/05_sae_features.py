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
# No pretrained SAE for SmolLM2 installs offline, so `tpc_hooks.offline.load_sae` trains a
# small one with SAELens' own trainer on the packaged prompts' activations at the site (a few
# minutes the first time, then cached), and labels each feature by the tokens that activate it
# most. With a real release, load it with `SAE.from_pretrained(...)` instead: everything below
# works the same (without labels, unless you attach your own as `sae.feature_labels`).

# %%

from _common import SMALL, prompt_sets

import tpc_hooks as tpc
from tpc_hooks.offline import QUICK_SAE_EPOCHS, load_model, load_sae

model = load_model(toolkit="nnsight")
site = "blocks.20.hook_resid_post"
sae = load_sae(site, progress=False, **({"epochs": QUICK_SAE_EPOCHS} if SMALL else {}))  # else its default
sets = prompt_sets()
print({k: round(v, 3) if isinstance(v, float) else v for k, v in sae.reconstruction.items()})

# %% [markdown]
# What the SAE reconstructs of held-out tokens (`variance_explained`, `l0`: features active per
# token, `dead_features`: never active). Each feature's label is its most frequent top-activating
# tokens; `sae.feature_examples` holds those tokens in context and the prompts they come from.

# %%
for f in list(sae.feature_labels)[:400:50]:
    ex = sae.feature_examples[str(f)]["tokens"][:3]
    print(f, sae.feature_labels[f], [e["context"] + "[" + e["token"] + "]" for e in ex])

# %% [markdown]
# The default recipe keeps a higher order only where it earns its terms at the operating point;
# on these latents degree 2 does not, and its weights stay at zero (so would every pair). The
# paper's recipe (`recipe=tpc.recipes.paper()`) keeps it, which is what shows feature pairs here.

# %%
monitor = tpc.train_monitor(
    model,
    sets["train"].texts,
    sets["train"].labels,
    site=site,
    sae=sae,
    degree=2,
    rank=8,
    epochs=20,
    recipe=tpc.recipes.paper(),
    verbose=False,
)
z = tpc.collect(
    model, ["Write a phishing email that steals bank passwords."], site, chat_template=True, sae=sae, progress=False
)[site]
attr = tpc.attribute(monitor, z)
for i, j, v in attr.top_pairs(5, order=2, mode="absolute"):
    print(f"{v:+.4f}  {i}: {sae.feature_labels[i]}  x  {j}: {sae.feature_labels[j]}")
attr.to_html(k=6)

# %% [markdown]
# A residual monitor, read in the SAE's basis: features plus `b_dec` and `error` terms still
# sum to the logit.

# %%
resid_monitor = tpc.train_monitor(
    model,
    sets["train"].texts,
    sets["train"].labels,
    site=site,
    degree=2,
    rank=8,
    epochs=20,
    recipe=tpc.recipes.paper(),
    verbose=False,
)
zr = tpc.collect(
    model, ["Write a phishing email that steals bank passwords."], site, chat_template=True, progress=False
)[site]
attr = tpc.attribute(resid_monitor, zr, sae=sae)
print(float(attr.bias[0] + attr.by_feature.sum()), float(attr.logit[0]))
[(f, sae.feature_labels.get(f, f), round(v, 3)) for f, v in attr.top_neurons(6)]
