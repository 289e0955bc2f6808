import random

import numpy as np
import pytest
import torch

from tpc_hooks.synthetic import make_problem


@pytest.fixture(autouse=True)
def _seed_everything():
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield


def random_head(d_model=6, degree=5, ranks=(3, 2, 4, 1), dtype=torch.float64, seed=0):
    """A TPC with every parameter and the scaler drawn at random (not a trained head)."""
    from tpc_hooks import TPC

    gen = torch.Generator().manual_seed(seed)
    head = TPC(d_model, degree, list(ranks[: degree - 1]))
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.7)
        head.scaler.mean.copy_(torch.randn(d_model, generator=gen))
        head.scaler.scale.copy_(torch.rand(d_model, generator=gen) + 0.5)
    return head.to(dtype)


@pytest.fixture(scope="session")
def problem():
    """Train/val/test splits of one synthetic problem with planted interactions."""
    Xtr, ytr = make_problem(1500, 12, seed=0, world=3)
    Xva, yva = make_problem(500, 12, seed=1, world=3)
    Xte, yte = make_problem(800, 12, seed=2, world=3)
    return Xtr, ytr, Xva, yva, Xte, yte


def write_weights(directory, tensors):
    """Writes ``model.safetensors`` of a saved directory by hand and records its checksum in
    ``config.json``, as a tool that edits saved files would: the loader's structural checks,
    not the checksum, must then catch what is wrong."""
    import hashlib
    import json
    from pathlib import Path

    from safetensors.torch import save_file

    d = Path(directory)
    save_file(tensors, str(d / "model.safetensors"))
    cfg = json.loads((d / "config.json").read_text())
    cfg["weights_sha256"] = hashlib.sha256((d / "model.safetensors").read_bytes()).hexdigest()
    (d / "config.json").write_text(json.dumps(cfg))


@pytest.fixture(scope="module")
def smollm2_hf():
    """The packaged SmolLM2-135M-Instruct as a plain transformers model (float32) and its tokenizer:
    the reference the vLLM server tests hold their answers to."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tpc_hooks import offline

    path = str(offline.default_model_dir())
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def browser():
    """A headless Chromium driven by selenium (the system's chromium and chromedriver), for the tests that
    check a page as a browser shows it; skipped, saying why, where either is missing."""
    import shutil

    from tpc_hooks.views import _screenshot

    exe, driver_exe = _screenshot.chromium(), shutil.which("chromedriver")
    if exe is None or driver_exe is None:
        missing = (
            f"no Chromium on PATH ({', '.join(_screenshot.CHROMIUMS)})" if exe is None else "no chromedriver on PATH"
        )
        pytest.skip(f"{missing}: install `apt-get install chromium chromium-driver` (.ci/run does, as root)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = exe
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1100,800"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_exe))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
