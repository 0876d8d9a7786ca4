"""A real samplerd for the client tests: started per test module on port 0, in a temp dir.

SAMPLERD_BIN names the binary (default: the repository's bazel-bin/server/samplerd, built by
scripts/test.sh); SAMPLERD_TEST_BACKEND picks the backend (default cpu; the GPU machine runs
the cuda-marked tests with cuda).
"""
import os
import pathlib
import subprocess
import sys
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]


class Server:
    def __init__(self, tmp: pathlib.Path, *flags, backend=None, unix_socket=False):
        binary = os.environ.get("SAMPLERD_BIN", str(REPO / "bazel-bin" / "server" / "samplerd"))
        if not os.path.exists(binary):
            raise RuntimeError(f"{binary} not found: build //server:samplerd first")
        port_file = tmp / "port"
        if port_file.exists():
            port_file.unlink()  # a restart in the same dir must not read the last run's port
        if unix_socket:  # the same target across restarts, as a pod's sidecar socket is
            flags = (*flags, f"--unix_socket={tmp / 'samplerd.sock'}")
        self.log = open(tmp / "samplerd.log", "w+")
        backend = backend or os.environ.get("SAMPLERD_TEST_BACKEND", "cpu")
        self.proc = subprocess.Popen(
            [binary, "--listen=127.0.0.1:0", f"--port_file={port_file}", f"--backend={backend}",
             "--threads=2", *flags], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.log.seek(0)
                raise RuntimeError(f"samplerd did not start: {self.log.read()[-2000:]}")
            time.sleep(0.02)
        self.port = int(port_file.read_text().split()[0])
        self.target = f"unix:{tmp / 'samplerd.sock'}" if unix_socket else f"127.0.0.1:{self.port}"

    def stop(self):
        self.proc.terminate()
        try:
            rc = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        self.log.close()
        return rc


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("samplerd"))
    yield s
    assert s.stop() == 0, "samplerd did not exit cleanly on SIGTERM"


@pytest.fixture
def client(server):
    import samplerd

    with samplerd.SamplerClient(server.target, client_id="pytest", timeout=30) as c:
        c.wait_ready()
        yield c
