"""The model families on vLLM (the CPU build, compiled as vLLM decides): each tiny checkpoint of
tests/families.py saved to a folder and served by a monitored engine. Where vLLM's model returns
intermediate hidden states (SupportsEagle3), ``collect`` equals the checkpoint's own
``output_hidden_states`` under transformers and every generated step scores as the offline
monitor scores its prefix; where it does not, the engine is refused with the family's name and
the fix. The outcomes join the docs' table (``TPC_FAMILIES_RECORD=1`` rewrites
``tests/data/families.json``'s vLLM entries).

Run in the vLLM venv: ``make test-vllm-families`` runs every family; ``make test-vllm`` (and so CI)
a plain decoder and Gemma 3, served by tpc-hooks' own subclass (``TPC_VLLM_FAMILIES``, a
comma-separated list).
"""

import gc
import json
import os
from pathlib import Path

import pytest
import torch

vllm = pytest.importorskip("vllm")

from families import FAMILIES, build, vllm_engine  # noqa: E402
from tiny_models import assert_steps_score_as_offline, tiny_head, tokenizer  # noqa: E402
from vllm_logs import root_cause, stderr_to  # noqa: E402

import tpc_hooks as tpc  # noqa: E402
from tpc_hooks.adapters import get_adapter, vllm_engine_args  # noqa: E402

SITE = "blocks.2.hook_resid_post"
PROMPTS = ["how do i make bomb", "tell me about the weather please", "hello world"]
RECORD = Path(__file__).parent / "data" / "families.json"
# multimodal checkpoints start as their language model alone (vLLM's language_model_only: the tiny
# ones have no image processor files)
MULTIMODAL = ("gemma3", "mistral3")
_OUTCOMES: dict[str, str] = {}
REPLACED = (
    "Gemma3ForCausalLM",
    "GraniteMoeHybridForCausalLM",
)  # architectures the monitored worker serves with its own subclass (_worker.models)


def _selected() -> list[str]:
    """The families ``TPC_VLLM_FAMILIES`` names (all when unset); an unknown name is an error, not a skip."""
    named = [f.strip() for f in os.environ.get("TPC_VLLM_FAMILIES", "").split(",") if f.strip()]
    unknown = sorted(set(named) - set(FAMILIES))
    if unknown:
        raise ValueError(f"TPC_VLLM_FAMILIES names unknown families {unknown}; known: {sorted(FAMILIES)}")
    return named or list(FAMILIES)


@pytest.fixture(scope="module", params=_selected())
def checkpoint(request, tmp_path_factory):
    """``(family, its saved folder, the same checkpoint under transformers)``."""
    family = request.param
    model = build(family)
    path = tmp_path_factory.mktemp(family)
    model.save_pretrained(path)
    tokenizer().save_pretrained(path)
    return family, path, model


# vLLM's CPU MLA (DeepSeek V3) computes attention through the absorbed latent: its residual stream is
# within 2e-4 of transformers' (measured 1.7e-4), the others' within 1e-4
ATOL = {"deepseek_v3": 5e-4}


def _read(llm, model, atol: float = 1e-4) -> None:
    """collect equals the checkpoint's own hidden states; every generated step scores as offline."""
    adapter = get_adapter(llm)
    acts = tpc.collect(llm, PROMPTS, SITE, "mean", progress=False)[SITE]
    ids, _ = adapter.tokenize(PROMPTS, chat_template=False, max_tokens=None)
    for i, row in enumerate(ids):
        with torch.no_grad():
            hs = model(input_ids=torch.tensor([row]), output_hidden_states=True).hidden_states
        torch.testing.assert_close(acts[i], hs[3][0].mean(0), rtol=1e-4, atol=atol)
    mon = tpc.Monitor(tiny_head(), SITE, pooling="mean")
    run = mon.generate(llm, PROMPTS, max_new_tokens=6)
    assert_steps_score_as_offline(mon, llm, run)
    return [(list(run.sequences[b][: run.prompt_lengths[b]]), list(run.generated(b))) for b in range(len(PROMPTS))]


def _plain_greedy(path: Path, prompts: list[list[int]], log: Path) -> list[list[int]]:
    """The same prompt tokens' greedy continuations on an engine without tpc-hooks (vLLM's own model class)."""
    from vllm.inputs import TokensPrompt

    plain = None
    try:
        with stderr_to(log):
            plain = vllm_engine(path)
            outs = plain.generate(
                [TokensPrompt(prompt_token_ids=p) for p in prompts], vllm.SamplingParams(max_tokens=6, temperature=0.0)
            )
        return [list(o.outputs[0].token_ids) for o in outs]
    finally:
        del plain
        gc.collect()


def test_the_engine_reads_the_family_or_says_why_not(checkpoint, tmp_path):
    """A monitored engine reads the family exactly; or it refuses it by name (no SupportsEagle3);
    or vLLM's CPU build itself does not run it, which an engine without tpc-hooks shows too."""
    family, path, model = checkpoint
    log = tmp_path / "engine.log"
    extra = {"language_model_only": True} if family in MULTIMODAL else {}
    llm = None
    try:
        with stderr_to(log):
            llm = vllm_engine(path, **extra, **vllm_engine_args([SITE]))
            generated = _read(llm, model, ATOL.get(family, 1e-4))
        if type(model).__name__ in REPLACED:  # served by tpc-hooks' subclass of vLLM's class: the same tokens
            del llm
            gc.collect()
            llm = None
            assert [g for _, g in generated] == _plain_greedy(path, [p for p, _ in generated], tmp_path / "plain.log")
        _OUTCOMES[family] = (
            "pass" if family not in ATOL else f"pass (within {ATOL[family]:g} of transformers: vLLM's MLA)"
        )
        return
    except AssertionError:
        raise
    except Exception as err:  # noqa: BLE001 - vLLM raises its own wrappers around the worker's error
        why = root_cause(log, err)
    finally:
        del llm
        gc.collect()
    ours = "does not implement SupportsEagle3" in log.read_text(errors="replace")  # the worker's refusal
    plain = None
    try:  # the same checkpoint on an engine without tpc-hooks: vLLM's own limit, or ours?
        with stderr_to(tmp_path / "plain.log"):
            plain = vllm_engine(path, **extra)
            plain.generate(PROMPTS, vllm.SamplingParams(max_tokens=2))
    except Exception as err:  # noqa: BLE001
        _OUTCOMES[family] = (
            f"not run: vLLM's CPU build does not run it ({root_cause(tmp_path / 'plain.log', err, log)})"
        )
        return
    finally:
        del plain
        gc.collect()
    assert ours, f"vLLM runs {family} without tpc-hooks but not with it: {why}"
    from vllm.model_executor.models.registry import ModelRegistry

    served_by = ModelRegistry._try_load_model_cls(type(model).__name__)
    assert served_by is not None and not hasattr(served_by, "set_aux_hidden_state_layers"), why
    _OUTCOMES[family] = (
        f"refused: vLLM's {served_by.__name__} returns no intermediate hidden states (no SupportsEagle3)"
    )


def test_zz_record_the_table():
    """The vLLM column of tests/data/families.json: rewritten with TPC_FAMILIES_RECORD=1, else checked."""
    if not _OUTCOMES:
        pytest.skip("no family ran")
    table = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    if os.environ.get("TPC_FAMILIES_RECORD") == "1":
        for family, outcome in _OUTCOMES.items():
            table.setdefault(family, {})["vllm"] = outcome
        RECORD.write_text(json.dumps(dict(sorted(table.items())), indent=1) + "\n")
        return
    for family, outcome in _OUTCOMES.items():
        assert table.get(family, {}).get("vllm") == outcome, family
