"""A queue consumer over `wrpc-broker serve`'s WebSocket, with the `websockets` package
(PyPI, pinned in scripts/test.sh): a client nobody in this repository wrote the protocol
library of.

    queue_client.py URL TOKEN COUNT [hold]

Consumes until COUNT messages were acked. A body `retry` is retried after 100 ms on its first
attempt (acked on the second); a body `dead` is dead-lettered. Prints one JSON line: the acked
bodies in order, and the attempts seen per body. With `hold`, it takes one delivery, prints it
and closes the socket without settling it (the server must release it).
"""

import json
import sys

from websockets.sync.client import connect


def main():
    url, token, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    hold = len(sys.argv) > 4 and sys.argv[4] == "hold"
    headers = {"Authorization": f"Bearer {token}"}
    acked, attempts, settled = [], {}, []
    # Every frame read as it comes (no high-water mark): a client that stops reading would
    # not see the server's answer to its close frame until its close timeout.
    with connect(url, additional_headers=headers, open_timeout=10, max_queue=None) as ws:
        while len(acked) < count:
            frame = json.loads(ws.recv(timeout=20))
            if frame["type"] == "settled":
                settled.append(frame["outcome"])
                continue
            if frame["type"] == "error":
                raise SystemExit(f"error frame: {frame}")
            body, tag = frame["body"], frame["tag"]
            attempts.setdefault(body, []).append(frame["attempt"])
            if hold:
                print(json.dumps({"held": body, "attempt": frame["attempt"]}), flush=True)
                return
            if body == "retry" and frame["attempt"] == 1:
                ws.send(json.dumps({"type": "retry", "tag": tag, "delay_ms": 100}))
            elif body == "dead":
                ws.send(json.dumps({"type": "dead_letter", "tag": tag, "reason": "poison"}))
                count -= 1
            else:
                ws.send(json.dumps({"type": "ack", "tag": tag}))
                acked.append(body)
    print(json.dumps({"acked": acked, "attempts": attempts, "settled": settled}), flush=True)


if __name__ == "__main__":
    main()
