#!/usr/bin/env bash
# Copy the runs of a Ray cluster's head to this machine.
#
#   cluster/fetch_runs.sh [--output-dir DIR] [--dest DIR] CLUSTER_YAML [EXPERIMENT]
#
#   cluster/fetch_runs.sh ray_cluster.yaml cmp    # head:$FL_LIGHTNING_RUNS/runs/cmp/ -> ./runs/cmp/
#   cluster/fetch_runs.sh ray_cluster.yaml        # every experiment: head:.../runs/ -> ./runs/
#   fl-lightning compare runs/cmp                 # then works here
#
# A job's driver runs on the head and writes its run directory there; a relative output_dir
# (the default `runs`) is taken relative to $FL_LIGHTNING_RUNS on the node (set in
# ~/.fl_lightning_env by the yaml's setup_commands; default ~/fl_lightning_runs):
# $FL_LIGHTNING_RUNS/runs/<experiment>/<run id>. This copies that folder (or one experiment
# of it), checkpoints and W&B files included, into the same relative place here.
#
#   --output-dir DIR   the output_dir the runs used (default: runs). Relative: under the
#                      head's $FL_LIGHTNING_RUNS; absolute: that path on the head.
#   --dest DIR         the local folder (default: runs, relative to the current directory);
#                      EXPERIMENT, when given, is appended to it.
#
# It runs `ray rsync-down` with a copy of the yaml without `rsync_exclude`/`rsync_filter`:
# the yaml's upload excludes (runs, wandb, ...) apply to rsync-down too and would drop the
# runs and their W&B folders. Incremental: a second call copies only what is new.
# Variables: RAY (the ray CLI, default `ray`: run it from this project's .venv, whose Ray
# matches the nodes').
set -euo pipefail

RAY="${RAY:-ray}"
OUTPUT_DIR=runs
DEST=runs
die() { echo "fetch_runs: error: $*" >&2; exit 1; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --output-dir) OUTPUT_DIR="${2:?}"; shift 2 ;;
    --output-dir=*) OUTPUT_DIR="${1#--output-dir=}"; shift ;;
    --dest) DEST="${2:?}"; shift 2 ;;
    --dest=*) DEST="${1#--dest=}"; shift ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) break ;;
  esac
done
[[ $# -ge 1 && $# -le 2 ]] || die "usage: cluster/fetch_runs.sh [--output-dir DIR] [--dest DIR] CLUSTER_YAML [EXPERIMENT]"
YAML="$1"
EXPERIMENT="${2:-}"
[[ -f "$YAML" ]] || die "no cluster config $YAML"
[[ "$EXPERIMENT" != */* && "$EXPERIMENT" != ".." ]] || die "EXPERIMENT is a folder name, not a path: $EXPERIMENT"

RAY_PATH="$(command -v "$RAY")" || die "no ray CLI ($RAY): activate this project's .venv or set RAY"
PY="$(dirname "$RAY_PATH")/python"
[[ -x "$PY" ]] || PY=python3
"$PY" -I -c 'import yaml' 2>/dev/null || die "$PY cannot import yaml (run from this project's .venv)"

# Ray keeps the cluster's state below RAY_TMPDIR (else TMPDIR, else /tmp): pin that, then point
# TMPDIR at a private folder so the config cache of the copied yaml goes away with it.
export RAY_TMPDIR="${RAY_TMPDIR:-${TMPDIR:-/tmp}}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/fl_fetch.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
export TMPDIR="$WORK"

"$PY" -I - "$YAML" "$WORK/cluster.yaml" <<'PY'
import sys, yaml
cfg = yaml.safe_load(open(sys.argv[1]))
cfg.pop("rsync_exclude", None)   # the upload excludes ("runs", "wandb", ...) would apply to the download
cfg.pop("rsync_filter", None)
yaml.safe_dump(cfg, open(sys.argv[2], "w"), sort_keys=False)
PY

# Where the runs are on the head (the node's own FL_LIGHTNING_RUNS), and whether they exist.
REMOTE="$(printf '. ~/.fl_lightning_env 2>/dev/null; base="${FL_LIGHTNING_RUNS:-$HOME/fl_lightning_runs}"; out=%q; exp=%q; ' "$OUTPUT_DIR" "$EXPERIMENT")"
REMOTE+='case "$out" in /*) src="$out" ;; "~"*) src="$HOME${out#"~"}" ;; *) src="$base/$out" ;; esac; '
REMOTE+='[ -n "$exp" ] && src="$src/$exp"; '
REMOTE+='if [ -d "$src" ]; then echo "FL_FETCH_SRC=$src"; else echo "FL_FETCH_MISSING=$src"; fi'
if ! OUT="$("$RAY" exec --no-config-cache "$WORK/cluster.yaml" "$REMOTE" 2>&1)"; then
  die "ray exec on the head failed (is the cluster up? \`ray up $YAML\`): $(printf '%s\n' "$OUT" | grep -v '^\s*$' | tail -n 1)"
fi
SRC="$(printf '%s\n' "$OUT" | tr -d '\r' | sed -n 's/^FL_FETCH_SRC=//p' | tail -n 1)"
MISSING="$(printf '%s\n' "$OUT" | tr -d '\r' | sed -n 's/^FL_FETCH_MISSING=//p' | tail -n 1)"
[[ -z "$MISSING" ]] || die "no runs on the head at $MISSING"
[[ -n "$SRC" ]] || die "could not read FL_LIGHTNING_RUNS on the head: $(printf '%s\n' "$OUT" | grep -v '^\s*$' | tail -n 1)"

[[ -n "$EXPERIMENT" ]] && DEST="$DEST/$EXPERIMENT"
mkdir -p "$DEST"
if ! OUT="$("$RAY" rsync-down "$WORK/cluster.yaml" "$SRC/" "$DEST/" 2>&1)"; then
  die "ray rsync-down of $SRC failed: $(printf '%s\n' "$OUT" | grep -v '^\s*$' | tail -n 1)"
fi
N="$(find "$DEST" -name summary.json -not -path '*/compare/*' | wc -l)"
echo "fetch_runs: $SRC (head) -> $DEST ($N finished or stopped runs with summary.json)"
