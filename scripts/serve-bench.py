"""Figures for `wrpc-broker serve` over HTTP on loopback: log append (one at a time, and from
several client threads) and SSE reads (catch-up throughput, live append→event latency).

    python3 scripts/serve-bench.py BASE_URL TOKEN [seconds]

The client is plain Python (http.client, keep-alive); it costs its share, so read the figures
beside `wrpc-broker bench` from the same run, not as the gateway's ceiling.
"""

import http.client
import json
import sys
import threading
import time
import uuid
from urllib.parse import urlparse


def connect(base):
    url = urlparse(base)
    return http.client.HTTPConnection(url.hostname, url.port, timeout=30)


def append(conn, token, topic, value=b"x" * 100):
    conn.request("POST", f"/v1/log/{topic}", body=value, headers={"Authorization": f"Bearer {token}"})
    response = conn.getresponse()
    body = response.read()
    assert response.status == 201, (response.status, body)
    return json.loads(body)["id"]


def quantile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * (len(values) - 1)))] if values else float("nan")


def row(name, count, elapsed, latencies, unit):
    p50 = quantile(latencies, 0.5) * 1e6 if latencies else float("nan")
    p99 = quantile(latencies, 0.99) * 1e6 if latencies else float("nan")
    print(f"| {name:<40} | {count / elapsed:>10.0f} {unit}/s | {p50:>9.1f} | {p99:>9.1f} |")


def appends(base, token, seconds, threads):
    topic = f"bench-{uuid.uuid4().hex}"
    latencies, counts = [], []
    deadline = time.perf_counter() + seconds

    def work():
        conn, mine = connect(base), []
        while time.perf_counter() < deadline:
            t = time.perf_counter()
            append(conn, token, topic)
            mine.append(time.perf_counter() - t)
        latencies.extend(mine)
        counts.append(len(mine))

    started = time.perf_counter()
    workers = [threading.Thread(target=work) for _ in range(threads)]
    [w.start() for w in workers]
    [w.join() for w in workers]
    row(f"log append over HTTP, {threads} client(s)", sum(counts), time.perf_counter() - started, latencies, "ops")


def sse_events(response):
    """Yield (id, data) of each event of an SSE response."""
    event_id, data = None, None
    while True:
        line = response.fp.readline()
        if not line:
            return
        line = line.decode().rstrip("\n")
        if line.startswith("id:"):
            event_id = line[3:].strip()
        elif line.startswith("data:"):
            data = line[5:].strip()
        elif line == "" and data is not None:
            yield event_id, data
            event_id, data = None, None


def read(base, token, topic, headers=None):
    conn = connect(base)
    conn.request("GET", f"/v1/log/{topic}", headers={"Authorization": f"Bearer {token}", **(headers or {})})
    response = conn.getresponse()
    assert response.status == 200, response.status
    return conn, response


def catch_up(base, token, entries=10_000):
    topic, conn = f"bench-{uuid.uuid4().hex}", connect(base)
    for _ in range(entries):
        append(conn, token, topic)
    started = time.perf_counter()
    _, response = read(base, token, topic, {})
    for n, _ in enumerate(sse_events(response), 1):
        if n == entries:
            break
    row(f"log read over SSE, catch-up {entries}", entries, time.perf_counter() - started, [], "entries")


def live(base, token, seconds):
    topic, conn = f"bench-{uuid.uuid4().hex}", connect(base)
    _, response = read(base, token, topic, {})
    time.sleep(0.2)
    # A read from `earliest` of an empty topic waits live; time append → event.
    events = sse_events(response)
    latencies, deadline = [], time.perf_counter() + seconds
    started = time.perf_counter()
    while time.perf_counter() < deadline:
        t = time.perf_counter()
        append(conn, token, topic)
        next(events)
        latencies.append(time.perf_counter() - t)
    row("log read over SSE, live (append→event)", len(latencies), time.perf_counter() - started, latencies, "entries")


def main():
    base, token = sys.argv[1], sys.argv[2]
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 3.0
    print(f"| {'operation':<40} | {'throughput':>15} | {'p50 µs':>9} | {'p99 µs':>9} |")
    print(f"|{'-' * 42}|{'-' * 17}|{'-' * 11}|{'-' * 11}|")
    appends(base, token, seconds, 1)
    appends(base, token, seconds, 8)
    catch_up(base, token)
    live(base, token, seconds)


if __name__ == "__main__":
    main()
