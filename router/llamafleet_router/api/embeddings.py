"""`POST /v1/embeddings`: the body's check, and which pods serve embeddings.

A llama-server serves embeddings only when started with `--embeddings`, and its `/props` does not say
so: the gateway learns it from the pods' own answers. A pod that answers an embeddings request with
llama-server's "not supported" (501) is remembered as not serving them, by its uid (a restarted pod has
a new uid, and may have new flags), and the request goes to another pod of the model; when none of them
serves embeddings the client gets a 400 saying so for that model. Pure, but for the small memo.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from llamafleet_router.errors import ApiError, bad_request

_TRACKED_PODS = 4096  # pod uids remembered (a uid changes when a pod restarts)


def check_embeddings_input(body: Mapping[str, Any]) -> None:
    """`input`: a string, an array of strings, an array of token ids, or an array of such arrays;
    `dimensions` cannot be honoured (llama-server returns the model's own size)."""
    if "input" not in body:
        raise bad_request("Missing required parameter: 'input'.", param="input",
                          code="missing_required_parameter")
    given = body["input"]
    if not (type(given) is str or (isinstance(given, list) and given and all(
            type(item) is str or _token(item) or (isinstance(item, list) and item and all(map(_token, item)))
            for item in given))):
        raise bad_request("`input` must be a string, an array of strings, an array of token ids or an "
                          "array of arrays of token ids, none empty.", param="input", code="invalid_type")
    if body.get("dimensions") is not None:
        raise bad_request("`dimensions` is not supported: the embeddings have the model's own size.",
                          param="dimensions", code="unsupported_parameter")
    if body.get("encoding_format") not in (None, "float", "base64"):
        raise bad_request("`encoding_format` must be `float` or `base64`.", param="encoding_format",
                          code="invalid_value")


def _token(value: Any) -> bool:
    return type(value) is int and value >= 0


def not_serving(model: str) -> ApiError:
    return ApiError(400, f"The model `{model}` does not serve embeddings on this fleet (its pods run "
                    "without llama-server's `--embeddings`).", param="model", code="model_not_embedding")


def says_unsupported(status: int, body: bytes) -> bool:
    """Whether a pod's answer is llama-server's refusal for a server started without `--embeddings`."""
    return status == 501 and b"--embeddings" in body


class EmbeddingPods:
    """Which pods (by uid) answered that they do not serve embeddings."""

    def __init__(self, tracked: int = _TRACKED_PODS) -> None:
        self._without: OrderedDict[str, None] = OrderedDict()
        self._tracked = tracked

    def serves(self, uid: str) -> bool:
        """False only for a pod that said it does not; a pod never asked may."""
        return uid not in self._without

    def mark_without(self, uid: str) -> None:
        self._without[uid] = None
        self._without.move_to_end(uid)
        while len(self._without) > self._tracked:
            self._without.popitem(last=False)
