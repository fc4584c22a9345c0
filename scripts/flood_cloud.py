#!/usr/bin/env python3
"""A malicious cloud for measuring the device: answers every request with the shallow JSON
document {"data":[{},{},...]} of --mib MiB (a 200 with a Content-Length, or --chunked).

  python3 scripts/flood_cloud.py --port 18080 --mib 60 &
  /usr/bin/time -v build/tandem run -m MODEL --cloud http://127.0.0.1:18080 --cloud-api openai \\
      --mode route --policy always -p "The quick brown fox" -n 8 --temp 0 2>&1 | grep Maximum
"""
import argparse
import http.server
import socketserver

PIECE = b"{}," * 21845


class Flood(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        head, tail = b'{"data":[', b"{}]}"
        repeats = (self.server.bytes - len(head) - len(tail)) // 3
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if self.server.chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(len(head) + 3 * repeats + len(tail)))
        self.end_headers()
        try:
            self.write(head)
            while repeats > 0:
                n = min(repeats, len(PIECE) // 3)
                self.write(PIECE[: 3 * n])
                repeats -= n
            self.write(tail)
            if self.server.chunked:
                self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def write(self, data):
        if self.server.chunked:
            self.wfile.write(b"%x\r\n" % len(data) + data + b"\r\n")
        else:
            self.wfile.write(data)

    do_GET = do_POST = do_DELETE = answer

    def log_message(self, *args):
        pass


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=18080)
    p.add_argument("--mib", type=float, default=60)
    p.add_argument("--chunked", action="store_true")
    a = p.parse_args()
    server = Server((a.host, a.port), Flood)
    server.bytes = int(a.mib * (1 << 20))
    server.chunked = a.chunked
    server.serve_forever()


if __name__ == "__main__":
    main()
