"""Building a step's SampleRequest from plain Python values.

A step is its logits (one of the sources below) and its requests: Prefill, Decode or Draft
(one kind per step, SPEC section 5). Fields mirror API.md's RequestInputs; lists take any
sequence of ints, masks take xgrammar/numpy int32 bitmask rows (ceil(V / 32) words, bit t % 32
of word t / 32 set = token t allowed) or bytes.
"""
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence, Union

import numpy as np

from ._proto import pb
from .cuda import CudaRegion
from .shm import ShmRegion


_SCALAR_PARAMS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                  "presence_penalty", "frequency_penalty", "top_logprobs", "dry_multiplier",
                  "dry_base", "dry_allowed_length", "dry_range", "top_n_sigma",
                  "xtc_probability", "xtc_threshold")


@dataclass
class SamplingParams:
    """SPEC section 2. None = the server's default (temperature 1, no cuts, no penalties).
    `seed` is the request's seq_seed: fixed seeds make a step replayable.

    Token adjustments (SPEC 3 step 2), as vLLM's and OpenAI's parameters: `allowed_token_ids`
    (only these may be sampled), `bad_words` (token-id sequences: the last token of a word is
    banned where the output history ends with the rest of it), `min_tokens` with
    `stop_token_ids` (banned until the output history holds min_tokens tokens) and
    `logit_bias` ({token id: bias in [-100, 100]}).

    DRY (SPEC 3 step 3, as llama.cpp and text-generation-webui define it): `dry_multiplier`
    (0 = off), `dry_base` (1.75), `dry_allowed_length` (2), `dry_sequence_breakers` (token
    ids), `dry_range` (0 = the whole context); None = the server's default.

    Filters from llama.cpp (SPEC 3 steps 4 and 8): `top_n_sigma` (keep logits >= max - n·σ;
    0 = off), XTC's `xtc_probability` (0 = off) and `xtc_threshold` (0.1). `logprobs_mode`:
    "processed" (the default: what the row samples from) or "raw" (the logits' log_softmax as
    sent, vLLM's raw logprobs: what a trainer compares against)."""

    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    repetition_penalty: Optional[float] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    top_logprobs: Optional[int] = None
    seed: Optional[int] = None
    allowed_token_ids: Sequence[int] = ()
    bad_words: Sequence[Sequence[int]] = ()
    min_tokens: int = 0
    stop_token_ids: Sequence[int] = ()
    logit_bias: Optional[Mapping[int, float]] = None
    dry_multiplier: Optional[float] = None
    dry_base: Optional[float] = None
    dry_allowed_length: Optional[int] = None
    dry_sequence_breakers: Sequence[int] = ()
    dry_range: Optional[int] = None
    top_n_sigma: Optional[float] = None
    xtc_probability: Optional[float] = None
    xtc_threshold: Optional[float] = None
    logprobs_mode: Optional[str] = None

    def __setattr__(self, name, value):
        object.__setattr__(self, name, value)
        object.__setattr__(self, "_encoded", None)  # any assignment re-encodes

    def fill(self, msg):
        # A decode loop sends the same parameters for every request of every step (issue 29
        # measured building them): scalars only (what assignment alone can change) are encoded
        # once and merged as bytes after that; token lists, which a caller may change in place,
        # are written every time.
        if (self.allowed_token_ids or self.bad_words or self.stop_token_ids or self.logit_bias
                or self.dry_sequence_breakers):
            self._fill_fields(msg)
            return
        encoded = self._encoded
        if encoded is None:
            params = pb.SamplingParams()
            self._fill_fields(params)
            encoded = params.SerializeToString()
            object.__setattr__(self, "_encoded", encoded)
        msg.MergeFromString(encoded)

    def _fill_fields(self, msg):
        for name in _SCALAR_PARAMS:
            value = getattr(self, name)
            if value is not None:
                setattr(msg, name, value)
        if self.seed is not None:
            msg.seq_seed = self.seed
        if self.logprobs_mode is not None:
            modes = {"processed": pb.LOGPROBS_MODE_PROCESSED, "raw": pb.LOGPROBS_MODE_RAW}
            if self.logprobs_mode not in modes:
                raise ValueError(f"logprobs_mode: {self.logprobs_mode!r} is not 'processed' or "
                                 "'raw'")
            msg.logprobs_mode = modes[self.logprobs_mode]
        if self.allowed_token_ids:
            msg.allowed_token_ids.extend(int(t) for t in self.allowed_token_ids)
        for word in self.bad_words:
            msg.bad_words.add().token_ids.extend(int(t) for t in word)
        if self.min_tokens:
            msg.min_tokens = int(self.min_tokens)
        if self.stop_token_ids:
            msg.stop_token_ids.extend(int(t) for t in self.stop_token_ids)
        for token, bias in (self.logit_bias or {}).items():
            msg.logit_bias[int(token)] = float(bias)
        if self.dry_sequence_breakers:
            msg.dry_sequence_breakers.extend(int(t) for t in self.dry_sequence_breakers)


Mask = Union[bytes, np.ndarray, None]


def _mask_bytes(mask) -> bytes:
    if mask is None:
        return b""
    if isinstance(mask, (bytes, bytearray, memoryview)):
        return bytes(mask)
    if hasattr(mask, "numpy"):  # a CPU torch tensor (xgrammar.allocate_token_bitmask)
        mask = mask.numpy()
    return np.ascontiguousarray(mask, dtype="<i4").tobytes()


@dataclass
class _Common:
    request_id: str
    params: SamplingParams = field(default_factory=SamplingParams)
    sample_position: int = 0
    prompt_token_ids: Sequence[int] = ()
    output_token_ids: Sequence[int] = ()

    def _fill_common(self, msg):
        msg.request_id = self.request_id
        self.params.fill(msg.params)
        if self.sample_position:
            msg.sample_position = self.sample_position
        if len(self.prompt_token_ids):
            msg.prompt_token_ids.extend(self.prompt_token_ids)
        if len(self.output_token_ids):
            msg.output_token_ids.extend(self.output_token_ids)


@dataclass
class Prefill(_Common):
    """Samples one token from `row` (optionally with prompt logprobs)."""

    row: int = 0
    golden_token_id: Optional[int] = None
    allowed_token_mask: Mask = None
    prompt_first_row: int = 0
    prompt_targets: Sequence[int] = ()

    kind = pb.PREFILL

    def to_proto(self, msg):
        self._fill_common(msg)
        msg.row = self.row
        if self.golden_token_id is not None:
            msg.golden_token_ids.append(self.golden_token_id)
        if self.allowed_token_mask is not None:
            msg.allowed_token_masks.append(_mask_bytes(self.allowed_token_mask))
        msg.prompt_first_row = self.prompt_first_row
        msg.prompt_targets.extend(self.prompt_targets)


@dataclass
class Decode(_Common):
    """Verifies `draft_token_ids` (num_rows - 1 of them) against rows first_row.. and emits
    the accepted drafts plus one token. `draft_logprobs` ([num_rows - 1, cols]) are the
    drafts' processed logprobs, or `draft_topn` = (values [num_rows - 1, N], token_ids of the
    same shape) their top N; None = the server's draft pool (from this request's earlier Draft
    steps). Either tensor is anything a step's logits may be: a numpy array or CPU torch tensor
    (sent inline), ShmLogits, or CudaLogits (a view of a registered CUDA tensor, read in place
    by samplerd's kernels after its ready event: a drafter's output never leaves the GPU)."""

    first_row: int = 0
    num_rows: int = 1
    draft_token_ids: Sequence[int] = ()
    draft_logprobs: Optional[object] = None
    draft_topn: Optional[tuple] = None
    golden_token_ids: Sequence[int] = ()
    allowed_token_masks: Sequence[Mask] = ()

    kind = pb.DECODE

    def to_proto(self, msg):
        self._fill_common(msg)
        if self.first_row:
            msg.first_row = self.first_row
        msg.num_rows = self.num_rows
        if len(self.draft_token_ids):
            msg.draft_token_ids.extend(self.draft_token_ids)
        if self.draft_logprobs is not None:
            _fill_logits(msg.draft_logprobs, _as_tensor_source(self.draft_logprobs))
        if self.draft_topn is not None:
            values, token_ids = self.draft_topn
            _fill_logits(msg.draft_topn.values, _as_tensor_source(values))
            msg.draft_topn.token_ids.extend(int(t) for t in np.asarray(token_ids).reshape(-1))
        if len(self.golden_token_ids):
            msg.golden_token_ids.extend(self.golden_token_ids)
        if self.allowed_token_masks:
            msg.allowed_token_masks.extend(_mask_bytes(m) for m in self.allowed_token_masks)


@dataclass
class Draft(_Common):
    """Samples draft tokens from `rows` (draft index `draft_indices[i]` each); the server keeps
    their logprobs in its draft pool for the Decode step that verifies them."""

    rows: Sequence[int] = ()
    draft_indices: Sequence[int] = ()
    last_valid_offset: int = 0
    allowed_token_masks: Sequence[Mask] = ()

    kind = pb.DRAFT

    def to_proto(self, msg):
        self._fill_common(msg)
        msg.rows.extend(self.rows)
        msg.draft_indices.extend(self.draft_indices)
        msg.last_valid_offset = self.last_valid_offset
        msg.allowed_token_masks.extend(_mask_bytes(m) for m in self.allowed_token_masks)


Request = Union[Prefill, Decode, Draft]

_NUMPY_DTYPES = {np.dtype(np.float32): pb.FLOAT32, np.dtype(np.float16): pb.FLOAT16}


def _inline(tensor, array: np.ndarray):
    """Inline bytes: float32 or float16 numpy arrays (bfloat16: pass a torch tensor)."""
    if array.ndim != 2:
        raise ValueError(f"logits must be 2-D [rows, cols], got shape {array.shape}")
    dtype = _NUMPY_DTYPES.get(array.dtype)
    if dtype is None:
        raise ValueError(f"inline logits must be float32 or float16, not {array.dtype}")
    tensor.dtype = dtype
    tensor.rows, tensor.cols = array.shape
    tensor.data = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()


@dataclass(frozen=True)
class ShmLogits:
    """Logits in a registered shm region: a [rows, cols] array from region.ndarray()."""

    region: ShmRegion
    array: np.ndarray

    def fill(self, tensor):
        if self.array.ndim != 2 or self.array.dtype not in _NUMPY_DTYPES:
            raise ValueError("shm logits: a 2-D float32 or float16 view of the region")
        tensor.dtype = _NUMPY_DTYPES[self.array.dtype]
        tensor.rows, tensor.cols = self.array.shape
        tensor.row_stride = self.array.strides[0] // self.array.itemsize
        tensor.buffer.name = self.region.buffer_name
        tensor.buffer.byte_offset = self.region.byte_offset_of(self.array)


_TORCH_DTYPES = {"torch.float32": pb.FLOAT32, "torch.bfloat16": pb.BFLOAT16,
                 "torch.float16": pb.FLOAT16}


@dataclass(frozen=True)
class CudaLogits:
    """Logits in a registered CUDA_IPC region: a [rows, cols] view of the registered tensor.
    `ready_event` is ReadyEvent.record()'s handle (None: the producer stream was synchronised)."""

    region: CudaRegion
    view: object  # torch.Tensor
    ready_event: Optional[bytes] = None

    def fill(self, tensor):
        view = self.view
        if view.dim() != 2 or view.stride(1) != 1:
            raise ValueError("cuda logits: a 2-D view with contiguous rows")
        tensor.dtype = _TORCH_DTYPES[str(view.dtype)]
        tensor.rows, tensor.cols = view.shape
        tensor.row_stride = view.stride(0)
        tensor.buffer.name = self.region.name
        tensor.buffer.byte_offset = self.region.byte_offset_of(view)
        if self.ready_event:
            tensor.ready_event = self.ready_event


@dataclass(frozen=True)
class NcclLogits:
    """Logits a group follower sends over NCCL (GroupFollower.send_logits): samplerd receives
    rows x cols of `dtype` ("float32", "bfloat16" or "float16") from `src_rank`."""

    group_id: str
    src_rank: int
    rows: int
    cols: int
    dtype: str = "float32"

    def fill(self, tensor):
        tensor.dtype = {"float32": pb.FLOAT32, "bfloat16": pb.BFLOAT16, "float16": pb.FLOAT16}[self.dtype]
        tensor.rows, tensor.cols = self.rows, self.cols
        tensor.nccl.group_id = self.group_id
        tensor.nccl.src_rank = self.src_rank


@dataclass(frozen=True)
class ShardedLogits:
    """A vocabulary split across tensor-parallel ranks (an lm_head split by columns): `shards`
    in column order, each any logits source (CudaLogits, ShmLogits, an array, a pb.Tensor such
    as a CUDA IPC handle another rank exported). Every shard has the same rows and dtype. On
    the CUDA backend shards in device memory are read in place, each after its own
    ready_event (at most 16); host shards are concatenated by the server."""

    shards: Sequence[object]

    def fill(self, tensor):
        if not self.shards:
            raise ValueError("sharded logits: at least one shard")
        cols = 0
        for shard in self.shards:
            part = tensor.shards.add()
            _fill_logits(part, shard)
            cols += part.cols
        tensor.dtype = tensor.shards[0].dtype
        tensor.rows, tensor.cols = tensor.shards[0].rows, cols


def _as_tensor_source(value):
    """Lists become numpy arrays; every other source passes as it is."""
    return np.asarray(value) if isinstance(value, (list, tuple)) else value


def _fill_logits(tensor, logits):
    if isinstance(logits, (ShmLogits, CudaLogits, NcclLogits, ShardedLogits)):
        logits.fill(tensor)
    elif isinstance(logits, np.ndarray):
        _inline(tensor, logits)
    elif isinstance(logits, pb.Tensor):
        tensor.CopyFrom(logits)
    elif (type(logits).__module__ or "").startswith("torch"):
        if logits.is_cuda:
            raise ValueError("a CUDA tensor must be registered first (register_cuda_tensor) "
                             "and sent as CudaLogits")
        import torch

        t = logits.contiguous()
        tensor.dtype = _TORCH_DTYPES[str(t.dtype)]
        tensor.rows, tensor.cols = t.shape
        tensor.data = t.view(-1).view(torch.uint8).numpy().tobytes()
    else:
        raise TypeError(f"logits: unsupported type {type(logits).__name__}")


def build_step(logits, requests: Sequence[Request], *, step_id: int = 0,
               vocab_size: Optional[int] = None, force_top_n: int = 0,
               compute_sum_smaller_probs: bool = False, group_id: str = "", output=None):
    """A SampleRequest for one step. `vocab_size` defaults to the logits' columns; `output`: a
    pb.StepOutput (TokenOutput.next()) for tokens written into this worker's GPU memory."""
    if not requests:
        raise ValueError("a step needs at least one request")
    kinds = {r.kind for r in requests}
    if len(kinds) != 1:
        raise ValueError("one step holds one kind of request (Prefill, Decode or Draft)")
    msg = pb.SampleRequest(step_id=step_id, group_id=group_id)
    _fill_logits(msg.logits, logits)
    msg.inputs.kind = kinds.pop()
    msg.inputs.vocab_size = vocab_size if vocab_size is not None else msg.logits.cols
    msg.inputs.force_top_n = force_top_n
    msg.inputs.compute_sum_smaller_probs = compute_sum_smaller_probs
    for r in requests:
        r.to_proto(msg.inputs.requests.add())
    if output is not None:
        msg.output.CopyFrom(output)
    return msg


_KINDS = {"prefill": pb.PREFILL, "decode": pb.DECODE}


def _array_bytes(values, dtype) -> bytes:
    return np.ascontiguousarray(values, dtype=dtype).tobytes()


def build_batch(logits, kind, rows, *, params=None,
                num_rows=None, sample_positions=None, seeds=None, request_id_prefix: str = "",
                step_id: int = 0, vocab_size: Optional[int] = None,
                compute_sum_smaller_probs: bool = False, output=None,
                packed_results: bool = True):
    """A SampleRequest of B = len(rows) requests from arrays (RequestBatch), with no Python
    object per request: request i reads row rows[i] (DECODE: rows[i] .. + num_rows[i] - 1) with
    the shared `params`, seeds[i] as its seq_seed and sample_positions[i]; it is named
    request_id_prefix + str(i). `params` is one SamplingParams for all, or a sequence of B
    (one per request: each distinct object is sent once, the requests index them). `kind` is
    "prefill" or "decode" (or pb.PREFILL / pb.DECODE).
    `output`: a pb.StepOutput (TokenOutput.next()). With `packed_results` samplerd answers with
    arrays (a BatchResult)."""
    msg = pb.SampleRequest(step_id=step_id, packed_results=packed_results)
    _fill_logits(msg.logits, logits)
    inputs = msg.inputs
    inputs.kind = _KINDS.get(kind, kind)
    inputs.vocab_size = vocab_size if vocab_size is not None else msg.logits.cols
    inputs.compute_sum_smaller_probs = compute_sum_smaller_probs
    batch = inputs.batch
    if isinstance(params, SamplingParams):
        params.fill(batch.params)
    elif params is not None:
        slots, index = {}, []
        for p in params:
            slot = slots.get(id(p))
            if slot is None:
                slot = slots[id(p)] = len(slots)
                p.fill(batch.param_sets.add())
            index.append(slot)
        if len(index) != len(rows):
            raise ValueError(f"{len(index)} params for {len(rows)} rows")
        batch.param_index = _array_bytes(index, "<i4")
    batch.rows = _array_bytes(rows, "<i4")
    if num_rows is not None:
        batch.num_rows = _array_bytes(num_rows, "<i4")
    if sample_positions is not None:
        batch.sample_positions = _array_bytes(sample_positions, "<i8")
    if seeds is not None:
        batch.seq_seeds = _array_bytes(seeds, "<u8")
    if request_id_prefix:
        batch.request_id_prefix = request_id_prefix
    if output is not None:
        msg.output.CopyFrom(output)
    return msg
