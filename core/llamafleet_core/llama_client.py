"""A small async client for the llama-server endpoints llamafleet uses (admin and inference).

One `LlamaClient` per base URL; it borrows an `httpx.AsyncClient` from its owner (the app's lifespan
creates one per process), so no client is created at import time and tests can inject a transport.
Errors from the server become `LlamaError` with the status and the server's own message.
"""

from __future__ import annotations

from typing import Any

import httpx


class LlamaError(RuntimeError):
    """llama-server answered with an error, or could not be reached."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def error_message(resp: httpx.Response) -> str:
    """The message of an error answer: llama-server's `{"error": {"message": ...}}`, a bare
    `{"error": "..."}` (what a proxy in front of it may say), else the body as text."""
    try:
        body = resp.json()
    except ValueError:
        return resp.text
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])
    return error if isinstance(error, str) else resp.text


class LlamaClient:
    def __init__(self, base_url: str, http: httpx.AsyncClient, api_key: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = http
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    async def _call(
        self, method: str, path: str, json: Any = None, timeout: float | None = 30.0
    ) -> Any:
        try:
            resp = await self._http.request(
                method, self.base_url + path, json=json, headers=self._headers, timeout=timeout
            )
        except httpx.HTTPError as exc:
            raise LlamaError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        if resp.status_code >= 400:
            raise LlamaError(f"{method} {path}: {resp.status_code} {error_message(resp)}", resp.status_code)
        return resp.json() if resp.content else None

    async def health(self) -> bool:
        try:
            resp = await self._http.get(self.base_url + "/health", timeout=5.0)
        except httpx.HTTPError:
            return False
        return resp.status_code == 200

    async def props(self) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("GET", "/props")
        return result

    async def slots(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = await self._call("GET", "/slots")
        return result

    async def tokenize(self, content: str, add_special: bool = True) -> list[int]:
        body = {"content": content, "add_special": add_special, "parse_special": True}
        result = await self._call("POST", "/tokenize", body)
        return list(result["tokens"])

    async def apply_template(self, body: dict[str, Any]) -> str:
        result = await self._call("POST", "/apply-template", body)
        return str(result["prompt"])

    async def prefill(
        self, prompt: str | list[int], slot: int, timeout: float | None = None
    ) -> dict[str, Any]:
        """Compute `prompt` into `slot` and generate nothing (`n_predict: 0`)."""
        body = {"prompt": prompt, "n_predict": 0, "id_slot": slot, "cache_prompt": True}
        result: dict[str, Any] = await self._call("POST", "/completion", body, timeout=timeout)
        return result

    async def save_slot(self, slot: int, filename: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._call(
            "POST", f"/slots/{slot}?action=save", {"filename": filename}, timeout=None
        )
        return result

    async def restore_slot(self, slot: int, filename: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._call(
            "POST", f"/slots/{slot}?action=restore", {"filename": filename}, timeout=None
        )
        return result

    async def erase_slot(self, slot: int) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("POST", f"/slots/{slot}?action=erase")
        return result
