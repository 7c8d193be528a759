"""A real local HTTP endpoint for tests that scrape ``/metrics``."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def serve_text(body: Callable[[str], bytes]) -> Iterator[str]:
    """Serve ``body(path)`` for every GET on 127.0.0.1 (a free port); yields the base URL."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            data = body(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
