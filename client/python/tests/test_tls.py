"""TLS and mutual TLS on samplerd's TCP listener (issue 31), against a real samplerd process,
with a throwaway PKI made for the test (scripts/make_test_certs.sh: openssl).

The server under test serves mutual TLS from a directory reached through a symlink (as a
Kubernetes Secret volume is laid out, so rotation swaps the link), re-read every second, and
allows one client identity (DNS:worker-a.llm.svc) to change its state.
"""
import os
import pathlib
import shutil
import socket
import ssl
import subprocess
import time
import urllib.request

import grpc
import numpy as np
import pytest

import samplerd
from conftest import REPO, Server

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None,
                                reason="needs the openssl command (scripts/install-deps.sh)")
ALLOWED = "worker-a.llm.svc"
GREEDY = samplerd.SamplingParams(temperature=0)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    subprocess.run(["bash", str(REPO / "scripts" / "make_test_certs.sh"), str(d)], check=True)
    (d / "current").symlink_to(d / "server")
    return d


@pytest.fixture(scope="module")
def tls_server(pki, tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("samplerd-tls"),
               f"--tls_cert_file={pki / 'current' / 'tls.crt'}",
               f"--tls_key_file={pki / 'current' / 'tls.key'}",
               f"--tls_client_ca_file={pki / 'ca.pem'}", f"--tls_allowed_clients={ALLOWED}",
               "--tls_reload_interval_s=1", "--registration_lease_ms=60000")
    yield s
    assert s.stop() == 0


def client_for(server, pki, who=None, **kw):
    tls = samplerd.TLS(ca_file=str(pki / "ca.pem"),
                       cert_file=str(pki / f"{who}.pem") if who else None,
                       key_file=str(pki / f"{who}.key") if who else None)
    return samplerd.SamplerClient(server.target, tls=tls, timeout=10, reconnect_timeout=0, **kw)


def inline_step(client):
    logits = np.array([[0.5, 2.0, 1.0, -1.0]], dtype=np.float32)
    return client.sample(logits, [samplerd.Prefill("r0", row=0, params=GREEDY)])


def error_of(call):
    """(code, message) of the SamplerError `call` raises (the exception itself is not kept: its
    traceback would hold the caller's views of shared memory)."""
    try:
        call()
    except samplerd.SamplerError as e:
        return e.code, e.message
    raise AssertionError("no error")


def refused(make):
    """The handshake fails: the call never reaches samplerd (UNAVAILABLE)."""
    with make() as c:
        with pytest.raises(samplerd.SamplerError) as e:
            c.server_info()
    return e.value.code


def test_valid_client_samples_and_registers(tls_server, pki):
    with client_for(tls_server, pki, "worker-a") as c:
        assert c.health() == "SERVING"
        assert inline_step(c)["r0"].token_ids.tolist() == [1]
        region = samplerd.ShmRegion(4 * 4)
        view = region.ndarray((1, 4))
        view[:] = [[0.0, 0.0, 9.0, 0.0]]
        c.register_shm(region)
        step = c.sample(samplerd.ShmLogits(region, view),
                        [samplerd.Prefill("r1", row=0, params=GREEDY)])
        assert step["r1"].token_ids.tolist() == [2]
        assert [b.name for b in c.list_buffers()] == [region.buffer_name]
        c.unregister(region.buffer_name)
        del view
        region.close()


def test_plaintext_and_bad_certificates_are_refused(tls_server, pki):
    plaintext = lambda: samplerd.SamplerClient(tls_server.target, timeout=5, reconnect_timeout=0)
    assert refused(plaintext) == grpc.StatusCode.UNAVAILABLE
    for who in (None, "stranger", "expired"):  # no certificate, another CA, expired
        code = refused(lambda: client_for(tls_server, pki, who))
        assert code == grpc.StatusCode.UNAVAILABLE, who
    # The server's certificate is checked too: a client trusting another CA refuses samplerd.
    other = samplerd.TLS(ca_file=str(pki / "other-ca.pem"), cert_file=str(pki / "worker-a.pem"),
                         key_file=str(pki / "worker-a.key"))
    distrusting = lambda: samplerd.SamplerClient(tls_server.target, tls=other, timeout=5,
                                                 reconnect_timeout=0)
    assert refused(distrusting) == grpc.StatusCode.UNAVAILABLE


def test_client_outside_the_allowlist_may_only_sample_inline(tls_server, pki):
    with client_for(tls_server, pki, "worker-a", client_id="owner") as owner, \
            client_for(tls_server, pki, "worker-b", client_id="owner") as other:
        assert inline_step(other)["r0"].token_ids.tolist() == [1]   # sampling: allowed
        assert other.server_info().backend
        region = samplerd.ShmRegion(4 * 4)
        view = region.ndarray((1, 4))
        for attempt in (lambda: other.register_shm(region), other.list_buffers,
                        lambda: other.unregister("anything"), other.channel,
                        lambda: other.create_group(2, 16)):
            code, message = error_of(attempt)
            assert code == grpc.StatusCode.PERMISSION_DENIED
            assert "worker-b.llm.svc" in message and "--tls_allowed_clients" in message
        # A failed registration unlinked the region's name (issue 45): a fresh one.
        del view
        region.close()
        region = samplerd.ShmRegion(4 * 4)
        view = region.ndarray((1, 4))
        # A region the allowed client registered: the other may not name it in a step, even
        # under the same client id (scopes are per certificate identity).
        owner.register_shm(region)
        code, message = error_of(lambda: other.sample(samplerd.ShmLogits(region, view),
                                                      [samplerd.Prefill("r", row=0)]))
        assert code == grpc.StatusCode.PERMISSION_DENIED and message.startswith("logits:")
        owner.unregister(region.buffer_name)
        del view
        region.close()


def served_certificate(port, pki):
    """The DER certificate samplerd presents to a new connection."""
    ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    ctx.load_cert_chain(str(pki / "worker-a.pem"), str(pki / "worker-a.key"))
    ctx.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        with ctx.wrap_socket(sock, server_hostname="localhost") as tls:
            return tls.getpeercert(binary_form=True)


def der(path):
    return ssl.PEM_cert_to_DER_cert(path.read_text())


def test_rotation_keeps_open_streams(tls_server, pki):
    assert served_certificate(tls_server.port, pki) == der(pki / "server" / "tls.crt")
    with client_for(tls_server, pki, "worker-a") as c, c.stream() as stream:
        logits = np.array([[0.0, 3.0]], dtype=np.float32)
        step = lambda: stream.step(logits, [samplerd.Prefill("a", row=0, params=GREEDY)])
        assert step()["a"].token_ids.tolist() == [1]
        # cert-manager's rotation as the kubelet applies it: a new pair in a new directory, the
        # link swapped atomically.
        subprocess.run(["bash", str(REPO / "scripts" / "make_test_certs.sh"), str(pki), "rotated"],
                       check=True)
        (pki / "next").symlink_to(pki / "rotated")
        os.replace(pki / "next", pki / "current")
        deadline = time.monotonic() + 15
        while served_certificate(tls_server.port, pki) != der(pki / "rotated" / "tls.crt"):
            assert time.monotonic() < deadline, "samplerd did not take the rotated certificate"
            time.sleep(0.2)
        # The stream opened before the rotation goes on; new connections verify the new pair.
        for _ in range(3):
            assert step()["a"].token_ids.tolist() == [1]
    with client_for(tls_server, pki, "worker-a") as fresh:
        assert inline_step(fresh)["r0"].token_ids.tolist() == [1]


def test_plaintext_off_loopback_needs_an_explicit_flag(tmp_path):
    binary = os.environ.get("SAMPLERD_BIN", str(REPO / "bazel-bin" / "server" / "samplerd"))
    run = subprocess.run([binary, "--listen=0.0.0.0:0", "--backend=cpu"], capture_output=True,
                         text=True, timeout=30)
    assert run.returncode == 2
    assert "--allow_insecure_network" in run.stderr + run.stdout
    s = Server(tmp_path, "--listen=0.0.0.0:0", "--allow_insecure_network")  # the last --listen wins
    assert s.stop() == 0


def test_unix_socket_is_owner_only(tmp_path):
    s = Server(tmp_path, unix_socket=True)
    try:
        assert (os.stat(tmp_path / "samplerd.sock").st_mode & 0o777) == 0o600
    finally:
        assert s.stop() == 0


def test_samplerctl_over_mutual_tls(tls_server, pki):
    samplerctl = pathlib.Path(os.environ.get(
        "SAMPLERCTL_BIN", str(REPO / "bazel-bin" / "client" / "samplerctl")))
    if not samplerctl.exists():
        pytest.skip(f"{samplerctl} not built")
    base = [str(samplerctl), "health", f"--target={tls_server.target}", "--timeout_ms=5000",
            f"--tls_ca={pki / 'ca.pem'}"]
    with_cert = base + [f"--tls_cert={pki / 'worker-a.pem'}", f"--tls_key={pki / 'worker-a.key'}"]
    ok = subprocess.run(with_cert, capture_output=True, text=True)
    assert ok.returncode == 0 and ok.stdout.strip() == "SERVING", ok.stderr
    no_cert = subprocess.run(base, capture_output=True, text=True)
    assert no_cert.returncode == 1


def test_a_reload_that_reads_a_broken_pair_keeps_the_last_good_one(pki, tmp_path):
    """Issue 45: a rotation that rewrites the files in place can be read between truncate and
    write; gRPC was handed the empty key and samplerd aborted (SIGABRT, exit 134). Now each
    unusable read is refused (logged, counted in samplerd_tls_reload_failures_total) and the
    last good pair keeps serving; a key that is not the certificate's is refused too."""
    live = tmp_path / "live"
    shutil.copytree(pki / "server", live)
    s = Server(tmp_path, f"--tls_cert_file={live / 'tls.crt'}", f"--tls_key_file={live / 'tls.key'}",
               f"--tls_client_ca_file={pki / 'ca.pem'}", "--tls_reload_interval_s=1",
               "--metrics_address=127.0.0.1:0")
    metrics_port = int((tmp_path / "port").read_text().split()[1])

    def failures():
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5)
        for line in text.read().decode().splitlines():
            if line.startswith("samplerd_tls_reload_failures_total "):
                return float(line.split()[1])
        return None

    try:
        good_key = (live / "tls.key").read_bytes()
        for broken in (b"", good_key[: len(good_key) // 2], (pki / "worker-b.key").read_bytes()):
            (live / "tls.key").write_bytes(broken)  # in place: truncate, then write
            before = failures()
            deadline = time.monotonic() + 10
            while failures() == before:
                assert s.proc.poll() is None, "samplerd died on a broken TLS file"
                assert time.monotonic() < deadline, "the broken read was not counted"
                time.sleep(0.1)
            with client_for(s, pki, "worker-a") as c:  # new connections: the last good pair
                assert inline_step(c)["r0"].token_ids.tolist() == [1]
        (live / "tls.key").write_bytes(good_key)
        assert s.proc.poll() is None
    finally:
        assert s.stop() == 0


def test_a_key_that_is_not_the_certificates_is_refused_at_start(pki):
    binary = os.environ.get("SAMPLERD_BIN", str(REPO / "bazel-bin" / "server" / "samplerd"))
    run = subprocess.run([binary, "--listen=127.0.0.1:0", "--backend=cpu",
                          f"--tls_cert_file={pki / 'server' / 'tls.crt'}",
                          f"--tls_key_file={pki / 'worker-b.key'}"],
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 2
    assert "is not the key of the certificate" in run.stderr + run.stdout


def test_one_certificate_cannot_use_or_remove_anothers_regions(pki, tmp_path):
    """Issue 45: under mutual TLS, certificate B saw A's owner id in ListBuffers, sampled A's
    logits and unregistered A's region. Regions are their owner identity's: B (allowed too)
    sees none of A's, cannot name them in a step, nor remove them, even under A's client id."""
    s = Server(tmp_path, f"--tls_cert_file={pki / 'server' / 'tls.crt'}",
               f"--tls_key_file={pki / 'server' / 'tls.key'}",
               f"--tls_client_ca_file={pki / 'ca.pem'}",
               f"--tls_allowed_clients={ALLOWED},worker-b.llm.svc")
    try:
        with client_for(s, pki, "worker-a", client_id="shared") as a, \
                client_for(s, pki, "worker-b", client_id="shared") as b:
            region = samplerd.ShmRegion(4 * 4)
            view = region.ndarray((1, 4))
            view[:] = [0.5, 2.0, 1.0, -1.0]
            a.register_shm(region, "a-logits")
            assert b.list_buffers() == []
            [mine] = a.list_buffers()
            assert mine.owner == f"cert:{ALLOWED}/id:shared"
            code, message = error_of(lambda: b.sample(samplerd.ShmLogits(region, view),
                                                      [samplerd.Prefill("r", row=0)]))
            assert code == grpc.StatusCode.NOT_FOUND and "a-logits" in message
            code, _ = error_of(lambda: b.unregister("a-logits"))
            assert code == grpc.StatusCode.NOT_FOUND
            got = a.sample(samplerd.ShmLogits(region, view), [samplerd.Prefill("r", row=0,
                                                                               params=GREEDY)])
            assert got["r"].token_ids.tolist() == [1]
            a.unregister("a-logits")
            del view
            region.close()
    finally:
        assert s.stop() == 0


def test_a_connection_that_never_handshakes_is_closed(pki, tmp_path):
    """A peer that connects to the TLS port and sends nothing (no certificate, no ClientHello)
    is closed after --tls_handshake_timeout_ms (gRPC's default would hold it 120 s), while a
    client that handshakes is served."""
    s = Server(tmp_path, f"--tls_cert_file={pki / 'current' / 'tls.crt'}",
               f"--tls_key_file={pki / 'current' / 'tls.key'}",
               f"--tls_client_ca_file={pki / 'ca.pem'}", "--tls_handshake_timeout_ms=500")
    try:
        silent = [socket.create_connection(("127.0.0.1", s.port)) for _ in range(4)]
        start = time.monotonic()
        for sock in silent:
            sock.settimeout(10)
            assert sock.recv(1) == b"", "the server sent something to a silent peer"
            sock.close()
        closed_after = time.monotonic() - start
        assert closed_after < 5, f"silent connections held {closed_after:.1f} s"
        with client_for(s, pki, "worker-a") as c:
            assert inline_step(c)["r0"].token_ids.tolist() == [1]
    finally:
        assert s.stop() == 0
