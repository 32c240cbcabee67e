#!/usr/bin/env bash
# Submit an fl-lightning command to a running Ray cluster as a Ray job.
#
#   cluster/submit.sh [--address URL] [--no-wait] [run|sweep|resume|compare|reproduce] <overrides...>
#
#   cluster/submit.sh run method=fedavg data=fmnist fl.rounds=50 runtime=gpu experiment=cmp
#   cluster/submit.sh sweep method=fedavg seed=0,1,2 runtime=gpu experiment=cmp --parallel 3
#   cluster/submit.sh reproduce fedglcl --scale paper runtime=gpu --parallel 4
#
# The command defaults to `run`. The address is the head's dashboard URL: --address, else
# $RAY_API_SERVER_ADDRESS, else $RAY_ADDRESS (the ray job CLI's own order), else
# http://127.0.0.1:8265. Both yamls bind the dashboard to the head's loopback: from your
# machine, keep `ray dashboard ray_cluster.yaml` running (an SSH tunnel from 127.0.0.1:8265
# here to the head's dashboard) and the default works; or submit on the head node.
#
# A run writes its run directory on the head, under $FL_LIGHTNING_RUNS for a relative
# output_dir, and prints it; `resume <that path>` continues it, cluster/fetch_runs.sh brings
# the runs home.
#
# The repository is uploaded as the job's working dir WITHOUT data, runs, .venv, .git and
# caches: data must already be on the nodes (shared storage, or `fl-lightning fetch fmnist`
# in the cluster's setup_commands), named by data.root=<path> or the nodes' FL_LIGHTNING_DATA
# (your local FL_LIGHTNING_DATA is not forwarded: paths differ between machines). Inside
# the job, the driver joins the cluster it was submitted to (Ray sets RAY_ADDRESS for it), so
# no runtime.address is needed.
#
# Forwarded to the job (runtime_env env_vars) when set here: WANDB_MODE, WANDB_PROJECT,
# WANDB_ENTITY, and WANDB_API_KEY (note: a job's env_vars are visible to
# anyone who can reach the dashboard; set FL_SUBMIT_NO_WANDB_KEY=1 to keep the key out and
# configure it on the nodes instead, e.g. `wandb login` in setup_commands).
#
# Variables: RAY (the ray CLI, default `ray`), PYTHON (the job's interpreter on the nodes,
# default `python`), FL_SUBMIT_EXTRA_EXCLUDES (more comma-separated exclude patterns).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ADDRESS="${RAY_API_SERVER_ADDRESS:-${RAY_ADDRESS:-http://127.0.0.1:8265}}"
RAY="${RAY:-ray}"
PYTHON="${PYTHON:-python}"
WAIT=()

while [[ $# -gt 0 ]]; do
  case "$1" in
    --address) ADDRESS="$2"; shift 2 ;;
    --address=*) ADDRESS="${1#--address=}"; shift ;;
    --no-wait) WAIT=(--no-wait); shift ;;
    -h|--help) sed -n '2,33p' "$0"; exit 0 ;;
    *) break ;;
  esac
done

CMD=run
case "${1:-}" in
  run|sweep|resume|compare|reproduce) CMD="$1"; shift ;;
esac

# `python3 -I`: isolated, so a `json.py` (or `os.py`) in the working directory is not imported.
# gitignore-style patterns relative to the repository; the leading '/' matters: a bare
# `data` would also drop the package folders fl_lightning/data and fl_lightning/text/data.
RUNTIME_ENV="$(FL_SUBMIT_EXTRA_EXCLUDES="${FL_SUBMIT_EXTRA_EXCLUDES:-}" python3 -I - <<'PY'
import json, os
excludes = ["/.git", "/.venv", "/data", "/runs", "/wandb", "/.cache", "/benchmarks/results", "/docs/reproduce",
            "/.pytest_cache", "/.ruff_cache", "/build", "*.egg-info", "__pycache__", "*.pyc"]
excludes += [e for e in os.environ.get("FL_SUBMIT_EXTRA_EXCLUDES", "").split(",") if e]
names = ["WANDB_MODE", "WANDB_PROJECT", "WANDB_ENTITY"]
if os.environ.get("FL_SUBMIT_NO_WANDB_KEY") != "1":
    names.append("WANDB_API_KEY")
env = {k: os.environ[k] for k in names if os.environ.get(k)}
out = {"excludes": excludes}
if env:
    out["env_vars"] = env
print(json.dumps(out))
PY
)"

exec "$RAY" job submit --address "$ADDRESS" --working-dir "$REPO" \
  --runtime-env-json "$RUNTIME_ENV" "${WAIT[@]}" -- "$PYTHON" -m fl_lightning "$CMD" "$@"
