"""int8 and float16 exports: a float32 export's graphs converted after tracing (`--precision`).

What changes precision is the weight matrix products: every MatMul whose second input is a 2-D
float32 weight (the query, key, value and output projections and both feed-forward products of
each layer). Everything else stays float32: the fused attention (its -1e30 key mask overflows
float16, and a fully masked row would turn into NaN), layer norms, softmax, the pooling sums,
the position and index arithmetic, and a variant's own tables that are not weight products
(LSH's 3-D rotations). Inputs and outputs keep their dtypes, so serving runs every precision
the same way.

- int8: onnxruntime.quantization.quantize_dynamic, int8 weights per output channel,
  activations quantized as they come. Chosen by measurement on longformer at 2,048 tokens:
  per-tensor scales gave cosine 0.84 to float32; static QDQ quantization calibrated on four
  bundled documents gave 0.95 and ran slower than dynamic (253 against 230 ms, float32 304).
- float16: the weights stored in float16, each product's input cast to float16 and its result
  back to float32. Written here rather than taken from onnxruntime.transformers.float16: on
  these graphs that converter writes Cast nodes twice under one name (an invalid model) and
  rounds index arithmetic (Linformer's position indices) to float16.

Both start from ONNX Runtime's basic graph optimisations saved into the graph (constant
folding): the exporter leaves every weight behind a Transpose, where quantization would not
see it as a weight.
"""
from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from attnserve.contract.export_format import DEFAULT_PRECISION, PRECISIONS

# A converted graph's embeddings against PyTorch's float32 ones, cosine at least this
# (verify.verify_embedding_graph). The check runs on random token ids, which no text
# looks like: float16 keeps 0.99999 on them, int8 0.97 to 0.99 (0.976 to 0.996 on bundled man
# pages). Its bound catches a broken conversion; `bench quality --precision` measures what
# int8 costs in retrieval.
MIN_COSINE = {"int8": 0.95, "float16": 0.999}


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; valid: {', '.join(PRECISIONS)}")
    return precision


def _folded(src: Path, dst: Path) -> None:
    """src with ONNX Runtime's basic (standard-op) optimisations applied, saved as dst."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(dst)
    options.add_session_config_entry("session.optimized_model_external_initializers_file_name", dst.name + ".data")
    ort.InferenceSession(str(src), options, providers=["CPUExecutionProvider"])


def weight_products(model) -> list[str]:
    """Names of the MatMul nodes whose second input is a 2-D float32 weight."""
    from onnx import TensorProto

    weights = {t.name for t in model.graph.initializer if len(t.dims) == 2 and t.data_type == TensorProto.FLOAT}
    return [node.name for node in model.graph.node if node.op_type == "MatMul" and node.input[1] in weights]


def _named(model) -> None:
    """Give every node a unique name (the exporter leaves some empty, and both conversions
    select nodes by name)."""
    for index, node in enumerate(model.graph.node):
        node.name = f"{node.name or node.op_type}__{index}"


def _int8(folded: Path, dst: Path) -> None:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = onnx.load(str(folded))
    _named(model)
    nodes = weight_products(model)
    named = folded.with_name(folded.stem + "-named.onnx")
    onnx.save(model, str(named), save_as_external_data=True, location=named.name + ".data")
    quantize_dynamic(named, dst, weight_type=QuantType.QInt8, per_channel=True, op_types_to_quantize=["MatMul"],
                     nodes_to_quantize=nodes, use_external_data_format=True)


def rewrite_products(src: Path, dst: Path, rewrite) -> None:
    """src with every weight product replaced by the nodes `rewrite(node, weight, model)` gives
    (it may add initializers to model.graph); weights nothing reads any more are dropped.
    Saved as dst (+ dst.data)."""
    import onnx

    model = onnx.load(str(src))
    _named(model)
    products = set(weight_products(model))
    weights = {t.name: t for t in model.graph.initializer}
    nodes = []
    for node in model.graph.node:
        nodes += rewrite(node, weights[node.input[1]], model) if node.name in products else [node]
    used = {name for node in nodes for name in node.input}
    kept = [t for t in model.graph.initializer if t.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.save(model, str(dst), save_as_external_data=True, location=dst.name + ".data")


def _float16(folded: Path, dst: Path) -> None:
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    halved: dict[str, str] = {}  # a weight two products share is stored once

    def in_float16(node, weight, model):
        if weight.name not in halved:
            halved[weight.name] = f"{weight.name}.float16"
            model.graph.initializer.append(numpy_helper.from_array(numpy_helper.to_array(weight).astype(np.float16),
                                                                   halved[weight.name]))
        x16, y16 = f"{node.name}.input.float16", f"{node.name}.output.float16"
        return [helper.make_node("Cast", [node.input[0]], [x16], to=TensorProto.FLOAT16, name=f"{node.name}.cast_input"),
                helper.make_node("MatMul", [x16, halved[weight.name]], [y16], name=node.name),
                helper.make_node("Cast", [y16], [node.output[0]], to=TensorProto.FLOAT, name=f"{node.name}.cast_output")]

    rewrite_products(folded, dst, in_float16)


CONVERTERS = {"int8": _int8, "float16": _float16}


def convert_graph(src: Path, dst: Path, precision: str) -> None:
    """Write src (an ONNX graph in float32, external data beside it) at `precision` as dst
    (+ dst.data)."""
    if precision == DEFAULT_PRECISION:
        raise ValueError("a float32 graph is the export itself; there is nothing to convert")
    logging.getLogger().setLevel(max(logging.getLogger().level, logging.ERROR))  # quantize's "consider pre-processing"
    with tempfile.TemporaryDirectory(prefix="attnserve-precision-") as scratch:
        folded = Path(scratch) / "folded.onnx"
        _folded(Path(src), folded)
        CONVERTERS[check_precision(precision)](folded, Path(dst))


def convert_graphs(src_dir: Path, out_dir: Path, files: list[str], precision: str, log=print) -> None:
    """Each graph file of a float32 export in src_dir written at `precision` into out_dir."""
    for name in files:
        log(f"  {precision}: converting {name}")
        convert_graph(Path(src_dir) / name, Path(out_dir) / name, precision)
