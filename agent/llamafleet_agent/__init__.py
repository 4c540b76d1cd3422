"""llamafleet_agent: the snapshot sidecar beside each llama-server.

It owns the server's `--slot-save-path` folder, and signs every manifest in it (`store.py`). Routes (all
but `/health`, `/ready` and `/metrics` need the shared bearer token):

- `POST /v1/snapshots/save {slot, name, pinned?, blocks?, block_chars?, tokens?}` -> manifest
- `POST /v1/snapshots/pull {name, source, pinned?}` -> manifest (fetched from a peer agent at an address
  of `peer_networks` and verified, its signature first: `pull.py`)
- `POST /v1/snapshots/{name}/restore {slot}` -> {n_tokens, verify_ms, restore_ms, total_ms}
- `GET /v1/snapshots`, `GET|DELETE /v1/snapshots/{name}`, `GET /v1/snapshots/{name}/file`
- `GET|PUT /v1/required {snapshots}`: the snapshots this pod must hold to be ready (`required.py`)
- `GET /v1/info`: pod, fleet, the `features` of this pod's llama-server build (read from the
  detector's `--help` text, `features.py`), the slots' context, the restore probe's result and the
  model's `slidingWindow` (from its metadata: the operator keeps attach off for such a model)
- `GET /v1/fingerprint` (this pod's), `GET /health`, `GET /ready` (503 naming missing required
  snapshots), `GET /metrics`

Refusals answer `{"error": {"kind": ..., "reason": ...}}` with 4xx (or 502 when a peer or the server failed).
"""

from llamafleet_agent.app import create_app
from llamafleet_agent.settings import AgentSettings

__all__ = ["AgentSettings", "create_app"]
