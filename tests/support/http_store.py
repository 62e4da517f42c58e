"""A tiny object store that is not S3, for the HTTP room's client tests
(tests/source/test_http_client.cpp): objects by path, bearer-token auth, Range
GETs (206 with Content-Range, an ETag), JSON error bodies, and two faults:
/flaky answers 503 to its first GET, /cut sends half its first answer's body
and closes. Every request is logged as one JSON line to argv[1]. Prints its
port, then serves until stdin closes."""
import http.server
import json
import sys
import threading

LOG = sys.argv[1]
TOKEN = "Bearer test-token"
OBJ = bytes((i * 7 + 3) % 251 for i in range(300_000))
seen = set()
lock = threading.Lock()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def error(self, status, code):
        body = json.dumps({"error": code}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        rng = self.headers.get("Range", "")
        with lock, open(LOG, "a") as f:
            f.write(json.dumps({"path": self.path, "range": rng, "auth": self.headers.get("Authorization", "")}) + "\n")
            first = self.path not in seen
            seen.add(self.path)
        if self.headers.get("Authorization") != TOKEN:
            return self.error(401, "unauthorized")
        if self.path not in ("/obj", "/flaky", "/cut"):
            return self.error(404, "no-such-object")
        if self.path == "/flaky" and first:
            return self.error(503, "busy")
        a, b = 0, len(OBJ) - 1
        if rng.startswith("bytes="):
            lo, hi = rng[6:].split("-")
            a, b = int(lo), min(int(hi), len(OBJ) - 1)
        body = OBJ[a:b + 1]
        self.send_response(206 if rng else 200)
        self.send_header("ETag", '"v1"')
        self.send_header("Content-Range", f"bytes {a}-{b}/{len(OBJ)}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.path == "/cut" and first:
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(body)


srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
srv.daemon_threads = True
threading.Thread(target=srv.serve_forever, daemon=True).start()
print(srv.server_address[1], flush=True)
sys.stdin.read()
srv.shutdown()
