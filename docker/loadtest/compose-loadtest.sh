#!/usr/bin/env bash
# Start the compose services, load-test them side by side, stop them again.
#   bash docker/loadtest/compose-loadtest.sh [loadtest.py options...]
# e.g. bash docker/loadtest/compose-loadtest.sh --duration 20 --concurrency 2 --out reports/loadtest
# SERVICES (default "full longformer bigbird lsh linformer") picks the services; the ports
# are compose.yaml's defaults. Images must be built first (docker compose ... build).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# Compose v2 (`docker compose`) where it is installed, else v1 (`docker-compose`).
if docker compose version >/dev/null 2>&1; then compose=(docker compose); else compose=(docker-compose); fi
compose+=(-f "$root/docker/compose.yaml")
services=${SERVICES:-full longformer bigbird lsh linformer}
declare -A port=([full]=${FULL_PORT:-8101} [longformer]=${LONGFORMER_PORT:-8102} [bigbird]=${BIGBIRD_PORT:-8103} [lsh]=${LSH_PORT:-8104} [linformer]=${LINFORMER_PORT:-8105} [longformer-int8]=${LONGFORMER_INT8_PORT:-8106} [sinkhorn-x5-longformer]=${SINKHORN_PRESET_PORT:-8107})
targets=()
for s in $services; do targets+=(--target "$s=http://127.0.0.1:${port[$s]}"); done
python=${PYTHON:-$root/.venv/bin/python}
[ -x "$python" ] || python=python3
trap '"${compose[@]}" stop -t 70 $services >/dev/null 2>&1 || true; "${compose[@]}" rm -f $services >/dev/null 2>&1 || true' EXIT
# shellcheck disable=SC2086
"${compose[@]}" up -d --no-build $services
"$python" "$here/loadtest.py" "${targets[@]}" "$@"
