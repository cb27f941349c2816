"""A small OTLP/HTTP trace receiver, run as its own process by the tracing tests.

`python otlp_receiver.py SPANS_FILE` listens on a free port of 127.0.0.1, prints
`listening PORT`, and appends each span of every `POST /v1/traces` (an
`ExportTraceServiceRequest` in protobuf, as the OTLP/HTTP exporter sends it) to SPANS_FILE as
one JSON line: ids in hex, name, times, attributes, event names and resource attributes.
"""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


class Receiver(BaseHTTPRequestHandler):
    spans_file = ""

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path != "/v1/traces":
            self.send_response(404)
            self.end_headers()
            return
        message = ExportTraceServiceRequest.FromString(body)
        lines = []
        for resource_spans in message.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    record = {
                        "trace_id": span.trace_id.hex(),
                        "span_id": span.span_id.hex(),
                        "parent_span_id": span.parent_span_id.hex(),
                        "name": span.name,
                        "start": span.start_time_unix_nano,
                        "end": span.end_time_unix_nano,
                        "attributes": _attributes(span.attributes),
                        "events": [event.name for event in span.events],
                        "resource": resource,
                    }
                    lines.append(json.dumps(record) + "\n")
        with open(self.spans_file, "a", encoding="utf-8") as out:
            out.writelines(lines)
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format: str, *args: Any) -> None:  # silence: the test reads the spans file
        return


def main() -> None:
    Receiver.spans_file = sys.argv[1]
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    print(f"listening {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
