#!/usr/bin/env bash
# Start a local Ray head node for rayfl: dashboard on 127.0.0.1 only, token authentication on.
#   cluster/start-local-head.sh [NUM_CPUS] [NUM_GPUS]
# Then: rayfl submit CONFIG.yaml --address http://127.0.0.1:8265 --wait --fetch
# Ray's own clients (`ray job submit`, `ray status`) need RAY_AUTH_MODE=token in *their* shell:
#   export RAY_AUTH_MODE=token   (this script cannot set it for the shell that runs it)
# Metrics (docs/watching.md): Prometheus and Grafana with the configs Ray writes under
# /tmp/ray/session_latest/metrics; this script adds cluster/grafana/rayfl.json to Ray's dashboards.
# Stop with `ray stop` (note: it stops every Ray process on this host).
set -euo pipefail
cpus=${1:-$(nproc)}
gpus=${2:-0}
export RAY_AUTH_MODE=token
# Ray's clients read the token from $RAY_AUTH_TOKEN or ~/.ray/auth_token; create one if missing.
if [ -z "${RAY_AUTH_TOKEN:-}" ] && [ ! -s "${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}" ]; then
  ray get-auth-token --generate >/dev/null
fi
ray start --head \
  --num-cpus "$cpus" --num-gpus "$gpus" \
  --dashboard-host 127.0.0.1 --dashboard-port "${RAYFL_DASHBOARD_PORT:-8265}" \
  --disable-usage-stats
# rayfl's Grafana dashboard beside Ray's own (Ray provisions every JSON in this folder).
dashboards="${RAY_METRICS_GRAFANA_DASHBOARD_OUTPUT_DIR:-${RAY_TMPDIR:-/tmp}/ray/session_latest/metrics/grafana/dashboards}"
for _ in $(seq 50); do [ -d "$dashboards" ] && break; sleep 0.2; done
cp "$(dirname "$0")/grafana/rayfl.json" "$dashboards/" && echo "Grafana dashboard: $dashboards/rayfl.json"
echo "dashboard: http://127.0.0.1:${RAYFL_DASHBOARD_PORT:-8265} (the browser asks for a token: paste the output of: ray get-auth-token)"
echo "for ray job submit / ray status in your shell: export RAY_AUTH_MODE=token"
