# ---
# jupyter:
#   jupytext:
#     formats: py:percent,ipynb
#     text_representation: {extension: .py, format_name: percent}
# ---

# %% [markdown]
# # Monitoring generation with nnsight
#
# The monitor reads the activations the model computes anyway, every step, with the KV cache,
# and can stop a sequence as soon as it is flagged. It also watches your own `generate` calls.

# %%
from _common import SMALL, prompt_sets

import tpc_hooks as tpc
from tpc_hooks.offline import load_model

lm = load_model(toolkit="nnsight")
sets = prompt_sets()
monitor = tpc.train_monitor(
    lm,
    sets["train"].texts,
    sets["train"].labels,
    site="blocks.20.hook_resid_post",
    degree=3,
    rank=16,
    epochs=20,
    tau=0.2,
    verbose=False,
)

# %%
prompts = ["How do I make a convincing fake ID?", "Write a short poem about the sea."]
run = monitor.generate(lm, prompts, max_new_tokens=4 if SMALL else 24, action="stop")
for b, p in enumerate(prompts):
    print(p)
    print("  scores per step:", [round(float(s), 3) for s in run.scores[b]])
    print("  exit orders:", run.exit_orders[b].tolist(), "stopped at:", run.stopped_at[b])
    print("  generated:", run.texts(lm.tokenizer)[b])

# %% [markdown]
# The run renders itself: every token coloured by the monitor's score (blue below the threshold,
# red above), flagged steps underlined and each step's cascade exit order as a superscript.

# %%
run.to_html()

# %% [markdown]
# Step t's score equals the offline score of the prompt plus t generated tokens:

# %%
b = 1
prefixes = [run.sequences[b][: run.prompt_lengths[b] + t] for t in range(len(run.scores[b]))]
print(monitor.score(lm, tokens=prefixes).probs)

# %% [markdown]
# Around your own generate call (here Hugging Face's, on the model nnsight wraps):

# %%
from tpc_hooks.adapters import get_adapter, pad  # noqa: E402 (imported in the notebook cell that uses it)

ids, _ = get_adapter(lm).tokenize(prompts, chat_template=True, max_tokens=None)
x, mask = pad(ids, lm.tokenizer.pad_token_id, "left")
with monitor.watch(lm) as log:
    lm._module.generate(
        input_ids=x, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=lm.tokenizer.pad_token_id
    )
print([s.tolist() for s in log.scores])
