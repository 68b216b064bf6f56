"""A free loopback port for a server that a run starts (the benches' and tests' Serve proxies, HAProxy)."""
from __future__ import annotations

import random
import socket
from pathlib import Path

# Above Ray's worker ports (10002-19999), below Serve's direct-ingress replica ports (30000 up; 31000 up in the
# HAProxy scenario) and Linux's ephemeral range (32768-60999 unless the host lowers it)
PORTS = (20000, 30000)


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """Not one the kernel hands out for port 0: that range is the ephemeral one, where any process's outgoing
    connection (Ray's start-up opens hundreds) can take the port before the server binds it: Serve's proxy then
    fails with "Failed to bind to address", HAProxy with "Address already in use"."""
    hi = min(PORTS[1], _ephemeral_low())
    for port in random.Random().sample(range(PORTS[0], hi), min(200, max(0, hi - PORTS[0]))):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # (a host whose ephemeral range starts below 20000, or every try taken)
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
