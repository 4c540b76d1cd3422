"""`llamafleet agent ...`: run the snapshot agent under uvicorn.

Flags override the `LLAMAFLEET_AGENT_*` environment; the operator passes the pod's rendered settings
(cache types, flash attention, unified KV, slots, SWA) the same way it passes them to llama-server.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

import uvicorn
from prometheus_client import CollectorRegistry

from llamafleet_agent.app import create_app
from llamafleet_agent.settings import AgentSettings
from llamafleet_core import http_pool
from llamafleet_core.llama_client import LlamaClient

# (flags, settings field, type). The first spelling is the one `llamafleet_core.podspec.agent_args`
# renders for pods; the others are kept for people who start the agent by hand.
_FLAGS: tuple[tuple[tuple[str, ...], str, Any], ...] = (
    (("--server-url", "--llama-url"), "llama_url", str),
    (("--snapshot-dir",), "snapshot_dir", str),
    (("--model-path", "--model-file"), "model_file", str),
    (("--model-sha256",), "model_sha256", str),
    (("--model-name",), "model_name", str),
    (("--fleet",), "fleet", str),
    (("--cache-type-k",), "cache_type_k", str),
    (("--cache-type-v",), "cache_type_v", str),
    (("--flash-attn",), "flash_attn", str),
    (("--slots",), "slots", int),
    (("--token-file",), "token_file", str),
    (("--signing-key-file",), "signing_key_file", str),
    (("--llama-api-key-file",), "llama_api_key_file", str),
    (("--peer-networks",), "peer_networks", str),
    (("--server-help-file",), "server_help_file", str),
    (("--budget-bytes",), "budget_bytes", int),
    (("--pod-name",), "pod_name", str),
    (("--host",), "host", str),
    (("--port",), "port", int),
)
_SWITCHES = (
    ("--kv-unified", "kv_unified"),
    ("--swa-full", "swa_full"),
    ("--attn-rot-disabled", "attn_rot_disabled"),
    ("--await-required", "await_required"),
    ("--attach", "attach"),
)


def parse_settings(argv: list[str]) -> AgentSettings:
    parser = argparse.ArgumentParser(prog="llamafleet agent", description=__doc__)
    for flags, dest, kind in _FLAGS:
        parser.add_argument(*flags, dest=dest, type=kind, default=None)
    for flag, dest in _SWITCHES:
        parser.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction, default=None)
    args = vars(parser.parse_args(argv))
    return AgentSettings(**{k: v for k, v in args.items() if v is not None})


async def serve(settings: AgentSettings) -> None:
    async with http_pool.async_client() as http:
        app = create_app(
            settings, llama=LlamaClient(settings.llama_url, http, api_key=settings.resolved_llama_api_key()),
            http=http, registry=CollectorRegistry(),
        )
        config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level="info")
        await uvicorn.Server(config).serve()


def main(argv: list[str] | None = None) -> int:
    try:
        settings = parse_settings(sys.argv[1:] if argv is None else argv)
        settings.resolved_token()
        settings.resolved_llama_api_key()  # a key file that cannot be read fails at start, by name
    except (ValueError, OSError) as exc:
        print(f"llamafleet agent: {exc}", file=sys.stderr)
        return 2
    asyncio.run(serve(settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
