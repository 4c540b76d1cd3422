"""What `LlamaClient` raises for an error answer, whatever its body: llama-server's own error object, a
bare error string (a proxy in front of it), a list, or text. Never a crash of its own (an AttributeError
on a string body was one)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from llamafleet_core.llama_client import LlamaClient, LlamaError


def _answering(status: int, **body: Any) -> httpx.MockTransport:
    return httpx.MockTransport(lambda request: httpx.Response(status, **body))


@pytest.mark.parametrize(("body", "message"), [
    ({"json": {"error": {"code": 400, "message": "exceeds the context", "type": "invalid_request_error"}}},
     "exceeds the context"),
    ({"json": {"error": "slot busy"}}, "slot busy"),
    ({"json": ["not", "an", "object"]}, '["not","an","object"]'),
    ({"json": {"error": {"code": 500}}}, '{"error":{"code":500}}'),
    ({"text": "upstream connect error"}, "upstream connect error"),
])
async def test_an_error_answer_raises_llama_error_with_its_message(
        body: dict[str, Any], message: str) -> None:
    async with httpx.AsyncClient(transport=_answering(503, **body)) as http:
        client = LlamaClient("http://pod", http)
        with pytest.raises(LlamaError) as raised:
            await client.props()
    assert raised.value.status == 503
    assert str(raised.value).endswith(message)
