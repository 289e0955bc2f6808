"""Pooled activations of a prompt list at several layers, collected once into a resumable cache.

A cached split whose prompts changed (another version of the data) is collected afresh; one whose
collection was interrupted resumes. The model is loaded at the first collection only."""

import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

import tpc_hooks as tpc
from tpc_hooks import offline

# the packaged models the benchmarks run on: the layers they collect (a third, a half and two thirds
# up) and whether prompts are wrapped in the chat template (a base model has none)
MODELS = {
    "SmolLM2-135M-Instruct": {"layers": (10, 15, 20), "chat_template": True},
    "gemma-3-270m": {"layers": (6, 9, 12), "chat_template": False},
}
DEFAULT_MODEL = "SmolLM2-135M-Instruct"


def site(layer: int | str, kind: str = "resid_post") -> str:
    """The hook name of ``layer``'s ``kind`` (a full hook name is returned as it is)."""
    return layer if isinstance(layer, str) else f"blocks.{layer}.hook_{kind}"


def short(name: str) -> str:
    """``"15"`` for ``blocks.15.hook_resid_post``, ``"15 mlp_out"`` for another site of layer 15."""
    _, layer, hook = name.split(".")
    return layer if hook == "hook_resid_post" else f"{layer} {hook.removeprefix('hook_')}"


def digest(texts: list[str]) -> str:
    """What a store records of the prompts it was collected from (``prompts_sha256``)."""
    return hashlib.sha256(json.dumps(texts).encode()).hexdigest()


def cached_activations(
    path: Path, texts: list[str], layers, model_box: list, name: str, model: str = DEFAULT_MODEL
) -> dict[int, np.ndarray]:
    """``{layer: X [len(texts), d_model]}`` (the packaged ``model`` via nnsight, mean pooling, the chat
    template where :data:`MODELS` says), read from the stores under ``path`` or collected into them
    (a layer is a number, its residual stream, or a hook name);
    ``model_box`` holds the model once loaded (shared between calls); ``name`` labels the progress line."""
    want = digest(texts)
    stores = {}
    for layer in layers:
        try:
            stores[layer] = tpc.ActivationStore.open(path / site(layer))
        except tpc.TPCHooksError:
            continue
    if any(st.meta.get("prompts_sha256") != want for st in stores.values()):
        shutil.rmtree(path)  # cached from another version of the prompts: collect afresh
        stores = {}
    if len(stores) < len(layers) or any(len(st) != len(texts) for st in stores.values()):
        if not model_box:
            model_box.append(offline.load_model(model, toolkit="nnsight"))
        t0 = time.time()
        got = tpc.collect(
            model_box[0],
            texts,
            [site(layer) for layer in layers],
            "mean",
            chat_template=MODELS[model]["chat_template"],
            batch_size=8,
            store=path,
            progress=True,
        )
        stores = {layer: got[site(layer)] for layer in layers}
        print(f"collected {name}: {len(texts)} rows in {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    return {layer: st.to_numpy() for layer, st in stores.items()}
