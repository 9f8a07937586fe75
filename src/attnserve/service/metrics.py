"""Prometheus metrics (GET /metrics), one registry per app so tests can run several apps.

Histograms of each hop a request takes (request, tokenization, queue, inference), of its input
length in tokens and of the size of the inference batch it ran in, labelled by route, variant
and precision (float32, int8 or float16: what the export runs, so that two deployments of one
variant at two precisions stay apart on a dashboard); counters of successes and of failures by
reason.
"""
from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_TOKENS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
_BATCH = (1, 2, 4, 8, 16, 32, 64, 128, 256)

# Routes get their own label value; anything else (404s, probes) shares one.
TRACKED_ROUTES = ("/embed", "/embed_chunks", "/embed_all", "/similarity", "/decode", "/v1/embeddings", "/v1/contextualizedembeddings", "/attention", "/rank_collapse", "/tokenize", "/info", "/health", "/ready", "/metrics")


class ServiceMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, variant: str, precision: str = "float32"):
        self.variant, self.precision = variant, precision
        self.registry = CollectorRegistry()
        labels = ("route", "variant", "precision")

        def histogram(name, doc, buckets):
            return Histogram(name, doc, labels, buckets=buckets, registry=self.registry)

        self.request_duration = histogram("attnserve_request_duration_seconds", "Whole request, first byte in to response start", _SECONDS)
        self.tokenization_duration = histogram("attnserve_tokenization_duration_seconds", "Tokenization of a request's inputs", _SECONDS)
        self.queue_duration = histogram("attnserve_queue_duration_seconds", "Time a request's inputs waited for an inference batch", _SECONDS)
        self.inference_duration = histogram("attnserve_inference_duration_seconds", "ONNX Runtime time of the batches a request ran in", _SECONDS)
        self.input_tokens = histogram("attnserve_input_tokens", "Tokens per input, [CLS] and [SEP] included", _TOKENS)
        self.batch_size = histogram("attnserve_batch_size", "Inputs in the inference batch a request's input ran in", _BATCH)
        self.successes = Counter("attnserve_requests_success", "Requests answered with 2xx", labels, registry=self.registry)
        self.failures = Counter("attnserve_requests_failure", "Requests answered with an error", ("route", "variant", "precision", "reason"), registry=self.registry)
        self.queue_depth = Gauge("attnserve_queue_inputs", "Inputs waiting for an inference batch", registry=self.registry)
        self.cancelled = Counter("attnserve_requests_cancelled", "Requests whose work was stopped: client disconnected, deadline, or shutdown",
                                 ("reason",), registry=self.registry)
        self.inputs_run = Counter("attnserve_inputs_run", "Inputs handed to the model in a batch", registry=self.registry)
        self.in_flight = Gauge("attnserve_requests_in_flight", "Requests accepted and not yet answered", registry=self.registry)

    @staticmethod
    def route_label(path: str) -> str:
        return path if path in TRACKED_ROUTES else "other"

    def observe_request(self, path: str, status: int, seconds: float, reason: str | None) -> None:
        route = self.route_label(path)
        self.request_duration.labels(route, self.variant, self.precision).observe(seconds)
        if status < 400:
            self.successes.labels(route, self.variant, self.precision).inc()
        else:
            self.failures.labels(route, self.variant, self.precision, reason or f"http_{status}").inc()

    def observe_work(self, path: str, timings) -> None:
        """The per-hop timings of a request that reached the model."""
        route = self.route_label(path)
        self.tokenization_duration.labels(route, self.variant, self.precision).observe(timings.tokenization)
        if timings.batch_sizes:
            self.queue_duration.labels(route, self.variant, self.precision).observe(timings.queue)
            self.inference_duration.labels(route, self.variant, self.precision).observe(timings.inference)
        for n in timings.input_tokens:
            self.input_tokens.labels(route, self.variant, self.precision).observe(n)
        for size in timings.batch_sizes:
            self.batch_size.labels(route, self.variant, self.precision).observe(size)

    def render(self) -> bytes:
        return generate_latest(self.registry)
