#!/usr/bin/env bash
# FedAvg vs CReFF vs CLIP2FL on long-tailed Fashion-MNIST (docs/results_clip2fl.md) in
# conf/experiment/clip2fl_fmnist_lt.yaml's setting (imbalance factor 100, 20 clients,
# 8 per round, Dirichlet 0.5, ResNet-8 at width 2, the aligned teacher), shortened for one CPU
# core: ROUNDS rounds of EPOCHS local epochs, evaluation every 2 rounds, and SGD at LR for all
# three (CLIP2FL diverges in round 1 at the paper's 0.1 here: docs/results_clip2fl.md).
# Runs with a summary.json are skipped; seeds go outermost so a cut-short sweep stays balanced.
#   SEEDS="0 1 2"  OUT=runs  RUNS="fedavg creff clip2fl"
set -euo pipefail
source "$(dirname "$0")/evidence_lib.sh"
OUT=${OUT:-runs}
SEEDS=${SEEDS:-0 1 2}
RUNS=${RUNS:-fedavg creff clip2fl}
ROUNDS=${ROUNDS:-8}
EPOCHS=${EPOCHS:-2}
LR=${LR:-0.05}
FLL=${FLL:-fl-lightning}
$FLL teacher build +experiment=clip2fl_fmnist_lt  # cached after the first build
for seed in $SEEDS; do
  for run in $RUNS; do
    case $run in
      fedavg|creff|clip2fl) ;;
      *) echo "unknown run $run" >&2; exit 2 ;;
    esac
    dir="$OUT/clip2fl_fmnist_lt/${run}_s${seed}"
    claim "$dir" || continue  # done, or held by a live run
    $FLL run +experiment=clip2fl_fmnist_lt method=$run seed=$seed run_id=${run}_s${seed} \
      fl.rounds=$ROUNDS fl.local_epochs=$EPOCHS eval.every=2 optim.lr=$LR \
      runtime=serial logger=none output_dir=$OUT --quiet
  done
done
