"""Checks of deploy/: every overlay renders, validates strictly against the Kubernetes API
schemas of 1.29, 1.31, 1.33 and 1.35, passes checkov with no failed check, and states what
the README says it does (hardening, shared uid, native sidecar, shutdown budget, memory bound,
same GPU). Run by scripts/test.sh in a venv from deploy/tests/requirements.txt.

Rendering uses Debian 12's kubectl (kustomize v2; scripts/debian-kubectl.sh). Where a newer
kubectl (kustomize v5, what users run) is on PATH, its rendering must be the same objects.
"""
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import kubernetes_validate
import pytest
import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
VERSIONS = ["1.29.0", "1.31.0", "1.33.0", "1.35.0"]
# The DRA overlay uses resource.k8s.io/v1 (GA in Kubernetes 1.34): older API servers lack it.
MIN_VERSION = {"sidecar-gpu-dra": (1, 34)}
OVERLAYS = sorted(p.name for p in (DEPLOY / "overlays").iterdir() if p.is_dir())
# Custom resources kubernetes-validate has no schema for; test_podmonitor_targets checks them.
CRDS = {("monitoring.coreos.com/v1", "PodMonitor"), ("cert-manager.io/v1", "Certificate")}


def kubectl_debian():
    return subprocess.run(["bash", str(REPO / "scripts" / "debian-kubectl.sh")], check=True,
                          capture_output=True, text=True).stdout.strip()


def render(kubectl, overlay):
    out = subprocess.run([kubectl, "kustomize", str(DEPLOY / "overlays" / overlay)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


_cache = {}


def objects(overlay):
    if overlay not in _cache:
        _cache[overlay] = render(kubectl_debian(), overlay)
    return _cache[overlay]


def pod_spec(objs):
    (dep,) = [o for o in objs if o["kind"] == "Deployment"]
    return dep["spec"]["template"]


def containers(spec):
    return spec.get("initContainers", []) + spec["containers"]


def samplerd(spec):
    return next(c for c in containers(spec) if c["name"] == "samplerd")


def flag(container, name):
    for arg in container.get("args", []):
        if arg.startswith(f"--{name}="):
            return arg.split("=", 1)[1]
    return None


def quantity(q):
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 1e3, "M": 1e6, "G": 1e9, "m": 1e-3}
    m = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(q))
    return float(m.group(1)) * units.get(m.group(2), 1)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_the_same_with_kustomize_v5(overlay):
    modern = shutil.which("kubectl")
    if not modern or "v5." not in subprocess.run([modern, "version", "--client"],
                                                  capture_output=True, text=True).stdout:
        pytest.skip("no kubectl with kustomize v5 on PATH")
    key = lambda o: (o["kind"], o["metadata"]["name"])
    ours = sorted(objects(overlay), key=key)
    theirs = sorted(render(modern, overlay), key=key)
    assert json.dumps(ours, sort_keys=True) == json.dumps(theirs, sort_keys=True)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_validates_strictly(overlay, version):
    if tuple(int(x) for x in version.split(".")[:2]) < MIN_VERSION.get(overlay, (0, 0)):
        pytest.skip(f"{overlay} needs Kubernetes {'.'.join(map(str, MIN_VERSION[overlay]))}+")
    for obj in objects(overlay):
        if (obj["apiVersion"], obj["kind"]) in CRDS:
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.SchemaNotFoundError as e:
            pytest.fail(f"{overlay}: no schema for {obj['apiVersion']} {obj['kind']} in {version}: {e}")
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{overlay} {obj['kind']}/{obj['metadata']['name']} on {version}: {e}")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_hardened(overlay):
    objs = objects(overlay)
    assert all(o["metadata"].get("namespace") == "samplerd" for o in objs if o["kind"] != "Namespace")
    template = pod_spec(objs)
    spec = template["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] >= 10000
    assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    for c in containers(spec):
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert "runAsUser" not in sc, "one pod-level uid for every container"
        for kind in ("cpu", "memory"):
            assert c["resources"]["limits"][kind] == c["resources"]["requests"][kind], (c["name"], kind)
        image = c["image"]
        assert re.fullmatch(r"[a-z0-9.-]+\.[a-z]+/[a-z0-9/_-]+:\d+\.\d+\.\d+@sha256:[0-9a-f]{64}", image), image
    sd = samplerd(spec)
    # --threads follows the CPU request through the downward API.
    assert flag(sd, "threads") == "$(SAMPLERD_THREADS)"
    (env,) = [e for e in sd["env"] if e["name"] == "SAMPLERD_THREADS"]
    assert env["valueFrom"]["resourceFieldRef"] == {"containerName": "samplerd",
                                                   "resource": "requests.cpu", "divisor": "1"}
    # The memory limit covers what the flags let samplerd allocate (CPU backend: the draft pool
    # is host memory; messages count twice, on the wire and parsed) plus 256 MiB of runtime.
    bound = 2 * int(flag(sd, "max_inflight_message_bytes")) + int(flag(sd, "max_request_memory_bytes"))
    if flag(sd, "backend") == "cpu":
        bound += int(flag(sd, "draft_pool_bytes"))
    assert quantity(sd["resources"]["limits"]["memory"]) >= bound + 256 * 2**20
    assert int(flag(sd, "max_message_bytes")) <= int(flag(sd, "max_inflight_message_bytes"))
    # samplerd's whole shutdown fits in the pod's grace period.
    drain_ms = int(flag(sd, "shutdown_grace_ms")) + int(flag(sd, "shutdown_deadline_ms"))
    assert drain_ms + 2000 <= spec["terminationGracePeriodSeconds"] * 1000


@pytest.mark.parametrize("overlay", [o for o in OVERLAYS if o.startswith("sidecar")])
def test_sidecar_pod(overlay):
    spec = pod_spec(objects(overlay))["spec"]
    sd = samplerd(spec)
    assert sd in spec["initContainers"] and sd["restartPolicy"] == "Always", "a native sidecar"
    assert flag(sd, "listen") == "127.0.0.1:50051"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert sd[probe]["exec"]["command"][:2] == ["samplerctl", "health"], probe
    assert "--live" in sd["livenessProbe"]["exec"]["command"]
    # shm: a memory-backed /dev/shm in both containers; the worker's limit holds its size.
    (dshm,) = [v for v in spec["volumes"] if v["name"] == "dshm"]
    assert dshm["emptyDir"]["medium"] == "Memory"
    worker = next(c for c in spec["containers"] if c["name"] == "worker")
    for c in (sd, worker):
        assert {"name": "dshm", "mountPath": "/dev/shm"}.items() <= next(
            m for m in c["volumeMounts"] if m["name"] == "dshm").items()
    assert quantity(worker["resources"]["limits"]["memory"]) > quantity(dshm["emptyDir"]["sizeLimit"])
    # samplerd outlives the worker's drain: it gets SIGTERM after the worker exits, and the
    # grace period leaves the worker at least a minute.
    drain_ms = int(flag(sd, "shutdown_grace_ms")) + int(flag(sd, "shutdown_deadline_ms"))
    assert spec["terminationGracePeriodSeconds"] * 1000 - drain_ms >= 60_000
    if "gpu" in overlay:
        assert spec["shareProcessNamespace"] is True
        assert flag(sd, "backend") == "cuda"
        assert sd["image"].startswith("registry.example.com/samplerd/samplerd-cuda:")
    else:
        assert flag(sd, "backend") == "cpu"


def test_gpu_overlays_put_both_containers_on_one_gpu():
    objs = objects("sidecar-gpu-dra")
    spec = pod_spec(objs)["spec"]
    (claim,) = spec["resourceClaims"]
    (template,) = [o for o in objs if o["kind"] == "ResourceClaimTemplate"]
    assert claim["resourceClaimTemplateName"] == template["metadata"]["name"]
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["count"] == 1
    for c in containers(spec):
        assert c["resources"]["claims"] == [{"name": claim["name"]}], c["name"]
        assert "nvidia.com/gpu" not in c["resources"]["limits"]
    spec = pod_spec(objects("sidecar-gpu-device-plugin"))["spec"]
    assert spec["nodeSelector"]["nvidia.com/gpu.count"] == "1"
    for c in containers(spec):
        assert c["resources"]["limits"]["nvidia.com/gpu"] == 1, c["name"]


@pytest.mark.parametrize("overlay", ["sidecar-gpu-dra", "sidecar-gpu-device-plugin"])
def test_gpu_overlays_run_samplerd_and_the_worker_under_one_mps_server(overlay):
    """Issue 46: the pod's first native sidecar is an MPS control daemon; samplerd and the
    worker are its clients (its pipe directory, shared by a memory-backed emptyDir, and one
    /dev/shm); a daemon whose server refuses new clients is restarted by its liveness probe."""
    spec = pod_spec(objects(overlay))["spec"]
    mps, sd = spec["initContainers"][0], spec["initContainers"][1]
    assert mps["name"] == "mps" and sd["name"] == "samplerd"
    assert mps["restartPolicy"] == "Always" and mps["command"] == ["nvidia-cuda-mps-control", "-f"]
    assert mps["image"] == sd["image"]
    env = lambda c: {e["name"]: e.get("value") for e in c.get("env", [])}
    pipe = env(mps)["CUDA_MPS_PIPE_DIRECTORY"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    worker = next(c for c in spec["containers"] if c["name"] == "worker")
    for c in (mps, sd, worker):
        assert env(c)["CUDA_MPS_PIPE_DIRECTORY"] == pipe, c["name"]
        mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
        assert volumes[mounts[pipe]["name"]]["emptyDir"]["medium"] == "Memory", c["name"]
        assert mounts["/dev/shm"]["name"] == "dshm" and not mounts["/dev/shm"].get("readOnly")
    assert mps["startupProbe"]["exec"]["command"][-1].endswith("nvidia-cuda-mps-control")
    assert mps["livenessProbe"]["exec"]["command"] == ["samplerd", "--probe_gpu_context"]


@pytest.mark.parametrize("overlay", ["standalone", "standalone-cert-manager"])
def test_standalone(overlay):
    objs = objects(overlay)
    by_kind = {o["kind"]: o for o in objs}
    assert set(by_kind) >= {"Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy", "PodMonitor"}
    template = pod_spec(objs)
    sd = samplerd(template["spec"])
    assert flag(sd, "listen") == "0.0.0.0:50051"
    # Off loopback only with mutual TLS, from the mounted Secret, and no plaintext escape hatch.
    assert "--allow_insecure_network" not in sd["args"]
    (tls,) = [v for v in template["spec"]["volumes"] if v["name"] == "tls"]
    (mount,) = [m for m in sd["volumeMounts"] if m["name"] == "tls"]
    assert mount["readOnly"] is True
    for name, file in (("tls_cert_file", "tls.crt"), ("tls_key_file", "tls.key"),
                       ("tls_client_ca_file", "ca.crt")):
        assert flag(sd, name) == f"{mount['mountPath']}/{file}", name
    assert flag(sd, "tls_allowed_clients")
    assert tls["secret"]["defaultMode"] & 0o007 == 0, "the key is not world-readable"
    assert template["spec"]["securityContext"]["fsGroup"] == template["spec"]["securityContext"]["runAsGroup"]
    if overlay == "standalone-cert-manager":
        assert by_kind["Certificate"]["spec"]["secretName"] == tls["secret"]["secretName"]
    # The kubelet's gRPC probes cannot speak TLS: samplerctl over the pod-local unix socket.
    socket = flag(sd, "unix_socket")
    (run,) = [m for m in sd["volumeMounts"] if socket.startswith(m["mountPath"] + "/")]
    assert any(v["name"] == run["name"] and "emptyDir" in v for v in template["spec"]["volumes"])
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        command = sd[probe]["exec"]["command"]
        assert command[:2] == ["samplerctl", "health"] and f"--target=unix:{socket}" in command
    assert "--live" in sd["livenessProbe"]["exec"]["command"]
    assert by_kind["Service"]["spec"]["clusterIP"] == "None"
    labels = template["metadata"]["labels"]
    for kind in ("Service",):
        assert by_kind[kind]["spec"]["selector"].items() <= labels.items()
    for kind in ("PodDisruptionBudget", "NetworkPolicy"):
        sel = by_kind[kind]["spec"].get("selector") or by_kind[kind]["spec"]["podSelector"]
        assert sel["matchLabels"].items() <= labels.items(), kind
    assert by_kind["Deployment"]["spec"]["replicas"] > by_kind["PodDisruptionBudget"]["spec"]["minAvailable"]
    # Readiness turns NOT_SERVING into "out of the endpoints" before new steps are refused.
    rp = sd["readinessProbe"]
    assert rp["periodSeconds"] * rp["failureThreshold"] * 1000 < int(flag(sd, "shutdown_grace_ms"))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_podmonitor_and_networkpolicy_target_the_metrics_port(overlay):
    objs = objects(overlay)
    template = pod_spec(objs)
    ports = {p["name"] for c in containers(template["spec"]) for p in c.get("ports", [])}
    (pm,) = [o for o in objs if o["kind"] == "PodMonitor"]
    assert pm["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    assert {e["port"] for e in pm["spec"]["podMetricsEndpoints"]} == {"metrics"} <= ports
    (np_,) = [o for o in objs if o["kind"] == "NetworkPolicy"]
    allowed = {p["port"] for rule in np_["spec"]["ingress"] for p in rule["ports"]}
    assert "metrics" in allowed and allowed <= ports


def test_checkov_finds_nothing(tmp_path):
    """checkov over every rendered overlay and both Dockerfiles: no failed check. A skip needs
    a `checkov:skip=CHECK: reason` comment in deploy/ (none today)."""
    for overlay in OVERLAYS:
        (tmp_path / f"{overlay}.yaml").write_text(yaml.safe_dump_all(objects(overlay)))
    for name in ("Dockerfile", "Dockerfile.cuda"):
        d = tmp_path / name.replace(".", "_")
        d.mkdir()
        shutil.copy(DEPLOY / name, d / "Dockerfile")
    out = subprocess.run(["checkov", "-d", str(tmp_path), "--framework", "kubernetes", "dockerfile",
                          "--skip-download", "--compact", "--quiet", "-o", "json"],
                         capture_output=True, text=True,
                         env={**os.environ, "PATH": f"{pathlib.Path(sys.executable).parent}:{os.environ['PATH']}"})
    reports = json.loads(out.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    failed = [(r["check_type"], c["check_id"], c["resource"], c.get("file_path"))
              for r in reports for c in r.get("results", {}).get("failed_checks", [])]
    passed = sum(r.get("summary", {}).get("passed", 0) for r in reports)
    assert not failed, failed
    assert passed > 300, f"checkov passed only {passed} checks: did it read the manifests?"
    sources = [p for p in DEPLOY.rglob("*")
               if p.is_file() and (p.suffix == ".yaml" or p.name.startswith("Dockerfile"))]
    skips = [l for p in sources for l in p.read_text().splitlines() if "checkov:skip=" in l]
    for line in skips:
        assert re.search(r"checkov:skip=CKV\w+:\s*\S", line), f"skip without a reason: {line}"
    print(f"checkov: {passed} passed, 0 failed, {len(skips)} skipped")
