# The llamafleet image: one image, three entry points.
#   docker build -t llamafleet/llamafleet:dev .
#   llamafleet router ... | llamafleet agent ... | llamafleet operator ...
# The base is pinned by tag (python 3.11.11 on Debian bookworm). Pin it by digest where you build
# (python:3.11.11-slim-bookworm@sha256:...): a digest cannot be looked up on machines without registry access.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY pyproject.toml README.md ./
COPY core core
COPY router router
COPY agent agent
COPY operator operator
COPY cli cli
COPY local local
RUN pip wheel --no-deps --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="llamafleet" \
      org.opencontainers.image.description="Prefix-aware gateway, snapshot agent and operator for llama-server fleets" \
      org.opencontainers.image.licenses="MIT"
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=build /wheels /wheels
RUN pip install /wheels/*.whl && rm -rf /wheels
# The conventional "nonroot" uid, the same the chart and the operator's pods run as.
USER 65532:65532
WORKDIR /tmp
EXPOSE 8000 8090
ENTRYPOINT ["llamafleet"]
CMD ["--help"]
