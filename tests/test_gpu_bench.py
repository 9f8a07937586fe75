"""python -m attnserve.bench.gpu --dry-run: every step of the GPU benchmark on the CPU (exports in worker
processes, PyTorch fp32 and bf16, OnnxRunner with and without IO binding, node placement, the
batcher's throughput), so that the run a GPU machine gets once is known to work and its JSON
holds every figure docs/gpu.md's tables are made from."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from export_helpers import EXPORTS_ROOT

GPU_BENCH = ["-m", "attnserve.bench.gpu"]
VARIANTS = ["full", "global"]  # the dry run's own defaults
LENGTHS = [64, 128]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-bench")
    # Its seeded exports are kept in the suite's export cache and reused while the models code is the same.
    exports = EXPORTS_ROOT / "gpu-dry-run"
    exports.mkdir(parents=True, exist_ok=True)
    os.utime(exports)  # in use: the cache's pruning goes by this time
    proc = subprocess.run([sys.executable, *GPU_BENCH, "--dry-run", "--out", str(out), "--exports-dir", str(exports)],
                          capture_output=True, text=True,
                          timeout=900, cwd=tmp_path_factory.getbasetemp())  # not the repo root: it runs from the installed package
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, json.loads((out / "gpu.json").read_text()), out


def test_the_dry_run_measures_every_variant_on_the_cpu(dry_run):
    _, result, _ = dry_run
    assert result["schema"] == "attnserve-gpu-bench/1" and result["dry_run"] is True and result["complete"] is True
    assert result["settings"]["lengths"] == LENGTHS and result["settings"]["providers"] == ["CPUExecutionProvider"]
    assert result["environment"]["device"] == "cpu" and result["environment"]["onnxruntime"]
    assert [e["variant"] for e in result["variants"]] == VARIANTS  # full first: the ratios' base
    for entry in result["variants"]:
        assert entry["errors"] == [], entry["variant"]
        assert entry["export"]["max_length"] == max(LENGTHS) and len(entry["export"]["sha256"]) == 64
        assert [row["length"] for row in entry["latency"]] == LENGTHS
        for row in entry["latency"]:
            for key in ("eager_fp32_ms", "eager_bf16_ms", "ort_ms", "ort_session_run_ms"):
                assert row[key] > 0, (entry["variant"], row["length"], key)
            assert row["eager_fp32_calls"] >= 1 and row["ort_calls"] >= 1
            # The parity bound for ORT against PyTorch fp32; same weights, CPU against CPU here.
            assert row["max_abs_diff"] <= 1e-3 and row["strict_fp32_max_abs_diff"] <= 1e-3
            assert row["cosine"] > 0.999
            assert 0 < row["bf16_max_abs_diff"] < 0.5  # bf16 ran, and is not fp32 under another name
            # GPU memory figures exist as fields and are empty without a GPU.
            assert row["eager_fp32_peak_bytes"] is None and row["eager_bf16_peak_bytes"] is None


def test_runner_placement_and_throughput_figures(dry_run):
    _, result, _ = dry_run
    for entry in result["variants"]:
        ort = entry["ort"]
        assert ort["provider"] == "CPUExecutionProvider" and ort["io_binding_device"] is None
        assert ort["device_bytes"] is None and "CPUExecutionProvider" in ort["provider_options"]
        placement = ort["placement"]
        assert list(placement["nodes_by_provider"]) == ["CPUExecutionProvider"]
        assert sum(placement["nodes_by_provider"]["CPUExecutionProvider"].values()) > 10
        assert placement["cpu_fallback"] is None and placement["cpu_fallback_note"]
        tp = ort["throughput"]
        assert tp["docs"] == 8 and tp["doc_tokens"] == 128
        assert tp["batch_1_docs_per_s"] > 0 and set(tp["batched_docs_per_s"]) == {"4", "8"}
        assert all(rate > 0 for rate in tp["batched_docs_per_s"].values())
        # Every document went through the batcher once; on the CPU budget (2,048 tokens) at most 16 of 128 fit a batch.
        assert len(tp["batcher_batch_sizes"]) == 8 and all(1 <= size <= 8 for size in tp["batcher_batch_sizes"])
        assert tp["batcher_batch_tokens"] == 2048 and tp["batcher_docs_per_s"] > 0 and tp["batcher_speedup"] > 0


def test_the_tables_are_printed_and_reprinted_from_the_json(dry_run):
    proc, result, out = dry_run
    for heading in ("PyTorch eager fp32", "PyTorch eager bf16", "ONNX Runtime (CPU provider", "Memory at 128 tokens",
                    "Parity and placement", "IO binding and throughput"):
        assert heading in proc.stdout, heading
    for variant in VARIANTS:
        assert sum(line.startswith(f"| {variant} |") for line in proc.stdout.splitlines()) == 6, variant
    assert "| full | " in proc.stdout and " / 1.00 |" in proc.stdout  # full's own ratio
    assert "a dry run, not GPU figures" in proc.stdout and "Errors:" not in proc.stdout
    again = subprocess.run([sys.executable, *GPU_BENCH, "--tables", str(out / "gpu.json")], capture_output=True, text=True,
                           check=True, timeout=120)
    assert again.stdout == proc.stdout


def test_fallback_reasons_are_read_from_the_cuda_providers_log():
    from attnserve.bench import gpu

    # The lines ONNX Runtime's CUDA provider logs (INFO) while partitioning, as it formats them.
    log = "\n".join([
        "2026-01-01 [I:onnxruntime:, fallback_cpu_capability.cc:161 GetCpuPreferredNodes] ORT optimization- Force fallback "
        "to CPU execution for node: node_Shape_12 because the CPU execution path is deemed faster than overhead involved",
        "2026-01-01 [I:onnxruntime:, cuda_execution_provider.cc:2600 GetCapability] CUDA kernel not found in registries "
        "for Op type: Einsum node name: node_Einsum_7",
        "2026-01-01 [I:onnxruntime:, cuda_execution_provider.cc:2580 GetCapability] CUDA kernel not supported. Fallback "
        "to CPU execution provider for Op type: Attention node name: node_Attention_3",
    ])
    reasons = gpu.fallback_reasons(log)
    assert set(reasons) == {"node_Shape_12", "node_Einsum_7", "node_Attention_3"}
    assert "on purpose" in reasons["node_Shape_12"]
    assert reasons["node_Einsum_7"].startswith("no CUDA kernel") and reasons["node_Einsum_7"].endswith("(Einsum)")
    assert "does not support" in reasons["node_Attention_3"] and "(Attention)" in reasons["node_Attention_3"]
    assert gpu.fallback_lines(log + "\n" + log.splitlines()[0] + "\nan unrelated line") == [line.strip() for line in log.splitlines()]


def test_the_tables_render_the_figures_only_a_gpu_gives(dry_run, tmp_path):
    """The GPU run happens once: its tables must not fail on the fields a CPU run leaves empty
    (the dry run's JSON, with those fields filled as a CUDA run fills them)."""
    _, result, _ = dry_run
    gpu_like = json.loads(json.dumps(result))
    gpu_like["dry_run"] = False
    for entry in gpu_like["variants"]:
        for row in entry["latency"]:
            row.update(eager_fp32_peak_bytes=300 << 20, eager_bf16_peak_bytes=200 << 20)
        entry["ort"].update(provider="CUDAExecutionProvider", io_binding_device="cuda", device_bytes=500 << 20)
        entry["ort"]["placement"]["cpu_fallback"] = [
            {"name": "node_Shape_1", "op_type": "Shape", "reason": "kept on the CPU on purpose"},
            {"name": "node_Shape_2", "op_type": "Shape", "reason": "kept on the CPU on purpose"},
            {"name": "node_Einsum_3", "op_type": "Einsum", "reason": "no CUDA kernel (Einsum)"}]
    entry["ort"]["throughput"] = {"docs": 8, "doc_tokens": 128, "batch_1_docs_per_s": 0.1, "batched_docs_per_s": {},
                                  "skipped": "batches and batcher not timed: one pass at batch 1 took 80 s"}
    (tmp_path / "gpu.json").write_text(json.dumps(gpu_like))
    text = subprocess.run([sys.executable, *GPU_BENCH, "--tables", str(tmp_path / "gpu.json")], capture_output=True,
                          text=True, check=True, timeout=120).stdout
    assert "ONNX Runtime (CUDA provider, OnnxRunner)" in text and "a dry run" not in text
    assert "| full | 300 | 200 | 500 |" in text
    assert "| 3: Einsum x1, Shape x2 | 2 x kept on the CPU on purpose; 1 x no CUDA kernel (Einsum) |" in text
    assert f"| {entry['variant']} | CUDAExecutionProvider | cuda |" in text
    assert text.rstrip().endswith(f"- {entry['variant']}: batches and batcher not timed: one pass at batch 1 took 80 s")

