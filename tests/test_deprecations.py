"""Deprecated names keep working: each warns once per process (a FutureWarning naming the new
name) and gives what the new name gives. ``save`` / ``load``: tests/test_hub.py."""

import warnings

import pytest
import torch

import tpc_hooks as tpc
from tiny_models import hf_llama, named, tiny_head, tokenizer
from tpc_hooks.head import _errors

SITE = "blocks.1.hook_resid_post"


@pytest.fixture
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(_errors, "_WARNED", set())


def test_last_generate_log_is_last_run(fresh_warnings):
    hf = named(hf_llama())
    mon = tpc.Monitor(tiny_head(), SITE, threshold=0.5)
    tok = tokenizer()
    batch = tok(["hello world", "the cat sat"], return_tensors="pt", padding=True)
    with torch.no_grad():
        hf.generate(**batch, max_new_tokens=3, do_sample=False, pad_token_id=0,
                    stopping_criteria=[mon.stopping_criteria(hf, tokenizer=tok)])
    assert isinstance(mon.last_run, tpc.GenerationRun) and mon.last_run.steps >= 1
    with pytest.warns(FutureWarning, match=r"Monitor\.last_generate_log is deprecated; use Monitor\.last_run"):
        assert mon.last_generate_log is mon.last_run
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process
        mon.last_generate_log = None
    assert mon.last_run is None
    monitors = tpc.MonitorSet({"a": mon})
    with pytest.warns(FutureWarning, match=r"MonitorSet\.last_generate_log is deprecated"):
        assert monitors.last_generate_log is None


def test_train_config_moved_to_the_baselines(fresh_warnings):
    from tpc_hooks import baselines

    assert "TrainConfig" not in tpc.__all__ and "TrainConfig" in baselines.__all__
    with pytest.warns(FutureWarning, match=r"tpc_hooks\.TrainConfig is deprecated; use tpc_hooks\.baselines\.TrainConfig"):
        assert tpc.TrainConfig is baselines.TrainConfig
