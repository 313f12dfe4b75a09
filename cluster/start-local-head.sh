#!/usr/bin/env bash
# A local Ray head for rayfl (`rayfl up --dashboard-port`): the dashboard on 127.0.0.1 only, token
# authentication on, every other port a free one (a second head on this host keeps working), Ray's
# own log in ~/rayfl/head.log; rayfl's Grafana dashboard beside Ray's. Prints four lines: the head's
# address, the dashboard's URL, the token step and the export Ray's own CLI needs.
#   cluster/start-local-head.sh [NUM_CPUS] [NUM_GPUS]      (RAYFL_DASHBOARD_PORT, default 8265)
# Stop it with: rayfl down   (that head only; never `ray stop`, which stops every Ray cluster here)
set -euo pipefail
cpus=${1:-$(nproc)}
gpus=${2:-0}
if command -v rayfl >/dev/null; then rayfl=(rayfl); else rayfl=(python3 -m rayfl); fi
"${rayfl[@]}" up --num-cpus "$cpus" --num-gpus "$gpus" --dashboard-port "${RAYFL_DASHBOARD_PORT:-8265}"
# rayfl's Grafana dashboard beside Ray's own (Ray provisions every JSON in this folder).
# The head's Ray temp folder is its own (~/rayfl/head.json's temp_dir), not /tmp/ray.
temp_dir=$(python3 -c 'import json, pathlib; print(json.loads((pathlib.Path.home() / "rayfl/head.json").read_text()).get("temp_dir") or "/tmp/ray")')
dashboards="${RAY_METRICS_GRAFANA_DASHBOARD_OUTPUT_DIR:-$temp_dir/session_latest/metrics/grafana/dashboards}"
for _ in $(seq 50); do [ -d "$dashboards" ] && break; sleep 0.2; done
cp "$(dirname "$0")/grafana/rayfl.json" "$dashboards/" 2>/dev/null || true
