"""`llama-server --help` parsing: what a build accepts, robust to the help's layout, never guessed."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from llamafleet_core.features import ServerFeatures, parse_help, spellings, summary

# The shape of a patched build's help: real upstream lines around the proposal's options, which come with
# a short alias and an env name, one as a negatable pair, and a description that names another flag.
PATCHED_HELP = """\
----- common params -----

-h,    --help, --usage                  print usage and exit
-c,    --ctx-size N                     size of the prompt context (default: 0, 0 = loaded from model)
                                        (env: LLAMA_ARG_CTX_SIZE)
-fa,   --flash-attn [on|off|auto]       set Flash Attention use ('on', 'off', or 'auto', default: 'auto')
                                        (env: LLAMA_ARG_FLASH_ATTN)

----- example-specific params -----

-sa,   --slot-attach, --no-slot-attach  let a slot attach to the prefix KV another slot holds (seq_cp);
                                        hybrid models attach at checkpoints (default: disabled)
                                        (env: LLAMA_ARG_SLOT_ATTACH)
-cpfx, --cache-prefix                   keep a persistent RAM cache entry cut at the first user message
                                        (env: LLAMA_ARG_CACHE_PREFIX)
--slot-save-checkpoints N                slot saves write the slot's last N context checkpoints
                                        (env: LLAMA_ARG_SLOT_SAVE_CHECKPOINTS)
--slot-save-path PATH                   path to save slot kv cache (default: disabled)
"""


def upstream_help(binary: Path) -> str:
    done = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=60, check=False)
    return done.stdout + done.stderr


@pytest.mark.llama
def test_upstream_build_has_no_prefix_sharing_flags_when_parsed(llama_server_bin: Path) -> None:
    """The real help of the build we test with is recognised, and names neither patched flag."""
    text = upstream_help(llama_server_bin)
    features = parse_help(text)
    assert features is not None, text[:500]
    assert (features.slot_attach, features.cache_prefix, features.slot_checkpoints) == (False, False, False)
    # Recognised as a whole, not by luck: the options the renderer emits are all found.
    for flag in ("--slot-save-path", "--ctx-size", "--kv-unified", "-no-kvu", "--cache-ram", "-fa", "-np",
                 "--no-cache-idle-slots", "--kv-unified-per-slot", "--fit"):
        assert features.has(flag), flag
    assert features.has("LLAMA_ARG_CACHE_RAM")


def test_patched_build_features_found_when_flags_have_aliases_and_envs() -> None:
    features = parse_help(PATCHED_HELP)
    assert features is not None
    assert features.slot_attach and features.cache_prefix and features.slot_checkpoints
    assert {"-sa", "--no-slot-attach", "-cpfx", "LLAMA_ARG_SLOT_ATTACH"} <= features.flags
    assert features.to_json() == {"slotAttach": True, "cachePrefix": True, "slotCheckpoints": True}
    assert ServerFeatures.from_json(features.to_json()) == ServerFeatures(slot_attach=True, cache_prefix=True,
                                                                          slot_checkpoints=True)


def test_flag_named_only_in_a_description_is_not_a_feature_when_parsed() -> None:
    """`Complements --slot-attach` in another option's description defines nothing."""
    text = PATCHED_HELP.replace("-sa,   --slot-attach, --no-slot-attach", "--keep N").replace(
        "(env: LLAMA_ARG_SLOT_ATTACH)", "Complements --slot-attach and -sa when a build has them")
    features = parse_help(text)
    assert features is not None
    assert not features.slot_attach and features.cache_prefix


def test_feature_found_when_only_its_env_variable_is_documented() -> None:
    text = PATCHED_HELP.replace("-sa,   --slot-attach, --no-slot-attach", "--attach-mode N")
    features = parse_help(text)
    assert features is not None and features.slot_attach


def test_markdown_table_and_colours_and_crlf_parse_like_plain_help() -> None:
    """The server README's table format, ANSI colours and Windows line ends change nothing."""
    table = "\r\n".join([
        "| Argument | Explanation |",
        "| -------- | ----------- |",
        "| `-c, --ctx-size N` | size of the prompt context |",
        "| `--slot-save-path PATH` | path to save slot kv cache (default: disabled) |",
        "| `\x1b[1m-sa, --slot-attach\x1b[0m` | attach to another slot's prefix "
        "(env: LLAMA_ARG_SLOT_ATTACH) |",
    ])
    features = parse_help(table)
    assert features is not None and features.slot_attach and not features.cache_prefix
    assert "-c" in spellings(table)


@pytest.mark.parametrize("text", [
    "", "sh: 1: /app/llama-server: not found\n",
    "/app/llama-server: error while loading shared libraries: libcuda.so.1: cannot open shared object file\n",
    "usage: something-else [--slot-attach]\n",
])
def test_text_that_is_not_llama_server_help_gives_unknown_not_unsupported(text: str) -> None:
    """Unknown (None) keeps `auto` off without claiming the build lacks the flags."""
    assert parse_help(text) is None
    assert summary(None).startswith("unknown")


def test_summary_names_what_the_build_accepts() -> None:
    assert summary(ServerFeatures(slot_attach=True)) == "slot_attach"
    assert summary(ServerFeatures()).startswith("none of")
