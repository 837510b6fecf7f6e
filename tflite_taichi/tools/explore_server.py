"""Model Explorer's UI on one model and our overlays, served on 127.0.0.1 to the user who started
it and to nobody else (`tflite-taichi inspect --explore`, tools/explore.py).

Model Explorer's own server (the flask app of the `ai-edge-model-explorer` package) answers any
local user, and any web page whose name is rebound to 127.0.0.1: it reads any file its user can
read (`/api/v1/read_text_file`), converts any path, stores uploads and, at exit, deletes the
directory of any model a command marked for deletion. This server serves the UI the package ships
and answers only the calls that UI makes to show the one model it was given:

- the Host header must name 127.0.0.1, localhost or [::1] at our port, so a page that rebinds its
  own name to 127.0.0.1 is refused;
- every request carries a random token: in the address printed and opened (`&token=`), then in
  the cookie the first answer to it sets (HttpOnly, SameSite=Strict, named after the port), so
  another local user or a page that guesses the port is refused;
- the API lists Model Explorer's TFLite adapter, converts our model (no other path) and hands out
  our overlays; reading files, uploads, converting another path and changing the config are
  refused.
"""
from __future__ import annotations

import hmac
import json
import os
import secrets
import socketserver
from typing import Callable, Optional, Sequence
from wsgiref import simple_server

TOKEN_PARAM = "token"
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
TFLITE_ADAPTER = "builtin_tflite_flatbuffer"    # Model Explorer's adapter that reads .tflite files
DEFAULT_PORTS = range(8080, 8100)               # Model Explorer's own choice: 8080 or the next free


def web_app_dir() -> str:
    """The built UI that Model Explorer's package ships."""
    import model_explorer
    return os.path.join(os.path.dirname(model_explorer.__file__), "web_app")


def tflite_adapter():
    """Model Explorer's extension manager, for its TFLite adapter's metadata and conversion."""
    from model_explorer.extension_manager import ExtensionManager
    manager = ExtensionManager([])
    manager.load_extensions()
    return manager


class ExploreApp:
    """The WSGI application: the checks, then the UI's files and the few API calls it makes."""

    def __init__(self, model_path: str, node_data: Sequence[str], token: str, port: int):
        self.model_path = os.path.realpath(model_path)
        self.node_data = list(node_data)            # JSON strings, by the UI's node_data_index
        self.token = token.encode()
        self.hosts = {f"{name}:{port}" for name in LOOPBACK_NAMES}
        self.cookie = f"tflite_taichi_explore_{port}"   # cookies are not kept apart by port
        self.extensions = tflite_adapter()
        self.static = web_app_dir()
        self.api: dict = {
            ("GET", "/check_health"): lambda request: self._text("model_explorer_ok"),
            ("GET", "/api/v1/check_new_version"): self._no_new_version,
            ("GET", "/api/v1/get_extensions"): self._adapters,
            ("GET", "/api/v1/send_command"): self._command_in_query,
            ("POST", "/apipost/v1/send_command"): self._command_in_body,
            ("GET", "/api/v1/load_node_data"): self._load_node_data,
            ("GET", "/apistream/server_director"): self._no_directives,
            # the UI says which model path it loads, for a file watch this server does not keep
            ("GET", "/api/v1/notify_user_provided_model_path"): lambda request: self._json({"status": "ok"}),
        }

    def __call__(self, environ, start_response):
        from werkzeug.wrappers import Request
        return self.respond(Request(environ))(environ, start_response)

    def respond(self, request):
        host = request.environ.get("HTTP_HOST", "")
        if host not in self.hosts:
            return self._refuse(f"Host {host!r} is not this server's loopback address")
        from_url = request.args.get(TOKEN_PARAM)
        if from_url is not None and self._is_token(from_url):
            response = self._route(request)
            response.set_cookie(self.cookie, self.token.decode(), httponly=True, samesite="Strict",
                                path="/")
            return response
        if self._is_token(request.cookies.get(self.cookie, "")):
            return self._route(request)
        return self._refuse("no valid token: open the address tflite-taichi printed")

    def _is_token(self, given: str) -> bool:
        return hmac.compare_digest(given.encode("utf-8", "replace"), self.token)

    def _route(self, request):
        handler: Optional[Callable] = self.api.get((request.method, request.path))
        if handler is not None:
            return handler(request)
        if request.path.startswith(("/api", "/check_health")):
            return self._refuse(f"{request.method} {request.path} is not served: this server "
                                "shows one model and reads no other file")
        return self._static(request)

    def _static(self, request):
        from werkzeug.exceptions import HTTPException
        from werkzeug.utils import send_from_directory
        if request.method not in ("GET", "HEAD"):
            return self._refuse(f"{request.method} {request.path} is not served")
        path = request.path.lstrip("/") or "index.html"
        try:                            # send_from_directory refuses a path outside the UI
            response = send_from_directory(self.static, path, request.environ)
        except HTTPException as e:
            return e.get_response(request.environ)
        response.headers["Cache-Control"] = "no-store"
        return response

    def _no_new_version(self, request):
        """Nothing to say (Model Explorer's own server asks PyPI; this one goes nowhere)."""
        return self._json({"version": "", "runningVersion": "", "releaseUrl": "", "desktopAppUrl": ""})

    def _adapters(self, request):
        return self._json([m for m in self.extensions.get_extensions_metadata()
                           if m.get("id") == TFLITE_ADAPTER])

    def _command_in_query(self, request):
        try:
            command = json.loads(request.args.get("json", "{}"))
        except ValueError:
            return self._refuse("send_command: its json is not JSON")
        return self._convert(command)

    def _command_in_body(self, request):
        command = request.get_json(silent=True)
        return self._convert(command)

    def _convert(self, command):
        """Model Explorer's TFLite adapter on our model: the one command the UI needs."""
        if not isinstance(command, dict) or command.get("cmdId") != "convert" \
                or command.get("extensionId") != TFLITE_ADAPTER:
            return self._refuse(f"send_command: only {TFLITE_ADAPTER}'s convert of the model served")
        path = command.get("modelPath")
        if not isinstance(path, str) or os.path.realpath(os.path.expanduser(path)) != self.model_path:
            return self._refuse(f"send_command: {path!r} is not the model served")
        settings = command.get("settings")
        try:
            return self._json(self.extensions.run_cmd({
                "extensionId": TFLITE_ADAPTER, "cmdId": "convert", "modelPath": self.model_path,
                "settings": settings if isinstance(settings, dict) else {},
                "deleteAfterConversion": False}))
        except Exception as e:      # the UI shows the adapter's error, as Model Explorer's server does
            return self._json({"error": f"{type(e).__name__}: {e}"})

    def _load_node_data(self, request):
        index = request.args.get("node_data_index", "")
        if not index.isdigit() or int(index) >= len(self.node_data):
            return self._refuse(f"load_node_data: no overlay {index!r}")
        return self._json({"content": self.node_data[int(index)]})

    def _no_directives(self, request):
        """The UI listens for "refresh the page"; none come. 204 tells its EventSource not to
        reconnect."""
        from werkzeug.wrappers import Response
        return Response(status=204)

    @staticmethod
    def _json(obj, status: int = 200):
        from werkzeug.wrappers import Response
        return Response(json.dumps(obj), status=status, mimetype="application/json",
                        headers={"Cache-Control": "no-store"})

    @staticmethod
    def _text(text: str):
        from werkzeug.wrappers import Response
        return Response(text, mimetype="text/plain")

    @classmethod
    def _refuse(cls, why: str):
        return cls._json({"error": why}, status=403)


class ExploreServer:
    """The app on 127.0.0.1, a thread per request: `url` (with the token) is what the user opens."""

    def __init__(self, model_path: str, node_data: Sequence[str], url_data: str,
                 port: Optional[int] = None):
        from tflite_taichi.errors import InputError
        self.token = secrets.token_urlsafe(32)
        try:
            self.server = _bind(port)
        except OSError as e:
            where = f"--port {port}: 127.0.0.1:{port}" if port is not None else "127.0.0.1"
            raise InputError(f"{where}: cannot serve Model Explorer there: {e.strerror or e}") from None
        self.port = self.server.server_address[1]
        self.server.set_app(ExploreApp(model_path, node_data, self.token, self.port))
        self.url = f"http://127.0.0.1:{self.port}/?data={url_data}&{TOKEN_PARAM}={self.token}"

    def serve_forever(self) -> None:
        self.server.serve_forever()

    def shutdown(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _ThreadingWSGIServer(socketserver.ThreadingMixIn, simple_server.WSGIServer):
    daemon_threads = True               # an open page's request does not hold the exit


class _QuietHandler(simple_server.WSGIRequestHandler):
    def log_message(self, format, *args):     # noqa: A002 (the base class's name)
        pass                                    # a line per request would bury the address


def _bind(port: Optional[int]) -> _ThreadingWSGIServer:
    """The server on 127.0.0.1 at `port`, or at 8080 or the next free (any free one if all of
    8080-8099 are taken), as Model Explorer's own server picks."""
    def on(candidate):
        return _ThreadingWSGIServer(("127.0.0.1", candidate), _QuietHandler)
    if port is not None:
        return on(port)
    for candidate in DEFAULT_PORTS:
        try:
            return on(candidate)
        except OSError:
            continue
    return on(0)
