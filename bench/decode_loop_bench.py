"""The decode loop a PyTorch model worker runs (issues 29 and 46): the model alone, the model
then sampling in-process with PyTorch, and the model then samplerd through the Python client,
each in a synchronous and an asynchronous loop.

A Llama-shaped model (8 layers, d = 2048, 16 heads, SwiGLU 5632, vocab 128,256, bf16 weights at
random, a KV cache) decodes B sequences. Every mode runs the same forward (its logits written
into the same [B, V] bf16 tensor) and takes its next input tokens from the device; they differ
only in what comes after the logits:
  - alone: nothing is sampled; the host reads a fixed token tensor (as it would read tokens);
  - torch: temperature 0.7, top-k 50 (topk), top-p 0.95 (softmax + cumsum), multinomial, top-5
    logprobs (log_softmax + topk): vLLM's path for seeded or logprob requests; tokens and
    logprobs to the host;
  - samplerd (transport `channel`: the co-located step channel, `channel:S` the same with a
    fixed poll of S seconds before it sleeps on the futex; `grpc`: SampleStream): the
    logits tensor is a registered CUDA IPC region; one step built from arrays (build_batch,
    same parameters, a seed a sequence) with a ReadyEvent, answered as arrays; samplerd writes
    the tokens into the worker's TokenOutput, which the next forward reads after a device-side
    wait (cuStreamWaitValue32): no tokens cross to the device from the host.
Loops: `sync`: the host waits for step N's results before it enqueues forward N+1. `async`: it
enqueues forward N+1 (reading step N's tokens on the device) before it reads step N's results
(the host one step behind, as engines with asynchronous scheduling run).
The modes run interleaved, in blocks of 20 timed steps at the same positions (the host's step
times drift over a run). A step's time is one iteration of the loop; each mode's overhead is
its p50 minus the model alone's in the same loop. The model alone must be the fastest in its
loop (within 3%, the noise of a host-bound step): where it is not the baseline is broken, the
parts of every mode are printed and the run exits 1. Every KV length is run once before the
timing: the first forward at a new length costs ~40 ms of one-off setup, which once fell on
whichever mode reached a position first and made the model alone the slowest. `--graph` runs
the model's step as one captured CUDA graph (as engines decode): the step is then GPU-bound, and
what each sampler adds to it is no longer hidden behind Python's launches. `--mps` starts a private MPS control daemon for the run (and always stops it):
samplerd and this process become clients of one MPS server. `samplerctl bench`'s p50 for the
same step shape is printed beside.

    python3 bench/decode_loop_bench.py --samplerd=.device-pack/bin/samplerd \
        --samplerctl=.device-pack/bin/samplerctl [--batches=1,16,64] [--steps=200] [--mps]
"""
import argparse
import atexit
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

import samplerd

VOCAB = 128256


class Model(torch.nn.Module):
    """A Llama-shaped decoder (no RoPE: timing only) with a preallocated KV cache."""

    def __init__(self, layers=8, d=2048, heads=16, ffn=5632, vocab=VOCAB, batch=1, max_len=512):
        super().__init__()
        g = torch.Generator(device="cuda").manual_seed(0)
        w = lambda *shape: (torch.randn(*shape, generator=g, device="cuda") / shape[-1] ** 0.5).bfloat16()
        self.heads, self.hd = heads, d // heads
        self.embed = w(vocab, d)
        self.layers = [dict(qkv=w(3 * d, d), o=w(d, d), up=w(2 * ffn, d), down=w(d, ffn))
                       for _ in range(layers)]
        self.lm_head = w(vocab, d)
        self.k = torch.zeros(layers, batch, heads, max_len, self.hd, device="cuda", dtype=torch.bfloat16)
        self.v = torch.zeros_like(self.k)
        self.batch, self.max_len = batch, max_len
        self._pos = 0
        self.graph = None

    @property
    def pos(self):
        return self._pos

    @pos.setter
    def pos(self, value):
        self._pos = value
        if self.graph is not None:
            self.pos_t.fill_(value)  # the captured forward reads its position from the device

    @staticmethod
    def norm(x):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype)

    def capture(self, out):
        """Captures one decode step as a CUDA graph (as engines run decode): the step's host
        cost becomes one replay, so the GPU, not Python's launches, sets the step time and
        what a sampler adds to it shows. Its position lives on the device (pos_t), the KV
        write and the attention mask follow it; the logits go to `out`."""
        self.pos_t = torch.zeros((), dtype=torch.long, device="cuda")
        self.cols = torch.arange(self.max_len, device="cuda")
        self.static_tokens = torch.zeros(self.batch, dtype=torch.long, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                self._graph_step(out)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._graph_step(out)
        self.graph_out = out
        self.pos = 0

    def _graph_step(self, out):
        B = self.batch
        x = self.embed[self.static_tokens]
        at = self.pos_t.view(1)
        mask = (self.cols <= self.pos_t).view(1, 1, 1, -1)
        for i, L in enumerate(self.layers):
            q, k, v = F.linear(self.norm(x), L["qkv"]).view(B, 3, self.heads, self.hd).unbind(1)
            self.k[i].index_copy_(2, at, k.unsqueeze(2))
            self.v[i].index_copy_(2, at, v.unsqueeze(2))
            a = F.scaled_dot_product_attention(q.unsqueeze(2), self.k[i], self.v[i],
                                               attn_mask=mask).view(B, -1)
            x = x + F.linear(a, L["o"])
            gate, up = F.linear(self.norm(x), L["up"]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, L["down"])
        torch.matmul(self.norm(x), self.lm_head.t(), out=out)
        self.pos_t += 1

    def forward(self, tokens, out=None):
        """tokens [B] on the device -> logits [B, V] (bf16), written into `out` when given."""
        if self.graph is not None:
            assert out is self.graph_out
            self.static_tokens.copy_(tokens)
            self.graph.replay()
            self._pos += 1
            return out
        B = tokens.shape[0]
        x = self.embed[tokens]
        p = self.pos
        for i, L in enumerate(self.layers):
            q, k, v = F.linear(self.norm(x), L["qkv"]).view(B, 3, self.heads, self.hd).unbind(1)
            self.k[i, :, :, p] = k
            self.v[i, :, :, p] = v
            a = F.scaled_dot_product_attention(q.unsqueeze(2), self.k[i, :, :, :p + 1],
                                               self.v[i, :, :, :p + 1]).view(B, -1)
            x = x + F.linear(a, L["o"])
            gate, up = F.linear(self.norm(x), L["up"]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, L["down"])
        self._pos += 1
        if out is None:
            return F.linear(self.norm(x), self.lm_head)
        return torch.matmul(self.norm(x), self.lm_head.t(), out=out)


def torch_sample(logits, gen):
    """vLLM's fallback path: T 0.7, top-k 50, top-p 0.95, multinomial, top-5 logprobs."""
    x = logits.float() / 0.7
    vals, ids = x.topk(50, dim=-1)
    probs = vals.softmax(-1)
    cum = probs.cumsum(-1)
    vals = vals.masked_fill(cum - probs > 0.95, float("-inf"))
    probs = vals.softmax(-1)
    choice = torch.multinomial(probs, 1, generator=gen)
    tokens = ids.gather(-1, choice).squeeze(-1)
    lp = vals.log_softmax(-1)
    top_lp, top_i = lp.topk(5, dim=-1)
    return tokens, top_lp, ids.gather(-1, top_i)


def stats(times):
    us = sorted(t * 1e6 for t in times)
    return statistics.median(us), us[min(len(us) - 1, int(len(us) * 0.99))]


BLOCK, WARMUP = 20, 5


class Mode:
    """One way of running the loop. step(tokens) enqueues a forward from device `tokens` and
    whatever the mode does after the logits; it returns the next step's device tokens. sync:
    the host has this step's results when step() returns; async: the previous step's."""

    def __init__(self, model, B, loop):
        self.model, self.B, self.loop = model, B, loop
        self.parts = {}

    def part(self, name, seconds):
        self.parts.setdefault(name, []).append(seconds)

    def open(self):
        pass

    def close(self):
        pass


class HostCopies:
    """Device results to the host as each loop reads them: sync, at once (the host waits for
    this step); async, into pinned buffers, the host waiting only for the previous step's."""

    def __init__(self, *shapes):
        self.host = [torch.empty(shape, dtype=dtype, pin_memory=True) for shape, dtype in shapes]
        self.events = [torch.cuda.Event(), torch.cuda.Event()]
        self.n = 0

    def read(self, loop, *tensors):
        if loop == "sync":
            for t in tensors:
                t.cpu()
            return
        for host, t in zip(self.host, tensors):
            host.copy_(t, non_blocking=True)
        self.events[self.n % 2].record()
        if self.n:
            self.events[(self.n - 1) % 2].synchronize()
        self.n += 1

    def reset(self):
        torch.cuda.synchronize()
        self.n = 0


class Alone(Mode):
    """The model, and the host reading a token tensor it did not sample."""

    def __init__(self, model, B, loop):
        super().__init__(model, B, loop)
        self.fixed = torch.arange(B, device="cuda")
        self.copies = HostCopies(((B,), torch.long))

    def step(self, tokens, timed):
        t0 = time.perf_counter()
        self.model(tokens, out=self.model.logits)
        t1 = time.perf_counter()
        self.copies.read(self.loop, self.fixed)
        if timed:
            self.part("host forward", t1 - t0)
            self.part("wait for the GPU", time.perf_counter() - t1)
        return self.fixed

    def close(self):
        self.copies.reset()


class InProcess(Mode):
    """vLLM's fallback sampling path in this process; tokens and logprobs to the host."""

    def __init__(self, model, B, loop):
        super().__init__(model, B, loop)
        self.gen = torch.Generator(device="cuda").manual_seed(0)
        self.copies = HostCopies(((B,), torch.long), ((B, 5), torch.float32))

    def step(self, tokens, timed):
        t0 = time.perf_counter()
        logits = self.model(tokens, out=self.model.logits)
        t, lp, _ = torch_sample(logits, self.gen)
        t1 = time.perf_counter()
        self.copies.read(self.loop, t, lp)
        if timed:
            self.part("host forward+sample", t1 - t0)
            self.part("wait for the GPU", time.perf_counter() - t1)
        return t

    def close(self):
        self.copies.reset()


class WithSamplerd(Mode):
    """samplerd reads the logits tensor by CUDA IPC and writes the tokens into TokenOutput."""

    def __init__(self, model, B, loop, client, transport, region, output):
        super().__init__(model, B, loop)
        self.client, self.transport = client, transport
        self.region, self.output = region, output
        self.ready = samplerd.ReadyEvent()
        self.rows = np.arange(B, dtype=np.int32)
        self.seeds = np.arange(B, dtype=np.uint64)
        self.params = samplerd.SamplingParams(temperature=0.7, top_k=50, top_p=0.95,
                                              top_logprobs=5)
        self.sent = False

    def open(self):
        if self.transport.startswith("channel"):
            # "channel:S" polls a fixed S seconds before the futex (the default adapts).
            spin = float(self.transport.split(":")[1]) if ":" in self.transport else None
            self.steps = self.client.channel(spin_seconds=spin)
        else:
            self.steps = self.client.stream()

    def close(self):
        if self.sent:
            self._receive(False)
        self.steps.close()
        torch.cuda.synchronize()

    def _send(self, timed):
        t0 = time.perf_counter()
        logits = samplerd.CudaLogits(self.region, self.model.logits, self.ready.record())
        request = self.client.build_batch(
            logits, "decode", self.rows, params=self.params, seeds=self.seeds,
            sample_positions=np.full(self.B, self.model.pos, np.int64),
            output=self.output.next(self.B))
        t1 = time.perf_counter()
        self.steps.send(request)
        self.sent = True
        if timed:
            self.part("build", t1 - t0)

    def _receive(self, timed):
        t0 = time.perf_counter()
        result = self.steps.receive()
        self.sent = False
        if timed:
            self.part("receive", time.perf_counter() - t0)
            self.part("server total", result.total_us * 1e-6)
            self.part("server compute", result.compute_us * 1e-6)
            self.part("kernels", result.kernel_us * 1e-6)
        return result

    def step(self, tokens, timed):
        t0 = time.perf_counter()
        self.model(tokens, out=self.model.logits)
        t1 = time.perf_counter()
        if timed:
            self.part("host forward", t1 - t0)
        if self.loop == "sync":
            self._send(timed)
            self._receive(timed)
        else:
            if self.sent:
                self._receive(timed)
            self._send(timed)
        # The next forward's input: this step's tokens, on the device once samplerd wrote them.
        self.output.wait()
        return self.output.token_ids[:self.B, 0]


def run_blocks(model, B, steps, modes):
    """The modes interleaved in blocks of BLOCK timed steps (after WARMUP untimed ones), each
    block of each mode at the same positions, so that drift of the host falls on every mode
    alike. A step's time: one iteration of the loop."""
    times = {name: [] for name in modes}
    for block in range(max(1, steps // BLOCK)):
        for name, mode in modes.items():
            mode.open()
            model.pos = block * (BLOCK + WARMUP)
            tokens = torch.zeros(B, dtype=torch.long, device="cuda")
            last = None
            for k in range(BLOCK + WARMUP):
                timed = k >= WARMUP
                tokens = mode.step(tokens, timed)
                now = time.perf_counter()
                if timed and last is not None:
                    times[name].append(now - last)
                last = now
            mode.close()
    return times


def start_samplerd(binary, extra):
    d = tempfile.mkdtemp()
    port_file = os.path.join(d, "port")
    proc = subprocess.Popen([binary, "--listen=127.0.0.1:0", f"--port_file={port_file}"] + extra,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(400):
        if os.path.exists(port_file) and open(port_file).read().strip():
            break
        time.sleep(0.05)
    return proc, "127.0.0.1:" + open(port_file).read().split()[0]


def start_mps():
    """A private MPS control daemon for this run (before any CUDA context): samplerd and this
    process, started after, are its clients. Stopped at exit, whatever happens."""
    base = tempfile.mkdtemp(prefix="samplerd-mps-")
    os.environ["CUDA_MPS_PIPE_DIRECTORY"] = os.path.join(base, "pipe")
    os.environ["CUDA_MPS_LOG_DIRECTORY"] = os.path.join(base, "log")
    for d in ("pipe", "log"):
        os.makedirs(os.path.join(base, d))
    subprocess.run(["nvidia-cuda-mps-control", "-d"], check=True)
    atexit.register(lambda: subprocess.run(["nvidia-cuda-mps-control"], input=b"quit\n"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samplerd", required=True)
    ap.add_argument("--samplerctl")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--transports", default="channel,grpc",
                    help="channel, channel:SECONDS (a fixed poll before the futex), grpc")
    ap.add_argument("--loops", default="sync,async")
    ap.add_argument("--mps", action="store_true")
    ap.add_argument("--graph", action="store_true",
                    help="the model's step as one CUDA graph (GPU-bound, as engines decode)")
    args = ap.parse_args()
    if args.mps:
        start_mps()
    torch.backends.cuda.matmul.allow_tf32 = True
    proc, target = start_samplerd(args.samplerd, [])
    client = samplerd.SamplerClient(target)
    client.wait_ready()
    info = client.server_info()
    print(f"device: {torch.cuda.get_device_name()}; samplerd backend {info.backend}, "
          f"{'an MPS client' if info.mps else 'no MPS'}; the model "
          f"{'as one CUDA graph a step' if args.graph else 'eager'}")
    broken = False
    for B in [int(b) for b in args.batches.split(",")]:
        blocks = max(1, args.steps // BLOCK)
        model = Model(batch=B, max_len=blocks * (BLOCK + WARMUP) + 8)
        model.logits = torch.empty(B, VOCAB, device="cuda", dtype=torch.bfloat16)
        if args.graph:
            model.capture(model.logits)
        # Every KV length the loops will use, once, untimed: the first forward at each new
        # length pays ~40 ms of one-off setup (measured), which fell on whichever mode ran a
        # position first (the model alone) and made the baseline the slowest mode.
        for pos in range(blocks * (BLOCK + WARMUP)):
            model.pos = pos
            model(torch.zeros(B, dtype=torch.long, device="cuda"), out=model.logits)
        torch.cuda.synchronize()
        region = client.register_cuda_tensor(f"logits-b{B}", model.logits)
        output = samplerd.TokenOutput(client, f"tokens-b{B}", max_requests=B)
        lines = [f"B={B:<3d} {blocks * (BLOCK - 1)} steps a mode, interleaved in blocks of {BLOCK}"]
        for loop in args.loops.split(","):
            modes = {"alone": Alone(model, B, loop), "in-process torch": InProcess(model, B, loop)}
            for transport in args.transports.split(","):
                modes["samplerd " + transport] = WithSamplerd(model, B, loop, client, transport,
                                                              region, output)
            times = run_blocks(model, B, args.steps, modes)
            p50s = {name: stats(t)[0] for name, t in times.items()}
            base = p50s["alone"]
            lines.append(f"  {loop} loop")
            for name, t in times.items():
                p50, p99 = stats(t)
                lines.append(f"    {name:20s} p50 {p50:8.1f} p99 {p99:8.1f} us" +
                             ("" if name == "alone" else f"  overhead p50 {p50 - base:+8.1f} us"))
                lines.append("        parts p50 us: " + ", ".join(
                    f"{k} {stats(v)[0]:.1f}" for k, v in modes[name].parts.items()))
            # A mode whose GPU work hides behind the host's launches (a host-bound model in
            # the asynchronous loop) can come out within noise of the model alone either way:
            # only a baseline slower by more than 3% is broken.
            slower = [name for name, p50 in p50s.items() if p50 * 1.03 < base]
            if slower:
                broken = True
                lines.append(f"  BROKEN BASELINE ({loop}): the model alone ({base:.1f} us) is "
                             f"slower than {', '.join(slower)}: see the parts above")
        client.unregister(region.name)
        client.unregister(output.region.name)
        ctl = ""
        if args.samplerctl:
            out = subprocess.run([args.samplerctl, "bench", f"--target={target}", f"--rows={B}",
                                  f"--vocab={VOCAB}", "--source=cuda_ipc", "--mode=stream",
                                  "--steps=500"], capture_output=True, text=True).stdout
            ctl = out.split("latency p50 ")[1].split(" us")[0] if "latency p50 " in out else "?"
            lines.append(f"  samplerctl bench (C++ client, stream, cuda_ipc) p50 {ctl} us")
        print("\n".join(lines), flush=True)
        del model, output
        torch.cuda.empty_cache()
    client.close()
    proc.terminate()
    proc.wait()
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
