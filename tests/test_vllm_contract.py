"""tpc-hooks' contract with vLLM (``tests/vllm_contract/surface.py``): the table is well formed
and names every vLLM name the plugin's source uses (no vLLM needed); the installed vLLM is as every
static row says (``make test-vllm``; ``make test-vllm-contract-newest`` against the newest release);
and a live engine's worker is as every runtime row says, on a real runner (``make test-vllm``)."""

import ast
import importlib.util
import os
import re
from pathlib import Path

import pytest
import torch
from vllm_contract import checks as checks
from vllm_contract import live as _vllm_live
from vllm_contract.surface import ROWS, check_static, size

from tpc_hooks.adapters.vllm._wire import worker_error

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tpc_hooks"
HAS_VLLM = importlib.util.find_spec("vllm") is not None


# ---------------------------------------------------------------------------------------------- the table
def _defined(name: str) -> bool:
    """``module:qualname`` under tpc_hooks names a class, function or module-level name (read with
    ``ast``: the worker's modules import vLLM)."""
    module, _, qual = name.partition(":")
    path = PACKAGE.joinpath(*module.split("."))
    path = path.with_suffix(".py") if path.with_suffix(".py").exists() else path / "__init__.py"
    if not path.exists() or not qual:
        return False
    body: list[ast.stmt] = ast.parse(path.read_text()).body
    for part in qual.split("."):
        found = None
        for node in body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == part:
                found = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == part for t in targets):
                    found = node
        if found is None:
            return False
        body = getattr(found, "body", [])
    return True


def test_every_row_is_well_formed():
    names = [r.name for r in ROWS]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})
    for r in ROWS:
        assert r.kind in checks.KINDS and r.when in checks.WHEN, r
        assert re.fullmatch(r"vllm[\w.]*(:[\w.]+)?( \(.+\))?", r.name), f"not module:qualname (...): {r.name}"
        assert (r.check is not None) == (r.when in ("static", "both")), f"{r.name}: {r.when} without its check"
        assert (r.live is not None) == (r.when in ("runtime", "both")), f"{r.name}: {r.when} without its check"
        missing = [o for o in r.ours if not _defined(o)]
        assert r.ours and not missing, f"{r.name}: ours names nothing in tpc_hooks: {missing}"
        if r.kind == "behaviour":
            assert " (" in r.name, f"a behaviour row says what is relied on: {r.name}"


def test_every_runtime_row_has_a_check_that_exists():
    keys = {r.live for r in ROWS if r.live is not None}
    tests = {k for k in keys if k.startswith("tests/")}
    assert keys - tests == set(_vllm_live.CHECKS), "every live key is checked, every check is a row's"
    for ref in tests:
        path, _, test = ref.partition("::")
        assert re.search(rf"^def {test}\(", (ROOT / path).read_text(), re.M), f"no test {ref}"


def _vllm_names(path: Path) -> set[frozenset[str]]:
    """The vLLM names a module uses, each as the spellings any one of which the table must have:
    imports and imported names, attributes of those (and of their calls' results), and in a class
    with a vLLM base the methods it overrides and the attributes it reads from ``self`` without
    setting them."""
    tree = ast.parse(path.read_text())
    bound: dict[str, str] = {}
    found: set[frozenset[str]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "vllm":
                    bound[(a.asname or a.name).split(".")[0]] = a.name if a.asname else "vllm"
                    found.add(frozenset({a.name}))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "vllm":
            for a in node.names:
                bound[a.asname or a.name] = f"{node.module}.{a.name}"
                found.add(frozenset({f"{node.module}.{a.name}"}))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            base = node.value
            call = isinstance(base, ast.Call)
            base = base.func if call else base
            if isinstance(base, ast.Name) and base.id in bound:
                found.add(frozenset({f"{bound[base.id]}{'()' if call else ''}.{node.attr}"}))
        elif isinstance(node, ast.ClassDef):
            bases = [bound[b.id] for b in node.bases if isinstance(b, ast.Name) and b.id in bound]
            bases += [
                f"{bound[b.value.id]}.{b.attr}"
                for b in node.bases
                if isinstance(b, ast.Attribute) and isinstance(b.value, ast.Name) and b.value.id in bound
            ]
            if not bases:
                continue
            own = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
            own |= {
                t.attr
                for n in ast.walk(node)
                if isinstance(n, ast.Assign)
                for t in n.targets
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
            }
            used = {
                n.attr
                for n in ast.walk(node)
                if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"
            }
            for attr in sorted((used - own) | {n.name for n in node.body if isinstance(n, ast.FunctionDef)}):
                found.add(frozenset(f"{b}.{attr}" for b in bases))
    return found


def test_every_vllm_name_the_plugin_uses_is_in_the_table():
    """Scanned from the source: a name is in the table if a row's path is it or starts with it (an
    imported module whose attributes have rows), or a row spells it so (``also``)."""
    paths = {r.path for r in ROWS} | {a for r in ROWS for a in r.also}
    seen, lost = 0, []
    for path in sorted(PACKAGE.rglob("*.py")):
        for spellings in _vllm_names(path):
            seen += 1
            if not any(p == s or p.startswith(s + ".") for s in spellings for p in paths):
                lost.append(f"{path.relative_to(ROOT)}: {' or '.join(sorted(spellings))}")
    assert seen > 50  # the scan reads the worker's modules
    assert not lost, "vLLM names the plugin uses and the table lacks:\n" + "\n".join(lost)


def test_the_size_of_the_surface_adds_up():
    counted = size()
    assert sum(counted["kind"].values()) == sum(counted["when"].values()) == len(ROWS)
    assert set(counted["when"]) <= set(checks.WHEN)


def test_the_docs_say_how_big_the_surface_is():
    """docs/concepts/vllm.md's table of the surface counts what the table holds, kind by kind."""
    page = (ROOT / "docs" / "concepts" / "vllm.md").read_text()
    section = page[page.index("### What it relies on in vLLM") :]
    lines = [ln for ln in section.splitlines() if ln.startswith("| ") and not ln.startswith("| the plugin")][
        : len(checks.KINDS) + 1
    ]
    got = [[int(x.strip("* ") or 0) for x in ln.split("|")[2:6]] for ln in lines]
    want = [
        [sum(r.kind == k and r.when in w for r in ROWS) for w in (checks.WHEN, ("static",), ("both",), ("runtime",))]
        for k in checks.KINDS
    ]
    want.append([len(ROWS), *(sum(r.when == w for r in ROWS) for w in ("static", "both", "runtime"))])
    assert got == want
    live = sum(r.live is not None and not r.live.startswith("tests/") for r in ROWS)
    static, runtime = sum(r.check is not None for r in ROWS), sum(r.live is not None for r in ROWS)
    assert f"{static} names are checked by introspection" in page
    assert f"{runtime} are checked at run time: {live} inside a monitored engine's worker" in page
    assert f"and {runtime - live} by the server's own tests" in page


# ---------------------------------------------------------------------------------------------- the checks
def test_a_module_that_does_not_import_marks_its_rows_missing_and_the_others_are_checked(tmp_path, monkeypatch):
    (tmp_path / "tpc_contract_broken.py").write_text("raise ImportError('needs a GPU library')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    us = "adapters.vllm._wire:vllm_engine_args"
    rows = (
        checks.row("tpc_contract_broken:Thing", "import", us, checks.exists()),
        checks.row("tpc_contract_broken:Thing.go", "call", us, checks.params()),
        checks.row("json:dumps", "call", us, checks.params("obj", more=True)),
        checks.row("json:loads", "call", us, checks.params("s", "strict")),
        checks.row("json:nothing_here", "call", us, checks.exists()),
        checks.row("json.decoder:JSONDecodeError.msg", "read", us, checks.prop()),
    )
    found = {f.name: f for f in checks.run_static(rows)}
    assert [f.status for f in found.values()] == ["MISSING", "MISSING", "OK", "CHANGED", "MISSING", "MISSING"]
    assert "ImportError: needs a GPU library" in found["tpc_contract_broken:Thing.go"].detail
    assert (
        "parameters ['s', 'cls'" in found["json:loads"].detail
        and "expected ['s', 'strict']" in found["json:loads"].detail
    )
    assert str(found["json:nothing_here"]) == "MISSING  json:nothing_here: json has no attribute 'nothing_here'"


def test_a_workers_error_is_read_from_what_vllm_raises():
    """vLLM 0.32/0.33's words around a worker's error (the engine core's, and a worker process's),
    checked live in ``make test-vllm``; other text comes back unchanged."""
    assert worker_error(Exception("Call to collective_rpc method failed: monitor expects d_model=64")) == (
        "monitor expects d_model=64"
    )
    wrapped = (
        "Call to collective_rpc method failed: Worker failed with error 'no monitor named 'x'', please check "
        "the stack trace above for the root cause"
    )
    assert worker_error(Exception(wrapped)) == "no monitor named 'x'"
    assert worker_error(ValueError("something else: entirely")) == "something else: entirely"


def test_the_runtime_checks_catch_what_they_check():
    """The worker's judgements on a recorder's data, without an engine: each flags the breakage it
    is there for (an apply out of step or on another thread, a row count off, a row fed another
    request's token, an admission count off, a request reported finished in its own step)."""
    from vllm_contract import recorder as r

    steps = [("exec", 1, 2, 7), ("apply", 1, 2, 7), ("exec", 2, 2, 7), ("apply", 2, 2, 7)]
    assert r._order(steps) is None
    assert "apply of step 1 (thread 7) after ('exec', 2" in r._order([*steps[:3], ("apply", 1, 2, 7)])
    assert "apply of step 1 (thread 8)" in r._order([("exec", 1, 2, 7), ("apply", 1, 2, 8)])
    rec = r.Recorder(worker=None, force=True)
    rec.events = [("exec", 1, 3, 7), ("apply", 1, 2, 7)]
    assert r._rows(rec) == "step 1: 2 logits rows for 3 requests"
    rec.events = steps
    rec.prompts = {"a-1": [20, 5, 6], "b-2": [21, 5, 6]}
    rec.fed = {"a-1": [(0, [20, 5, 6]), (3, [20])], "b-2": [(0, [21, 5, 6]), (3, [21])]}
    assert r._rows(rec) is None
    rec.fed["b-2"].append((4, [20]))
    assert r._rows(rec) == "b-2 was fed 20, another request's token (its own: 21)"
    rec.computed = {"a-1": 0, "b-2": 0}
    assert r._computed(rec, block=2) == "no prompt came twice"
    rec.prompts["c-3"], rec.computed["c-3"] = [20, 5, 6], 0
    assert r._computed(rec, block=2) == "c-3 started at 0 computed tokens, expected 2"
    rec.last, rec.finished = {"a-1": 3}, {"a-1": 3}
    assert r._finished(rec) == "a-1 reported finished at step 3, last scheduled at 3"


# ---------------------------------------------------------------------------------------------- ids and calls
def test_the_id_scheme_is_read_in_one_helper_each_way():
    """Sample k of n, and prompt i of a completions batch, read from vLLM's ids as vLLM 0.32/0.33 write
    them (rows ParentRequest, OpenAIServingCompletion); an id of another shape is a loud error naming the
    row, never a guess; a request vLLM did not fan out is sample 0 whatever its id looks like."""
    from tpc_hooks import TPCHooksError
    from tpc_hooks.adapters.vllm._wire import child_index, completion_prompt

    for k in range(3):
        assert child_index(f"{k}_chatcmpl-3_x-1-0a1b2c3d", 3) == k
        assert completion_prompt(f"cmpl-a-{k}-{k}") == k
    assert child_index("2_a", 1) == child_index("x", 1) == 0
    for bad in ("chatcmpl-x-0a1b2c3d", "3_x", "_x", "12_x"):
        with pytest.raises(TPCHooksError, match="ParentRequest"):
            child_index(bad, 3)
    for bad in ("chatcmpl-x", "cmpl-x", "cmpl-x-", "x-1"):
        with pytest.raises(TPCHooksError, match="OpenAIServingCompletion"):
            completion_prompt(bad)


_VLLM_FILES = sorted(PACKAGE.glob("adapters/vllm/**/*.py"))
_ID_READERS = ("child_index", "completion_prompt")  # in _wire: the two that read vLLM's ids


def test_no_id_is_split_or_matched_in_part_outside_the_contracts_helpers():
    """The vLLM side of the plugin cuts no string at '-' or '_' and matches none in part (``x in rid``,
    ``startswith``) or by pattern: engine ids are read by ``_wire.child_index`` and
    ``completion_prompt`` alone, requests matched by keys of tpc-hooks' own."""
    found = []
    for path in _VLLM_FILES:
        tree = ast.parse(path.read_text())
        readers = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in _ID_READERS]
        inside = {id(n) for r in readers for n in ast.walk(r)}
        assert len(readers) == (2 if path.name == "_wire.py" else 0)
        for node in ast.walk(tree):
            if id(node) in inside:
                continue
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                what, args = node.func.attr, node.args
                cuts = what in ("split", "rsplit", "partition", "rpartition") and any(
                    isinstance(a, ast.Constant) and a.value in ("-", "_") for a in args
                )
                if cuts:
                    found.append(f"{path.name}:{node.lineno}: .{what}({ast.unparse(args[0])})")
            ids = ("rid", "request_id", "engine_id", "response_id", "req_id")
            if isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
                right = node.comparators[0]
                if any(isinstance(n, ast.Name) and n.id in ids or getattr(n, "attr", "") in ids for n in [right]):
                    found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")  # a part of an id
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") in ("startswith", "endswith", "match"):
                if any(isinstance(n, ast.Name) and n.id in ids for n in ast.walk(node)):
                    found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    assert not found, found


def test_every_remote_call_name_resolves_to_a_method_of_the_worker():
    """The names callers pass to ``collective_rpc`` are the constants of ``_wire``, each one a
    method of the worker (read with ``ast``: the worker imports vLLM; with vLLM, on the class itself);
    no caller spells one out."""
    from tpc_hooks.adapters.vllm import _wire as _vllm_args

    methods = set()
    for module in ("control.py", "worker.py"):
        for node in ast.walk(ast.parse((PACKAGE / "adapters" / "vllm" / "_worker" / module).read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("tpc_hooks_"):
                methods.add(node.name)
    assert set(_vllm_args.RPCS) == methods, set(_vllm_args.RPCS) ^ methods
    if HAS_VLLM:
        from tpc_hooks.adapters.vllm._worker.worker import TPCHooksWorker

        assert all(callable(getattr(TPCHooksWorker, name, None)) for name in _vllm_args.RPCS)
    spelled = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "collective_rpc" and node.args:
                if isinstance(node.args[0], ast.Constant):
                    spelled.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not spelled, f"remote calls by a literal name: {spelled}"


def test_a_pass_the_runner_does_not_hold_as_read_is_refused_saying_why():
    """``last_pass`` reads a pass or raises naming what was missing; it never hands back "no pass" for a
    forward that ran (whose requests would go unscored)."""
    from types import SimpleNamespace as NS

    import numpy as np

    from tpc_hooks import TPCHooksError
    from tpc_hooks.adapters.vllm._engine import last_pass

    so = object()
    aux = [torch.zeros(3, 4)]
    batch = NS(num_reqs=1, req_ids=["r"])
    v1 = dict(input_batch=batch, query_start_loc=NS(np=np.array([0, 3])), input_ids=NS(gpu=torch.arange(3)))
    step = last_pass(NS(execute_model_state=NS(aux_hidden_states=aux, scheduler_output=so), **v1), so)
    assert step.req_ids == ["r"] and step.tokens.tolist() == [0, 1, 2] and step.aux[0] is aux[0]
    for state, why in [
        (None, "kept no execute_model_state"),
        (NS(aux_hidden_states=None, scheduler_output=so), "returned no auxiliary hidden states"),
        (NS(aux_hidden_states=aux, scheduler_output=object()), "holds another step's state"),
    ]:
        with pytest.raises(TPCHooksError, match=f"cannot read this forward pass: vLLM's model runner {why}"):
            last_pass(NS(execute_model_state=state, **v1), so)


# ---------------------------------------------------------------------------------------------- against vLLM
@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed here (make test-vllm)")
def test_the_installed_vllm_is_as_every_static_row_says():
    """Fails listing every row that is not OK, by name (``-s`` prints them all)."""
    from tpc_hooks.adapters.vllm._engine import vllm_version

    found = check_static()
    print(f"\nvLLM {vllm_version()}: {len(found)} static rows")
    for f in found:
        print(f)
    bad = [str(f) for f in found if f.status != checks.OK]
    assert not bad, f"{len(bad)} of {len(found)} rows differ:\n" + "\n".join(bad)


SITES = ["blocks.1.hook_resid_post", "blocks.2.hook_resid_pre"]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """One small monitored engine: the tiny Llama of tests/families.py, compiled as vLLM decides."""
    pytest.importorskip("vllm")
    from families import build, vllm_engine
    from tiny_models import tokenizer

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    path = tmp_path_factory.mktemp("contract-llama")
    build("llama").save_pretrained(path)
    tokenizer().save_pretrained(path)
    llm = vllm_engine(path, **_vllm_live.engine_args(SITES))
    yield llm
    del llm


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed here (make test-vllm)")
def test_a_model_runner_tpc_hooks_does_not_know_is_refused_at_build():
    """Checked on the class (vLLM's GPU model runner V1 or V2, or one built on it): another is refused
    with the reason, before any pass runs."""
    from tpc_hooks import TPCHooksError
    from tpc_hooks.adapters.vllm._engine import check_runner

    class OwnRunner:
        pass

    with pytest.raises(TPCHooksError, match=r"this engine runs .*OwnRunner, which it does not know"):
        check_runner(OwnRunner())


def test_turned_off_the_worker_is_plain_vllms_token_for_token_and_refuses_to_monitor(tmp_path, monkeypatch):
    """TPC_HOOKS_DISABLE=1 when the engine starts: built with tpc-hooks' worker and logits processor, it
    generates what an engine without them does (greedy and seeded sampling), and monitor.generate and
    tpc.collect on it refuse, saying why, rather than run unmonitored."""
    vllm = pytest.importorskip("vllm")
    import gc

    from families import build, vllm_engine
    from tiny_models import tiny_head, tokenizer

    import tpc_hooks as tpc
    from tpc_hooks.adapters import vllm_engine_args

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    build("llama").save_pretrained(tmp_path)
    tokenizer().save_pretrained(tmp_path)
    prompts = [{"prompt_token_ids": [5 + j, 20 + 3 * j, 37, 12 + j]} for j in range(3)]  # the tiny vocabulary: 40
    params = [
        vllm.SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True),
        vllm.SamplingParams(max_tokens=12, temperature=1.0, seed=7, ignore_eos=True),
        vllm.SamplingParams(max_tokens=12, temperature=0.7, seed=3, ignore_eos=True),
    ]
    made = {}
    for case in ("plain", "off"):
        if case == "off":
            monkeypatch.setenv("TPC_HOOKS_DISABLE", "1")  # the engine's processes start with it
        llm = vllm_engine(tmp_path, enforce_eager=True, **(vllm_engine_args(SITES) if case == "off" else {}))
        try:
            made[case] = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]
            if case == "off":
                width = llm.llm_engine.vllm_config.model_config.get_hidden_size()
                monitor = tpc.Monitor(tiny_head(d_model=width), SITES[0])
                off = r"turned off in this engine \(TPC_HOOKS_DISABLE=1"
                with pytest.raises(tpc.TPCHooksError, match=off):
                    monitor.generate(llm, ["hi"], max_new_tokens=2)
                with pytest.raises(tpc.TPCHooksError, match=off):
                    tpc.collect(llm, ["hi"], SITES[0], progress=False)
        finally:
            del llm
            gc.collect()
    assert made["off"] == made["plain"] and [len(m) for m in made["plain"]] == [12] * 3


def test_a_live_engine_is_as_every_runtime_row_says(engine):
    """Every runtime row on a real runner; only the other model runner's rows are skipped."""
    found = _vllm_live.check_engine(engine)
    for f in found:
        print(f)
    live = {r.name: r.live for r in ROWS}
    assert len(found) == sum(r.live in _vllm_live.CHECKS for r in ROWS)
    bad = [
        str(f)
        for f in found
        if f.status != checks.OK and not (f.status == checks.SKIPPED and live[f.name][:3] in ("v1.", "v2."))
    ]
    assert not bad, f"{len(bad)} runtime rows differ:\n" + "\n".join(bad)
