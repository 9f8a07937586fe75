"""Training (`attnserve adapt ...`): adapt.py distills what a variant adds, context_cache.py runs
the frozen encoder once over documents, context_train.py learns context heads on that cache
(context_heads.py, context_files.py; a head folder's format: context_format.py; its graphs
through ONNX Runtime, as `attnserve bench context` times them: context_runtime.py),
training_docs.py builds training documents from Debian documentation packages."""
