"""Issue 46: what a worker SIGKILLed while its kernels run does to the MPS server, samplerd and
the next worker. Under a running MPS control daemon, with samplerd (CUDA) at TARGET:

    python3 bench/mps_wedge.py SAMPLERD_BIN ROUNDS

Each round: a worker registers a CUDA tensor, samples, starts matmuls and is SIGKILLed; then
samplerd is asked for a step (inline logits), a new process probes for a context
(samplerd --probe_gpu_context), and a replacement worker tries to sample. Prints what each
saw and how long it took. Fails (exit 1) when a worker does not sample within 30 s, when a new
context cannot be had after a kill, or when samplerd exits other than with 3 (its context torn
down) within 5 s of the kill; samplerd is restarted (as a pod's kubelet would) when it exits.
The first round's worker is the first client; each later one is the replacement of a killed
one (its "sampled N s after its start" is how long a replacement waits for a context)."""
import subprocess
import sys
import textwrap
import time

import samplerd

WORKER = textwrap.dedent("""
    import sys, time, torch, samplerd
    client = samplerd.SamplerClient(sys.argv[1], timeout=30, reconnect_timeout=0)
    pool = torch.randn(4 * 32000, device="cuda")
    region = client.register_cuda_tensor("pool", pool)
    ready = samplerd.ReadyEvent()
    r = client.sample(samplerd.CudaLogits(region, pool.view(4, 32000), ready.record()),
                      [samplerd.Prefill("r", row=0, params=samplerd.SamplingParams(seed=1))])
    assert r["r"].ok
    print("READY", flush=True)
    if sys.argv[2] == "busy":
        a = torch.randn(8192, 8192, device="cuda")
        while True:
            a = a @ a
            a = a / a.norm()
    time.sleep(600)
""")


def start_samplerd(binary, port_file):
    port_file.unlink(missing_ok=True)
    proc = subprocess.Popen([binary, "--listen=127.0.0.1:0", f"--port_file={port_file}",
                             "--backend=cuda", "--registration_lease_ms=1000"],
                            stdout=open("/tmp/wedge-samplerd.log", "a"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while not (port_file.exists() and port_file.read_text().strip()):
        if proc.poll() is not None:
            return proc, None
        if time.monotonic() > deadline:
            return proc, None
        time.sleep(0.05)
    return proc, f"127.0.0.1:{int(port_file.read_text().split()[0])}"


def main():
    import pathlib
    binary, rounds = sys.argv[1], int(sys.argv[2])
    port_file = pathlib.Path("/tmp/wedge-port")
    proc, target = start_samplerd(binary, port_file)
    print(f"samplerd: {target}", flush=True)
    failures = []
    for i in range(rounds):
        how = "busy"
        t0 = time.monotonic()
        w = subprocess.Popen([sys.executable, "-c", WORKER, target, how],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = w.stdout.readline().strip()
        t_ready = time.monotonic() - t0
        if line != "READY" or t_ready > 30:
            failures.append(f"round {i}: the worker did not sample within 30 s")
            print(f"round {i}: worker did not sample ({t_ready:.1f} s): "
                  f"{w.communicate()[1][-300:] if line != 'READY' else ''}", flush=True)
        time.sleep(0.5)
        killed = time.monotonic()
        w.kill()
        w.wait()
        # No step is sent: samplerd's watchdog must notice its torn-down context by itself.
        while proc.poll() is None and time.monotonic() - killed < 10:
            time.sleep(0.02)
        took = time.monotonic() - killed
        exited = (f"exited {proc.returncode} {took:.2f} s after the kill"
                  if proc.poll() is not None else "still running 10 s after the kill")
        probe = subprocess.run([binary, "--probe_gpu_context"], capture_output=True, text=True,
                               timeout=60)
        if proc.poll() is not None and (proc.returncode != 3 or took > 5):
            failures.append(f"round {i}: samplerd {exited}")
        if probe.returncode != 0:
            failures.append(f"round {i}: no new context after the kill")
        print(f"round {i}: worker sampled {t_ready:.1f} s after its start, killed mid-kernel; "
              f"samplerd {exited}; a new context: rc {probe.returncode} "
              f"{(probe.stdout + probe.stderr).strip()[-80:]}", flush=True)
        if proc.poll() is not None:
            print(f"round {i}: samplerd exited {proc.returncode}; restarting it", flush=True)
            proc, target = start_samplerd(binary, port_file)
            print(f"samplerd: {target}", flush=True)
    proc.terminate()
    proc.wait()
    print("\n".join(failures) or f"mps_wedge: {rounds} rounds, every replacement served")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
