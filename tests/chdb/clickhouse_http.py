"""ClickHouse's HTTP interface over chDB (PyPI `chdb`: the current ClickHouse release embedded),
as much of it as phaseprof's collector uses: a query POSTed as the body, or in the `query`
parameter with an INSERT's RowBinary rows as the body; `GET /ping`; errors as 500 with
ClickHouse's own message. Lets the tests run the collector's ClickHouse store against a current
ClickHouse where only Debian's 18.16 server is packaged.

    python3 clickhouse_http.py PORT DATA_DIR
"""
import http.server
import os
import re
import sys
import tempfile
import threading
import urllib.parse

from chdb import session

INSERT = re.compile(
    r"^\s*INSERT\s+INTO\s+([\w.`]+)\s*(?:\(([^)]*)\))?\s*FORMAT\s+RowBinary\s*$",
    re.IGNORECASE | re.DOTALL,
)


class Store:
    def __init__(self, path):
        self.path = path
        self.session = session.Session(path)
        # chDB runs one query at a time.
        self.lock = threading.Lock()

    def run(self, sql):
        with self.lock:
            return self.session.query(sql, "TabSeparated").bytes()

    def insert_rows(self, table, columns, rows):
        """An INSERT's RowBinary rows, read through a file with the table's own types."""
        described = self.run(f"DESCRIBE TABLE {table} FORMAT TabSeparated").decode()
        types = dict(line.split("\t")[:2] for line in described.splitlines() if line)
        names = [c.strip().strip("`") for c in columns.split(",")] if columns else list(types)
        structure = ", ".join(f"`{n}` {types[n]}" for n in names)
        with tempfile.NamedTemporaryFile(dir=self.path, suffix=".rowbinary", delete=False) as f:
            f.write(rows)
        try:
            cols = ", ".join(f"`{n}`" for n in names)
            return self.run(
                f"INSERT INTO {table} ({cols}) SELECT * FROM "
                f"file('{f.name}', 'RowBinary', '{structure}')"
            )
        finally:
            os.unlink(f.name)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, body):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        # As ClickHouse does: a client that asked to close is told the connection closes (else
        # it pools the connection and its next request meets a closed socket: a reset).
        if self.headers.get("Connection", "").lower() == "close":
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        if url.path == "/ping":
            return self.reply(200, b"Ok.\n")
        self.answer(urllib.parse.parse_qs(url.query).get("query", [""])[0], b"")

    def do_POST(self):
        url = urllib.parse.urlsplit(self.path)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        query = urllib.parse.parse_qs(url.query).get("query", [None])[0]
        self.answer(query, body)

    def answer(self, query, body):
        try:
            if query is None:
                out = self.server.store.run(body.decode())
            elif body and (m := INSERT.match(query)):
                out = self.server.store.insert_rows(m.group(1), m.group(2), body)
            else:
                out = self.server.store.run(query + "\n" + body.decode())
        except Exception as e:  # ClickHouse's own message, as its server answers
            return self.reply(500, str(e).encode())
        self.reply(200, out)


def main():
    port, path = int(sys.argv[1]), sys.argv[2]
    os.makedirs(path, exist_ok=True)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.store = Store(path)
    server.serve_forever()


if __name__ == "__main__":
    main()
