"""The judge's conversation with a candidate's process: length-prefixed JSON messages on a Unix
socket. What arrives from the candidate's side is data, never code: a message is parsed as JSON
(no pickle), bounded in size, and must be an object; a deadline bounds every wait.

    send(sock, {"op": "call", ...})
    reply = receive(sock, deadline)     # WireClosed, WireTimeout or WireGarbage when it is not a reply
"""

from __future__ import annotations

import json
import select
import socket
import struct
import time
from typing import Any

__all__ = ["MAX_MESSAGE", "WireClosed", "WireError", "WireGarbage", "WireTimeout", "receive", "send"]

MAX_MESSAGE = 16 << 20
_HEADER = struct.Struct("<I")


class WireError(Exception):
    """The conversation ended without a reply."""


class WireClosed(WireError):
    """The other side closed the socket (its process ended)."""


class WireTimeout(WireError):
    """No reply before the deadline."""


class WireGarbage(WireError):
    """What arrived is not a message: too large, not JSON, not an object."""


def send(sock: socket.socket, message: dict[str, Any]) -> None:
    data = json.dumps(message, default=float).encode()
    if len(data) > MAX_MESSAGE:
        raise WireGarbage(f"a message of {len(data)} bytes is over the limit of {MAX_MESSAGE}")
    try:
        sock.sendall(_HEADER.pack(len(data)) + data)
    except OSError as exc:
        raise WireClosed(f"the other side is gone ({exc})") from None


def _read(sock: socket.socket, n: int, deadline: float | None) -> bytes:
    data = bytearray()
    while len(data) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([sock], [], [], left)[0]:
                raise WireTimeout("no reply in time")
        try:
            chunk = sock.recv(min(n - len(data), 1 << 20))
        except OSError as exc:
            raise WireClosed(f"the other side is gone ({exc})") from None
        if not chunk:
            raise WireClosed("the other side closed the conversation")
        data.extend(chunk)
    return bytes(data)


def receive(sock: socket.socket, deadline: float | None = None) -> dict[str, Any]:
    """The next message, an object; `deadline` is a `time.monotonic()` time, None waits for ever."""
    (length,) = _HEADER.unpack(_read(sock, _HEADER.size, deadline))
    if length > MAX_MESSAGE:
        raise WireGarbage(f"a message of {length} bytes is over the limit of {MAX_MESSAGE}")
    body = _read(sock, length, deadline)
    try:
        message = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise WireGarbage(f"a message is not JSON ({exc})") from None
    if not isinstance(message, dict):
        raise WireGarbage("a message is not a JSON object")
    return message
