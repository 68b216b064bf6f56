"""A lean keep-alive HTTP/1.1 client for the load benchmark: one asyncio stream per client, requests written
as bytes, the response read by Content-Length (or chunked). It costs tens of microseconds per request where
httpx costs about half a millisecond, so what the benchmark calls "client latency" is the server's time."""
from __future__ import annotations

import asyncio
import socket
from urllib.parse import urlparse


class HTTPError(Exception):
    """The connection broke or the response could not be read."""


class KeepAliveClient:
    def __init__(self, url: str):
        u = urlparse(url)
        self.host, self.port, self.prefix = u.hostname or "127.0.0.1", u.port or 80, u.path.rstrip("/")
        self._r: asyncio.StreamReader | None = None
        self._w: asyncio.StreamWriter | None = None

    async def _connect(self) -> None:
        self._r, self._w = await asyncio.open_connection(self.host, self.port)
        self._w.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    async def post(self, path: str, body: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
        if self._w is None:
            await self._connect()
        head = (f"POST {self.prefix}{path} HTTP/1.1\r\nHost: {self.host}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        try:
            self._w.write(head + body)
            raw = await self._r.readuntil(b"\r\n\r\n")
            lines = raw.split(b"\r\n")
            status = int(lines[0].split()[1])
            headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(b":") for ln in lines[1:]) if k}
            if b"content-length" in headers:
                data = await self._r.readexactly(int(headers[b"content-length"]))
            elif b"chunked" in headers.get(b"transfer-encoding", b"").lower():
                data = await self._read_chunked()
            else:
                data = await self._r.read()
                self.close()
            if headers.get(b"connection", b"").lower() == b"close":
                self.close()
            return status, headers, data
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, IndexError) as e:
            self.close()
            raise HTTPError(f"{type(e).__name__}: {e}") from None

    async def _read_chunked(self) -> bytes:
        parts = []
        while True:
            size = int((await self._r.readuntil(b"\r\n")).strip().split(b";")[0], 16)
            chunk = await self._r.readexactly(size + 2)
            if size == 0:
                return b"".join(parts)
            parts.append(chunk[:-2])

    def close(self) -> None:
        if self._w is not None:
            self._w.close()
        self._r = self._w = None
