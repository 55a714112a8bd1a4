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


class HubServer:
    """A Hugging Face Hub stand-in on 127.0.0.1, in a thread: ``GET`` and ``HEAD`` of
    ``/ORG/NAME/resolve/REVISION/FILE`` serve ``root/ORG/NAME/FILE`` with the headers huggingface_hub reads
    (X-Repo-Commit, ETag, Content-Length); a missing file is a 404 with ``X-Error-Code: EntryNotFound``, as the
    Hub answers. Every request's method and path are recorded."""

    COMMIT = "0123456789abcdef0123456789abcdef01234567"

    def __init__(self, root):
        import hashlib

        self.root, self.requests = root, []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def answer(self, body):
                outer.requests.append((self.command, self.path))
                match = re.fullmatch(r"/([^/]+)/([^/]+)/resolve/([^/]+)/(.+)", self.path.split("?")[0])
                file = match and os.path.join(outer.root, match.group(1), match.group(2), match.group(4))
                if not file or not os.path.isfile(file):
                    self.send_response(404)
                    self.send_header("X-Error-Code", "EntryNotFound")
                    self.send_header("X-Error-Message", "Entry not found")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                with open(file, "rb") as f:
                    data = f.read()
                self.send_response(200)
                self.send_header("X-Repo-Commit", outer.COMMIT)
                self.send_header("ETag", '"' + hashlib.sha256(data).hexdigest() + '"')
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if body:
                    self.wfile.write(data)

            def do_GET(self):
                self.answer(True)

            def do_HEAD(self):
                self.answer(False)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
