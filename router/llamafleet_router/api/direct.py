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

import orjson
from starlette.responses import Response

from llamafleet_router.access.limits import Permit
from llamafleet_router.api.embeddings import EmbeddingPods, not_serving, says_unsupported
from llamafleet_router.api.parse import ParsedRequest, Route
from llamafleet_router.discovery.base import PodStatus
from llamafleet_router.errors import no_pod_available
from llamafleet_router.proxy.forward import forward
from llamafleet_router.proxy.gone import PodUnreachable
from llamafleet_router.proxy.relay import Outcome
from llamafleet_router.request.claim import SlotClaim
from llamafleet_router.request.director import Director

log = logging.getLogger(__name__)


def candidates(model: str, pods: Sequence[PodStatus], load: Callable[[str], int],
               usable: Callable[[str], bool]) -> list[PodStatus]:
    """Ready pods of `model` that may serve the request, least loaded first (pure)."""
    ready = [pod for pod in pods if pod.ready and pod.model == model and usable(pod.endpoint.uid)]
    return sorted(ready, key=lambda pod: (load(pod.endpoint.uid), pod.endpoint.uid))


class _Done:
    """One attempt's `on_finish`: gives its claim on the pod back, once."""

    def __init__(self, claim: SlotClaim) -> None:
        self.claim = claim

    def __call__(self, outcome: Outcome, close: Callable[[], Awaitable[None]] | None) -> None:
        self.claim.release(first=close() if close is not None and not self.claim.released else None)


async def answer_direct(
    director: Director, embedding_pods: EmbeddingPods, request_accept: str, parsed: ParsedRequest,
    model: str, pods: Sequence[PodStatus], key: str, permit: Permit | None,
) -> Response:
    """Send `parsed` to a pod of `model` and relay its answer; ApiError when none can take it."""
    d = director
    embeddings = parsed.route is Route.EMBEDDINGS
    body = orjson.dumps(parsed.body)
    shown = d.tenancy.routing_headers(key)
    tried: set[str] = set()
    unreachable = 0
    try:
        while unreachable <= d.retries:
            usable = [pod for pod in candidates(model, pods, d.in_flight.count, embedding_pods.serves)
                      if pod.endpoint.uid not in tried]
            if not usable:
                break
            pod = usable[0]
            uid, url = pod.endpoint.uid, pod.endpoint.url
            tried.add(uid)
            done = _Done(d.claims.claim_pod(pod.endpoint))
            try:
                response = await forward(
                    d.upstream.http, url + parsed.route.value, body,
                    {"content-type": "application/json", "accept": request_accept,
                     "accept-encoding": "identity", **d.upstream.pod_headers},
                    on_finish=done, max_response_bytes=d.upstream.max_response_bytes,
                    extra_headers={"x-llamafleet-pod": pod.endpoint.pod.name} if shown else None,
                )
            except PodUnreachable as exc:
                done.claim.release()
                unreachable += 1
                d.discovery.mark_down(uid)
                d.metrics.upstream_retries.inc()
                log.warning("pod unreachable, trying another", extra={"pod": url, "error": str(exc)})
                continue
            except BaseException:
                done.claim.release()
                raise
            if embeddings and says_unsupported(response.status_code, bytes(response.body)):
                embedding_pods.mark_without(uid)  # its flags hold until it restarts (a new uid)
                continue
            d.metrics.requests.labels(model, key, str(response.status_code)).inc()
            return response
        if embeddings and not candidates(model, pods, d.in_flight.count, embedding_pods.serves):
            raise not_serving(model)
        raise no_pod_available(model)
    finally:
        if permit is not None:
            permit.release()
