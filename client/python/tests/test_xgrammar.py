"""Grammar masks straight from xgrammar, end to end through a real samplerd.

A JSON-schema grammar is compiled over a small vocabulary built here; each step, every
sequence's GrammarMatcher fills its bitmask row (int32 words, bit t % 32 of word t / 32 =
token t allowed, the layout SPEC 3.2 uses), the row goes to samplerd as the request's
allowed_token_mask, and xgrammar's matcher must accept every token samplerd returns. Logits
are random, so without the mask most draws would break the grammar: the test also checks
that the same logits sampled without masks produce tokens the matcher rejects (so a server
that ignored masks would fail here).
"""
import json

import numpy as np
import pytest

import samplerd
from samplerd import Prefill, SamplingParams

xgr = pytest.importorskip("xgrammar")

VOCAB_TOKENS = (["<eos>", "{", "}", "[", "]", ":", ",", '"', " ", "\n", "true", "false", "null",
                 '"name"', '"age"', '"tags"', "name", "age", "tags"]
                + list("abcdefghijklmnopqrstuvwxyz0123456789-.")
                + ["ab", "cd", "ef", "10", "42", '":', '",', '"}', "0."])
SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "age": {"type": "integer", "minimum": 0, "maximum": 150},
                         "tags": {"type": "array", "items": {"type": "string", "maxLength": 6},
                                  "maxItems": 3}},
          "required": ["name", "age", "tags"], "additionalProperties": False}
SEQS, MAX_STEPS = 6, 160


def test_every_sampled_token_is_accepted_by_the_grammar(client):
    vocab = len(VOCAB_TOKENS)
    cols = 96  # padded like a model's vocabulary: columns >= vocab_size are never sampled
    info = xgr.TokenizerInfo(VOCAB_TOKENS, vocab_type=xgr.VocabType.RAW, vocab_size=vocab,
                             stop_token_ids=[0])
    grammar = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(SCHEMA))
    matchers = [xgr.GrammarMatcher(grammar) for _ in range(SEQS)]
    bitmask = xgr.allocate_token_bitmask(SEQS, vocab)
    text = [[] for _ in range(SEQS)]
    rng = np.random.default_rng(7)
    unmasked_rejected = accepted = 0
    with client.stream() as stream:
        for position in range(MAX_STEPS):
            live = [i for i, m in enumerate(matchers) if not m.is_terminated()]
            if not live:
                break
            logits = rng.normal(0, 2, (SEQS, cols)).astype(np.float32)
            for i in live:
                matchers[i].fill_next_token_bitmask(bitmask, i)
            requests = [Prefill(f"s{i}", row=i, sample_position=position,
                                allowed_token_mask=bitmask[i].numpy(),
                                params=SamplingParams(temperature=0.9, seed=1000 + i))
                        for i in live]
            step = stream.step(logits, requests, vocab_size=vocab)
            free = client.sample(logits, [Prefill(r.request_id, row=r.row, sample_position=position,
                                                  params=r.params) for r in requests],
                                 vocab_size=vocab)
            for i, result, unmasked in zip(live, step, free):
                token = int(result.token_ids[0])
                assert 0 <= token < vocab
                # Would the grammar have taken the unmasked draw? (bit test on the mask row)
                u = int(unmasked.token_ids[0])
                if not (int(bitmask[i, u // 32]) >> (u % 32)) & 1:
                    unmasked_rejected += 1
                assert matchers[i].accept_token(token), (
                    f"seq {i} step {position}: token {token} {VOCAB_TOKENS[token]!r} after "
                    f"{''.join(text[i])!r} is not allowed by the grammar")
                text[i].append(VOCAB_TOKENS[token])
                accepted += 1
    assert accepted >= SEQS * 5, accepted
    assert unmasked_rejected > accepted // 4, (
        f"only {unmasked_rejected} of {accepted} unmasked draws broke the grammar: the masks "
        "did not constrain much, so this test would not notice a server that ignores them")
    finished = [i for i, m in enumerate(matchers) if m.is_terminated()]
    for i in finished:  # a finished sequence is valid JSON that the schema's keys fit
        doc = json.loads("".join(t for t in text[i] if t != "<eos>"))
        assert set(doc) == {"name", "age", "tags"} and isinstance(doc["age"], int), doc
    print(f"{accepted} tokens accepted over {SEQS} sequences, {len(finished)} finished; "
          f"{unmasked_rejected} unmasked draws would have broken the grammar")
