"""An OTLP/HTTP receiver for the telemetry test.

Decodes each ExportTraceServiceRequest and ExportMetricsServiceRequest with the official
OpenTelemetry protos and appends one JSON object per span (service, name, trace and span ids,
parent span id, attributes) or per metric data point ("metric", attributes, value) to a file.
Usage: otlp_sink.py PORT OUT_FILE (PORT 0: any free port). Prints "listening PORT" once it
accepts requests, with the port it is bound to.
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

port, out_path = int(sys.argv[1]), sys.argv[2]


def value_of(any_value):
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


class Receiver(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path == "/v1/metrics":
            self.metrics(body)
            return
        if self.path != "/v1/traces":
            self.send_response(404)
            self.end_headers()
            return
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        lines = []
        for resource_spans in request.resource_spans:
            resource = {a.key: value_of(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    lines.append(json.dumps({
                        "service": resource.get("service.name", ""),
                        "name": span.name,
                        "kind": span.kind,
                        "trace_id": span.trace_id.hex(),
                        "span_id": span.span_id.hex(),
                        "parent": span.parent_span_id.hex(),
                        "attributes": {a.key: value_of(a.value) for a in span.attributes},
                    }))
        with open(out_path, "a", encoding="utf-8") as out:
            out.writelines(line + "\n" for line in lines)
        self.answer(ExportTraceServiceResponse().SerializeToString())

    def metrics(self, body):
        request = ExportMetricsServiceRequest()
        request.ParseFromString(body)
        lines = []
        for resource_metrics in request.resource_metrics:
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    kind = metric.WhichOneof("data")
                    for point in getattr(metric, kind).data_points:
                        value = point.as_double if point.WhichOneof("value") == "as_double" else point.as_int
                        lines.append(json.dumps({
                            "metric": metric.name,
                            "attributes": {a.key: value_of(a.value) for a in point.attributes},
                            "value": value,
                        }))
        with open(out_path, "a", encoding="utf-8") as out:
            out.writelines(line + "\n" for line in lines)
        self.answer(ExportMetricsServiceResponse().SerializeToString())

    def answer(self, answer):
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", port), Receiver)
print("listening", server.server_address[1], flush=True)
server.serve_forever()
