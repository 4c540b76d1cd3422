"""The agent reports its llama-server's features from the help text the detector wrote (`GET /v1/info`).

No llama-server: reporting reads a file and never calls the server (the stand-in fails any slot call).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from prometheus_client import CollectorRegistry

from llamafleet_agent import AgentSettings, create_app
from llamafleet_agent.cli import parse_settings
from llamafleet_core.agent_client import AgentClient
from tests.agent.test_app_offline import MODEL_SHA, TOKEN, PropsOnly
from tests.core.test_features import PATCHED_HELP


def make(tmp_path: Path, help_file: Path | None) -> tuple[Any, CollectorRegistry]:
    registry = CollectorRegistry()
    settings = AgentSettings(snapshot_dir=tmp_path / "snaps", model_sha256=MODEL_SHA, slots=2, pod_name="p-0",
                             fleet="f", server_help_file=help_file)
    app = create_app(settings, llama=PropsOnly(), http=httpx.AsyncClient(), registry=registry, token=TOKEN)
    return app, registry


async def test_info_reports_patched_features_when_help_file_names_them(tmp_path: Path) -> None:
    help_file = tmp_path / "help.txt"
    help_file.write_text(PATCHED_HELP)
    app, registry = make(tmp_path, help_file)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as http:
        info = await AgentClient("http://a", http, TOKEN).info()
        assert info["pod"] == "p-0" and info["fleet"] == "f"
        assert info["features"] == {"known": True, "slotAttach": True, "cachePrefix": True,
                                    "slotCheckpoints": True,
                                    "message": "slot_attach, cache_prefix, slot_checkpoints"}
        assert (await http.get("/v1/info")).status_code == 401, "info is for the operator and routers only"
        text = (await http.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})).text
    assert 'llamafleet_agent_server_feature{feature="slot_attach"} 1.0' in text
    assert "llamafleet_agent_server_features_known 1.0" in text
    assert registry.get_sample_value("llamafleet_agent_server_feature", {"feature": "cache_prefix"}) == 1


async def test_info_says_unknown_with_the_detectors_output_when_it_is_not_help(tmp_path: Path) -> None:
    """A shell-less image or a missing library: unknown (so `auto` stays off), and the status says why."""
    help_file = tmp_path / "help.txt"
    help_file.write_text("exec /app/llama-server: error while loading shared libraries: libcuda.so.1\n")
    app, registry = make(tmp_path, help_file)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as http:
        features = (await AgentClient("http://a", http, TOKEN).info())["features"]
    assert features["known"] is False and features["slotAttach"] is False
    assert "libcuda.so.1" in features["message"]
    assert registry.get_sample_value("llamafleet_agent_server_features_known") == 0


async def test_help_file_written_after_start_is_still_read(tmp_path: Path) -> None:
    help_file = tmp_path / "late" / "help.txt"
    app, _ = make(tmp_path, help_file)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as http:
        agent = AgentClient("http://a", http, TOKEN)
        before = (await agent.info())["features"]
        assert before["known"] is False and "not written yet" in before["message"]
        help_file.parent.mkdir()
        help_file.write_text(PATCHED_HELP.replace("-cpfx, --cache-prefix", "--keep N").replace(
            "LLAMA_ARG_CACHE_PREFIX", "LLAMA_ARG_KEEP"))
        after = (await agent.info())["features"]
    assert after["known"] is True and after["slotAttach"] is True and after["cachePrefix"] is False


async def test_no_help_file_configured_reports_unknown(tmp_path: Path) -> None:
    app, _ = make(tmp_path, None)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as http:
        features = (await AgentClient("http://a", http, TOKEN).info())["features"]
    assert features["known"] is False and features["message"] == "no help file configured"


def test_cli_flag_sets_the_help_file_as_rendered_pods_pass_it() -> None:
    settings = parse_settings(["--server-help-file", "/tmp/llamafleet/llama-server-help.txt", "--token-file",
                               "/t"])
    assert settings.server_help_file == Path("/tmp/llamafleet/llama-server-help.txt")
