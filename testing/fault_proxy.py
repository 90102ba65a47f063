"""A fault-injecting HTTP proxy between hoist and an S3 server (SeaweedFS),
on 127.0.0.1: each rank of a job talks to the store through a listener of
its own, and rules say which of its requests fail and how.

    python testing/fault_proxy.py --upstream 127.0.0.1:8333 \\
        --listen rank0 --listen rank1 ...

starts the proxy on free ports, prints "NAME=http://127.0.0.1:PORT" for
each listener and "control=http://127.0.0.1:PORT", then "ready", and runs
until its standard input closes (the test that started it ended) or it is
sent SIGTERM. From Python: `with FaultProxy(upstream, names) as proxy:
proxy.endpoint["rank1"]; proxy.set_rules([...])`.

A rule (a JSON object; PUT /rules on the control port replaces the list,
GET /stats returns each rule's count of faults injected):
    listener     "rank1", or "*" (default) for every listener
    ops          S3 operations it applies to: "PutObject", "UploadPart",
                 "CreateMultipartUpload", "CompleteMultipartUpload",
                 "GetObject", "HeadObject", "ListObjects", "DeleteObject",
                 "DeleteObjects", ... or "*" (default)
    key          a regular expression the object key must contain
    fault        "503" (S3's SlowDown), "reset" (the connection closed
                 with a TCP reset, no response), "truncate" (half the
                 response, then the connection closed) or "stall" (no
                 response for stall_s seconds, then the connection closed)
    probability  of each matching request (default 1)
    count        at most this many faults (default: no limit)
    stall_s      for "stall" (default 120)
The first rule that matches and fires decides; a request no rule fires on
is forwarded as it is. Faults are drawn from a seeded generator (--seed),
so a run is repeatable given the same order of requests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import socket
import struct
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

sys.path.insert(0, str(Path(__file__).parent))
from object_store_server import free_ports  # noqa: E402

# Each stream's buffer: whole parts move in a few reads, not 64 KiB ones.
_BUFFER = 16 << 20

_SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown'
              b'</Code><Message>Please reduce your request rate.</Message>'
              b'<RequestId>fault-proxy</RequestId></Error>')


def operation(method: str, target: str) -> str:
    """The S3 operation of a request, from its method and query."""
    parts = urlsplit(target)
    query = parse_qs(parts.query, keep_blank_values=True)
    path = parts.path.strip("/")
    has_key = "/" in path
    if method == "PUT":
        if "partNumber" in query:
            return "UploadPart"
        return "PutObject" if has_key else "CreateBucket"
    if method == "POST":
        if "uploads" in query:
            return "CreateMultipartUpload"
        if "uploadId" in query:
            return "CompleteMultipartUpload"
        if "delete" in query:
            return "DeleteObjects"
        return "Post"
    if method == "GET":
        return "GetObject" if has_key and not query.get("list-type") and \
            "prefix" not in query else "ListObjects"
    if method == "HEAD":
        return "HeadObject" if has_key else "HeadBucket"
    if method == "DELETE":
        return "AbortMultipartUpload" if "uploadId" in query else \
            "DeleteObject"
    return method


class Rules:
    """The rules in force and what each has injected; thread-safe enough
    for one event loop (only the loop touches them)."""

    def __init__(self, seed: int):
        self.rules: list[dict] = []
        self.fired: list[int] = []
        self.random = random.Random(seed)

    def replace(self, rules: list[dict]) -> None:
        for rule in rules:
            if rule.get("fault") not in ("503", "reset", "truncate", "stall"):
                raise ValueError(f"unknown fault in {rule}")
        self.rules, self.fired = rules, [0] * len(rules)

    def pick(self, listener: str, op: str, key: str) -> dict | None:
        for i, rule in enumerate(self.rules):
            if rule.get("listener", "*") not in ("*", listener):
                continue
            ops = rule.get("ops", "*")
            if ops != "*" and op not in ops:
                continue
            if "key" in rule and not re.search(rule["key"], key):
                continue
            if "count" in rule and self.fired[i] >= rule["count"]:
                continue
            if self.random.random() >= rule.get("probability", 1.0):
                continue
            self.fired[i] += 1
            return rule
        return None


async def _read_head(reader: asyncio.StreamReader) -> bytes | None:
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None


def _headers(head: bytes) -> tuple[str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    fields = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            fields[name.strip().lower()] = value.strip()
    return lines[0], fields


async def _read_body(reader, fields, *, until_close=False) -> bytes:
    """A message's body, as its headers frame it (raw: chunked stays
    chunked)."""
    if "chunked" in fields.get("transfer-encoding", "").lower():
        out = bytearray()
        while True:
            size_line = await reader.readuntil(b"\r\n")
            out += size_line
            size = int(size_line.split(b";")[0], 16)
            if size == 0:  # trailers, if any, then an empty line
                while True:
                    line = await reader.readuntil(b"\r\n")
                    out += line
                    if line == b"\r\n":
                        return bytes(out)
            out += await reader.readexactly(size + 2)
    if "content-length" in fields:
        return await reader.readexactly(int(fields["content-length"]))
    return await reader.read() if until_close else b""


def _reset(writer: asyncio.StreamWriter) -> None:
    """Closes the connection with a TCP reset (SO_LINGER 0)."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                        struct.pack("ii", 1, 0))
    writer.transport.abort()


class Proxy:
    def __init__(self, upstream: tuple[str, int], rules: Rules):
        self.upstream = upstream
        self.rules = rules

    async def serve(self, listener: str, reader, writer) -> None:
        up = None
        try:
            while True:
                head = await _read_head(reader)
                if head is None:
                    return
                request_line, fields = _headers(head)
                method, target, _ = request_line.split(" ", 2)
                if fields.get("expect", "").lower() == "100-continue":
                    writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                    await writer.drain()
                    head = re.sub(rb"(?im)^expect:[^\r\n]*\r\n", b"", head)
                body = await _read_body(reader, fields)
                op = operation(method, target)
                key = urlsplit(target).path
                rule = self.rules.pick(listener, op, key)
                fault = rule["fault"] if rule else None
                if fault == "503":
                    payload = b"" if method == "HEAD" else _SLOW_DOWN
                    writer.write(
                        b"HTTP/1.1 503 Slow Down\r\nContent-Type: "
                        b"application/xml\r\nContent-Length: %d\r\n"
                        b"x-amz-request-id: fault-proxy\r\n\r\n"
                        % len(_SLOW_DOWN) + payload)
                    await writer.drain()
                    continue
                if fault == "reset":
                    _reset(writer)
                    return
                if fault == "stall":
                    try:  # until the client gives up, or stall_s
                        await asyncio.wait_for(reader.read(),
                                               rule.get("stall_s", 120))
                    except asyncio.TimeoutError:
                        pass
                    _reset(writer)
                    return
                if up is None:
                    up = await asyncio.open_connection(*self.upstream,
                                                       limit=_BUFFER)
                up[1].write(head + body)
                await up[1].drain()
                response = await _read_head(up[0])
                if response is None:
                    _reset(writer)
                    return
                status_line, response_fields = _headers(response)
                status = int(status_line.split(" ")[1])
                no_body = method == "HEAD" or status in (204, 304) or \
                    100 <= status < 200
                closes = response_fields.get("connection", "").lower() == \
                    "close"
                response_body = b"" if no_body else await _read_body(
                    up[0], response_fields, until_close=closes)
                if fault == "truncate":
                    whole = response + response_body
                    cut = len(response) + len(response_body) // 2 \
                        if response_body else len(response) // 2
                    writer.write(whole[:cut])
                    await writer.drain()
                    _reset(writer)
                    return
                writer.write(response + response_body)
                await writer.drain()
                if closes:
                    writer.close()
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            if up is not None:
                up[1].close()
            if not writer.is_closing():
                writer.close()

    async def control(self, reader, writer) -> None:
        head = await _read_head(reader)
        if head is None:
            return
        request_line, fields = _headers(head)
        method, target, _ = request_line.split(" ", 2)
        body = await _read_body(reader, fields)
        status, answer = b"200 OK", b""
        try:
            if method == "PUT" and target == "/rules":
                self.rules.replace(json.loads(body or b"[]"))
            elif method == "GET" and target == "/stats":
                answer = json.dumps({"fired": self.rules.fired}).encode()
            else:
                status = b"404 Not Found"
        except (ValueError, TypeError) as error:
            status, answer = b"400 Bad Request", str(error).encode()
        writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Length: %d\r\n"
                     b"Connection: close\r\n\r\n" % len(answer) + answer)
        await writer.drain()
        writer.close()


async def _main(args) -> None:
    host, port = args.upstream.rsplit(":", 1)
    proxy = Proxy((host, int(port)), Rules(args.seed))
    ports = free_ports(len(args.listen) + 1)
    servers = []
    for name, p in zip(args.listen, ports):
        servers.append(await asyncio.start_server(
            lambda r, w, name=name: proxy.serve(name, r, w), "127.0.0.1", p,
            limit=_BUFFER))
        print(f"{name}=http://127.0.0.1:{p}")
    servers.append(await asyncio.start_server(
        proxy.control, "127.0.0.1", ports[-1]))
    print(f"control=http://127.0.0.1:{ports[-1]}")
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)  # until stdin closes
    for server in servers:
        server.close()


class FaultProxy:
    """The proxy as a process of its own, for a test: started with the
    listeners `names` in front of `upstream` ("http://127.0.0.1:PORT"),
    stopped on exit (its standard input closed)."""

    def __init__(self, upstream: str, names: list[str], seed: int = 1):
        self.upstream = upstream.split("://", 1)[-1].rstrip("/")
        self.names, self.seed = names, seed
        self.endpoint: dict[str, str] = {}
        self.proc = None

    def __enter__(self) -> "FaultProxy":
        argv = [sys.executable, __file__, "--upstream", self.upstream,
                "--seed", str(self.seed)]
        for name in self.names:
            argv += ["--listen", name]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        for line in self.proc.stdout:
            line = line.strip()
            if line == "ready":
                break
            name, url = line.split("=", 1)
            self.endpoint[name] = url
        else:
            raise RuntimeError("the fault proxy exited before it was ready")
        return self

    def __exit__(self, *exc) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def _control(self, method: str, path: str, body: bytes = b"") -> bytes:
        request = urllib.request.Request(
            self.endpoint["control"] + path, data=body or None,
            method=method)
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.read()

    def set_rules(self, rules: list[dict]) -> None:
        self._control("PUT", "/rules", json.dumps(rules).encode())

    def fired(self) -> list[int]:
        return json.loads(self._control("GET", "/stats"))["fired"]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True,
                        help="the S3 server, HOST:PORT")
    parser.add_argument("--listen", action="append", default=[],
                        help="a listener's name (one per rank)")
    parser.add_argument("--seed", type=int, default=1)
    asyncio.run(_main(parser.parse_args()))
