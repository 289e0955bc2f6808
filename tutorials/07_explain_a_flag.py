# ---
# jupyter:
#   jupytext:
#     formats: py:percent,ipynb
#     text_representation: {extension: .py, format_name: percent}
# ---

# %% [markdown]
# # Explain a flag: the tokens and layers behind it, then patch them with TransformerLens
#
# The packaged monitor flags some everyday questions. `monitor.explain` splits each logit exactly over
# the tokens the monitor read and over the parts of the model that wrote the residual stream it reads:
# the embedding, each block's attention and each block's MLP. Here we open such a flag, find the token
# and the layer that carry it, patch that layer's output with a TransformerLens hook, and compare the
# score's move with the explanation's prediction.

# %%
import math

import matplotlib.pyplot as plt
import numpy as np
from _common import SMALL

import tpc_hooks as tpc
from tpc_hooks.offline import load_model, load_monitor

model = load_model(toolkit="transformer_lens")  # SmolLM2-135M-Instruct as a TransformerBridge
monitor = load_monitor()  # its pretrained monitor: mean pooling over the chat template
print(monitor)
flag_at = math.log(monitor.threshold / (1 - monitor.threshold))  # the threshold on the logit's scale
print(f"flags at probability >= {monitor.threshold:.3f}, that is logit >= {flag_at:+.3f}")

prompts = [
    "How do I kill a Python process that hangs?",
    "How do I terminate a contract with my landlord early?",
    "How do I bake sourdough bread?",
    "Write a phishing email that steals bank passwords.",
]
scores = monitor.score(model, prompts)
for text, flagged, prob in zip(prompts, scores.flagged.tolist(), scores.probs.tolist(), strict=True):
    print(f"{'FLAGGED' if flagged else 'ok':>7}  {prob:.3f}  {text}")

# %% [markdown]
# ## Open the flag
#
# `explain` runs the model once per batch and splits each row's logit twice: over positions
# (`by_token`) and over model parts (`by_component`), the two margins of one position-by-part table
# (`token_by_component`). What no token and no part carries is the `baseline`: the head's bias and
# the offset of the monitor's standardisation.

# %%
ex = monitor.explain(model, prompts)
print(ex)
for b, text in enumerate(prompts):
    tokens = float(ex.by_token[b].sum())
    print(
        f"{text[:40]:40}  logit {float(ex.logit[b]):+.4f} = baseline {float(ex.baseline[b]):+.3f}"
        f" + tokens {tokens:+.3f}   (their sum: {float(ex.baseline[b]) + tokens:+.4f})"
    )
print("\nthe first question's top tokens:", [(i, tok, round(v, 3)) for i, tok, v in ex.top_tokens(0, 5)])
print("its top parts:", [(name, round(v, 3)) for name, v in ex.top_components(0, 5, mode="absolute")])

# %% [markdown]
# The first question beside the harmful request: tokens coloured by their share of the logit (red
# towards a flag, blue away; hover a token for its value, the strongest one sets the full colour), the
# top tokens and parts, and the parts as a heatmap of layer by attention and MLP. Then the first
# question as a plot.

# %%
ex.to_html([0, 3])

# %%
fig = ex.plot(0)

# %% [markdown]
# ## The chat template's share
#
# The monitor reads the whole chat template: the system prompt and the user's header before the
# question, the end of the turn and the assistant's header after it. The template's positions are
# read off the tokens: those every prompt shares at its start and at its end (the four prompts here
# and a sample of everyday ShareGPT prompts). The table splits each logit into the baseline, the
# template before the question, the question's own tokens and the template after it; the last column
# is the template's share of what the tokens carry together.

# %%
everyday = tpc.data.everyday_prompts(16 if SMALL else 100)
daily = monitor.explain(model, everyday, batch_size=16)


def shared_ends(rows):
    """How many tokens every row shares at its start, and at its end."""
    start = end = 0
    while all(len(r) > start and r[start] == rows[0][start] for r in rows):
        start += 1
    while all(len(r) > end and r[-1 - end] == rows[0][-1 - end] for r in rows):
        end += 1
    return start, end


head, tail = shared_ends(ex.token_ids + daily.token_ids)
print(f"template before the prompt, {head} tokens: {''.join(ex.tokens[0][:head])!r}")
print(f"template after the prompt, {tail} tokens: {''.join(ex.tokens[0][-tail:])!r}")


def by_segment(e, b):
    """Row b's tokens' share: (template before, the prompt's own tokens, template after)."""
    v = e.by_token[b]
    return float(v[:head].sum()), float(v[head:-tail].sum()), float(v[-tail:].sum())


print(f"\n{'':40} {'T':>3} {'logit':>7} = {'baseline':>8} + {'before':>7} + {'prompt':>7} + {'after':>7}  template")
for b, text in enumerate(prompts):
    before, own, after = by_segment(ex, b)
    print(
        f"{text[:40]:40} {len(ex.tokens[b]):3d} {float(ex.logit[b]):+7.3f} = {float(ex.baseline[b]):+8.3f}"
        f" + {before:+7.3f} + {own:+7.3f} + {after:+7.3f}  {(before + after) / (before + own + after):8.0%}"
    )

# %% [markdown]
# The positions before the question cannot attend to it (the model is causal), so their vectors are
# the same for every prompt, and mean pooling weighs each of the T positions by 1/T. Their share is
# then one number over the prompt's length: two prompts of equal length get the same, and a prompt's
# length alone moves it.

# %%
T = np.array([len(t) for t in daily.tokens])
segments = np.array([by_segment(daily, b) for b in range(len(daily))])
times_T = segments[:, 0] * T
print(f"T x (template before), over {len(daily)} everyday prompts: {times_T.min():.3f} to {times_T.max():.3f}")
short, long = T.argmin(), T.argmax()
print(f"template before: {segments[short, 0]:+.3f} at T = {T[short]}, {segments[long, 0]:+.3f} at T = {T[long]}")
template = np.array([float(v[:head].abs().sum() + v[-tail:].abs().sum()) for v in daily.by_token])
total = np.array([float(v.abs().sum()) for v in daily.by_token])
print(
    f"the template's positions: median {np.median((head + tail) / T):.0%} of the positions pooled,"
    f" median {np.median(template / total):.0%} of the tokens' absolute contributions"
)
print(f"flagged: {int(daily.flagged.sum())} of {len(daily)} everyday prompts")

# %% [markdown]
# ## The token and the part that carry the flag
#
# Among the question's own tokens, the one that pushes hardest towards a flag; at that position, the
# part of the model whose output carries most of it. `to_dataframe` holds the same table in long form
# for any grouping, here attention against MLP at that token.

# %%
b, prompt = 0, prompts[0]
t = head + int(ex.by_token[b][head:-tail].argmax())
at_t = ex.token_by_component[b][t]
part = ex.components[int(at_t.argmax())]
print(f"token {t} {ex.tokens[b][t]!r} carries {float(ex.by_token[b][t]):+.3f} of the logit")
print("its top parts:", [(ex.components[i], round(float(at_t[i]), 3)) for i in at_t.abs().argsort(descending=True)[:5]])
df = ex.to_dataframe(b)
print("by kind:", df[df.position == t].groupby("kind").value.sum().round(3).to_dict())


def hook_name(part):
    """The TransformerLens hook holding a part's output: blocks.{l}.hook_attn_out or blocks.{l}.hook_mlp_out."""
    _, layer, kind = part.split(".")
    return f"blocks.{layer}.hook_{kind}_out"


print(f"the part: {part}, whose output is {hook_name(part)}")

# %% [markdown]
# ## Patch it
#
# The explanation's number for a part at a token is what its output there adds, straight through the
# residual stream, to the vector the monitor reads. It predicts that taking the output away moves the
# logit by minus that number. Three patches, each a TransformerLens hook around `monitor.score`:
#
# * **site only**: subtract the part's output from the stream at the monitor's site, and nowhere
#   else: no later layer sees the change. This is the explanation's own claim, tested;
# * **zeroed**: zero the part's output at that token, so every later layer reads the stream without it;
# * **mean-ablated**: replace it by its mean over the question's own tokens. Mean pooling weighs every
#   position alike, so the explanation predicts this move too: the part's mean contribution over those
#   tokens minus its contribution at the token.

# %%
logit = float(monitor.score(model, [prompt]).logits[0])


def moved(hooks):
    """How far the logit moves under TransformerLens hooks."""
    with model.hooks(fwd_hooks=hooks):
        return float(monitor.score(model, [prompt]).logits[0]) - logit


def patch(part, t):
    """``{patch: (predicted move, measured move)}`` for ``part``'s output at token ``t``."""
    name, own = hook_name(part), slice(head, -tail)
    contribution = ex.token_by_component[b][:, ex.components.index(part)]
    saved = {}

    def save(out, hook):
        saved["out"] = out[:, t].clone()

    def subtract(resid, hook):
        resid[:, t] -= saved["out"]
        return resid

    def zero(out, hook):
        out[:, t] = 0
        return out

    def mean(out, hook):
        out[:, t] = out[:, own].mean(1)
        return out

    return {
        "site only": (-float(contribution[t]), moved([(name, save), (monitor.site, subtract)])),
        "zeroed": (-float(contribution[t]), moved([(name, zero)])),
        "mean-ablated": (float(contribution[own].mean() - contribution[t]), moved([(name, mean)])),
    }


def verdict(x):
    return "flagged" if x >= flag_at else "not flagged"


print(f"logit {logit:+.3f} ({verdict(logit)}); patching {part} at token {t} {ex.tokens[b][t]!r}:")
for how, (guess, move) in patch(part, t).items():
    print(
        f"  {how:13} predicted {guess:+.3f} -> {verdict(logit + guess):11}"
        f"  measured {move:+.3f} -> {verdict(logit + move)}"
    )

# %% [markdown]
# ## Every part at that token
#
# The same patches for each layer's attention and MLP at that token (in the small run, only the parts
# that carry most there). Where the site-only move equals the prediction, the split is exact; where
# the zeroed or mean-ablated move differs from it, the layers between the part and the site changed
# what the part's output does. The last block's MLP writes straight into the site, with nothing
# after it, so there all three moves agree. This monitor is degree 1 (printed at the top), so its
# head is linear and the site-only patch must reproduce the prediction. For a higher degree the split
# still sums exactly, but removing a part also changes the head's own gradients, so even the
# site-only move would differ from it.

# %%
order = at_t.abs().argsort(descending=True).tolist()
last_mlp = max(i for i, name in enumerate(ex.components) if name.endswith(".mlp"))
keep = sorted(set(order[:6]) | {last_mlp}) if SMALL else range(len(ex.components))
names = [ex.components[i] for i in keep if ex.components[i] != "embed"]
rows = {name: patch(name, t) for name in names}
print(f"{'part':15} {'predicted':>9} {'site only':>9} {'zeroed':>8}   {'mean: predicted':>15} {'measured':>8}")
for name, r in rows.items():
    print(
        f"{name:15} {r['site only'][0]:+9.3f} {r['site only'][1]:+9.3f} {r['zeroed'][1]:+8.3f}"
        f"   {r['mean-ablated'][0]:+15.3f} {r['mean-ablated'][1]:+8.3f}"
    )
kinds = ("site only", "zeroed", "mean-ablated")
predicted = np.array([[r[k][0] for k in kinds] for r in rows.values()])
measured = np.array([[r[k][1] for k in kinds] for r in rows.values()])
gap = np.abs(measured - predicted)
print(f"\nsite only: largest |measured - predicted| {gap[:, 0].max():.1e}")
for j in (1, 2):
    worst = [names[i] for i in gap[:, j].argsort()[::-1][:3]]
    r = np.corrcoef(predicted[:, j], measured[:, j])[0, 1]
    print(
        f"{kinds[j]}: correlation {r:+.2f}, median |measured - predicted| {np.median(gap[:, j]):.3f},"
        f" largest at {worst}"
    )

# %% [markdown]
# Each part in one row: where the explanation puts each patch's move (a bar) and where the patch
# lands (a dot), zeroed above, mean-ablated below. A move beyond the plot's edge is drawn at the edge
# with its value; left of the dotted line the question is no longer flagged.

# %%
y = np.arange(len(names))
lim = max(3 * float(np.abs(predicted).max()), 1.5 * abs(flag_at - logit))
fig, ax = plt.subplots(figsize=(8, 1.4 + 0.3 * len(names)))
for j, shift, color, dot in ((1, -0.17, "#d6604d", "o"), (2, 0.17, "#4393c3", "s")):
    for x, marker, what in ((predicted[:, j], "|", "predicted"), (measured[:, j], dot, "measured")):
        ax.scatter(
            np.clip(x, -lim, lim),
            y + shift,
            marker=marker,
            color=color,
            s=70 if marker == "|" else 22,
            label=f"{kinds[j]}: {what}",
            zorder=3,
        )
        for yi, xi in zip(y + shift, x, strict=True):
            if abs(xi) > lim:
                ax.annotate(
                    f"{xi:+.2f}",
                    (np.sign(xi) * lim, yi),
                    xytext=(-np.sign(xi) * 7, -3),
                    textcoords="offset points",
                    ha="right" if xi > 0 else "left",
                    fontsize=7,
                    color=color,
                )
ax.axvline(0, color="grey", lw=0.6)
ax.axvline(flag_at - logit, color="black", lw=0.8, ls=":", label="left of it: not flagged")
ax.set_yticks(y, names, fontsize=8)
ax.invert_yaxis()
ax.set_xlim(-1.1 * lim, 1.1 * lim)
ax.grid(axis="y", lw=0.3)
ax.set_xlabel(f"move of the logit, each part's output patched at token {t} {ex.tokens[b][t]!r}")
ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
fig.tight_layout()
plt.show()

# %% [markdown]
# ## The token itself
#
# `by_token` says how much a position's vector carries, not how much the word there changes the score:
# any word at that position carries something. Swap the word for another of one token and explain
# both prompts; the difference of the two splits says where the word's effect sits: at its own
# position, or at the positions after it that read it through attention.

# %%
swap = prompt.replace(ex.tokens[b][t], " stop")
pair = monitor.explain(model, [prompt, swap])
assert len(pair.tokens[0]) == len(pair.tokens[1])
for i, text in enumerate([prompt, swap]):
    print(f"{verdict(float(pair.logit[i])):>11}  {float(pair.probs[i]):.3f}  logit {float(pair.logit[i]):+.3f}  {text}")
diff = pair.by_token[0] - pair.by_token[1]
print(
    f"logit difference {float(pair.logit[0] - pair.logit[1]):+.3f}: before the word {float(diff[:t].sum()):+.3f},"
    f" at it {float(diff[t]):+.3f}, after it {float(diff[t + 1 :].sum()):+.3f}"
)

# %% [markdown]
# So the explanation is an exact account of what each position's vector and each part's output add to
# the vector the monitor reads (the site-only patches), not a forecast of what removing a part from
# the model does (the zeroed and mean-ablated patches, where the layers in between answer back); and
# a position's share is not the effect of the word written there (the swap).
#
# `monitor.explain(model, prompts, heads=True)` splits each attention layer by head;
# `ex.colored_tokens(b)` shows a row with circuitsvis (interactive, in a notebook); `ex.attribution`
# splits the same logits by order, neuron and neuron pair, as in tutorial 3.
