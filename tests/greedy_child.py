"""A greedy client of ``saria serve``: takes every session it can and keeps
them (issue 41: one client of the node's uid, 20,000 hellos, locked every
new engine out).

    python greedy_child.py ADDRESS LAYOUT_JSON SECONDS CONNECTIONS STOP_FILE [SECRET SERVER_KEY]

Over CONNECTIONS sockets of this one process it sends hellos as fast as the
server answers, and pings every session it got (so none expires), for
SECONDS. Then it prints ``GREEDY {"hellos": n, "sessions": n, "refused":
{code: n}}`` and goes on pinging (never a bye) until STOP_FILE exists.
"""

import json
import os
import sys
import time

import zmq

if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from saria.serve import auth
    from saria.serve import protocol as P

    address, layout, seconds, conns = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3]), \
        int(sys.argv[4])
    stop_file = sys.argv[5]
    secret, server_key = (sys.argv[6], sys.argv[7]) if len(sys.argv) > 7 else (None, None)
    ctx = zmq.Context()
    socks = []
    for _ in range(conns):
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        if secret:
            auth.curve_client(s, secret, server_key)
        s.connect(address)
        socks.append(s)
    poller = zmq.Poller()
    for s in socks:
        poller.register(s, zmq.POLLIN)
    hello = {"name": f"greedy-{os.getpid()}", "pid": os.getpid(), "layout": layout}
    rid = 0
    sessions: dict[zmq.Socket, list[str]] = {s: [] for s in socks}
    hellos, refused = 0, {}
    inflight = {s: 0 for s in socks}
    end = time.monotonic() + seconds
    next_ping = 0.0
    while time.monotonic() < end:
        for s in socks:
            while inflight[s] < 8:  # a few hellos in flight on each socket, always
                rid += 1
                s.send(P.pack({"v": P.VERSION, "id": rid, "op": "hello", "session": None,
                               "args": hello}))
                inflight[s] += 1
                hellos += 1
        if time.monotonic() >= next_ping:
            for s, sids in sessions.items():
                for sid in sids:
                    s.send(P.pack({"v": P.VERSION, "id": 0, "op": "ping", "session": sid,
                                   "args": {}}))
            next_ping = time.monotonic() + 0.3
        for s, _ in poller.poll(50):
            while True:
                try:
                    r = P.unpack(s.recv(zmq.NOBLOCK))
                except zmq.Again:
                    break
                if r.get("id") == 0:
                    continue  # a ping's reply
                inflight[s] -= 1
                if r.get("ok"):
                    sessions[s].append(r["result"]["session"])
                else:
                    refused[r.get("code")] = refused.get(r.get("code"), 0) + 1
    print("GREEDY " + json.dumps({"hellos": hellos, "refused": refused,
                                  "sessions": sum(map(len, sessions.values()))}), flush=True)
    # holds its sessions until killed: a greedy client does not say bye
    while not os.path.exists(stop_file):
        for s, sids in sessions.items():
            for sid in sids:
                s.send(P.pack({"v": P.VERSION, "id": 0, "op": "ping", "session": sid,
                               "args": {}}))
        time.sleep(0.3)
