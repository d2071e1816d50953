"""What a candidate's process tells a test while it runs: datagrams on a Unix socket the test
binds (the process may write no files, so a test's probe inside a candidate reports this way).

    with Messages(tmp_path / "probe.sock") as messages:
        ...                                  # the candidate runs and sends to that path
    messages.received                        # every datagram, in order, as text
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path


class Messages:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.received: list[str] = []
        self._done = threading.Event()
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._reader = threading.Thread(target=self._drain, daemon=True)

    def __enter__(self) -> "Messages":
        self._socket.bind(str(self.path))
        self._socket.settimeout(0.2)
        self._reader.start()  # (read as they come: a full queue would block the sender)
        return self

    def _drain(self) -> None:
        while not self._done.is_set():
            try:
                self.received.append(self._socket.recv(4096).decode())
            except TimeoutError:
                pass

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._reader.join()
        self._socket.setblocking(False)
        while True:  # what is still queued
            try:
                self.received.append(self._socket.recv(4096).decode())
            except BlockingIOError:
                break
        self._socket.close()
