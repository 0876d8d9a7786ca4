"""Generation with any Hugging Face causal LM, every token sampled by samplerd.

    pip install ./client/python transformers       (torch too)
    python3 examples/hf_generate.py [ADDRESS] [MODEL]   (default: a tiny Llama at random weights)

`generate` prefills a batch of prompts (left-padded, as `model.generate` pads them), then
decodes with the model's KV cache; each sequence has its own SamplingParams (and seed) and
stops at a stop token or after max_new_tokens. The model's last-position logits reach samplerd
through one registered pool: shared memory on a CPU host, a CUDA tensor and a ready event on a
GPU (samplerd then reads them without the worker synchronising); each step goes through the
step channel (or gRPC's stream). On a GPU, generate(device_tokens=True) has samplerd also write
the tokens into the worker's memory and runs the loop a step ahead. hf_speculative.py adds a
draft model.
"""
import dataclasses
import inspect
import sys
from dataclasses import dataclass, field
from typing import List, Sequence

import numpy as np
import torch

import samplerd


class LogitsPool:
    """[rows, vocab] float32 logits in a region samplerd has registered; `put` fills its first
    rows and returns what a step sends."""

    def __init__(self, client, rows: int, vocab: int, device: torch.device):
        self.client, self.cuda = client, device.type == "cuda"
        if self.cuda:
            self.pool = torch.empty(rows, vocab, dtype=torch.float32, device=device)
            self.region = client.register_cuda_tensor(f"hf-logits-{id(self)}", self.pool)
            self.event = samplerd.ReadyEvent()
        else:
            self.region = samplerd.ShmRegion(rows * vocab * 4)
            self.array = self.region.ndarray((rows, vocab), np.float32)
            self.pool = torch.from_numpy(self.array)
            client.register_shm(self.region)

    def put(self, logits: torch.Tensor):
        n = logits.shape[0]
        self.pool[:n].copy_(logits)
        self.ready = self.event.record() if self.cuda else None
        return self.part(0, n)

    def part(self, first: int, n: int):
        """Rows [first, first + n) of what `put` wrote last, as a step (or a draft tensor)
        sends them: read in place, after put's ready event on a GPU."""
        if self.cuda:
            return samplerd.CudaLogits(self.region, self.pool[first:first + n], self.ready)
        return samplerd.ShmLogits(self.region, self.array[first:first + n])

    def close(self):
        self.client.unregister(self.region.name if self.cuda else self.region.buffer_name)
        if not self.cuda:
            del self.pool, self.array
            try:
                self.region.close()
            except BufferError:  # a view still held (an exception's frame): unmapped with it
                pass


@dataclass
class Generated:
    """One sequence's new tokens and, per token, its processed logprob and (when the params
    ask for them) its top logprobs."""
    tokens: List[int] = field(default_factory=list)
    logprobs: List[float] = field(default_factory=list)
    top_ids: List[np.ndarray] = field(default_factory=list)
    top_logprobs: List[np.ndarray] = field(default_factory=list)


def left_pad(seqs: Sequence[Sequence[int]], pad: int, device):
    """input_ids, attention_mask and position_ids of left-padded sequences (as generate)."""
    width = max(len(s) for s in seqs)
    ids = torch.tensor([[pad] * (width - len(s)) + list(s) for s in seqs], device=device)
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs], device=device)
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def cache_keyword(model) -> str:
    """The KV cache's keyword of the model's forward: `cache` in transformers 5,
    `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def open_steps(client, transport: str):
    """The step transport: "channel" (the step channel: shared memory and a futex, for a worker
    on samplerd's host, where shm and CUDA IPC logits are anyway) or "stream" (gRPC's
    SampleStream); the same answers either way."""
    return client.channel() if transport == "channel" else client.stream()


def _requests(prompts, params, out, live):
    """One kind of request a step: the first samples the prompts' last rows, then one decode
    row each. sample_position = tokens before the one drawn (SPEC 4)."""
    requests = []
    for i in live:
        common = dict(request_id=f"seq{i}", params=params[i], prompt_token_ids=prompts[i],
                      output_token_ids=out[i].tokens,
                      sample_position=len(prompts[i]) + len(out[i].tokens))
        requests.append(samplerd.Decode(first_row=i, **common) if out[i].tokens
                        else samplerd.Prefill(row=i, **common))
    return requests


def _needs_history(p):
    """Whether a request's parameters read its token history (penalties, DRY, bad words,
    min_tokens). A step where none does is sent as arrays (_step): no Python object and no
    history per sequence, which at B = 64 cost more host time a step than samplerd's step."""
    return bool(p.repetition_penalty not in (None, 1.0) or p.presence_penalty or
                p.frequency_penalty or p.dry_multiplier or p.bad_words or p.min_tokens)


def _seeded(params):
    """(shared, seeds) where the sequences' parameters differ only in their seeds (a seed per
    sequence, the usual case): one SamplingParams for all and each one's seed, which a batch
    step sends as seq_seeds. Else None: each sequence's own parameters are sent. (Encoding a
    SamplingParams a sequence cost build_batch ~2.7 us each on the H100 machine's host: 176 us
    of a B = 64 step, against ~7 us for one shared.)"""
    if not params or any(p.seed is None or p.seed < 0 for p in params):
        return None
    shared = dataclasses.replace(params[0], seed=None)
    if any(dataclasses.replace(p, seed=None) != shared for p in params[1:]):
        return None
    return shared, [p.seed for p in params]


def _step(client, logits, prompts, params, out, live, seeded=None, **kw):
    """The step's SampleRequest: arrays (client.build_batch, answered as a BatchResult) unless
    some live sequence's parameters need its history, then one request object a sequence.
    `seeded`: _seeded(params), computed once a generation."""
    if any(_needs_history(params[i]) for i in live):
        return client.build(logits, _requests(prompts, params, out, live), **kw)
    if seeded is not None:
        batch_params = dict(params=seeded[0], seeds=[seeded[1][i] for i in live])
    else:
        batch_params = dict(params=[params[i] for i in live])
    return client.build_batch(
        logits, "decode" if out[live[0]].tokens else "prefill", live,
        sample_positions=[len(prompts[i]) + len(out[i].tokens) for i in live],
        request_id_prefix="seq", **batch_params, **kw)


def _record(out, params, live, results):
    """Appends each live sequence's token (raises if its request failed), from a StepResult
    or a BatchResult (one token a request, top lists padded to the step's longest)."""
    if isinstance(results, samplerd.BatchResult):
        results.raise_for_errors()
        tokens, logprobs = results.token_ids.tolist(), results.logprobs.tolist()
        for k, i in enumerate(live):
            out[i].tokens.append(tokens[k])
            out[i].logprobs.append(logprobs[k])
            n = params[i].top_logprobs
            if n:
                out[i].top_ids.append(results.top_token_ids[k, :n])
                out[i].top_logprobs.append(results.top_logprobs[k, :n])
        return
    for i, result in zip(live, results):
        out[i].tokens.append(int(result.token_ids[0]))
        out[i].logprobs.append(float(result.logprobs[0]))
        if params[i].top_logprobs:
            out[i].top_ids.append(result.top_token_ids[0])
            out[i].top_logprobs.append(result.top_logprobs[0])


@torch.no_grad()
def generate(client, model, prompts, params, max_new_tokens=32, stop_token_ids=(), pad=0,
             transport="channel", device_tokens=None):
    """Each prompt's Generated; `transport` as open_steps'.

    `device_tokens` (a model on a GPU; off by default until the GPU test of this loop,
    client/python/tests/test_cuda_output.py, has passed on the GPU machine): samplerd writes each step's tokens
    into this process's GPU memory (samplerd.TokenOutput) and the loop runs a step ahead: the
    forward of step N+1 is enqueued, its input read from step N's tokens on the device, before
    the host reads step N's answer (stop tokens, logprobs, the next requests' histories). The
    answers are the same; the host's round trip leaves the GPU's critical path. A sequence
    that stopped at step N has had one more forward computed for it, which is discarded."""
    device = model.device
    if device_tokens is None:
        device_tokens = False
    if device_tokens and device.type != "cuda":
        raise ValueError("device_tokens needs a model on a CUDA device")
    pool = LogitsPool(client, len(prompts), model.config.vocab_size, device)
    try:
        with open_steps(client, transport) as steps:
            if device_tokens:
                return _generate_ahead(client, model, prompts, params, max_new_tokens,
                                       stop_token_ids, pad, steps, pool)
            return _generate_in_step(client, model, prompts, params, max_new_tokens,
                                     stop_token_ids, pad, steps, pool)
    finally:
        pool.close()


def _forward(model, pool, ids, mask, positions, cache):
    step = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                 logits_to_keep=1, **{cache_keyword(model): cache})
    # The model's dtype straight into the float32 pool: copy_ converts on the way (one kernel,
    # where .float() then the copy were two, and a temporary of B x V floats).
    logits = pool.put(step.logits[:, -1, :model.config.vocab_size])
    return getattr(step, cache_keyword(model)), logits


def _generate_in_step(client, model, prompts, params, max_new_tokens, stop_token_ids, pad, steps,
                      pool):
    """The synchronous loop: each step's answer, then its tokens to the device."""
    ids, mask, positions = left_pad(prompts, pad, model.device)
    out = [Generated() for _ in prompts]
    live, cache = list(range(len(prompts))), None
    seeded = _seeded(params)
    while live:
        cache, logits = _forward(model, pool, ids, mask, positions, cache)
        steps.send(_step(client, logits, prompts, params, out, live, seeded))
        _record(out, params, live, steps.receive())
        next_ids = [pad] * len(prompts)
        for i in live:
            next_ids[i] = out[i].tokens[-1]
        live = [i for i in live if out[i].tokens[-1] not in stop_token_ids
                and len(out[i].tokens) < max_new_tokens]
        ids = torch.tensor(next_ids, device=model.device)[:, None]  # one copy a step
        positions = positions[:, -1:] + 1
        mask = torch.cat([mask, torch.ones_like(ids)], dim=1)
    return out


def _generate_ahead(client, model, prompts, params, max_new_tokens, stop_token_ids, pad, steps,
                    pool):
    """The asynchronous loop: tokens stay on the device; the host is one step behind."""
    device, batch = model.device, len(prompts)
    ids, mask, positions = left_pad(prompts, pad, device)
    out = [Generated() for _ in prompts]
    tokens = samplerd.TokenOutput(client, f"hf-tokens-{id(pool)}", max_requests=batch,
                                  device=device)
    live = list(range(batch))
    seeded = _seeded(params)
    cache, logits = _forward(model, pool, ids, mask, positions, None)
    index = {}  # the live rows as a device index, made once per live set
    try:
        steps.send(_step(client, logits, prompts, params, out, live, seeded,
                         output=tokens.next(len(live))))
        while True:
            sent = live
            # Step N+1's forward, queued before step N's answer is read (unless no sequence
            # can go on after step N): the stream waits on the device for samplerd's tokens.
            if any(len(out[i].tokens) + 1 < max_new_tokens for i in sent):
                tokens.wait()
                rows = index.get(tuple(sent))
                if rows is None:
                    rows = index[tuple(sent)] = torch.tensor(sent, device=device)
                ids = torch.full((batch, 1), pad, dtype=torch.long, device=device)
                ids[rows, 0] = tokens.token_ids[:len(sent), 0].long()
                positions = positions[:, -1:] + 1
                mask = torch.cat([mask, torch.ones_like(ids)], dim=1)
                cache, logits = _forward(model, pool, ids, mask, positions, cache)
            try:
                results = steps.receive()
            except samplerd.SamplerError:
                tokens.release()  # the step wrote nothing: free the stream's wait
                raise
            _record(out, params, sent, results)
            live = [i for i in sent if out[i].tokens[-1] not in stop_token_ids
                    and len(out[i].tokens) < max_new_tokens]
            if not live:
                return out
            steps.send(_step(client, logits, prompts, params, out, live, seeded,
                             output=tokens.next(len(live))))
    finally:
        torch.cuda.synchronize(device)
        client.unregister(tokens.region.name)


def tiny_llama(vocab=512, hidden=64, layers=2, seed=0, **config):
    """A Llama at random weights (no download): what the tests and the default run use."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, bos_token_id=None, eos_token_id=None, pad_token_id=0,
        **config)).eval()


if __name__ == "__main__":
    address = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:50051"
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if len(sys.argv) > 2:
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained(sys.argv[2]).to(device).eval()
    else:
        model = tiny_llama().to(device)
    prompts = [[1, 17, 42, 7], [1, 99], [1, 5, 6, 7, 8, 9]]
    params = [samplerd.SamplingParams(temperature=0),   # greedy
              samplerd.SamplingParams(temperature=0.8, top_p=0.95, seed=7, top_logprobs=2),
              samplerd.SamplingParams(temperature=1.0, top_k=40, repetition_penalty=1.2, seed=8)]
    with samplerd.SamplerClient(address) as client:
        client.wait_ready()
        for prompt, gen in zip(prompts, generate(client, model, prompts, params, 16)):
            print(prompt, "->", gen.tokens)
