"""A stand-in for the Kubernetes API server in the launcher's tests, where no cluster runs (no
package index here ships kube-apiserver): the REST paths ``recpipe.launch.kubernetes`` calls
through Airflow's ``KubernetesHook`` and the official client, over HTTP on 127.0.0.1.

What it keeps of the API's contract: namespaced objects by ``(plural, namespace, name)``,
custom objects under ``/apis/<group>/<version>/namespaces/<ns>/<plural>``, ``batch/v1`` Jobs,
``networking.k8s.io/v1`` NetworkPolicies, pods and their logs under ``/api/v1``; a create
gives the object a ``uid`` and answers 409 when the name is taken, a read or delete of a
missing object 404, an unknown path 404. It does not collect owned objects (no garbage
collector runs): what a launcher leaves is left. A test moves a job by ``set_status``, adds
pods with ``add_pod`` and refuses a kind's creates with ``refuse``. Never imported by
production code.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

# /apis/<group>/<version>/namespaces/<ns>/<plural>[/<name>] and /api/v1/namespaces/<ns>/...
PATH = re.compile(r"^/apis?/(?:(?P<group>[^/]+)/)?(?P<version>v[^/]+)/namespaces/(?P<ns>[^/]+)/(?P<rest>.+)$")


class KubeApi:
    """The stand-in server; use as a context manager. ``objects`` maps ``(plural, namespace,
    name)`` to the stored object; ``calls`` lists ``(method, plural, name)`` in order."""

    def __init__(self):
        self.objects: dict[tuple[str, str, str], dict] = {}
        self.calls: list[tuple[str, str, str]] = []
        self.logs: dict[tuple[str, str], str] = {}
        self.refused: dict[str, int] = {}
        self.lock = threading.Lock()

    def __enter__(self) -> KubeApi:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # the test's output stays the test's
                pass

            def do_GET(self):
                api._answer(self, "GET")

            def do_POST(self):
                api._answer(self, "POST")

            def do_DELETE(self):
                api._answer(self, "DELETE")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def kubeconfig(self, path: Path) -> Path:
        """A kubeconfig file naming this server (no credentials)."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "stand-in", "cluster": {"server": self.url}}],
            "users": [{"name": "test", "user": {}}],
            "contexts": [{"name": "stand-in", "context": {"cluster": "stand-in", "user": "test"}}],
            "current-context": "stand-in",
        }
        path.write_text(json.dumps(config))
        return path

    def set_status(self, plural: str, namespace: str, name: str, status: dict) -> None:
        with self.lock:
            self.objects[(plural, namespace, name)]["status"] = status

    def add_pod(self, namespace: str, name: str, labels: dict[str, str], log: str) -> None:
        with self.lock:
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}}
            pod["metadata"]["labels"] = labels
            self.objects[("pods", namespace, name)] = pod
            self.logs[(namespace, name)] = log

    def refuse(self, plural: str, code: int = 403) -> None:
        """Answer every create of ``plural`` with ``code``."""
        self.refused[plural] = code

    def left(self) -> list[tuple[str, str, str]]:
        """The objects still stored, pods aside."""
        return sorted(k for k in self.objects if k[0] != "pods")

    def _answer(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        url = urlparse(handler.path)
        match = PATH.match(url.path)
        length = int(handler.headers.get("Content-Length") or 0)
        body = json.loads(handler.rfile.read(length) or b"null") if length else None
        if not match:
            return self._send(handler, 404, _status(404, f"no such path {url.path}"))
        ns, parts = match["ns"], match["rest"].split("/")
        plural, name = parts[0], parts[1] if len(parts) > 1 else None
        with self.lock:
            self.calls.append((method, plural, name or (body or {}).get("metadata", {}).get("name", "")))
            code, out = self._do(method, plural, ns, name, parts[2:], body, parse_qs(url.query))
        if isinstance(out, str):
            return self._send(handler, code, out.encode(), "text/plain")
        self._send(handler, code, json.dumps(out).encode())

    def _do(self, method, plural, ns, name, sub, body, query) -> tuple[int, dict | str]:
        key = (plural, ns, name)
        if method == "POST" and name is None:
            if plural in self.refused:
                return self.refused[plural], _status(self.refused[plural], f"{plural} refused")
            key = (plural, ns, body["metadata"]["name"])
            if key in self.objects:
                return 409, _status(409, f"{plural} {key[2]} already exists")
            stored = {**body, "metadata": {**body["metadata"], "uid": str(uuid.uuid4())}}
            self.objects[key] = stored
            return 201, stored
        if method == "GET" and name is None:  # a list, by label selector
            wanted = dict(p.split("=", 1) for p in query.get("labelSelector", [""])[0].split(",") if p)
            items = [
                o for (p, n, _), o in self.objects.items()
                if p == plural and n == ns and wanted.items() <= o["metadata"].get("labels", {}).items()
            ]  # fmt: skip
            return 200, {"apiVersion": "v1", "kind": "List", "metadata": {}, "items": items}
        if key not in self.objects:
            return 404, _status(404, f"{plural} {name} not found")
        if method == "GET":
            return (200, self.logs.get((ns, name), "")) if sub == ["log"] else (200, self.objects[key])
        if method == "DELETE":
            return 200, self.objects.pop(key)
        return 405, _status(405, f"{method} not allowed")

    @staticmethod
    def _send(handler, code: int, data: bytes, kind: str = "application/json") -> None:
        handler.send_response(code)
        handler.send_header("Content-Type", kind)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)


def _status(code: int, message: str) -> dict:
    reason = {404: "NotFound", 409: "AlreadyExists", 403: "Forbidden"}.get(code, "Unknown")
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
