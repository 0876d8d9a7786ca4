"""Speculative decoding through samplerd: a draft model proposes k tokens, the target verifies
them in one DECODE step, and the emitted tokens are distributed as the target's own sampling.

    python3 examples/hf_speculative.py [ADDRESS]     (tiny Llamas at random weights)

Each round, per sequence: k DRAFT steps sample d1..dk from the draft model (samplerd keeps
their processed distributions in its draft pool, keyed by request id); one DECODE step reads
the target's k + 1 rows (the pending token's and each draft's) and emits the accepted drafts
plus one token (SPEC 6). For brevity each forward reads the whole sequence (no KV cache).
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


def speculative_generate(client, target, draft, prompts, params, k=3, max_new_tokens=32,
                         stop_token_ids=(), transport="channel"):
    """Each sequence's Generated, and accepted drafts / proposed drafts (`transport` as
    hf_generate.open_steps')."""
    out = [Generated() for _ in prompts]
    live, accepted, proposed = list(range(len(prompts))), 0, 0
    pool = LogitsPool(client, len(prompts) * (k + 1), target.config.vocab_size, target.device)
    try:
        with open_steps(client, transport) as stream:
            while live:
                seqs = {i: list(prompts[i]) + out[i].tokens for i in live}
                drafts = {i: [] for i in live}
                for j in range(1, k + 1):  # draft j is the token at index len(seq) + j - 1
                    logits = pool.put(last_logits(draft, [seqs[i] + drafts[i] for i in live], 1))
                    step = stream.step(logits, [samplerd.Draft(
                        f"seq{i}", params=params[i], rows=[r], draft_indices=[j],
                        sample_position=len(seqs[i]) - 1, prompt_token_ids=prompts[i],
                        output_token_ids=out[i].tokens + drafts[i]) for r, i in enumerate(live)])
                    for i, result in zip(live, step):
                        drafts[i].append(int(result.token_ids[0]))
                logits = pool.put(last_logits(target, [seqs[i] + drafts[i] for i in live], k + 1))
                step = stream.step(logits, [samplerd.Decode(
                    f"seq{i}", params=params[i], first_row=r * (k + 1), num_rows=k + 1,
                    draft_token_ids=drafts[i], sample_position=len(seqs[i]),
                    prompt_token_ids=prompts[i], output_token_ids=out[i].tokens)
                    for r, i in enumerate(live)])
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
    return out, accepted / max(proposed, 1)


if __name__ == "__main__":
    target, draft = tiny_llama(hidden=64, layers=2, seed=0), tiny_llama(hidden=32, layers=1, seed=1)
    prompts = [[1, 17, 42, 7], [1, 99]]
    params = [samplerd.SamplingParams(temperature=0.8, seed=s) for s in (1, 2)]
    with samplerd.SamplerClient(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:50051") as c:
        c.wait_ready()
        generated, rate = speculative_generate(c, target, draft, prompts, params, k=3,
                                               max_new_tokens=16)
    for prompt, gen in zip(prompts, generated):
        print(prompt, "->", gen.tokens)
    print(f"draft accept rate {rate:.2f}")
