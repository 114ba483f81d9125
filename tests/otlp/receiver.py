#!/usr/bin/env python3
"""OTLP receiver for tests: the official opentelemetry-proto messages and grpcio.

Serves, on 127.0.0.1:
  - OTLP/gRPC: MetricsService/Export and TraceService/Export (grpcio server), and
  - OTLP/HTTP: POST /v1/metrics and /v1/traces with application/x-protobuf bodies
    (gzip-compressed when content-encoding says so; grpcio inflates gzip messages itself),
and writes every request it decodes as one JSON line to --out:
  {"transport": "grpc"|"http", "signal": "metrics"|"traces",
   "headers": {name: value}, "request": <MessageToDict of the Export request>}
A request that does not decode is answered with an error (INVALID_ARGUMENT / HTTP 400) and
written as {"transport", "signal", "error"}.

With --tls-cert and --tls-key (PEM), also OTLP/gRPC over TLS on --grpc-tls-port and OTLP/HTTP
over TLS on --https-port, recorded as transports "grpc-tls" and "https".

Usage: receiver.py --grpc-port P --http-port Q --out FILE
                   [--tls-cert C --tls-key K --grpc-tls-port P2 --https-port Q2]
"""

import argparse
import gzip
import json
import ssl
import sys
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from google.protobuf import json_format
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

LOCK = threading.Lock()
OUT = None


def record(transport, signal, headers, message=None, error=None):
    line = {"transport": transport, "signal": signal, "headers": headers}
    if message is not None:
        line["request"] = json_format.MessageToDict(message, preserving_proto_field_name=True)
    if error is not None:
        line["error"] = error
    with LOCK:
        OUT.write(json.dumps(line) + "\n")
        OUT.flush()


class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, transport):
        self.transport = transport

    def Export(self, request, context):
        record(self.transport, "metrics", dict(context.invocation_metadata()), request)
        return metrics_service_pb2.ExportMetricsServiceResponse()


class Traces(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, transport):
        self.transport = transport

    def Export(self, request, context):
        record(self.transport, "traces", dict(context.invocation_metadata()), request)
        return trace_service_pb2.ExportTraceServiceResponse()


def grpc_server(transport):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(transport), server)
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(transport), server)
    return server


SIGNALS = {
    "/v1/metrics": ("metrics", metrics_service_pb2.ExportMetricsServiceRequest, metrics_service_pb2.ExportMetricsServiceResponse),
    "/v1/traces": ("traces", trace_service_pb2.ExportTraceServiceRequest, trace_service_pb2.ExportTraceServiceResponse),
}


class Http(BaseHTTPRequestHandler):
    transport = "http"

    def do_POST(self):
        found = SIGNALS.get(self.path)
        if found is None:
            self.send_error(404)
            return
        signal, req_type, resp_type = found
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        headers = {k.lower(): v for k, v in self.headers.items()}
        if headers.get("content-type") != "application/x-protobuf":
            record(self.transport, signal, headers, error="content-type " + headers.get("content-type", ""))
            self.send_error(415)
            return
        try:
            if headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            elif headers.get("content-encoding") not in (None, "identity"):
                raise ValueError("content-encoding " + headers["content-encoding"])
            msg = req_type.FromString(body)
        except Exception as e:  # a body that is not the Export request
            record(self.transport, signal, headers, error=str(e))
            self.send_error(400)
            return
        record(self.transport, signal, headers, msg)
        out = resp_type().SerializeToString()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


def main():
    global OUT
    ap = argparse.ArgumentParser()
    ap.add_argument("--grpc-port", type=int, required=True)
    ap.add_argument("--http-port", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tls-cert")
    ap.add_argument("--tls-key")
    ap.add_argument("--grpc-tls-port", type=int)
    ap.add_argument("--https-port", type=int)
    a = ap.parse_args()
    OUT = open(a.out, "a", encoding="utf-8")
    server = grpc_server("grpc")
    if server.add_insecure_port(f"127.0.0.1:{a.grpc_port}") != a.grpc_port:
        sys.exit(f"cannot listen on 127.0.0.1:{a.grpc_port}")
    server.start()
    httpd = ThreadingHTTPServer(("127.0.0.1", a.http_port), Http)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    if a.tls_cert:
        with open(a.tls_cert, "rb") as c, open(a.tls_key, "rb") as k:
            creds = grpc.ssl_server_credentials([(k.read(), c.read())])
        tls_server = grpc_server("grpc-tls")
        if tls_server.add_secure_port(f"127.0.0.1:{a.grpc_tls_port}", creds) != a.grpc_tls_port:
            sys.exit(f"cannot listen on 127.0.0.1:{a.grpc_tls_port}")
        tls_server.start()
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(a.tls_cert, a.tls_key)
        https = ThreadingHTTPServer(("127.0.0.1", a.https_port), type("Https", (Http,), {"transport": "https"}))
        https.socket = ctx.wrap_socket(https.socket, server_side=True)
        threading.Thread(target=https.serve_forever, daemon=True).start()
    print(f"ready grpc={a.grpc_port} http={a.http_port}", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
