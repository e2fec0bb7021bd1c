"""Ports: a free one to listen on, and whether one answers.

Callers: the dev control plane's processes (cozygpu.devcluster), the dev webhook server's address
(runtime.process.app), and the tests and benches that start operators.
"""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on at `host` now (the system's pick)."""
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def accepts(port: int) -> bool:
    """Whether something listens on the loopback port."""
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0
