"""attnserve service: the HTTP API and the ONNX Runtime runner it calls."""
