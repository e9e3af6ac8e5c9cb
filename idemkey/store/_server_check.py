"""store.check() / acheck(), without I/O: which server settings can lose records.

The stores read the settings (``CONFIG GET``, or ``INFO`` where CONFIG is disabled) and hand
them here.
"""

from __future__ import annotations

from typing import Any, Final

from ..events import logger

__all__ = ["server_warnings"]

# The server settings that decide whether records can be lost.
_CONFIG_NAMES: Final = ("maxmemory-policy", "maxmemory", "save", "appendonly")


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _config_pairs(reply: Any) -> dict[str, str]:
    """A CONFIG GET reply (a dict, or a flat list from older clients) as str -> str."""
    if isinstance(reply, dict):
        return {_text(name): _text(value) for name, value in reply.items()}
    if isinstance(reply, list):
        return {
            _text(name): _text(value) for name, value in zip(reply[::2], reply[1::2], strict=False)
        }
    return {}


def _info_settings(memory: Any, persistence: Any) -> dict[str, str]:
    """The same settings from INFO, where CONFIG is disabled (managed Redis).

    INFO shows the eviction policy and whether AOF is on, but not the RDB save points: without
    AOF, persistence is unknown and nothing is said about it.
    """
    settings: dict[str, str] = {}
    if isinstance(memory, dict) and "maxmemory_policy" in memory:
        settings["maxmemory-policy"] = _text(memory["maxmemory_policy"])
        settings["maxmemory"] = _text(memory.get("maxmemory", ""))
    if isinstance(persistence, dict) and str(persistence.get("aof_enabled")) == "1":
        settings["appendonly"], settings["save"] = "yes", ""
    return settings


def server_warnings(settings: dict[str, str]) -> list[str]:
    """What can lose records on a server with these settings (``CONFIG GET`` names)."""
    from .diagnostics import check_persistence, eviction_warning

    warnings = []
    if "maxmemory-policy" in settings:
        warning = eviction_warning(settings["maxmemory-policy"], settings.get("maxmemory"))
        if warning is not None:
            warnings.append(warning)
    if "save" in settings and "appendonly" in settings:
        persistence = check_persistence(settings["save"], settings["appendonly"])
        if persistence.verdict != "OK":
            warnings.append(persistence.detail)
    return warnings


def _report(labelled: list[tuple[str, list[str]]]) -> list[str]:
    """Log each warning once and return them, each prefixed with its node's name (a cluster)."""
    warnings = [
        f"{label}: {text}" if label else text for label, texts in labelled for text in texts
    ]
    for warning in warnings:
        logger.warning("idemkey store check: %s", warning)
    return warnings
