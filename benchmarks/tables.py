"""The report's tables that other entry points print too (record_cost, the HTTP rows)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["added_table", "format_server_time", "memory_table"]


def _us(ns: float) -> str:
    return f"{ns / 1000:.1f}" if ns < 100_000 else f"{ns / 1000:.0f}"


def _x(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}x"


def added_table(
    cases: Mapping[str, Mapping[str, Any]], added: Sequence[tuple[str, Mapping[str, Any]]]
) -> list[str]:
    """The HTTP adapters' table: what each adds to the app alone, x its floor."""
    lines = [
        "",
        "HTTP adapters: latency idemkey adds to the same app (p50). Its floor: in process, the",
        "bare floor of this process; under a server, the same app under the same server doing",
        "the floor's Redis work (the `.floor.*` rows), where a Redis round trip costs what",
        "idemkey's does. Old: x the bare floor for every row, the column this table had before",
        "the in-server floors (kept for one release).",
        "",
        "| case | app alone us | with idemkey us | added us | floor added us | added x floor "
        "| old: added x bare floor |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, c in added:
        base = cases[c["baseline"]]
        if c.get("group") == "http-floor":
            floor_us, ratio = "", ""
        elif c.get("server_floor"):
            floor_us = _us(c["floor_added_ns"]) if "floor_added_ns" in c else ""
            ratio = _x(c.get("added_x_server_floor"))
        else:
            floor = cases.get(c["floor"] or "")
            floor_us, ratio = (_us(floor["p50"]) if floor else ""), _x(c.get("added_x_floor"))
        lines.append(
            f"| {name} | {_us(base['p50'])} | {_us(c['p50'])} | {_us(c['added_ns'])} | "
            f"{floor_us} | {ratio} | {_x(c.get('added_x_floor'))} |"
        )
    return lines


def format_server_time(row: dict[str, Any]) -> list[str]:
    """The report's table for :func:`server_time`'s result."""
    return [
        f"Redis server time per call (INFO commandstats evalsha usec, median of {row['slices']}"
        f" slices of {row['calls_per_slice']}, {row['response_bytes']} B response)",
        "",
        "| call | idemkey us | floor us | x floor |",
        "|---|---:|---:|---:|",
        f"| first call (claim + complete) | {row['first_usec']:.1f} | "
        f"{row['floor_first_usec']:.1f} | {row['first_x_floor']:.2f}x |",
        f"| replay (claim) | {row['replay_usec']:.1f} | {row['floor_replay_usec']:.1f} | "
        f"{row['replay_x_floor']:.2f}x |",
    ]


def memory_table(memory: Sequence[Mapping[str, Any]]) -> list[str]:
    """The report's memory table: each record beside the plain-string floor of its bytes."""
    lines = ["", "Memory per completed record (MEMORY USAGE SAMPLES 0, bytes; floor: a plain",
             "string holding the same stored bytes under a name as long)", ""]  # fmt: skip
    lines.append("| result size | guard record | string floor | HTTP record | string floor |")
    lines.append("|---:|---:|---:|---:|---:|")
    for row in memory:
        lines.append(
            f"| {row['size']} | {row['guard_record_bytes']} | {row.get('guard_floor_bytes', '')} | "
            f"{row['http_record_bytes']} | {row.get('http_floor_bytes', '')} |"
        )
    return lines
