# A test image that carries a tiny GGUF model; a LlamaFleet's `model.source.image` copies it out with an
# init container (`sh -c cp`, so the image needs a shell: busybox). The files sit in /gguf, not /models:
# the init container mounts the pod's models volume at /models, which would hide the image's own folder.
#   llamafleet models                                  # writes the tiny models, prints their paths
#   cp <tiny-dense.gguf> ctx/ && docker build -f docker/tiny-model.Dockerfile -t llamafleet/tiny-model:e2e ctx/
# LlamaFleet: model.source.image: {reference: llamafleet/tiny-model:e2e, path: /gguf}
FROM busybox:1.36.1
COPY *.gguf /gguf/
USER 65532:65532
