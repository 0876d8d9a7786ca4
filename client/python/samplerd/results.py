"""A step's answer as numpy arrays."""
from typing import Dict, List, Optional

import grpc
import numpy as np

from .errors import RequestError, status_code


def _vector(values, dtype) -> np.ndarray:
    """A repeated field as a numpy array (fromiter with the count: ~6x np.array's speed on a
    protobuf container, which a decode loop pays for every request of every step)."""
    return np.fromiter(values, dtype, len(values))


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
        self.queue_us: int = msg.timing.queue_us
        self.compute_us: int = msg.timing.compute_us
        self.total_us: int = msg.timing.total_us
        # Parts of the step: conversion and planning before the backend, and the device time
        # of its kernels (0 on the CPU backend); compute_us - kernel_us is host work.
        self.prepare_us: int = msg.timing.prepare_us
        self.kernel_us: int = msg.timing.kernel_us
        self.proto = msg
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
