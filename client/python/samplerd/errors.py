"""Errors as exceptions that carry the gRPC status code."""
import grpc


class SamplerError(Exception):
    """A failed call or step. `code` is a grpc.StatusCode; `message` is the server's text,
    which names the offending field (e.g. "requests[2].params.top_p: ...")."""

    def __init__(self, code: grpc.StatusCode, message: str, retry_after: float = None):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        # Seconds after which the same call may succeed, where samplerd says so: a registration
        # refused ALREADY_EXISTS for a name whose holder is alive by its lease alone.
        self.retry_after = retry_after

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> "SamplerError":
        retry_after = None
        try:
            for key, value in error.trailing_metadata() or ():
                if key == "samplerd-retry-after-ms":
                    retry_after = int(value) / 1000.0
        except (AttributeError, TypeError, ValueError):
            pass
        return cls(error.code(), error.details() or "", retry_after)


class RequestError(SamplerError):
    """One request of a step failed (SPEC: a fault of one request fails only itself); the
    step's other results are valid."""

    def __init__(self, request_id: str, code: grpc.StatusCode, message: str):
        super().__init__(code, message)
        self.request_id = request_id
        self.args = (f"request {request_id!r}: {code.name}: {message}",)


_CODES = {c.value[0]: c for c in grpc.StatusCode}


def status_code(number: int) -> grpc.StatusCode:
    """gRPC's numeric code (as in RequestResult.status.code) to grpc.StatusCode."""
    return _CODES.get(number, grpc.StatusCode.UNKNOWN)
