"""The routes that generate nothing: `/v1/messages/count_tokens` and `/v1/embeddings`.

Neither goes through the scheduler: there is no prefix to find and no slot to hold for a session.
llama-server counts tokens on its HTTP thread (it renders the messages with the model's chat template
and tokenizes, the same render its generations use), so a count takes no slot and needs no lease; an
embedding runs in whichever slot the server picks. The gateway sends each to the ready pod of the model
with the fewest requests in flight (counted in flight meanwhile, so the scheduler sees the load), tries
another pod when one refuses the connection, and relays the answer. For embeddings, a pod that answers
that it runs without `--embeddings` is remembered (`EmbeddingPods`) and the next pod is tried; when no
pod of the model serves them the client gets a 400 naming the model.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

import orjson
from starlette.responses import Response

from llamafleet_router.access.limits import Permit
from llamafleet_router.api.embeddings import not_serving, says_unsupported
from llamafleet_router.api.parse import ParsedRequest, Route
from llamafleet_router.discovery.base import PodStatus
from llamafleet_router.errors import no_pod_available
from llamafleet_router.proxy.forward import forward
from llamafleet_router.proxy.gone import PodUnreachable
from llamafleet_router.request.after import Outcome
from llamafleet_router.scheduling.framework import ANY_SLOT

if TYPE_CHECKING:
    from llamafleet_router.api.gateway import Gateway

log = logging.getLogger(__name__)


def candidates(model: str, pods: Sequence[PodStatus], load: Callable[[str], int],
               usable: Callable[[str], bool]) -> list[PodStatus]:
    """Ready pods of `model` that may serve the request, least loaded first (pure)."""
    ready = [pod for pod in pods if pod.ready and pod.model == model and usable(pod.endpoint.uid)]
    return sorted(ready, key=lambda pod: (load(pod.endpoint.uid), pod.endpoint.uid))


async def _closing(close: Callable[[], Awaitable[None]]) -> None:
    await close()


class _Done:
    """Gives back one attempt's bookkeeping exactly once (the proxy's `on_finish`)."""

    def __init__(self, gateway: Gateway, pod: PodStatus, model: str, key: str) -> None:
        self.gateway, self.pod, self.model, self.key = gateway, pod, model, key
        self.done = False
        self.status = 0

    def __call__(self, outcome: Outcome, close: Callable[[], Awaitable[None]] | None) -> None:
        if self.done:
            return
        self.done = True
        self.status = outcome.status
        g = self.gateway
        g.in_flight.end(self.pod.endpoint.uid, self.pod.endpoint.url, ANY_SLOT)
        if close is not None:
            g.tasks.spawn(_closing(close), name="close-direct")

    def counted(self, status: int) -> None:
        self.gateway.metrics.requests.labels(self.model, self.key, str(status)).inc()


async def answer_direct(
    gateway: Gateway, request_accept: str, parsed: ParsedRequest, model: str, pods: Sequence[PodStatus],
    key: str, permit: Permit | None,
) -> Response:
    """Send `parsed` to a pod of `model` and relay its answer; ApiError when none can take it."""
    g = gateway
    assert g.http is not None and g.discovery is not None
    embeddings = parsed.route is Route.EMBEDDINGS
    body = orjson.dumps(parsed.body)
    shown = g.tenancy.routing_headers(key)
    tried: set[str] = set()
    unreachable = 0
    try:
        while unreachable <= g.retries:
            usable = [pod for pod in candidates(model, pods, g.in_flight.count, g.embedding_pods.serves)
                      if pod.endpoint.uid not in tried]
            if not usable:
                break
            pod = usable[0]
            uid, url = pod.endpoint.uid, pod.endpoint.url
            tried.add(uid)
            done = _Done(g, pod, model, key)
            g.in_flight.begin(uid, url, ANY_SLOT)
            try:
                response = await forward(
                    g.http, url + parsed.route.value, body,
                    {"content-type": "application/json", "accept": request_accept,
                     "accept-encoding": "identity", **g.pod_headers},
                    on_finish=done, max_response_bytes=g.max_response_bytes,
                    extra_headers={"x-llamafleet-pod": pod.endpoint.pod.name} if shown else None,
                )
            except PodUnreachable as exc:
                done(Outcome(status=502, error=str(exc)), None)
                unreachable += 1
                g.discovery.mark_down(uid)
                g.metrics.upstream_retries.inc()
                log.warning("pod unreachable, trying another", extra={"pod": url, "error": str(exc)})
                continue
            except BaseException:
                done(Outcome(status=500, error="router error"), None)
                raise
            if embeddings and says_unsupported(response.status_code, bytes(response.body)):
                g.embedding_pods.mark_without(uid)  # its flags hold until it restarts (a new uid)
                continue
            done.counted(response.status_code)
            return response
        if embeddings and not candidates(model, pods, g.in_flight.count, g.embedding_pods.serves):
            raise not_serving(model)
        raise no_pod_available(model)
    finally:
        if permit is not None:
            permit.release()
