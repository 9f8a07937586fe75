#!/usr/bin/env bash
# Measure one replica's documents per second for docs/deploy.md's sizing table: start one
# `attnserve serve` per export on 127.0.0.1 (one pod's server, default settings), load them
# one after another with docker/loadtest/loadtest.py, stop them.
#   bash deploy/kubernetes/sizing.sh OUT VARIANT=EXPORT_DIR [VARIANT=EXPORT_DIR ...] [-- loadtest.py options]
# e.g. bash deploy/kubernetes/sizing.sh reports/sizing full=/tmp/full-4096 longformer=/tmp/lf-4096 \
#        -- --lengths 512 4096 --duration 30 --concurrency 4
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
python=${PYTHON:-$root/.venv/bin/python}
out=$1; shift
pids=()
targets=()
port=8111
trap 'for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait' EXIT
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    variant=${1%%=*}; export_dir=${1#*=}; shift
    "$python" -m attnserve serve --export-dir "$export_dir" --host 127.0.0.1 --port "$port" --log-level warning &
    pids+=($!)
    targets+=(--target "$variant=http://127.0.0.1:$port")
    port=$((port + 1))
done
[ "${1:-}" = "--" ] && shift
"$python" "$root/docker/loadtest/loadtest.py" "${targets[@]}" --out "$out" "$@"
