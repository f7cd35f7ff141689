#!/usr/bin/python3
"""A TCP proxy that adds a fixed delay to every byte, in both directions.

    delay_proxy.py LISTEN_HOST:PORT TARGET_HOST:PORT DELAY_MS

Used by the network-namespace tests and bench/netns_bench.sh instead of netem (not in this
kernel): each connection accepted on LISTEN is forwarded to TARGET, and every chunk read from
either side is written to the other DELAY_MS milliseconds after it was read. Reading and
writing run on separate threads, so the delay is a latency, not a throughput limit: chunks in
flight are pipelined, in order. A half-close (EOF) is passed on after the same delay; an
error on either side closes both. Standard library only. Prints "listening on HOST:PORT ..." on
stdout once it accepts connections and "connection from HOST:PORT" on stderr for each
connection, then runs until killed (SIGTERM/SIGINT).
"""
import collections
import signal
import socket
import sys
import threading
import time


def parse(hostport):
    host, _, port = hostport.rpartition(":")
    return host, int(port)


class Pump:
    """Copies src -> dst with a delay, on a reader and a writer thread."""

    def __init__(self, src, dst, delay_s, on_close):
        self.src, self.dst, self.delay_s = src, dst, delay_s
        self.queue = collections.deque()  # (due time, bytes or None for EOF)
        self.cond = threading.Condition()
        self.on_close = on_close
        threading.Thread(target=self.read, daemon=True).start()
        threading.Thread(target=self.write, daemon=True).start()

    def read(self):
        try:
            while True:
                data = self.src.recv(1 << 16)
                with self.cond:
                    self.queue.append((time.monotonic() + self.delay_s, data or None))
                    self.cond.notify()
                if not data:
                    return
        except OSError:
            with self.cond:
                self.queue.append((0.0, "error"))
                self.cond.notify()

    def write(self):
        try:
            while True:
                with self.cond:
                    while not self.queue:
                        self.cond.wait()
                    due, data = self.queue.popleft()
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                if data == "error":
                    break
                if data is None:
                    self.dst.shutdown(socket.SHUT_WR)
                    return
                self.dst.sendall(data)
        except OSError:
            pass
        self.on_close()


def serve(conn, target, delay_s):
    try:
        up = socket.create_connection(target, timeout=10)
        up.settimeout(None)
    except OSError as e:
        print(f"delay_proxy: cannot reach {target[0]}:{target[1]}: {e}", file=sys.stderr)
        conn.close()
        return
    for s in (conn, up):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    closed = threading.Event()

    def close_both():
        if closed.is_set():
            return
        closed.set()
        for s in (conn, up):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    Pump(conn, up, delay_s, close_both)
    Pump(up, conn, delay_s, close_both)


def main():
    if len(sys.argv) != 4:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    listen, target, delay_s = parse(sys.argv[1]), parse(sys.argv[2]), float(sys.argv[3]) / 1e3
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(listen)
    srv.listen(64)
    print(f"listening on {listen[0]}:{listen[1]}, forwarding to {target[0]}:{target[1]} "
          f"with {delay_s * 1e3:g} ms each way", flush=True)
    while True:
        conn, peer = srv.accept()
        print(f"connection from {peer[0]}:{peer[1]}", file=sys.stderr, flush=True)
        threading.Thread(target=serve, args=(conn, target, delay_s), daemon=True).start()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(0)
