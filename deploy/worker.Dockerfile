# A model worker's image for the pod check (deploy/tests/pod_check.sh): Python and samplerd's
# Python client, running examples/decode_loop.py against the samplerd beside it in the pod.
# A real worker image adds its engine (PyTorch, transformers) on top of the same two steps.
#   podman build --network=host -f deploy/worker.Dockerfile -t samplerd-worker .
FROM debian:12-slim
RUN apt-get update -qq && \
    apt-get install -y -qq --no-install-recommends python3 python3-venv && \
    rm -rf /var/lib/apt/lists/*
# The client compiles samplerd's .proto when it is built, and takes its VERSION: from the repository.
COPY proto /src/proto
COPY VERSION /src/VERSION
COPY client/python /src/client/python
RUN python3 -m venv /opt/venv && \
    /opt/venv/bin/pip install -q --no-cache-dir --disable-pip-version-check /src/client/python && \
    rm -rf /src
COPY examples /opt/examples
ENV PATH=/opt/venv/bin:$PATH
# The pod's uid: the worker's 0600 shm objects must be samplerd's own (deploy/README).
USER 10001:10001
HEALTHCHECK NONE
ENTRYPOINT ["python3"]
CMD ["/opt/examples/decode_loop.py", "127.0.0.1:50051"]
