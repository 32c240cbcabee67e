#!/usr/bin/env bash
# FedAvg vs FedC-Tran vs FedLGT (+ the frozen-random ablation) on the Fashion-MNIST
# multi-label mosaics (docs/results_fedlgt.md); the setting is
# conf/experiment/fedlgt_fmnist_multilabel.yaml. Runs with a summary.json are skipped.
#   SEEDS="0 1 2"  OUT=runs  RUNS="fedavg fedctran fedlgt frozen"
set -euo pipefail
source "$(dirname "$0")/evidence_lib.sh"
OUT=${OUT:-runs}
SEEDS=${SEEDS:-0 1 2}
RUNS=${RUNS:-fedavg fedctran fedlgt frozen}
FLL=${FLL:-fl-lightning}
for run in $RUNS; do
  case $run in
    fedavg) args="method=fedavg model=cnn" ;;  # a plain multi-label CNN with BCE, same optimiser
    fedctran) args="method=fedctran" ;;
    fedlgt) args="method=fedlgt" ;;
    frozen) args="method=fedlgt method.label_embedding=frozen_random" ;;
    *) echo "unknown run $run" >&2; exit 2 ;;
  esac
  for seed in $SEEDS; do
    dir="$OUT/fedlgt_fmnist_multilabel/${run}_s${seed}"
    claim "$dir" || continue  # done, or held by a live run
    $FLL run +experiment=fedlgt_fmnist_multilabel $args seed=$seed run_id=${run}_s${seed} \
      runtime=serial logger=none output_dir=$OUT --quiet
  done
done
