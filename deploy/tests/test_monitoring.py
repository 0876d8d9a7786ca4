"""deploy/monitoring: the Grafana dashboard and the PrometheusRule parse, render with Debian 12's
kubectl, and every metric they name is one a running samplerd exports (scraped from a real
samplerd after a few steps, so the histogram and labelled counters have series)."""
import json
import pathlib
import re
import subprocess
import tempfile
import time
import urllib.request

import yaml

from test_manifests import DEPLOY, REPO, kubectl_debian

MONITORING = DEPLOY / "monitoring"
METRIC = re.compile(r"\bsamplerd_[a-z0-9_]+")
SUFFIXES = ("_bucket", "_count", "_sum")


def exported_families():
    """The metric families (# TYPE lines) of a real samplerd on port 0, after one step."""
    binary = REPO / "bazel-bin" / "server" / "samplerd"
    samplerctl = REPO / "bazel-bin" / "client" / "samplerctl"
    with tempfile.TemporaryDirectory() as d:
        port_file = pathlib.Path(d) / "port"
        proc = subprocess.Popen([str(binary), "--listen=127.0.0.1:0", f"--port_file={port_file}",
                                 "--metrics_address=127.0.0.1:0", "--backend=cpu", "--threads=1"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(600):
                if port_file.exists() and len(port_file.read_text().split()) == 2:
                    break
                time.sleep(0.05)
            grpc_port, metrics_port = port_file.read_text().split()
            subprocess.run([str(samplerctl), "sample", f"--target=127.0.0.1:{grpc_port}",
                            str(REPO / "examples" / "prefill.json")], check=True,
                           capture_output=True)
            text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics",
                                          timeout=10).read().decode()
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    return {m.group(1): m.group(2) for m in re.finditer(r"^# TYPE (\S+) (\S+)$", text, re.M)}


def named_metrics(exprs):
    names = set()
    for expr in exprs:
        for name in METRIC.findall(expr):
            names.add(next((name[:-len(s)] for s in SUFFIXES if name.endswith(s)), name))
    return names


def dashboard_exprs():
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return dashboard, exprs


def rules():
    (doc,) = [d for d in yaml.safe_load_all((MONITORING / "prometheusrule.yaml").read_text()) if d]
    assert (doc["apiVersion"], doc["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    return [r for g in doc["spec"]["groups"] for r in g["rules"]]


def test_every_metric_named_is_exported():
    families = exported_families()
    _, exprs = dashboard_exprs()
    exprs += [r["expr"] for r in rules()]
    named = named_metrics(exprs)
    assert named, "no samplerd metric found in the files"
    missing = sorted(n for n in named if n not in families)
    assert not missing, f"named but not exported by samplerd: {missing}"
    # Suffixes only where Prometheus makes them: _bucket/_count/_sum of histograms.
    for expr in exprs:
        for name in METRIC.findall(expr):
            base = next((name[:-len(s)] for s in SUFFIXES if name.endswith(s)), None)
            if base is not None and base in families:
                assert families[base] == "histogram", name


def test_dashboard_covers_what_operators_watch():
    dashboard, exprs = dashboard_exprs()
    named = named_metrics(exprs)
    for metric in ("samplerd_step_seconds", "samplerd_requests_total", "samplerd_errors_total",
                   "samplerd_steps_in_flight", "samplerd_registered_buffers",
                   "samplerd_registered_buffer_bytes", "samplerd_group_failures_total"):
        assert metric in named, metric
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    assert any("histogram_quantile(0.99" in e and "by (le, kind)" in e for e in exprs)


def test_rules_are_well_formed():
    alerts = {r["alert"]: r for r in rules()}
    assert set(alerts) >= {"SamplerdErrorRatioHigh", "SamplerdStepLatencyP99High",
                           "SamplerdStreamsOpenNoSteps"}
    for name, rule in alerts.items():
        assert rule["expr"].strip() and rule["labels"]["severity"] in ("warning", "critical"), name
        assert rule["annotations"]["summary"], name
        assert rule["expr"].count("(") == rule["expr"].count(")"), name


def test_renders():
    out = subprocess.run([kubectl_debian(), "kustomize", str(MONITORING)], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    objs = [d for d in yaml.safe_load_all(out.stdout) if d]
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["samplerd.json"])["uid"] == "samplerd"
    assert {o["kind"] for o in objs} == {"ConfigMap", "PrometheusRule"}
    assert all(o["metadata"]["namespace"] == "samplerd" for o in objs)
