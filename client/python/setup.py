"""Builds the samplerd Python client.

The one build step beyond plain setuptools: compile the service's .proto (the repository's
proto/samplerd/v1/sampler.proto, two directories up) into a serialized FileDescriptorSet,
samplerd/sampler.desc, which samplerd._proto turns into message classes at import time. Doing
it at build time keeps one source of truth (the .proto) and no generated code in the tree. The
version is the repository's VERSION file, as samplerd's.
"""
import os
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_ROOT = os.path.normpath(os.path.join(HERE, "..", "..", "proto"))
VERSION_FILE = os.path.normpath(os.path.join(HERE, "..", "..", "VERSION"))
PROTO = "samplerd/v1/sampler.proto"


class BuildWithDescriptors(build_py):
    def run(self):
        super().run()
        from grpc_tools import protoc  # a build requirement (pyproject.toml)

        if not os.path.exists(os.path.join(PROTO_ROOT, PROTO)):
            sys.exit(f"samplerd client: {PROTO} not found under {PROTO_ROOT}; build from the "
                     "repository (pip install ./client/python)")
        out = os.path.join(self.build_lib, "samplerd", "sampler.desc")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        rc = protoc.main(["protoc", f"-I{PROTO_ROOT}", f"--descriptor_set_out={out}",
                          "--include_imports", os.path.join(PROTO_ROOT, PROTO)])
        if rc != 0:
            sys.exit(f"samplerd client: protoc failed on {PROTO} (exit {rc})")


def version():
    """The repository's VERSION (samplerd's too: one place it is written)."""
    with open(VERSION_FILE) as f:
        return f.read().strip()


setup(version=version(), cmdclass={"build_py": BuildWithDescriptors})
