"""MkDocs hook: the table of model families on the "Models" page, drawn from what the tests
recorded (``tests/data/families.json``, written by ``tests/test_families.py`` and
``tests/test_vllm_families.py`` with ``TPC_FAMILIES_RECORD=1`` and checked by them otherwise).

The page holds the marker ``<!-- families-table -->``; the hook puts the table in its place.
"""

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "tests" / "data" / "families.json"
MARKER = "<!-- families-table -->"

# family (the tests' name) -> what a user loads
NAMES = {
    "llama": "Llama 3.x (`LlamaForCausalLM`)",
    "qwen3_moe": "Qwen3-MoE (`Qwen3MoeForCausalLM`)",
    "gemma3_text": "Gemma 3, text-only (`Gemma3ForCausalLM`)",
    "gemma3": "Gemma 3, multimodal (`Gemma3ForConditionalGeneration`)",
    "gpt_oss": "gpt-oss (`GptOssForCausalLM`)",
    "gemma4": "Gemma 4 (`Gemma4ForCausalLM`)",
    "qwen3_5": "Qwen 3.5 (`Qwen3_5ForCausalLM`, hybrid)",
    "llama4": "Llama 4 (`Llama4ForCausalLM`)",
    "mistral3": "Mistral 3, multimodal (`Mistral3ForConditionalGeneration`)",
    "deepseek_v3": "DeepSeek V3, MLA (`DeepseekV3ForCausalLM`)",
    "olmo3": "OLMo 3 (`Olmo3ForCausalLM`)",
    "granite": "Granite (`GraniteForCausalLM`)",
    "smollm3": "SmolLM3 (`SmolLM3ForCausalLM`)",
    "qwen3_next": "Qwen3-Next, hybrid (`Qwen3NextForCausalLM`)",
    "granite4_hybrid": "Granite 4 hybrid, Mamba layers (`GraniteMoeHybridForCausalLM`)",
}
PAPER = {"llama", "qwen3_moe", "gemma3_text", "gemma3", "gpt_oss"}


def _cell(outcomes: dict, toolkit: str) -> str:
    if toolkit == "vllm":
        got = outcomes.get("vllm")
        if got is None:
            return "not run"
        return "yes" if got == "pass" else got.replace("pass (", "yes (")
    keys = [f"{toolkit}:collect", f"{toolkit}:generate"]
    if all(outcomes.get(k) == "pass" for k in keys):
        return "yes"
    for kind in ("refused", "load"):
        why = outcomes.get(f"{toolkit}:{kind}")
        if why:
            return ("refused: " if kind == "refused" else "") + why
    return "not run"


def _branches(outcomes: dict) -> str:
    """The branch sites (``hook_attn_out``, ``hook_resid_mid``, ``hook_mlp_out``) each toolkit offers."""

    def one(toolkit: str) -> str | None:
        got = outcomes.get(f"{toolkit}:branches")
        return None if got is None else "all three" if got == "pass" else got

    hf, nn, br = one("transformers"), one("nnsight"), one("bridge")
    parts = [f"{hf}" if hf == nn else f"transformers: {hf}; nnsight: {nn}"] if hf or nn else []
    if br is not None:
        parts.append(f"bridge: {br}" if br != hf else "bridge: the same")
    return "; ".join(parts) or "not run"


def table() -> str:
    record = json.loads(RECORD.read_text())
    v = record.get("_versions", {})
    head = (
        (
            "Recorded under " + ", ".join(f"{k} {x}" for k, x in v.items()) + " (vLLM: the CPU build `make test-vllm` "
            "installs).\n\n"
        )
        if v
        else ""
    )
    rows = [
        "| family | transformers | nnsight | TransformerLens (bridge) | vLLM (CPU build) | sites inside the block |",
        "|---|---|---|---|---|---|",
    ]
    for family, name in NAMES.items():
        got = record.get(family, {})
        label = f"{name} (paper)" if family in PAPER else name
        rows.append(
            f"| {label} | "
            + " | ".join(_cell(got, t) for t in ("transformers", "nnsight", "bridge", "vllm"))
            + f" | {_branches(got)} |"
        )
    return head + "\n".join(rows)


def on_page_markdown(markdown: str, page, config, files) -> str:
    return markdown.replace(MARKER, table()) if MARKER in markdown else markdown
