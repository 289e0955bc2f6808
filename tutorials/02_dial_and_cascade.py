# ---
# jupyter:
#   jupytext:
#     formats: py:percent,ipynb
#     text_representation: {extension: .py, format_name: percent}
# ---

# %% [markdown]
# # The safety dial and the cascade
#
# One polynomial gives a classifier at every truncation (the dial); the cascade evaluates
# higher orders only for prompts the lower ones are unsure about.

# %%
from _common import prompt_sets

import tpc_hooks as tpc
from tpc_hooks.metrics import classification_metrics
from tpc_hooks.offline import load_model
from tpc_hooks.views import plot_sweep

model = load_model(toolkit="nnsight")
sets = prompt_sets()
site = "blocks.20.hook_resid_post"
X = {k: tpc.collect(model, v.texts, site, chat_template=True, progress=False)[site] for k, v in sets.items()}
y = {k: v.labels for k, v in sets.items()}

# %%
head = tpc.fit(X["train"], y["train"], X["val"], y["val"], degree=5, rank=16, epochs=20, verbose=False)
for n in range(1, 6):
    c = head.cost(n)
    f1 = classification_metrics(y["test"], head(X["test"], order=n).detach())["f1"]
    print(f"order {n}: F1 {f1:.3f}, {c.params} parameters, {c.flops} FLOPs")

# %% [markdown]
# Calibrate each order on validation data, then sweep the threshold: F1 against compute.

# %%
cascade = tpc.Cascade(head).calibrate(X["val"], y["val"])
rows = cascade.sweep(X["test"], y["test"])
print("  tau     F1   FLOPs/probe   prompts exiting at orders 1..5")
for r in rows:
    print(f"{r['tau']:5.2f}  {r['f1']:.3f}  {r['relative_flops']:11.2f}   {r['exit_histogram']}")
ax = plot_sweep(rows)

# %% [markdown]
# ## Out of distribution: the trust region and the gate
#
# `fit` clips every projection `<U_k, z>` to the range it took on the training rows, and by
# default hands a prompt that leaves that range to the linear probe at every higher order, so
# the dial can only do what the training data supported. `head.outside` says which prompts
# those are; `recipe=tpc.recipes.paper()` trains the paper's plain polynomial to compare with.

# %%
print(head.history.settings)
for split in ("test", "heldout"):
    print(f"{split}: {float(head.outside(X[split]).float().mean()):.0%} of prompts outside the trust region")
paper = tpc.fit(
    X["train"], y["train"], X["val"], y["val"], degree=5, rank=16, epochs=20, recipe=tpc.recipes.paper(), verbose=False
)
for name, h in (("default", head), ("paper recipe", paper)):
    f1 = [round(classification_metrics(y["heldout"], h(X["heldout"], order=n).detach())["f1"], 3) for n in range(1, 6)]
    print(f"{name}: held-out F1 by order {f1}")
