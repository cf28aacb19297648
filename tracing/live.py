"""Live export to an OpenTelemetry Collector (or Jaeger) over OTLP/HTTP.

Built only when asked, because importing and configuring the HTTP exporter costs time and a
network peer. Settings the user does not pass come from the standard environment variables
(``OTEL_EXPORTER_OTLP_ENDPOINT``, ``..._TRACES_ENDPOINT``, ``..._HEADERS``, ``..._TIMEOUT``,
``..._COMPRESSION``, ``..._CERTIFICATE``), which the OTLP exporter reads itself.
"""
from __future__ import annotations

from typing import Optional
from urllib.parse import urlsplit

from opentelemetry.sdk.trace.export import SpanExporter

#: Pass this as the endpoint to take it from the environment alone.
FROM_ENV = "env"


def traces_url(endpoint: str) -> str:
    """A base URL (``http://host:4318``) gets the signal path ``/v1/traces``, as the
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` convention says; a URL with a path is used as given."""
    parts = urlsplit(endpoint)
    if not parts.scheme or not parts.netloc:
        raise ValueError(f"otlp endpoint {endpoint!r} is not a URL like http://host:4318")
    if parts.path in ("", "/"):
        return endpoint.rstrip("/") + "/v1/traces"
    return endpoint


def otlp_http_exporter(endpoint: Optional[str]) -> SpanExporter:
    """The OTLP/HTTP span exporter for ``endpoint`` (``"env"``/None: from the environment)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    if endpoint is None or endpoint == FROM_ENV:
        return OTLPSpanExporter()
    return OTLPSpanExporter(endpoint=traces_url(endpoint))
