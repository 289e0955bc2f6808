"""tpc-hooks' contract with vLLM: its checks."""

from tpc_hooks.serving import _vllm_checks as checks


# ---------------------------------------------------------------------------------------------- the checks
def test_a_module_that_does_not_import_marks_its_rows_missing_and_the_others_are_checked(tmp_path, monkeypatch):
    (tmp_path / "tpc_contract_broken.py").write_text("raise ImportError('needs a GPU library')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    rows = (
        checks.row("tpc_contract_broken:Thing", "import", "serving._vllm_contract:check_static", checks.exists()),
        checks.row("tpc_contract_broken:Thing.go", "call", "serving._vllm_contract:check_static", checks.params()),
        checks.row("json:dumps", "call", "serving._vllm_contract:check_static", checks.params("obj", more=True)),
        checks.row("json:loads", "call", "serving._vllm_contract:check_static", checks.params("s", "strict")),
        checks.row("json:nothing_here", "call", "serving._vllm_contract:check_static", checks.exists()),
        checks.row("json.decoder:JSONDecodeError.msg", "read", "serving._vllm_contract:check_static", checks.prop()),
    )
    found = {f.name: f for f in checks.run_static(rows)}
    assert [f.status for f in found.values()] == ["MISSING", "MISSING", "OK", "CHANGED", "MISSING", "MISSING"]
    assert "ImportError: needs a GPU library" in found["tpc_contract_broken:Thing.go"].detail
    assert (
        "parameters ['s', 'cls'" in found["json:loads"].detail
        and "expected ['s', 'strict']" in found["json:loads"].detail
    )
    assert str(found["json:nothing_here"]) == "MISSING  json:nothing_here: json has no attribute 'nothing_here'"
