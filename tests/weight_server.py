"""A real HTTP server on 127.0.0.1, in a thread, that stands in for the checkpoint hosts in download tests.

It serves a folder, honours ``Range: bytes=N-`` (206 with Content-Range) unless told not to, and can cut the
connection mid-file: ``cut[path] = n`` makes the next response to ``path`` announce the whole length, send its
first ``n`` bytes and close. Every request's path and Range header are recorded.
"""

import http.server
import os
import re
import threading


class WeightServer:
    def __init__(self, root, ranges=True):
        self.root, self.ranges, self.cut, self.requests = root, ranges, {}, []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                outer.requests.append((self.path, self.headers.get("Range")))
                outer.answer(self)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def answer(self, handler):
        file = os.path.join(self.root, *handler.path.lstrip("/").split("/"))
        if not os.path.isfile(file):
            handler.send_error(404, "Not Found")
            return
        with open(file, "rb") as f:
            data = f.read()
        start = 0
        match = re.fullmatch(r"bytes=(\d+)-", handler.headers.get("Range") or "")
        if match and self.ranges:
            start = int(match.group(1))
            if start >= len(data):
                handler.send_error(416, "Range Not Satisfiable")
                return
            handler.send_response(206)
            handler.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            handler.send_response(200)
        handler.send_header("Content-Length", str(len(data) - start))
        handler.end_headers()
        cut = self.cut.pop(handler.path, None)
        handler.wfile.write(data[start:start + cut] if cut is not None else data[start:])
        if cut is not None:
            handler.wfile.flush()
            handler.close_connection = True

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
