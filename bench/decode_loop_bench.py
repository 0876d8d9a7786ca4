"""The decode loop a PyTorch model worker runs, three ways (issue 29): the model alone, the model
then sampling in-process with PyTorch, and the model then samplerd through the Python client.

A Llama-shaped model (8 layers, d = 2048, 16 heads, SwiGLU 5632, vocab 128,256, bf16 weights at
random, a KV cache) decodes B sequences. Each step:
  - model alone: forward, then the next tokens (fixed, no sampling) on the host;
  - in-process PyTorch: forward, then temperature 0.7, top-k 50 (topk), top-p 0.95 (softmax +
    cumsum), multinomial, top-5 logprobs (log_softmax + topk): the path vLLM takes for seeded
    or logprob requests; the tokens to the host;
  - samplerd: forward writes its logits into a registered CUDA IPC pool, records a ReadyEvent
    and sends one step (a Decode per sequence, same parameters, a seed each) through the
    transport named by --transports (`grpc`: SampleStream; `channel`: the co-located shared-
    memory step channel); the tokens back into a CUDA tensor for the next forward.
The modes run interleaved, in blocks of 20 steps at the same positions (the host's step times
drift by milliseconds over a run), each transport on a stream or channel of its own per block.
Prints per-step p50 and p99 of each, each one's overhead over the model alone (the difference
of the p50s), the parts of a samplerd step, and `samplerctl bench`'s p50 for the same step
shape (B rows, V = 128,256, CUDA IPC logits, streaming) in the same run. `grpc@S` runs the
gRPC stream with sys.setswitchinterval(S) (the GIL's hand-off period; default 5 ms).

    python3 bench/decode_loop_bench.py --samplerd=.device-pack/bin/samplerd \
        --samplerctl=.device-pack/bin/samplerctl [--batches=1,16,64] [--steps=200]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

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
        self.pos = 0

    @staticmethod
    def norm(x):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype)

    def forward(self, tokens, out=None):
        """tokens [B] on the device -> logits [B, V] (bf16), written into `out` when given."""
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
        self.pos += 1
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


def run_blocks(model, B, steps, modes):
    """The modes interleaved in blocks of BLOCK timed steps (after WARMUP untimed ones), each
    block of each mode at the same positions, so that drift of the host (this machine's step
    times move by milliseconds over a minute) falls on every mode alike. A mode is
    (open, step_fn, close): open() before its block (a stream, a channel), close() after."""
    times = {name: [] for name in modes}
    for block in range(max(1, steps // BLOCK)):
        for name, (open_fn, step_fn, close_fn) in modes.items():
            handle = open_fn()
            model.pos = block * (BLOCK + WARMUP)
            tokens = torch.zeros(B, dtype=torch.long, device="cuda")
            for k in range(BLOCK + WARMUP):
                timed = k >= WARMUP
                t0 = time.perf_counter()
                tokens = step_fn(handle, tokens, model.pos, timed)
                if timed:
                    times[name].append(time.perf_counter() - t0)
            close_fn(handle)
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samplerd", required=True)
    ap.add_argument("--samplerctl")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--transports", default="grpc")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    proc, target = start_samplerd(args.samplerd, [])
    client = samplerd.SamplerClient(target)
    client.wait_ready()
    print(f"device: {torch.cuda.get_device_name()}; samplerd backend {client.server_info().backend}")
    for B in [int(b) for b in args.batches.split(",")]:
        blocks = max(1, args.steps // BLOCK)
        model = Model(batch=B, max_len=blocks * (BLOCK + WARMUP) + 8)
        fixed = torch.arange(B, device="cuda")
        parts = {}

        def alone(_, tokens, i, timed):
            t0 = time.perf_counter()
            model(tokens)
            t1 = time.perf_counter()
            out = fixed.cpu().to("cuda", non_blocking=True)  # the host has the tokens
            if timed:
                parts.setdefault("alone", {}).setdefault("host forward", []).append(t1 - t0)
                parts["alone"].setdefault("wait for the GPU", []).append(time.perf_counter() - t1)
            return out

        gen = torch.Generator(device="cuda").manual_seed(0)

        def in_process(_, tokens, i, timed):
            logits = model(tokens)
            t, lp, ids = torch_sample(logits, gen)
            host = t.cpu()  # tokens (and logprobs) to the host, as an engine needs them
            lp.cpu()
            return host.to("cuda", non_blocking=True)

        pool = torch.empty(B, VOCAB, device="cuda", dtype=torch.bfloat16)
        region = client.register_cuda_tensor(f"pool-b{B}", pool)
        ready = samplerd.ReadyEvent()
        params = [samplerd.SamplingParams(temperature=0.7, top_k=50, top_p=0.95, top_logprobs=5,
                                          seed=s) for s in range(B)]

        def with_samplerd(name):
            # The step's parts (p50 each): the forward's launch and the request's building on
            # the host; the step's round trip; inside it, samplerd's total and compute time
            # (compute waits on the ready event: it includes the GPU finishing the forward),
            # and the sampling kernels' device time; the tokens back into a CUDA tensor.
            def step_fn(stream, tokens, i, timed):
                t0 = time.perf_counter()
                model(tokens, out=pool)
                logits = samplerd.CudaLogits(region, pool, ready.record())
                request = client.build(logits, [
                    samplerd.Decode(f"s{s}", first_row=s, num_rows=1, sample_position=i,
                                    params=params[s]) for s in range(B)])
                t1 = time.perf_counter()
                if name.startswith("grpc"):
                    stream.send(request)
                    step = stream.recv()
                else:
                    step = stream.step_request(request)
                t2 = time.perf_counter()
                out = torch.tensor([r.token_ids[0] for r in step.proto.results], device="cuda")
                if timed:
                    p = parts.setdefault(name, {})
                    for key, value in (("host forward+build", t1 - t0), ("step", t2 - t1),
                                       ("server total", step.total_us * 1e-6),
                                       ("server compute", step.compute_us * 1e-6),
                                       ("kernels", step.kernel_us * 1e-6),
                                       ("tokens to device", time.perf_counter() - t2)):
                        p.setdefault(key, []).append(value)
                return out

            # grpc@S: with sys.setswitchinterval(S) (the GIL's hand-off period) while it runs.
            switch = float(name.partition("@")[2] or sys.getswitchinterval())
            default_switch = sys.getswitchinterval()

            def open_fn():
                sys.setswitchinterval(switch)
                return client.stream() if name.startswith("grpc") else client.channel()

            def close_fn(stream):
                stream.close()
                sys.setswitchinterval(default_switch)

            return open_fn, step_fn, close_fn

        none = lambda: None
        modes = {"alone": (none, alone, lambda _: None),
                 "in-process torch": (none, in_process, lambda _: None)}
        for transport in args.transports.split(","):
            modes["samplerd " + transport] = with_samplerd(transport)
        times = run_blocks(model, B, args.steps, modes)
        client.unregister(region.name)
        del pool
        ctl = ""
        if args.samplerctl:
            out = subprocess.run([args.samplerctl, "bench", f"--target={target}", f"--rows={B}",
                                  f"--vocab={VOCAB}", "--source=cuda_ipc", "--mode=stream",
                                  "--steps=500"], capture_output=True, text=True).stdout
            ctl = out.split("latency p50 ")[1].split(" us")[0] if "latency p50 " in out else "?"
        a50, a99 = stats(times["alone"])
        lines = [f"B={B:<3d} {len(times['alone'])} steps a mode, interleaved in blocks of {BLOCK}"]
        for name, t in times.items():
            p50, p99 = stats(t)
            lines.append(f"  {name:26s} p50 {p50:8.1f} p99 {p99:8.1f} us" +
                         ("" if name == "alone" else f"  overhead p50 {p50 - a50:+8.1f} us"))
            key = "alone" if name == "alone" else name.replace("samplerd ", "")
            if key in parts:
                lines.append("      parts p50: " + ", ".join(
                    f"{k} {stats(v)[0]:.1f}" for k, v in parts[key].items()))
        lines.append(f"  samplerctl bench (C++ client, stream, cuda_ipc) p50 {ctl} us")
        print("\n".join(lines), flush=True)
        del model
        torch.cuda.empty_cache()
    client.close()
    proc.terminate()
    proc.wait()


if __name__ == "__main__":
    sys.exit(main())
