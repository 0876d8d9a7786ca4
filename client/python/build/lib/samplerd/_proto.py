"""The service's protobuf messages, built at import time from the packaged descriptor set.

setup.py compiles proto/samplerd/v1/sampler.proto into sampler.desc. Building the classes from
that descriptor (rather than shipping protoc's generated _pb2 modules) means the package works
with any protobuf runtime >= 3.20: generated code is tied to the protobuf version that made it.
`pb.SampleRequest`, `pb.Tensor`, ... are ordinary protobuf message classes; enum values are
ints (`pb.FLOAT32`, `pb.PREFILL`, `pb.HOST_SHM`, ...).
"""
from importlib import resources
from types import SimpleNamespace

from google.protobuf import descriptor_pb2, descriptor_pool

try:  # protobuf >= 4.21
    from google.protobuf.message_factory import GetMessageClass as _message_class
except ImportError:  # pragma: no cover - protobuf 3.20
    from google.protobuf import message_factory as _mf

    _factory = _mf.MessageFactory()

    def _message_class(descriptor):
        return _factory.GetPrototype(descriptor)

PACKAGE = "samplerd.v1"
SERVICE = PACKAGE + ".Sampler"


def _load():
    try:
        data = resources.files(__package__).joinpath("sampler.desc").read_bytes()
    except (FileNotFoundError, AttributeError) as e:  # AttributeError: Python < 3.9 resources
        raise ImportError("samplerd: sampler.desc is missing; install the package with "
                          "`pip install ./client/python` (the build compiles the .proto)") from e
    files = descriptor_pb2.FileDescriptorSet.FromString(data)
    pool = descriptor_pool.DescriptorPool()
    for f in files.file:
        pool.Add(f)
    file = pool.FindFileByName("samplerd/v1/sampler.proto")
    names = {}
    for name, desc in file.message_types_by_name.items():
        names[name] = _message_class(desc)
    for enum in file.enum_types_by_name.values():
        for value in enum.values:
            names[value.name] = value.number
        names[enum.name] = enum
    return SimpleNamespace(**names), pool


pb, pool = _load()
