#!/usr/bin/python3
"""A small MLflow tracking server for the tests, and a helper to run it.

MLflow cannot be installed on the test machines, so this follows the part of
its REST API (mlflow/protos/service.proto, served by mlflow/server/handlers.py)
that distkernel and a rank's `mlflow.log_metric` / `log_param` / `set_tag` use:

  GET  /health                                     "OK"
  GET  /api/2.0/mlflow/experiments/get-by-name     ?experiment_name=
  GET  /api/2.0/mlflow/experiments/get             ?experiment_id=
  POST /api/2.0/mlflow/experiments/create          {name, artifact_location, tags}
  POST /api/2.0/mlflow/runs/create                 {experiment_id, user_id, run_name,
                                                    start_time, tags}
  GET  /api/2.0/mlflow/runs/get                    ?run_id= (or run_uuid=)
  POST /api/2.0/mlflow/runs/update                 {run_id, status, end_time, run_name}
  POST /api/2.0/mlflow/runs/log-batch              {run_id, metrics, params, tags}
  POST /api/2.0/mlflow/runs/log-metric             {run_id, key, value, timestamp, step}
  POST /api/2.0/mlflow/runs/log-parameter          {run_id, key, value}
  POST /api/2.0/mlflow/runs/set-tag                {run_id, key, value}
  PUT  /api/2.0/mlflow-artifacts/artifacts/PATH    the bytes of an artifact (the
                                                   server's artifact proxy), kept in
                                                   memory: GET /_test/artifacts lists
                                                   {PATH: size}

(each also under /ajax-api/2.0/mlflow/, as MLflow serves them). As MLflow does:
a wrong method is a 405 and an unknown path a 404, both plain text (Flask's);
API errors are JSON {"error_code", "message"}: INVALID_PARAMETER_VALUE (400) for
a missing or bad field, RESOURCE_DOES_NOT_EXIST (404), RESOURCE_ALREADY_EXISTS
(400); experiment ids are strings ("0" is the Default experiment), run ids 32
hex digits; a param, once logged, cannot change; log-batch takes at most 1000
metrics, 100 params and 100 tags.

For the tests it also records every request (method, path, query, headers with
lower-case names, body) and can be told, by command-line flag or at run time
through POST /_test/config, to:
  --token X / {"token": X}                 require "Authorization: Bearer X"
  --basic USER:PASS / {"username", "password"}  require basic auth
  --fail N / {"fail": N, "fail_status": 500}    answer 500 to the next N requests
  --delay S / {"delay": S}                 wait S seconds before every answer
  --race N / {"race": N}                   the next N get-by-name lookups of an
        absent experiment create it (as a concurrent client would) yet answer
        RESOURCE_DOES_NOT_EXIST, so the caller's create meets RESOURCE_ALREADY_EXISTS
  {"run_id": X} / {"experiment_id": X}      a hostile or broken server: runs created
        from now on get the id X, experiments created from now on the id X
Requests under /_test/ are never recorded, delayed, failed or checked:
  GET /_test/requests   the recorded requests, oldest first
  GET /_test/state      experiments, runs (with each run's status history), config
  POST /_test/config    change the knobs above (only those given)
  POST /_test/reset     forget the recorded requests (the store is kept)

Run: /usr/bin/python3 tests/mlflow_server.py --port 0  (prints the port, then serves
on 127.0.0.1 until SIGTERM/SIGINT). In Python: `with MlflowTestServer() as srv: ...`.
"""

import argparse
import base64
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PREFIXES = ("/api/2.0/mlflow/", "/ajax-api/2.0/mlflow/")
RUN_STATUSES = ("RUNNING", "SCHEDULED", "FINISHED", "FAILED", "KILLED")
MAX_PARAMS, MAX_TAGS, MAX_METRICS, MAX_ENTITIES = 100, 100, 1000, 1000


def now_ms():
    return int(time.time() * 1000)


class ApiError(Exception):
    def __init__(self, code, message, status=400):
        super().__init__(message)
        self.code, self.message, self.status = code, message, status


def invalid(message):
    return ApiError("INVALID_PARAMETER_VALUE", message, 400)


def missing(field):
    # MLflow's wording (mlflow/server/handlers.py: _assert_required).
    return invalid(f"Missing value for required parameter '{field}'. See the API docs for "
                   f"more information about request parameters.")


class Store:
    """Experiments and runs, in memory, behind one lock (the server is threaded)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.experiments = {}   # id -> dict
        self.runs = {}          # run_id -> {"info", "data", "status_history"}
        self.next_experiment = 1
        self._add_experiment("Default", "0")

    def _add_experiment(self, name, exp_id=None, tags=None, artifact_location=None):
        if exp_id is None:
            exp_id = str(self.next_experiment)
            self.next_experiment += 1
        t = now_ms()
        self.experiments[exp_id] = {
            "experiment_id": exp_id,
            "name": name,
            "artifact_location": artifact_location or f"mlflow-artifacts:/{exp_id}",
            "lifecycle_stage": "active",
            "last_update_time": t,
            "creation_time": t,
            "tags": list(tags or []),
        }
        return exp_id

    def by_name(self, name):
        for e in self.experiments.values():
            if e["name"] == name:
                return e
        return None

    def run(self, run_id):
        r = self.runs.get(run_id)
        if r is None:
            raise ApiError("RESOURCE_DOES_NOT_EXIST", f"Run with id={run_id} not found", 404)
        return r

    def public_run(self, r, history=False):
        """The run as runs/get answers it: data.metrics holds each metric's latest
        value (MLflow's rule: highest step, then timestamp, then value), unless
        HISTORY asks for every logged point."""
        metrics = list(r["data"]["metrics"])
        if not history:
            latest = {}
            for m in metrics:
                k = (m["step"], m["timestamp"], m["value"])
                if m["key"] not in latest or k >= latest[m["key"]][0]:
                    latest[m["key"]] = (k, m)
            metrics = [m for _, m in latest.values()]
        return {"info": dict(r["info"]),
                "data": {"metrics": metrics, "params": list(r["data"]["params"]),
                         "tags": list(r["data"]["tags"])},
                "inputs": {}}


class Config:
    def __init__(self, token=None, username=None, password=None, fail=0, fail_status=500,
                 delay=0.0, race=0):
        self.token, self.username, self.password = token, username, password
        self.fail, self.fail_status, self.delay, self.race = fail, fail_status, delay, race
        self.run_id, self.experiment_id = None, None

    def as_dict(self):
        return dict(vars(self))

    def update(self, d):
        for k in ("token", "username", "password", "fail", "fail_status", "delay", "race",
                  "run_id", "experiment_id"):
            if k in d:
                setattr(self, k, d[k])


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"   # keep-alive, as MLflow's servers do
    server_version = "mlflow-test-server/1"

    # -- plumbing ---------------------------------------------------------

    def setup(self):
        super().setup()
        # As gunicorn and uvicorn do: without it, a header write then a body
        # write meet the client's delayed ACK, 40 ms per answer.
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, fmt, *args):   # quiet: the tests read /_test/requests
        pass

    def do_GET(self):
        self.dispatch("GET")

    def do_POST(self):
        self.dispatch("POST")

    def do_PUT(self):
        self.dispatch("PUT")

    def do_DELETE(self):
        self.dispatch("DELETE")

    def do_PATCH(self):
        self.dispatch("PATCH")

    def send(self, status, body, ctype="application/json", extra=()):
        data = body if isinstance(body, bytes) else (
            json.dumps(body).encode() if ctype == "application/json" else body.encode())
        # Recorded before the answer leaves: a client that reads the record right
        # after its last answer must find that answer's status in it.
        entry = getattr(self, "entry", None)
        if entry is not None:
            entry["status"] = status
        try:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            for k, v in extra:
                self.send_header(k, v)
            # One write for head and body (end_headers() would flush the head alone).
            self._headers_buffer.append(b"\r\n")
            if self.command != "HEAD":
                self._headers_buffer.append(data)
            self.flush_headers()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True   # the client gave up (timeout): fine
        return status

    def dispatch(self, method):
        srv = self.server
        url = urllib.parse.urlsplit(self.path)
        self.entry = None
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length > 0 else b""
        if url.path.startswith("/_test/"):
            self.control(method, url.path, raw)
            return
        query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        entry = {
            "method": method,
            "path": url.path,
            "query": {k: v[0] if len(v) == 1 else v for k, v in query.items()},
            "headers": {k.lower(): v for k, v in self.headers.items()},
            "body": body,
            "time": time.time(),
            "status": None,
        }
        self.entry = entry
        with srv.store.lock:
            srv.recorded.append(entry)
            cfg = srv.config
            delay = float(cfg.delay or 0)
            fail = cfg.fail > 0 and url.path != "/health"
            if fail:
                cfg.fail -= 1
            fail_status = int(cfg.fail_status or 500)
        if delay > 0:
            time.sleep(delay)
        if fail:
            entry["status"] = self.send(fail_status, {"error_code": "INTERNAL_ERROR",
                                                      "message": "injected failure (--fail)"})
            return
        entry["status"] = self.answer(method, url.path, query, raw)

    def authorised(self):
        cfg = self.server.config
        if not cfg.token and not cfg.username:
            return True
        got = self.headers.get("Authorization") or ""
        if cfg.token and got == f"Bearer {cfg.token}":
            return True
        if cfg.username:
            pair = f"{cfg.username}:{cfg.password or ''}".encode()
            if got == "Basic " + base64.b64encode(pair).decode():
                return True
        return False

    def answer(self, method, path, query, raw):
        if path == "/health":
            if method != "GET":
                return self.method_not_allowed(["GET"])
            return self.send(200, "OK", "text/plain; charset=utf-8")
        if path.startswith(ARTIFACTS):
            if method != "PUT":
                return self.method_not_allowed(["PUT"])
            if not self.authorised():
                return self.send(401, {"error_code": "UNAUTHENTICATED",
                                       "message": "You are not authenticated."})
            with self.server.store.lock:
                self.server.artifacts[path[len(ARTIFACTS):]] = len(raw)
            return self.send(200, {})
        endpoint = None
        for prefix in PREFIXES:
            if path.startswith(prefix):
                endpoint = path[len(prefix):]
        route = ROUTES.get(endpoint) if endpoint is not None else None
        if route is None:
            return self.send(404, NOT_FOUND, "text/html; charset=utf-8")
        want, fn = route
        if method != want:
            return self.method_not_allowed([want])
        if not self.authorised():
            extra = [("WWW-Authenticate", 'Basic realm="mlflow"')] if self.server.config.username \
                else []
            return self.send(401, {"error_code": "UNAUTHENTICATED",
                                   "message": "You are not authenticated. Please see the "
                                              "documentation for details."}, extra=extra)
        if method == "GET":
            # MLflow's client sends GET parameters in the query string.
            args = {k: v[0] if len(v) == 1 else v for k, v in query.items()}
        else:
            try:
                args = json.loads(raw) if raw else {}
            except ValueError:
                args = None
            if not isinstance(args, dict):
                return self.send(400, {"error_code": "MALFORMED_REQUEST",
                                       "message": "Malformed request body: not a JSON object"})
        try:
            with self.server.store.lock:
                result = fn(self.server, args)
        except ApiError as e:
            return self.send(e.status, {"error_code": e.code, "message": e.message})
        return self.send(200, result)

    def method_not_allowed(self, allowed):
        return self.send(405, METHOD_NOT_ALLOWED, "text/html; charset=utf-8",
                         extra=[("Allow", ", ".join(allowed + ["OPTIONS"]))])

    def control(self, method, path, raw):
        srv = self.server
        with srv.store.lock:
            if path == "/_test/requests" and method == "GET":
                self.send(200, srv.recorded)
            elif path == "/_test/artifacts" and method == "GET":
                self.send(200, srv.artifacts)
            elif path == "/_test/state" and method == "GET":
                store = srv.store
                self.send(200, {
                    "experiments": list(store.experiments.values()),
                    "runs": [dict(store.public_run(r, history=True),
                                  status_history=list(r["status_history"]))
                             for r in store.runs.values()],
                    "config": srv.config.as_dict(),
                })
            elif path == "/_test/config" and method == "POST":
                try:
                    knobs = json.loads(raw or b"{}")
                    if not isinstance(knobs, dict):
                        raise ValueError("not an object")
                except ValueError as e:
                    self.send(400, {"error_code": "MALFORMED_REQUEST", "message": str(e)})
                    return
                srv.config.update(knobs)
                self.send(200, srv.config.as_dict())
            elif path == "/_test/reset" and method == "POST":
                srv.recorded.clear()
                self.send(200, {})
            else:
                self.send(404, {"error_code": "ENDPOINT_NOT_FOUND", "message": path})


NOT_FOUND = ("<!doctype html>\n<html lang=en>\n<title>404 Not Found</title>\n<h1>Not Found</h1>\n"
             "<p>The requested URL was not found on the server.</p>\n")
METHOD_NOT_ALLOWED = ("<!doctype html>\n<html lang=en>\n<title>405 Method Not Allowed</title>\n"
                      "<h1>Method Not Allowed</h1>\n<p>The method is not allowed for the "
                      "requested URL.</p>\n")


# -- the API --------------------------------------------------------------

def required(args, field):
    v = args.get(field)
    if v is None or v == "" or v == []:
        raise missing(field)
    return v


def as_int(args, field, default=None):
    v = args.get(field)
    if v is None:
        return default
    try:
        return int(v)
    except (TypeError, ValueError):
        raise invalid(f"Invalid value {v!r} for parameter '{field}' supplied: expected an "
                      f"integer")


def key_values(args, field):
    v = args.get(field) or []
    if not isinstance(v, list):
        raise invalid(f"Invalid value {v!r} for parameter '{field}': expected a list")
    for kv in v:
        if not isinstance(kv, dict) or not kv.get("key"):
            raise invalid(f"Invalid value {kv!r} in '{field}': every entry needs a 'key'")
        if "value" not in kv or kv["value"] is None:
            raise missing(f"{field}.value")
        if not isinstance(kv["value"], str):
            raise invalid(f"Invalid value {kv['value']!r} for '{field}' key '{kv['key']}': "
                          f"expected a string")
    return v


def experiment_or_404(store, exp_id):
    e = store.experiments.get(str(exp_id))
    if e is None:
        raise ApiError("RESOURCE_DOES_NOT_EXIST", f"No Experiment with id={exp_id} exists", 404)
    return e


def get_by_name(srv, args):
    name = required(args, "experiment_name")
    e = srv.store.by_name(name)
    if e is None:
        if srv.config.race > 0:
            srv.config.race -= 1
            srv.store._add_experiment(name)   # a concurrent client got there first
        raise ApiError("RESOURCE_DOES_NOT_EXIST", f"Could not find experiment with name "
                                                  f"'{name}'", 404)
    return {"experiment": e}


def get_experiment(srv, args):
    return {"experiment": experiment_or_404(srv.store, required(args, "experiment_id"))}


def create_experiment(srv, args):
    name = required(args, "name")
    if not isinstance(name, str):
        raise invalid("Invalid experiment name: expected a string")
    if srv.store.by_name(name) is not None:
        raise ApiError("RESOURCE_ALREADY_EXISTS",
                       f"Experiment '{name}' already exists.", 400)
    tags = key_values(args, "tags")
    return {"experiment_id": srv.store._add_experiment(name, srv.config.experiment_id, tags=tags,
                                                       artifact_location=args.get(
                                                           "artifact_location"))}


def create_run(srv, args):
    store = srv.store
    exp_id = str(required(args, "experiment_id"))
    e = experiment_or_404(store, exp_id)
    if e["lifecycle_stage"] != "active":
        raise invalid(f"The experiment {exp_id} must be in the 'active' state.")
    tags = key_values(args, "tags")
    tag_name = next((t["value"] for t in tags if t["key"] == "mlflow.runName"), None)
    run_name = args.get("run_name")
    if run_name and tag_name and run_name != tag_name:
        raise invalid(f"Both 'run_name' argument and 'mlflow.runName' tag are specified, but "
                      f"with different values (run_name='{run_name}', "
                      f"mlflow.runName='{tag_name}').")
    run_name = run_name or tag_name or f"run-{len(store.runs) + 1}"
    if tag_name is None:
        tags = tags + [{"key": "mlflow.runName", "value": run_name}]
    run_id = srv.config.run_id or uuid.uuid4().hex
    start = as_int(args, "start_time", now_ms())
    user = args.get("user_id") or next((t["value"] for t in tags if t["key"] == "mlflow.user"),
                                       "unknown")
    info = {
        "run_id": run_id,
        "run_uuid": run_id,
        "run_name": run_name,
        "experiment_id": exp_id,
        "user_id": user,
        "status": "RUNNING",
        "start_time": start,
        "artifact_uri": f"mlflow-artifacts:/{exp_id}/{run_id}/artifacts",
        "lifecycle_stage": "active",
    }
    store.runs[run_id] = {"info": info,
                          "data": {"metrics": [], "params": [], "tags": list(tags)},
                          "status_history": [{"status": "RUNNING", "end_time": None,
                                              "at": time.time()}]}
    return {"run": store.public_run(store.runs[run_id])}


def run_id_of(args):
    rid = args.get("run_id") or args.get("run_uuid")
    if not rid:
        raise missing("run_id")
    return rid


def get_run(srv, args):
    return {"run": srv.store.public_run(srv.store.run(run_id_of(args)))}


def update_run(srv, args):
    r = srv.store.run(run_id_of(args))
    status = args.get("status")
    if status is not None:
        if status not in RUN_STATUSES:
            raise invalid(f"Invalid value {status!r} for parameter 'status': expected one of "
                          f"{', '.join(RUN_STATUSES)}")
        r["info"]["status"] = status
    end = as_int(args, "end_time")
    if end is not None:
        r["info"]["end_time"] = end
    if args.get("run_name"):
        r["info"]["run_name"] = args["run_name"]
        set_tags(r, [{"key": "mlflow.runName", "value": args["run_name"]}])
    r["status_history"].append({"status": r["info"]["status"], "end_time": end,
                                "at": time.time()})
    return {"run_info": dict(r["info"])}


def set_tags(r, tags):
    kept = {t["key"]: t for t in r["data"]["tags"]}
    for t in tags:
        kept[t["key"]] = {"key": t["key"], "value": t["value"]}
    r["data"]["tags"] = list(kept.values())


def add_params(r, params):
    have = {p["key"]: p["value"] for p in r["data"]["params"]}
    for p in params:
        if p["key"] in have and have[p["key"]] != p["value"]:
            raise invalid(f"Changing param values is not allowed. Param with key='{p['key']}' "
                          f"was already logged with value='{have[p['key']]}' for run ID="
                          f"'{r['info']['run_id']}'. Attempted logging new value "
                          f"'{p['value']}'.")
    for p in params:
        if p["key"] not in have:
            have[p["key"]] = p["value"]
            r["data"]["params"].append({"key": p["key"], "value": p["value"]})


def check_metric(m):
    if not isinstance(m, dict) or not m.get("key"):
        raise missing("metrics.key")
    for f in ("value", "timestamp"):
        if m.get(f) is None:
            raise missing(f"metrics.{f}")
    try:
        value = float(m["value"])
        ts, step = int(m["timestamp"]), int(m.get("step") or 0)
    except (TypeError, ValueError):
        raise invalid(f"Invalid metric {m!r}")
    return {"key": m["key"], "value": value, "timestamp": ts, "step": step}


def add_metrics(r, metrics):
    for m in metrics:
        r["data"]["metrics"].append(m)


def require_active(r):
    if r["info"]["lifecycle_stage"] != "active":
        raise invalid(f"The run {r['info']['run_id']} must be in the 'active' state.")


def log_batch(srv, args):
    r = srv.store.run(run_id_of(args))
    require_active(r)
    metrics = args.get("metrics") or []
    params = key_values(args, "params")
    tags = key_values(args, "tags")
    if not isinstance(metrics, list):
        raise invalid("Invalid value for parameter 'metrics': expected a list")
    if len(metrics) > MAX_METRICS or len(params) > MAX_PARAMS or len(tags) > MAX_TAGS \
            or len(metrics) + len(params) + len(tags) > MAX_ENTITIES:
        raise invalid(f"A batch logging request can contain at most {MAX_METRICS} metrics, "
                      f"{MAX_PARAMS} params, and {MAX_TAGS} tags, and at most {MAX_ENTITIES} "
                      f"entities in total. Got {len(metrics)} metrics, {len(params)} params, "
                      f"and {len(tags)} tags.")
    checked = [check_metric(m) for m in metrics]
    add_params(r, params)
    add_metrics(r, checked)
    set_tags(r, tags)
    return {}


def log_metric(srv, args):
    r = srv.store.run(run_id_of(args))
    require_active(r)
    add_metrics(r, [check_metric(args)])
    return {}


def log_param(srv, args):
    r = srv.store.run(run_id_of(args))
    require_active(r)
    key = required(args, "key")
    if args.get("value") is None:
        raise missing("value")
    add_params(r, [{"key": key, "value": str(args["value"])}])
    return {}


def set_tag(srv, args):
    r = srv.store.run(run_id_of(args))
    require_active(r)
    key = required(args, "key")
    if args.get("value") is None:
        raise missing("value")
    set_tags(r, [{"key": key, "value": str(args["value"])}])
    return {}


ARTIFACTS = "/api/2.0/mlflow-artifacts/artifacts/"

ROUTES = {
    "experiments/get-by-name": ("GET", get_by_name),
    "experiments/get": ("GET", get_experiment),
    "experiments/create": ("POST", create_experiment),
    "runs/create": ("POST", create_run),
    "runs/get": ("GET", get_run),
    "runs/update": ("POST", update_run),
    "runs/log-batch": ("POST", log_batch),
    "runs/log-metric": ("POST", log_metric),
    "runs/log-parameter": ("POST", log_param),
    "runs/set-tag": ("POST", set_tag),
}


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128    # the default 5 drops SYNs when many clients connect at once

    def __init__(self, port, config):
        super().__init__(("127.0.0.1", port), Handler)
        self.store = Store()
        self.config = config
        self.recorded = []
        self.artifacts = {}     # artifact path -> bytes received


def main(argv=None):
    ap = argparse.ArgumentParser(description="A small MLflow tracking server for tests.")
    ap.add_argument("--port", type=int, default=0, help="0: a free loopback port")
    ap.add_argument("--token", help="require this bearer token")
    ap.add_argument("--basic", metavar="USER:PASS", help="require basic auth")
    ap.add_argument("--fail", type=int, default=0, help="answer 500 to the next N requests")
    ap.add_argument("--fail-status", type=int, default=500)
    ap.add_argument("--delay", type=float, default=0.0, help="wait S seconds before answering")
    ap.add_argument("--race", type=int, default=0,
                    help="the next N lookups of an absent experiment create it, yet say absent")
    a = ap.parse_args(argv)
    user, _, password = (a.basic or "").partition(":")
    cfg = Config(token=a.token, username=user or None, password=password or None,
                 fail=a.fail, fail_status=a.fail_status, delay=a.delay, race=a.race)
    srv = Server(a.port, cfg)

    def stop(signum, frame):
        threading.Thread(target=srv.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(srv.server_address[1], flush=True)
    srv.serve_forever(poll_interval=0.1)
    srv.server_close()


# -- the helper for tests -------------------------------------------------

class MlflowTestServer:
    """This server in a subprocess, for tests:

        with MlflowTestServer(token="t0k") as srv:
            env["MLFLOW_TRACKING_URI"] = srv.url
            ...
            assert srv.requests("runs/create")[0]["headers"]["authorization"] == "Bearer t0k"
            run = srv.runs()[0]

    url: "http://127.0.0.1:<port>"; requests(endpoint=None, method=None): the recorded
    requests (dicts: method, path, query, headers (lower-case names), body (parsed JSON),
    status, time), only those whose path ends with ENDPOINT if given; state(): the whole
    store; experiments(), runs(), run(run_id): parts of it (a run is {info, data:{metrics,
    params, tags}, status_history}); tags(run_id), params(run_id): as dicts;
    set_fail(n, status=500), set_delay(s), set_auth(token=, username=, password=),
    set_race(n), reset(): change the server while it runs.
    """

    def __init__(self, token=None, username=None, password=None, fail=0, delay=0.0, race=0,
                 python="/usr/bin/python3", start_timeout=20.0):
        args = [python if os.path.exists(python) else sys.executable, os.path.abspath(__file__),
                "--port", "0", "--fail", str(fail), "--delay", str(delay), "--race", str(race)]
        if token:
            args += ["--token", token]
        if username:
            args += ["--basic", f"{username}:{password or ''}"]
        self._args, self._start_timeout = args, start_timeout
        self.proc, self.port, self.url = None, None, None
        # The control calls must not go through an http_proxy from the environment.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def start(self):
        self.proc = subprocess.Popen(self._args, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                     text=True)
        result = []
        reader = threading.Thread(target=lambda: result.append(self.proc.stdout.readline()),
                                  daemon=True)
        reader.start()
        reader.join(self._start_timeout)
        line = result[0].strip() if result else ""
        if not line.isdigit():
            self.stop()
            raise RuntimeError(f"mlflow_server.py did not start (printed {line!r})")
        self.port = int(line)
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    def stop(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()
        self.proc = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def _call(self, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data,
                                     method="GET" if body is None else "POST",
                                     headers={"Content-Type": "application/json"})
        with self._opener.open(req, timeout=10) as resp:
            return json.loads(resp.read() or b"null")

    def requests(self, endpoint=None, method=None):
        return [r for r in self._call("/_test/requests")
                if (endpoint is None or r["path"].endswith(endpoint))
                and (method is None or r["method"] == method)]

    def state(self):
        return self._call("/_test/state")

    def experiments(self):
        return self.state()["experiments"]

    def runs(self):
        return self.state()["runs"]

    def run(self, run_id):
        for r in self.runs():
            if r["info"]["run_id"] == run_id:
                return r
        raise KeyError(run_id)

    def tags(self, run_id):
        return {t["key"]: t["value"] for t in self.run(run_id)["data"]["tags"]}

    def params(self, run_id):
        return {p["key"]: p["value"] for p in self.run(run_id)["data"]["params"]}

    def configure(self, **knobs):
        return self._call("/_test/config", knobs)

    def set_fail(self, n, status=500):
        return self.configure(fail=n, fail_status=status)

    def set_delay(self, seconds):
        return self.configure(delay=seconds)

    def set_auth(self, token=None, username=None, password=None):
        return self.configure(token=token, username=username, password=password)

    def set_race(self, n):
        return self.configure(race=n)

    def reset(self):
        return self._call("/_test/reset", {})


if __name__ == "__main__":
    main()
