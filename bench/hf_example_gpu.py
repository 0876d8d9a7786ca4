"""examples/hf_generate.py on a GPU: tokens/s of its generate() (logits in a registered CUDA
tensor with a ready event, samplerd on its CUDA backend) beside the same loop sampling
in-process with PyTorch (issue 30, part 3), in the synchronous loop and the asynchronous one
(generate's device_tokens: samplerd writes the tokens into the worker's GPU memory and the host
runs one step behind; PyTorch likewise keeps its tokens on the device), issue 46.

The model is transformers' LlamaForCausalLM (8 layers, d = 2048, vocab 128,256, bf16 at random
X
plain PyTorch model of that shape behind the forward signature generate() calls, which reads
equal-length prompts token by token (the printout says which ran).

After each B's tokens/s, a second table says where each loop's step goes on the host (mean us
a step of the best run, by part: the forward's launches, the logits' handoff to samplerd, the
build, the send, the waits), so that a difference in tokens/s is attributed part by part.

    python3 bench/hf_example_gpu.py --samplerd=.device-pack/bin/samplerd [--batches=1,16,64]
"""
import argparse
import statistics
import pathlib
import sys
import time
from types import SimpleNamespace

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "examples"), str(ROOT / "bench")]
import samplerd  # noqa: E402
from decode_loop_bench import VOCAB, Model, start_mps, start_samplerd, torch_sample  # noqa: E402
from hf_generate import cache_keyword, generate, left_pad  # noqa: E402


class PlainLlama(torch.nn.Module):
    """decode_loop_bench.Model behind the forward signature of a transformers causal LM."""

    def __init__(self, batch, max_len):
        super().__init__()
        self.inner = Model(batch=batch, max_len=max_len)
        self.config = SimpleNamespace(vocab_size=VOCAB)
        self.device = torch.device("cuda")

    def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None,
                use_cache=True, logits_to_keep=0):
        assert attention_mask is None or bool(attention_mask.all()), "equal-length prompts only"
        if cache is None:
            self.inner.pos = 0
        for j in range(input_ids.shape[1]):
            logits = self.inner(input_ids[:, j])
        return SimpleNamespace(logits=logits[:, None, :], cache=self)


def make_model(batch, max_len):
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        return PlainLlama(batch, max_len), "plain PyTorch (decode_loop_bench.Model)"
    import transformers

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=2048, intermediate_size=5632,
                         num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=16,
                         max_position_embeddings=max_len, pad_token_id=0)
    return (LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval(),
            f"transformers {transformers.__version__} Llama")


class Parts:
    """Host seconds by part of a step, summed over a run (`timed` wraps a function)."""

    def __init__(self):
        self.seconds = {}

    def add(self, name, seconds):
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def timed(self, name, inner):
        def call(*args, **kw):
            t0 = time.perf_counter()
            try:
                return inner(*args, **kw)
            finally:
                self.add(name, time.perf_counter() - t0)
        return call


@torch.no_grad()
def torch_generate(model, prompts, max_new_tokens, gen, ahead=False, parts=None):
    """The same loop, sampling in-process (decode_loop_bench.torch_sample: T 0.7, top-k 50,
    top-p 0.95, top-5 logprobs); tokens and logprobs to the host each step, as generate().
    `ahead`: as generate's device_tokens, the next input stays on the device and the host reads
    each step's tokens one step later. `parts` (Parts) gets the host's time by part."""
    parts = parts or Parts()
    ids, mask, positions = left_pad(prompts, 0, "cuda")
    cache, out = None, []
    cache_arg = cache_keyword(model)
    pending = None
    for _ in range(max_new_tokens):
        # The model called exactly as generate() calls it (mask and positions included).
        t0 = time.perf_counter()
        step = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                     logits_to_keep=1, **{cache_arg: cache})
        cache = getattr(step, cache_arg)
        t1 = time.perf_counter()
        tokens, top_lp, _ = torch_sample(step.logits[:, -1], gen)
        if ahead:
            host = (tokens.to("cpu", non_blocking=True), top_lp.to("cpu", non_blocking=True))
            done = torch.cuda.Event()
            done.record()
            t3 = time.perf_counter()
            if pending is not None:
                pending[1].synchronize()
                out.append(pending[0][0].tolist())
            pending = (host, done)
            ids = tokens[:, None]
        else:
            t3 = time.perf_counter()
            host = tokens.tolist()
            top_lp.cpu()
            out.append(host)
            ids = torch.tensor(host, device="cuda")[:, None]
        t4 = time.perf_counter()
        positions = positions[:, -1:] + 1
        mask = torch.cat([mask, torch.ones_like(ids)], dim=1)
        t5 = time.perf_counter()
        parts.add("forward", t1 - t0)
        parts.add("sample", t3 - t1)
        parts.add("results", t4 - t3)  # the wait for the GPU, then tokens to the host
        parts.add("next input", t5 - t4)
    if pending is not None:
        pending[1].synchronize()
        out.append(pending[0][0].tolist())
    return out


def time_generate_parts(parts):
    """Has hf_generate's loop report its host time by part into `parts` (a Parts), for as
    long as the returned function is not called (it restores the originals). The receive's
    wait is StepTimes' already."""
    import hf_generate

    saved = []

    def wrap(owner, attr, name):
        saved.append((owner, attr, getattr(owner, attr)))
        setattr(owner, attr, parts.timed(name, getattr(owner, attr)))

    wrap(hf_generate.LogitsPool, "put", "logits handoff")  # the copy and the ready event
    wrap(hf_generate, "_forward", "forward")  # less the handoff, below
    wrap(hf_generate, "_step", "build")
    wrap(samplerd.client.StepStream, "send", "send")
    wrap(samplerd.channel.StepChannel, "send", "send")
    wrap(hf_generate, "_record", "results")
    wrap(samplerd.TokenOutput, "wait", "device wait")

    def restore():
        for owner, attr, inner in reversed(saved):
            setattr(owner, attr, inner)
        fwd = parts.seconds.get("forward", 0.0) - parts.seconds.get("logits handoff", 0.0)
        parts.seconds["forward"] = fwd
    return restore


class StepTimes:
    """Wraps the transports' receive to keep each answer's wait (from the send in the
    synchronous loop; one forward later in the asynchronous one) and the server's times."""

    def __init__(self):
        self.round_trip, self.server_total, self.kernels = [], [], []
        # Every answer passes through exactly one of these (step() calls them too).
        stream, channel = samplerd.client.StepStream, samplerd.channel.StepChannel
        stream.recv = stream.receive = self._timed(stream.recv)
        channel.receive = self._timed(channel.receive)

    def _timed(self, inner):
        def step(stream, *args, **kw):
            t0 = time.perf_counter()
            result = inner(stream, *args, **kw)
            self.round_trip.append(time.perf_counter() - t0)
            self.server_total.append(result.total_us * 1e-6)
            self.kernels.append(result.kernel_us * 1e-6)
            return result
        return step

    def clear(self):
        for v in (self.round_trip, self.server_total, self.kernels):
            v.clear()

    def p50s(self):
        return tuple(statistics.median(v) * 1e6 for v in
                     (self.round_trip, self.server_total, self.kernels))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samplerd", required=True)
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--new_tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--mps", action="store_true", help="a private MPS daemon for the run")
    args = ap.parse_args()
    if args.mps:
        start_mps()
    proc, target = start_samplerd(args.samplerd, [])
    client = samplerd.SamplerClient(target)
    client.wait_ready()
    print(f"{torch.cuda.get_device_name()}; samplerd backend {client.server_info().backend}; "
          f"{args.new_tokens} new tokens a sequence, prompts of 16; best of {args.repeats}")
    times = StepTimes()
    print("| B | loop | transport | in-process PyTorch tok/s | samplerd (hf_generate.generate) "
          "tok/s | ratio | per step: samplerd - PyTorch us | step p50 us | server total p50 us "
          "| kernels p50 us |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for B in [int(b) for b in args.batches.split(",")]:
        model, kind = make_model(B, 16 + args.new_tokens + 8)
        prompts = [[1 + (7 * s + j) % 1000 for j in range(16)] for s in range(B)]
        params = [samplerd.SamplingParams(temperature=0.7, top_k=50, top_p=0.95, top_logprobs=5,
                                          seed=s) for s in range(B)]
        gen = torch.Generator(device="cuda").manual_seed(0)
        runs = [(loop, name) for loop in ("sync", "async")
                for name in ("torch", "channel", "stream")]
        best = {run: 0.0 for run in runs}
        parts, host_parts = {}, {}
        for round_ in range(args.repeats + 1):  # round 0 warms up and is not counted
            for loop, name in runs:  # interleaved: the host's drift falls on each alike
                torch.cuda.synchronize()
                host = Parts()
                t0 = time.perf_counter()
                if name == "torch":
                    n = len(torch_generate(model, prompts, args.new_tokens, gen,
                                           ahead=loop == "async", parts=host)) * B
                else:
                    times.clear()
                    restore = time_generate_parts(host)
                    try:
                        n = sum(len(g.tokens) for g in generate(
                            client, model, prompts, params, args.new_tokens, transport=name,
                            device_tokens=loop == "async"))
                    finally:
                        restore()
                wall = time.perf_counter() - t0
                rate = n / wall
                if round_ and rate > best[loop, name]:
                    best[loop, name] = rate
                    steps = n / B
                    host_parts[loop, name] = {k: v / steps * 1e6 for k, v in host.seconds.items()}
                    host_parts[loop, name]["step"] = wall / steps * 1e6
                    if name != "torch":
                        parts[loop, name] = times.p50s()
                        host_parts[loop, name]["receive"] = sum(times.round_trip) / steps * 1e6
        for loop in ("sync", "async"):
            base = best[loop, "torch"]
            for name in ("channel", "stream"):
                got = best[loop, name]
                extra = (B / got - B / base) * 1e6
                print(f"| {B} | {loop} | {name} | {base:.0f} | {got:.0f} | {got / base:.2f} | "
                      f"{extra:.0f} | " + " | ".join(f"{t:.0f}" for t in parts[loop, name]) +
                      " |", flush=True)
        # Where each loop's step goes on the host (mean us a step of the best run): what a
        # part costs is host time, and a wait (results, receive, device wait) is where the
        # host idles behind the GPU or samplerd. "other": the step less its parts.
        names = ["forward", "logits handoff", "sample", "build", "send", "device wait",
                 "receive", "results", "next input"]
        print(f"\nB = {B}, host time a step by part, mean us (receive: the wait for the answer)")
        print("| loop | run | step | " + " | ".join(names) + " | other |")
        print("|---|---|---|" + "---|" * (len(names) + 1))
        for loop, name in runs:
            h = dict(host_parts.get((loop, name), {}))
            if not h:
                continue
            rest = h["step"] - sum(h.get(k, 0.0) for k in names)
            print(f"| {loop} | {name} | {h['step']:.0f} | " +
                  " | ".join(f"{h[k]:.0f}" if k in h else "-" for k in names) +
                  f" | {rest:.0f} |", flush=True)
        print(f"\nmodel: {kind}")
        del model
        torch.cuda.empty_cache()
    client.close()
    proc.terminate()
    proc.wait()


if __name__ == "__main__":
    sys.exit(main())
