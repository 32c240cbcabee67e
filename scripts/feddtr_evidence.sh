#!/usr/bin/env bash
# FedDTR against the personalised-FL baselines (docs/results_feddtr.md) in
# conf/experiment/feddtr_fmnist.yaml's protocol (20 clients, all of them every round,
# Dirichlet 0.1, 25% of each client's data as its test split, batch 10, 1 local epoch, plain SGD
# lr 0.005), shortened for one CPU core: the first TRAIN images and ROUNDS rounds.
# Runs with a summary.json are skipped; seeds go outermost so a cut-short sweep stays balanced.
#   SEEDS="0 1 2"  OUT=runs  RUNS="fedavg fedper fedrep ditto fedrod feddtr feddtr_noprior"
set -euo pipefail
source "$(dirname "$0")/evidence_lib.sh"
OUT=${OUT:-runs}
SEEDS=${SEEDS:-0 1 2}
RUNS=${RUNS:-fedavg fedper fedrep ditto fedrod feddtr feddtr_noprior}
TRAIN=${TRAIN:-12000}
ROUNDS=${ROUNDS:-10}
FLL=${FLL:-fl-lightning}
for seed in $SEEDS; do
  for run in $RUNS; do
    case $run in
      feddtr_noprior) args="method=feddtr method.prior=false" ;;
      fedavg|fedper|fedrep|ditto|fedrod|feddtr) args="method=$run" ;;
      *) echo "unknown run $run" >&2; exit 2 ;;
    esac
    dir="$OUT/feddtr_fmnist/${run}_s${seed}"
    claim "$dir" || continue  # done, or held by a live run
    $FLL run +experiment=feddtr_fmnist $args seed=$seed run_id=${run}_s${seed} \
      data.train_subset=$TRAIN fl.rounds=$ROUNDS runtime=serial logger=none output_dir=$OUT --quiet
  done
done
