#!/usr/bin/env python3
"""delayline: a userspace delay line between two network namespaces (this kernel has no netem).

Creates TUN device `dl0` in namespace A and `dl1` in namespace B (addresses ADDR_A/30 and
ADDR_B/30), and forwards every IP packet between them after DELAY milliseconds, optionally
limited to RATE (bits/s, token bucket, tail drop above QUEUE bytes). TCP across it sees a real
round trip of about 2 x DELAY, so windows, in-flight bytes and Little's law behave as on a long
link. Runs until SIGINT/SIGTERM or --seconds; removes nothing it did not create.

Origin: the delay line the issue tracker's reports were measured with (issue 20), copied
into the repository unchanged but for this paragraph; tests/tests/e2e_tcp_inflight.rs runs it.

usage: delayline.py NS_A NS_B ADDR_A ADDR_B --delay-ms 20 [--rate 200e6] [--queue 1000000] [--seconds N]
example: ip netns add a; ip netns add b; delayline.py a b 198.18.100.1 198.18.100.2 --delay-ms 10
"""
import argparse, fcntl, heapq, os, selectors, signal, struct, subprocess, sys, time

TUNSETIFF, IFF_TUN, IFF_NO_PI = 0x400454CA, 0x0001, 0x1000

def tun(name):
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd

def sh(*a):
    subprocess.run(a, check=True)

def main():
    p = argparse.ArgumentParser()
    p.add_argument("ns_a"); p.add_argument("ns_b"); p.add_argument("addr_a"); p.add_argument("addr_b")
    p.add_argument("--delay-ms", type=float, default=10.0)
    p.add_argument("--rate", type=float, default=0.0, help="bits/s per direction, 0 = unlimited")
    p.add_argument("--queue", type=int, default=1_000_000, help="bytes queued per direction before tail drop")
    p.add_argument("--seconds", type=float, default=0.0)
    p.add_argument("--names", default="dl0,dl1")
    a = p.parse_args()
    n0, n1 = a.names.split(",")
    fds = {n0: tun(n0), n1: tun(n1)}
    for name, ns, addr in ((n0, a.ns_a, a.addr_a), (n1, a.ns_b, a.addr_b)):
        sh("ip", "link", "set", name, "netns", ns)
        sh("ip", "-n", ns, "addr", "add", f"{addr}/30", "dev", name)
        sh("ip", "-n", ns, "link", "set", name, "up", "mtu", "1500")
    other = {n0: n1, n1: n0}
    delay = a.delay_ms / 1000.0
    heap = []                                  # (due, seq, out_name, packet)
    seq = 0
    queued = {n0: 0, n1: 0}                    # bytes waiting per output direction
    next_free = {n0: 0.0, n1: 0.0}             # serialisation clock per direction (rate limit)
    stats = {"forwarded": 0, "dropped": 0}
    stop = [False]
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    signal.signal(signal.SIGINT, lambda *_: stop.__setitem__(0, True))
    sel = selectors.DefaultSelector()
    for name, fd in fds.items():
        sel.register(fd, selectors.EVENT_READ, name)
    end = time.monotonic() + a.seconds if a.seconds > 0 else float("inf")
    while not stop[0] and time.monotonic() < end:
        timeout = max(0.0, heap[0][0] - time.monotonic()) if heap else 0.05
        for key, _ in sel.select(min(timeout, 0.05)):
            src = key.data
            while True:
                try:
                    pkt = os.read(fds[src], 65536)
                except BlockingIOError:
                    break
                out = other[src]
                now = time.monotonic()
                if queued[out] + len(pkt) > a.queue:
                    stats["dropped"] += 1
                    continue
                depart = now
                if a.rate > 0:
                    depart = max(now, next_free[out]) + len(pkt) * 8 / a.rate
                    next_free[out] = depart
                queued[out] += len(pkt)
                seq += 1
                heapq.heappush(heap, (depart + delay, seq, out, pkt))
        now = time.monotonic()
        while heap and heap[0][0] <= now:
            _, _, out, pkt = heapq.heappop(heap)
            queued[out] -= len(pkt)
            try:
                os.write(fds[out], pkt)
                stats["forwarded"] += 1
            except OSError:
                stats["dropped"] += 1
    print(f"delayline: {stats['forwarded']} packets forwarded, {stats['dropped']} dropped", file=sys.stderr)

if __name__ == "__main__":
    main()
