"""`GET /v1/models` and `GET /v1/models/{id}`: the models the fleet serves, with their context length.

Clients size their context window from these entries (Hermes Agent assumed 256K when none was given,
and llama-server then refused its requests). The length is the per-slot context the pods report
(`/props` `default_generation_settings.n_ctx`: what llama-server really allocated, after any cap to the
model's training context), the smallest over the model's pods, since a request may land on any of
them. It is written under the names clients read: `context_length` (OpenRouter's, read by Hermes and
most agents), `max_model_len` (vLLM's) and `meta.n_ctx` (llama-server's own `/v1/models`). A model whose
pods have not reported it yet has none of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from llamafleet_router.access.auth import authenticate
from llamafleet_router.api.gateway import Gateway
from llamafleet_router.discovery.base import PodStatus
from llamafleet_router.errors import ApiError, model_not_found


def context_lengths(pods: Sequence[PodStatus]) -> dict[str, int]:
    """Each model's smallest reported per-slot context (pure); a model none of whose pods reported one
    is absent."""
    found: dict[str, int] = {}
    for pod in pods:
        if pod.props is None or pod.props.n_ctx <= 0:
            continue
        model = pod.props.model
        found[model] = min(found.get(model, pod.props.n_ctx), pod.props.n_ctx)
    return found


def model_entry(model: str, context_length: int | None) -> dict[str, Any]:
    entry: dict[str, Any] = {"id": model, "object": "model", "created": 0, "owned_by": "llamafleet"}
    if context_length:
        entry.update(context_length=context_length, max_model_len=context_length,
                     meta={"n_ctx": context_length})
    return entry


def model_entries(pods: Sequence[PodStatus]) -> list[dict[str, Any]]:
    """The `/v1/models` list: every model a pod reported, sorted by name (pure)."""
    lengths = context_lengths(pods)
    names = sorted({pod.model for pod in pods if pod.model})
    return [model_entry(name, lengths.get(name)) for name in names]


class ModelRoutes:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def _entries(self, request: Request) -> list[dict[str, Any]]:
        g = self.gateway
        authenticate(g.keys, request.headers)
        return model_entries(await g.director.discovery.endpoints())

    async def list(self, request: Request) -> Response:
        try:
            return JSONResponse({"object": "list", "data": await self._entries(request)})
        except ApiError as err:
            return err.response()

    async def one(self, request: Request) -> Response:
        model_id = request.path_params["model_id"]
        try:
            entry = next((e for e in await self._entries(request) if e["id"] == model_id), None)
            if entry is None:
                raise model_not_found(model_id)  # OpenAI's 404
            return JSONResponse(entry)
        except ApiError as err:
            return err.response()
