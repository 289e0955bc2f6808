"""``tpc-hooks serve`` with several monitors (``--monitor NAME=DIR:ACTION``, repeated): each
answer carries each monitor's decision by name, held to a MonitorSet on the transformers model;
the finish reason names the monitor that stopped a request; the metrics are labelled by
monitor; a request can opt out of, or re-threshold, one monitor by name (run by ``make
test-vllm``; skipped where vLLM is not installed)."""

import re
import subprocess

import pytest

pytest.importorskip("vllm")
pytest.importorskip("httpx")

import tpc_hooks as tpc  # noqa: E402
from test_vllm_serve import PROMPTS, REL, _chat, _free_port, _metrics, _monitor, _serve, running  # noqa: E402
from tiny_models import random_head  # noqa: E402

EARLY = "blocks.10.hook_resid_post"


def _early(threshold=0.5):
    head = random_head(576, std=0.05, scale=30.0, seed=7)
    return tpc.Monitor(head, EARLY, pooling="mean", chat_template=True, threshold=threshold)


@pytest.fixture(scope="module")
def expected(smollm2_hf):
    """The set on the transformers model: "harm" stops, "early" (another layer, mean pooling) flags
    with a threshold some requests cross and others do not."""
    model, tok = smollm2_hf
    early = _early()
    peaks = sorted(float(s.max()) for s in early.generate(model, PROMPTS, max_new_tokens=12, tokenizer=tok).scores)
    early.threshold = (peaks[1] + peaks[2]) / 2
    harm = _monitor()
    harm.report["operating_point"] = {"fpr": 0.05}  # the rate it was calibrated to: the drift gauges' target
    monitors = tpc.MonitorSet({"harm": harm, "early": early}, actions={"harm": "stop"})
    return monitors, monitors.generate(model, PROMPTS, max_new_tokens=12, tokenizer=tok)


@pytest.fixture(scope="module")
def set_server(tmp_path_factory, expected):
    monitors, _ = expected
    dirs = {}
    for name, mon in monitors.items():
        dirs[name] = tmp_path_factory.mktemp(name)
        mon.save(dirs[name])
    for client in running(["--monitor", f"harm={dirs['harm']}:stop", "--monitor", f"early={dirs['early']}:flag",
                           "--drift-window", "3"]):
        yield client, dirs


def test_models_endpoint_names_each_monitor(set_server):
    client, dirs = set_server
    from tpc_hooks.serving._vllm_serve import identity

    got = client.get("/v1/models").json()["tpc_hooks"]
    assert got["harm"]["target_fpr"] == 0.05 and got["early"]["target_fpr"] is None
    assert got == {"harm": {**identity(dirs["harm"]), "action": "stop"},
                   "early": {**identity(dirs["early"]), "action": "flag"}}


def test_each_answer_carries_each_monitors_decision_by_name(set_server, expected, smollm2_hf):
    client, _ = set_server
    monitors, want = expected
    _, tok = smollm2_hf
    assert "harm" in want.stopped_by and any(want["early"].flagged) and not all(want["early"].flagged)
    before = {name: _metrics(client, name) for name in monitors}
    flagged = {name: 0 for name in monitors}
    recent = []
    for b, prompt in enumerate(PROMPTS):
        r = _chat(client, prompt)
        assert r.status_code == 200, r.text
        recent = (recent + [r])[-3:]
        choice = r.json()["choices"][0]
        assert set(choice["tpc_hooks"]) == {"harm", "early"}
        for name in monitors:
            field, run = choice["tpc_hooks"][name], want[name]
            assert field["monitored"] and field["threshold"] == pytest.approx(monitors[name].threshold)
            assert field["stopped"] == (run.stopped_at[b] is not None)
            assert field["flagged_at_token"] == run.first_flagged[b]
            assert field["peak_score"] == pytest.approx(float(run.scores[b][:field["steps"]].max()), rel=REL)
            flagged[name] += field["flagged"]
        assert choice["message"]["content"] == tok.decode(want.generated(b), skip_special_tokens=True)
        if want.stopped_by[b] is not None:
            assert choice["finish_reason"] == f"content_flagged:{want.stopped_by[b]}"
        else:
            assert choice["finish_reason"] in ("stop", "length")
    for name in monitors:
        after = _metrics(client, name)
        grew = {k: after[k] - before[name].get(k, 0.0) for k in after}
        assert grew["tpc_hooks_requests_scored_total"] == len(PROMPTS)
        assert grew["tpc_hooks_requests_stopped_total"] == sum(by == name for by in want.stopped_by)
        assert grew["tpc_hooks_requests_flagged_total"] == flagged[name]
        assert grew["tpc_hooks_peak_score_count"] == len(PROMPTS)
    assert flagged["early"] > 0
    # the drift gauges: the flag rate over the last 3 scored requests, over the server's life, and the target
    last = {name: [r.json()["choices"][0]["tpc_hooks"][name]["flagged"] for r in recent] for name in monitors}
    for name in monitors:
        rates = _rates(client, name)
        counts = _metrics(client, name)
        assert rates["lifetime"] == pytest.approx(counts["tpc_hooks_requests_flagged_total"]
                                                  / counts["tpc_hooks_requests_scored_total"])
        assert rates["recent"] == pytest.approx(sum(last[name]) / 3)
    assert _rates(client, "harm")["target"] == 0.05 and "target" not in _rates(client, "early")


def _rates(client, monitor: str) -> dict[str, float]:
    """tpc_hooks_flag_rate of one monitor, by window."""
    out = {}
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("tpc_hooks_flag_rate{"):
            key, value = line.rsplit(" ", 1)
            labels = dict(re.findall(r'(\w+)="([^"]*)"', key))
            if labels.get("monitor") == monitor:
                out[labels["window"]] = float(value)
    return out


def test_a_request_opts_out_of_or_rethresholds_one_monitor_by_name(set_server):
    client, _ = set_server
    stopped = _chat(client, "hi").json()["choices"][0]
    assert stopped["finish_reason"] == "content_flagged:harm"
    before = _metrics(client, "harm")
    out = _chat(client, "hi", vllm_xargs={"tpc_hooks_monitor.harm": False}).json()["choices"][0]
    assert out["tpc_hooks"]["harm"] == {"monitored": False} and out["tpc_hooks"]["early"]["monitored"]
    assert out["finish_reason"] in ("stop", "length")
    assert len(out["message"]["content"]) > len(stopped["message"]["content"])
    assert _metrics(client, "harm")["tpc_hooks_requests_opted_out_total"] - \
        before.get("tpc_hooks_requests_opted_out_total", 0.0) == 1
    own = _chat(client, "hi", vllm_xargs={"tpc_hooks_threshold.harm": 0.99}).json()["choices"][0]
    assert own["tpc_hooks"]["harm"]["threshold"] == 0.99 and not own["tpc_hooks"]["harm"]["stopped"]
    assert own["tpc_hooks"]["early"]["threshold"] == stopped["tpc_hooks"]["early"]["threshold"]
    bad = _chat(client, "hi", vllm_xargs={"tpc_hooks_monitor.pii": False})
    assert bad.status_code == 400 and "names no monitor of this server" in bad.text and "harm, early" in bad.text


def test_several_monitors_each_need_a_name(tmp_path):
    _monitor().save(tmp_path / "a")
    proc = _serve(["--monitor", str(tmp_path / "a"), "--monitor", str(tmp_path / "a"), "--port", str(_free_port())])
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert proc.returncode == 2 and "several monitors need a name each" in out.strip().splitlines()[-1]
