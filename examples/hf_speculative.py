"""Speculative decoding through samplerd: a draft model proposes k tokens, the target verifies
them in one DECODE step, and the emitted tokens are distributed as the target's own sampling.

    python3 examples/hf_speculative.py [ADDRESS] [--own_drafter]   (tiny Llamas, random weights)

Each round, per sequence: k DRAFT steps sample d1..dk from the draft model (samplerd keeps
their processed distributions in its draft pool, keyed by request id); one DECODE step reads
the target's k + 1 rows (the pending token's and each draft's) and emits the accepted drafts
plus one token (SPEC 6). For brevity each forward reads the whole sequence (no KV cache).

With own_drafter=True the worker samples its drafts itself (as engines with a draft model or
EAGLE heads do) and sends only DECODE steps: each request's draft distributions q (the draft
model's log-softmax at the request's temperature, the distribution its drafts were drawn from)
stay where the worker wrote them (a registered CUDA tensor on a GPU, read in place by
samplerd's kernels after a ready event; a registered shm region on the host) and are sent by
handle as `draft_logprobs`.
"""
import sys

import torch

import samplerd
from hf_generate import Generated, LogitsPool, left_pad, open_steps, tiny_llama


@torch.no_grad()
def last_logits(model, seqs, n, pad=0):
    """Each sequence's last n positions' logits, [len(seqs) * n, vocab]."""
    ids, mask, positions = left_pad(seqs, pad, model.device)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    return logits[:, -n:, :model.config.vocab_size].float().reshape(-1, model.config.vocab_size)


def own_drafts(draft, seqs, live, params, k, generator):
    """The worker's own drafter: k tokens a sequence drawn from the draft model's softmax at
    each request's temperature. Returns {i: drafts} and q, [len(live) * k, vocab] log-probs
    (sequence-major), the distributions they were drawn from."""
    temps = torch.tensor([[params[i].temperature or 1.0] for i in live], device=draft.device)
    drafts, rows = {i: [] for i in live}, []
    for _ in range(k):
        lp = torch.log_softmax(last_logits(draft, [seqs[i] + drafts[i] for i in live], 1) / temps,
                               dim=-1)
        tokens = torch.multinomial(lp.exp(), 1, generator=generator)[:, 0].tolist()
        for r, i in enumerate(live):
            drafts[i].append(tokens[r])
        rows.append(lp)
    return drafts, torch.stack(rows, dim=1).reshape(len(live) * k, -1)


def pooled_drafts(stream, pool, draft, seqs, live, params, prompts, out, k):
    """k DRAFT steps: samplerd draws each sequence's drafts and keeps their distributions in
    its draft pool for the DECODE step. Returns {i: drafts}."""
    drafts = {i: [] for i in live}
    for j in range(1, k + 1):  # draft j is the token at index len(seq) + j - 1
        logits = pool.put(last_logits(draft, [seqs[i] + drafts[i] for i in live], 1))
        step = stream.step(logits, [samplerd.Draft(
            f"seq{i}", params=params[i], rows=[r], draft_indices=[j],
            sample_position=len(seqs[i]) - 1, prompt_token_ids=prompts[i],
            output_token_ids=out[i].tokens + drafts[i]) for r, i in enumerate(live)])
        for i, result in zip(live, step):
            drafts[i].append(int(result.token_ids[0]))
    return drafts


def speculative_generate(client, target, draft, prompts, params, k=3, max_new_tokens=32,
                         stop_token_ids=(), transport="channel", own_drafter=False,
                         draft_seed=0):
    """Each sequence's Generated, and accepted drafts / proposed drafts (`transport` as
    hf_generate.open_steps'). `own_drafter`: the worker draws the drafts (a torch generator
    seeded with `draft_seed`) and sends their distributions by handle (module docstring)."""
    out = [Generated() for _ in prompts]
    live, accepted, proposed = list(range(len(prompts))), 0, 0
    vocab = target.config.vocab_size
    pool = LogitsPool(client, len(prompts) * (k + 1), vocab, target.device)
    q_pool = LogitsPool(client, len(prompts) * k, vocab, draft.device) if own_drafter else None
    generator = torch.Generator(device=draft.device).manual_seed(draft_seed)
    try:
        with open_steps(client, transport) as stream:
            while live:
                seqs = {i: list(prompts[i]) + out[i].tokens for i in live}
                q = {}
                if own_drafter:
                    drafts, q_rows = own_drafts(draft, seqs, live, params, k, generator)
                    q_pool.put(q_rows)
                    q = {i: q_pool.part(r * k, k) for r, i in enumerate(live)}
                else:
                    drafts = pooled_drafts(stream, pool, draft, seqs, live, params, prompts, out, k)
                logits = pool.put(last_logits(target, [seqs[i] + drafts[i] for i in live], k + 1))
                step = stream.step(logits, [samplerd.Decode(
                    f"seq{i}", params=params[i], first_row=r * (k + 1), num_rows=k + 1,
                    draft_token_ids=drafts[i], sample_position=len(seqs[i]),
                    prompt_token_ids=prompts[i], output_token_ids=out[i].tokens,
                    draft_logprobs=q.get(i)) for r, i in enumerate(live)])
                for i, result in zip(live, step):
                    accepted, proposed = accepted + result.num_accepted, proposed + k
                    for n, token in enumerate(result.token_ids.tolist()):
                        if len(out[i].tokens) == max_new_tokens or (
                                out[i].tokens and out[i].tokens[-1] in stop_token_ids):
                            break
                        out[i].tokens.append(token)
                        out[i].logprobs.append(float(result.logprobs[n]))
                live = [i for i in live if len(out[i].tokens) < max_new_tokens
                        and out[i].tokens[-1] not in stop_token_ids]
    finally:
        pool.close()
        if q_pool is not None:
            q_pool.close()
    return out, accepted / max(proposed, 1)


if __name__ == "__main__":
    target, draft = tiny_llama(hidden=64, layers=2, seed=0), tiny_llama(hidden=32, layers=1, seed=1)
    prompts = [[1, 17, 42, 7], [1, 99]]
    params = [samplerd.SamplingParams(temperature=0.8, seed=s) for s in (1, 2)]
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    with samplerd.SamplerClient(args[0] if args else "127.0.0.1:50051") as c:
        c.wait_ready()
        generated, rate = speculative_generate(c, target, draft, prompts, params, k=3,
                                               max_new_tokens=16,
                                               own_drafter="--own_drafter" in sys.argv)
    for prompt, gen in zip(prompts, generated):
        print(prompt, "->", gen.tokens)
    print(f"draft accept rate {rate:.2f}")
