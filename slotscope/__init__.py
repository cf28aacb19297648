"""slotscope: reference simulator with instrumented tracing for hybrid-SWA KV-cache writes."""
__version__ = "0.1.0"
