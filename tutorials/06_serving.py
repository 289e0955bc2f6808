# ---
# jupyter:
#   jupytext:
#     formats: py:percent,ipynb
#     text_representation: {extension: .py, format_name: percent}
# ---

# %% [markdown]
# # Serving: monitors inside vLLM's OpenAI-compatible server
#
# Two monitors trained and saved, `tpc-hooks serve` started with both, a client speaking to it
# with the `openai` package. Every answer carries each monitor's decision; the server counts
# them for Prometheus and logs flagged requests with the exact attribution of the step that
# flagged them.
#
# The server runs in the environment `make vllm-env` builds (`.venv-vllm`, vLLM's CPU build;
# `make vllm-env-gpu` for CUDA): this notebook starts it there, or in the Python that
# `TPC_HOOKS_VLLM_PYTHON` names. The client needs only `pip install openai`.

# %%
import os
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
from _common import SMALL, free_port, prompt_sets, vllm_python
from openai import OpenAI

import tpc_hooks as tpc
from tpc_hooks.data import EVERYDAY_SOURCES, everyday_prompts, source_names
from tpc_hooks.offline import default_model_dir, load_model
from tpc_hooks.views import review_html

model = load_model(toolkit="transformers")
sets = prompt_sets()
train = sets["train"]

# %% [markdown]
# ## Two monitors
#
# `harm` is `train_monitor`'s default; `intent` the opt-in recipe that flags fewer benign
# questions on harmful topics, at a price in recall (the
# [constructions benchmark](../benchmarks/constructions.md) measures it). Both read layer 15's
# residual stream, so one forward pass serves both. Their thresholds are set at 1% of everyday
# prompts, the calibration prompts among them.

# %%
traffic = everyday_prompts(100 if SMALL else 500, exclude=[t for ps in sets.values() for t in ps.texts])
fit = dict(
    sources=source_names(train),
    everyday=EVERYDAY_SOURCES,
    calibration=traffic,
    degree=2,
    rank=16,
    epochs=4 if SMALL else 20,
    verbose=False,
)
work = Path(tempfile.mkdtemp(prefix="tpc-serving-"))
for name, recipe in (("harm", tpc.recipes.default()), ("intent", tpc.recipes.intent())):
    monitor = tpc.train_monitor(
        model, train.texts, train.labels, site="blocks.15.hook_resid_post", recipe=recipe, **fit
    )
    monitor.save_pretrained(work / name)
    print(f"{name}: threshold {monitor.threshold:.3f}; {monitor.report['orders']['note']}")

# %% [markdown]
# ## Start the server
#
# The same command a deployment runs: the model folder (here the packaged SmolLM2, converted
# once), each monitor by name with its action (`stop` ends a flagged request, `flag` only
# reports it), a review log, then any of vLLM's own options. On CPU, vLLM's KV cache takes
# `VLLM_CPU_KVCACHE_SPACE` GiB.

# %%
port = free_port()
command = [
    vllm_python(),
    "-m",
    "tpc_hooks",
    "serve",
    str(default_model_dir()),
    "--monitor",
    f"harm={work / 'harm'}:stop",
    "--monitor",
    f"intent={work / 'intent'}:flag",
    "--review-log",
    str(work / "logs"),
    "--review-log-sample",
    "1",
    "--review-log-text",
    "--port",
    str(port),
    "--served-model-name",
    "smol",
    "--dtype",
    "float32",
    "--max-num-seqs",
    "4",
]
log = open(work / "server.log", "w")
server = subprocess.Popen(
    command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
)
url = f"http://127.0.0.1:{port}"
started = time.time()
while True:
    if server.poll() is not None:
        raise RuntimeError(f"the server exited:\n{(work / 'server.log').read_text()[-3000:]}")
    try:
        if httpx.get(url + "/health", timeout=2).status_code == 200:
            break
    except httpx.HTTPError:
        pass
    if time.time() - started > 600:
        server.kill()
        raise RuntimeError("the server did not come up in 10 minutes")
    time.sleep(2)
print(f"serving on {url} after {time.time() - started:.0f} s")

# %% [markdown]
# ## Ask it
#
# Any OpenAI client works. The standard fields are vLLM's; each choice adds a `tpc_hooks` field
# with every monitor's decision (`flagged`, `stopped`, the token at which it first flagged, the
# peak score and its threshold). A request `harm` stops ends with the finish reason
# `content_flagged:harm`, so a client reading only the standard fields sees it too.

# %%
client = OpenAI(base_url=url + "/v1", api_key="none")
prompts = ["How do I pick the lock on my neighbour's door?", "How do I bake sourdough bread?"]
for prompt in prompts:
    reply = client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": prompt}], max_tokens=8 if SMALL else 32, temperature=0
    )
    choice = reply.choices[0]
    print(prompt)
    print("  finish_reason:", choice.finish_reason)
    print("  answer:", repr(choice.message.content))
    for name, decision in choice.model_extra["tpc_hooks"].items():
        print(
            f"  {name}:",
            {k: decision[k] for k in ("flagged", "stopped", "flagged_at_token", "peak_score", "threshold")},
        )

# %% [markdown]
# ## Metrics
#
# `GET /metrics` is vLLM's Prometheus endpoint; the monitors add their counters, labelled by
# monitor, and the drift gauge `tpc_hooks_flag_rate`: each monitor's flag rate over recent
# traffic and its life, beside the rate its threshold was set for (`window="target"`).

# %%
metrics = httpx.get(url + "/metrics").text
print(
    "\n".join(
        line
        for line in metrics.splitlines()
        if line.startswith(
            (
                "tpc_hooks_requests_scored_total",
                "tpc_hooks_requests_flagged_total",
                "tpc_hooks_requests_stopped_total",
                "tpc_hooks_flag_rate",
            )
        )
    )
)

# %% [markdown]
# ## The review log
#
# Each flagged request, and the share `--review-log-sample` of all requests (here every one), is
# written to `logs/review.jsonl` with the exact attribution of the step that flagged it (or its
# highest-scoring step), explained off the engine's thread. `tpc-hooks review logs/` renders the
# log as HTML pages; in Python, `tpc.read_review_log` reads the entries and `review_html` shows
# one: each monitor's steps coloured by score against its threshold, and the logit split by
# order, neuron and neuron pair.

# %%
review = work / "logs" / "review.jsonl"
deadline = time.time() + 120  # entries are written by a thread of their own, after the answer
while time.time() < deadline and (not review.exists() or len(review.read_text().splitlines()) < len(prompts)):
    time.sleep(1)
server.terminate()
server.wait(timeout=120)
log.close()
entries = tpc.read_review_log(work / "logs")
for entry in entries:
    print(
        {name: m["flagged"] for name, m in entry["monitors"].items()},
        "completion:",
        repr("".join(entry["text"]["completion"])),
    )
review_html(entries[0])
