#!/usr/bin/env python3
"""A small S3 server that lies, for the hostile-input tests (issue 40).

  hostile_s3.py DIR SCENARIO      prints "PORT" once it listens on 127.0.0.1

It serves the files of DIR as the objects of bucket "b" under prefix "ck/"
(path-style, no signature check) and answers honestly, except where
SCENARIO says otherwise:

  honest                 no lie (the control)
  content-range-wraps    a range GET from byte B > 0 gets 206 "Content-Range:
                         bytes B-0/1" and Content-Length 2^64 - B + 1 (the
                         wraparound of the issue), then an endless body
  content-length-lies    206 with the right Content-Range but a Content-Length
                         one byte longer than the range, then that many bytes
  listing-repeats-token  every listing page is "truncated" with the same token
  listing-endless        every listing page is "truncated" with a fresh token
  listing-outside-prefix the listing holds a key outside the prefix asked for
  listing-too-many-keys  a listing page with more keys than max-keys
  listing-huge-key       a key of 100,000 bytes

Standard library only.
"""
import os
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse
from xml.sax.saxutils import escape

ROOT, SCENARIO = sys.argv[1], sys.argv[2]
BUCKET, PREFIX = "b", "ck/"
_pages = [0]
_lock = threading.Lock()


def objects():
    return sorted(f for f in os.listdir(ROOT) if os.path.isfile(os.path.join(ROOT, f)))


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send(self, status, body=b"", headers=()):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        if not any(k.lower() == "content-length" for k, _ in headers):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)

    def listing(self, q):
        prefix = q.get("prefix", [""])[0]
        max_keys = int(q.get("max-keys", ["1000"])[0])
        keys = [(PREFIX + f, os.path.getsize(os.path.join(ROOT, f))) for f in objects() if (PREFIX + f).startswith(prefix)]
        truncated, token = "false", ""
        if SCENARIO == "listing-outside-prefix":
            keys.append(("elsewhere/model.safetensors", 8))
        elif SCENARIO == "listing-too-many-keys":
            keys += [(f"{PREFIX}extra-{i}", 1) for i in range(max_keys + 1)]
        elif SCENARIO == "listing-huge-key":
            keys.append((PREFIX + "k" * 100_000, 1))
        elif SCENARIO == "listing-repeats-token":
            truncated, token = "true", "again"
        elif SCENARIO == "listing-endless":
            with _lock:
                _pages[0] += 1
                truncated, token = "true", f"page-{_pages[0]}"
        contents = "".join(f"<Contents><Key>{escape(k)}</Key><Size>{s}</Size><ETag>\"e{s}\"</ETag></Contents>"
                           for k, s in keys)
        xml = (f'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><Name>{BUCKET}</Name>'
               f"<Prefix>{escape(prefix)}</Prefix><KeyCount>{len(keys)}</KeyCount><MaxKeys>{max_keys}</MaxKeys>"
               f"<IsTruncated>{truncated}</IsTruncated>{contents}"
               + (f"<NextContinuationToken>{token}</NextContinuationToken>" if token else "")
               + "</ListBucketResult>")
        self.send(200, xml.encode(), [("Content-Type", "application/xml")])

    def object(self, key):
        if not key.startswith(PREFIX) or not os.path.isfile(os.path.join(ROOT, key[len(PREFIX):])):
            return self.send(404, b"<Error><Code>NoSuchKey</Code><Message>no such key</Message></Error>")
        path = os.path.join(ROOT, key[len(PREFIX):])
        size = os.path.getsize(path)
        etag = f'"e{size}"'
        if self.command == "HEAD":
            return self.send(200, headers=[("Content-Length", str(size)), ("ETag", etag)])
        m = re.match(r"bytes=(\d+)-(\d+)$", self.headers.get("Range", ""))
        if not m:
            with open(path, "rb") as f:
                return self.send(200, f.read(), [("ETag", etag)])
        first, last = int(m.group(1)), min(int(m.group(2)), size - 1)
        if first >= size:
            return self.send(416, headers=[("Content-Range", f"bytes */{size}")])
        if SCENARIO == "content-range-wraps" and first > 0:
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {first}-0/1")
            self.send_header("Content-Length", str(2**64 - first + 1))
            self.send_header("ETag", etag)
            self.end_headers()
            try:  # an endless body: whatever the client does with it, it must not write past its buffer
                for _ in range(64):
                    self.wfile.write(b"\xAA" * (1 << 20))
            except OSError:
                pass
            self.close_connection = True
            return
        with open(path, "rb") as f:
            f.seek(first)
            body = f.read(last - first + 1)
        length = len(body)
        if SCENARIO == "content-length-lies":
            body += b"\xBB"
            length += 1
        self.send(206, body, [("Content-Range", f"bytes {first}-{last}/{size}"), ("Content-Length", str(length)),
                              ("ETag", etag)])

    def do_GET(self):
        u = urlparse(self.path)
        parts = u.path.lstrip("/").split("/", 1)
        if parts[0] != BUCKET:
            return self.send(404, b"<Error><Code>NoSuchBucket</Code><Message>no</Message></Error>")
        q = parse_qs(u.query)
        if len(parts) == 1 or parts[1] == "":
            return self.listing(q)
        return self.object(parts[1])

    do_HEAD = do_GET


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
