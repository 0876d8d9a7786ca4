"""Issue 26 on the GPU: a worker that dies leaves nothing behind, for CUDA IPC. A real worker
process registers a 1 GiB PyTorch tensor as "worker-pool", samples from it on a stream and is
killed (SIGKILL), 20 times in a row: half of them streaming (the stream drops: released at
once), half idle with only the client's keep-alive running (released when the lease runs out).
Each time the device's free memory must come back to where it was before the worker (within
64 MiB) within the lease plus a second, the next worker must register the same name and
sample, and samplerd's RSS must stay flat. Skipped where PyTorch has no CUDA device."""
import signal
import subprocess
import sys
import textwrap
import time

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import samplerd  # noqa: E402
from conftest import Server  # noqa: E402

LEASE_MS = 1000
GIB = 1 << 30

WORKER = textwrap.dedent("""
    import sys, time, torch, samplerd
    client = samplerd.SamplerClient(sys.argv[1], timeout=60)
    client.wait_ready()
    pool = torch.zeros(GIB // 4, dtype=torch.float32, device="cuda")
    pool[: 4 * 32000].normal_()
    region = client.register_cuda_tensor("worker-pool", pool)
    view = pool[: 4 * 32000].view(4, 32000)
    ready = samplerd.ReadyEvent()
    torch.cuda.synchronize()
    stream = client.stream()
    result = stream.step(samplerd.CudaLogits(region, view, ready.record()),
                         [samplerd.Prefill(f"r{r}", row=r, params=samplerd.SamplingParams(
                             seed=r, temperature=0.8)) for r in range(4)])
    assert all(r.ok for r in result)
    if sys.argv[2] == "idle":
        stream.close()
    print("READY", flush=True)
    time.sleep(600)
""").replace("GIB", str(GIB))


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def free_bytes():
    return torch.cuda.mem_get_info(0)[0]


def test_killed_cuda_ipc_workers_leave_nothing_behind(tmp_path):
    server = Server(tmp_path, f"--registration_lease_ms={LEASE_MS}", backend="cuda")
    torch.cuda.init()
    times = {"streaming": [], "idle": []}
    rss = []
    try:
        with samplerd.SamplerClient(server.target, client_id="watcher") as watcher:
            watcher.wait_ready()
            for i in range(20):
                how = "idle" if i % 2 else "streaming"
                before = free_bytes()
                worker = subprocess.Popen([sys.executable, "-c", WORKER, server.target, how],
                                          stdout=subprocess.PIPE, text=True)
                assert worker.stdout.readline().strip() == "READY", f"worker {i} ({how})"
                assert free_bytes() < before - GIB // 2  # the pool is there
                killed = time.monotonic()
                worker.send_signal(signal.SIGKILL)
                worker.wait()
                deadline = killed + LEASE_MS / 1000 + 1
                while free_bytes() < before - (64 << 20) and time.monotonic() < deadline:
                    time.sleep(0.005)
                took = time.monotonic() - killed
                assert free_bytes() >= before - (64 << 20), \
                    f"worker {i} ({how}): device memory not back {took:.2f} s after the kill"
                # (The worker's region is not the watcher's to list since issue 45: the memory
                # coming back is what shows it was released; the next worker registers the name.)
                times[how].append(took * 1000)
                rss.append(rss_kib(server.proc.pid))
    finally:
        assert server.stop() == 0
    assert rss[-1] - rss[1] < 16 * 1024, f"samplerd RSS {rss[1]} -> {rss[-1]} KiB"
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    print(f"\ntest_cuda_dead_worker: 20 workers killed (SIGKILL) with a 1 GiB CUDA IPC region "
          f"each, lease {LEASE_MS} ms: device memory back in {med['streaming']:.0f} ms median "
          f"(max {max(times['streaming']):.0f}) streaming, {med['idle']:.0f} ms median (max "
          f"{max(times['idle']):.0f}) idle; samplerd RSS {rss[1]} KiB after the 2nd, "
          f"{rss[-1]} KiB after the last")


def test_a_cuda_ipc_region_is_registered_again_after_a_samplerd_restart(tmp_path):
    """The other way round, on the GPU: samplerd killed under a worker whose logits are in a
    registered CUDA tensor; the client registers the tensor again and the loop goes on with the
    same answers (seeded steps: the answer before the kill is the reference)."""
    server = Server(tmp_path, backend="cuda", unix_socket=True)
    pool = torch.randn(4 * 32000, device="cuda")
    view = pool.view(4, 32000)
    requests = [samplerd.Prefill(f"r{r}", row=r, params=samplerd.SamplingParams(
        seed=r, temperature=0.8, top_logprobs=2)) for r in range(4)]
    try:
        with samplerd.SamplerClient(server.target, reconnect_timeout=30) as client:
            client.wait_ready()
            region = client.register_cuda_tensor("restart-pool", pool)
            ready = samplerd.ReadyEvent()
            with client.stream() as stream:
                want = [r.token_ids.tolist() for r in stream.step(
                    samplerd.CudaLogits(region, view, ready.record()), requests, step_id=1)]
                server.proc.send_signal(signal.SIGKILL)
                server.proc.wait()
                server.log.close()
                server = Server(tmp_path, backend="cuda", unix_socket=True)
                got = [r.token_ids.tolist() for r in stream.step(
                    samplerd.CudaLogits(region, view, ready.record()), requests, step_id=1)]
            assert got == want
            assert [b.name for b in client.list_buffers()] == ["restart-pool"]
    finally:
        assert server.stop() == 0
