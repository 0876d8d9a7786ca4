"""A step's answer as numpy arrays."""
from typing import Dict, List, Optional

import grpc
import numpy as np

from .errors import RequestError, SamplerError, status_code


def _vector(values, dtype) -> np.ndarray:
    """A repeated field as a numpy array (fromiter with the count: ~6x np.array's speed on a
    protobuf container, which a decode loop pays for every request of every step)."""
    return np.fromiter(values, dtype, len(values))


def _take_timing(result, msg):
    """The step's times (StepTiming) and the message itself, onto a StepResult or BatchResult.
    Parts of the step: conversion and planning before the backend (prepare_us), the device
    time of its kernels (kernel_us, 0 on the CPU backend); compute_us - kernel_us is host work."""
    t = msg.timing
    result.queue_us, result.compute_us, result.total_us = t.queue_us, t.compute_us, t.total_us
    result.prepare_us, result.kernel_us = t.prepare_us, t.kernel_us
    result.proto = msg


class RequestResult:
    """One request's result. Reading a field of a failed request raises its RequestError
    (check `ok` or `error` first to handle it without an exception).

    token_ids, logprobs, sum_smaller_probs: [n] for the n emitted tokens (DECODE: the accepted
    drafts then one more; PREFILL: 1; DRAFT: one per row). top_token_ids / top_logprobs:
    [n, k] (k = params.top_logprobs). prompt_logprobs: [len(prompt_targets)].
    """

    def __init__(self, msg):
        self.request_id: str = msg.request_id
        self.code: grpc.StatusCode = status_code(msg.status.code)
        self.message: str = msg.status.message
        self.seq_seed: int = msg.seq_seed
        self._msg = msg

    @property
    def ok(self) -> bool:
        return self.code == grpc.StatusCode.OK

    @property
    def error(self) -> Optional[RequestError]:
        return None if self.ok else RequestError(self.request_id, self.code, self.message)

    def _checked(self):
        if not self.ok:
            raise self.error
        return self._msg

    @property
    def token_ids(self) -> np.ndarray:
        return _vector(self._checked().token_ids, np.int32)

    @property
    def num_accepted(self) -> int:
        return self._checked().num_accepted

    @property
    def logprobs(self) -> np.ndarray:
        return _vector(self._checked().logprobs, np.float32)

    @property
    def sum_smaller_probs(self) -> np.ndarray:
        return _vector(self._checked().sum_smaller_probs, np.float32)

    @property
    def prompt_logprobs(self) -> np.ndarray:
        return _vector(self._checked().prompt_logprobs, np.float32)

    def _top(self, field, dtype, pad):
        rows = [getattr(t, field) for t in self._checked().top_logprobs]
        k = max((len(r) for r in rows), default=0)
        out = np.full((len(rows), k), pad, dtype=dtype)
        for i, r in enumerate(rows):
            out[i, :len(r)] = r
        return out

    @property
    def top_token_ids(self) -> np.ndarray:
        return self._top("token_ids", np.int32, -1)

    @property
    def top_logprobs(self) -> np.ndarray:
        return self._top("logprobs", np.float32, -np.inf)

    def __repr__(self):
        if not self.ok:
            return f"RequestResult({self.request_id!r}, {self.code.name}: {self.message})"
        return f"RequestResult({self.request_id!r}, token_ids={list(self._msg.token_ids)})"


class StepResult:
    """A step's results, in request order; also indexable by request id."""

    def __init__(self, msg):
        self.step_id: int = msg.step_id
        self.results: List[RequestResult] = [RequestResult(r) for r in msg.results]
        _take_timing(self, msg)
        self._by_id: Dict[str, RequestResult] = {r.request_id: r for r in self.results}

    def __len__(self):
        return len(self.results)

    def __iter__(self):
        return iter(self.results)

    def __getitem__(self, key):
        return self._by_id[key] if isinstance(key, str) else self.results[key]

    def raise_for_errors(self) -> "StepResult":
        """Raises the first failed request's RequestError; returns self when all succeeded."""
        for r in self.results:
            if not r.ok:
                raise r.error
        return self

    @property
    def token_ids(self) -> List[np.ndarray]:
        """Every request's token ids (raises if any request failed)."""
        return [r.token_ids for r in self.results]


class BatchResult:
    """A step's results as arrays (a step sent with packed_results, e.g. build_batch's): no
    object per request. B requests, T tokens in all.

    codes [B] (0 = OK; `errors` holds the failed requests' messages in order), token_counts [B],
    token_ids [T], num_accepted [B], logprobs [T], top_token_ids / top_logprobs [T, K] (K the
    step's largest top_logprobs, shorter lists padded with -1 / -inf), sum_smaller_probs [T]
    (when asked), prompt_counts [B] with prompt_logprobs concatenated, seq_seeds [B].
    `offsets` [B + 1]: request i's tokens are token_ids[offsets[i]:offsets[i + 1]].
    """

    def __init__(self, msg):
        p = msg.packed
        self.step_id: int = msg.step_id
        self.codes = np.frombuffer(p.status_codes, "<i4")
        self.errors: List[str] = list(p.errors)
        self.token_counts = np.frombuffer(p.token_counts, "<i4")
        self.token_ids = np.frombuffer(p.token_ids, "<i4")
        self.num_accepted = np.frombuffer(p.num_accepted, "<i4")
        self.logprobs = np.frombuffer(p.logprobs, "<f4")
        k = p.top_logprobs
        self.top_token_ids = np.frombuffer(p.top_token_ids, "<i4").reshape(-1, k) if k else \
            np.empty((len(self.token_ids), 0), np.int32)
        self.top_logprobs = np.frombuffer(p.top_token_logprobs, "<f4").reshape(-1, k) if k else \
            np.empty((len(self.token_ids), 0), np.float32)
        self.sum_smaller_probs = np.frombuffer(p.sum_smaller_probs, "<f4")
        self.prompt_counts = np.frombuffer(p.prompt_counts, "<i4")
        self.prompt_logprobs = np.frombuffer(p.prompt_logprobs, "<f4")
        self.seq_seeds = np.frombuffer(p.seq_seeds, "<u8")
        self.request_ids: List[str] = list(p.request_ids)
        _take_timing(self, msg)

    def __len__(self):
        return len(self.codes)

    @property
    def ok(self) -> bool:
        return not self.codes.any()

    @property
    def offsets(self) -> np.ndarray:
        out = np.zeros(len(self.token_counts) + 1, np.int64)
        np.cumsum(self.token_counts, out=out[1:])
        return out

    def raise_for_errors(self) -> "BatchResult":
        """Raises the first failed request's RequestError; returns self when all succeeded."""
        failed = np.flatnonzero(self.codes)
        if len(failed):
            i = int(failed[0])
            name = self.request_ids[i] if self.request_ids else str(i)
            raise RequestError(name, status_code(int(self.codes[i])), self.errors[0])
        return self


def check_step(msg):
    """A step's answer (stream, channel or unary): SamplerError for a step-level fault, else a
    StepResult, or a BatchResult for a step sent with packed_results."""
    if msg.HasField("error") and msg.error.code != 0:
        raise SamplerError(status_code(msg.error.code), msg.error.message)
    return BatchResult(msg) if msg.HasField("packed") else StepResult(msg)
