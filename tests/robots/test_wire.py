"""The sim arm's command frames (`robots.wire.send_frame` / `FrameReader`) over a real TCP connection
on 127.0.0.1: frames split across reads, several in one read, an oversized frame, the peer closing."""
from __future__ import annotations

import socket
import time

import pytest

from robots.wire import FRAME_HEADER, FrameReader, send_frame


@pytest.fixture
def link():
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    conn, _ = server.accept()
    server.close()
    yield client, FrameReader(conn, max_bytes=1024)
    client.close()
    conn.close()


def read_until(reader: FrameReader, count: int, timeout_s: float = 2.0) -> list[bytes]:
    frames, deadline = [], time.monotonic() + timeout_s
    while len(frames) < count and not reader.closed and time.monotonic() < deadline:
        frames += reader.read()
        time.sleep(0.001)
    return frames


def test_frames_arrive_whole_and_in_order(link):
    client, reader = link
    assert reader.read() == []   # never blocks on an empty socket
    for i in range(50):
        send_frame(client, f"cmd {i}".encode() * (i % 7 + 1))
    frames = read_until(reader, 50)
    assert frames == [f"cmd {i}".encode() * (i % 7 + 1) for i in range(50)]


def test_a_frame_split_across_reads_waits_for_its_tail(link):
    client, reader = link
    raw = FRAME_HEADER.pack(10) + b"0123456789"
    client.sendall(raw[:7])
    time.sleep(0.02)
    assert reader.read() == [] and not reader.closed
    client.sendall(raw[7:])
    assert read_until(reader, 1) == [b"0123456789"]


def test_an_oversized_frame_closes_the_link(link):
    client, reader = link
    send_frame(client, b"ok")
    client.sendall(FRAME_HEADER.pack(4096) + b"x" * 100)
    frames = read_until(reader, 2, timeout_s=0.5)
    assert frames == [b"ok"] and reader.closed
    assert reader.read() == []


def test_the_peer_closing_closes_the_reader(link):
    client, reader = link
    send_frame(client, b"last")
    client.close()
    assert read_until(reader, 2, timeout_s=0.5) == [b"last"]
    assert reader.closed
