"""Training, the `attnserve adapt` verb: adapt.py distills what a variant adds (`adapt variant`),
context_cache.py runs the frozen encoder once over documents (`adapt cache`), context_train.py
learns context heads on that cache (`adapt train`; context_heads.py, context_files.py; a head
folder's format: context_format.py; its graphs through ONNX Runtime, as `attnserve bench context`
times them: context_runtime.py), training_docs.py builds training documents from Debian
documentation packages (`adapt docs`). Nothing here is served: the service imports none of it."""
