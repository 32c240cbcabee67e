#!/usr/bin/env bash
# FedGLCL against FedAvg / FedProx / MOON on Fashion-MNIST (docs/results.md).
# Every method gets the same BN-free CNN (FedGLCL's projector is then linear:
# method.projector=auto), the same data, partition, rounds and plain SGD.
#   PARTS="shards dirichlet"  METHODS="fedavg fedglcl fedprox moon"  SEEDS="0 1 2"  OUT=runs
# MODEL=cnn_bn gives every method the same CNN with BatchNorm (FedGLCL's projector then ends in
# BatchNorm too) and pools the BN statistics exactly after each aggregation
# (fl.bn_stats=recompute) for every method; its runs go to <experiment>_bn.
# Runs that already have a summary.json are skipped; an interrupted one starts over.
# About 4-6 minutes per run on 2 CPU cores.
set -euo pipefail
source "$(dirname "$0")/evidence_lib.sh"
OUT=${OUT:-runs}
PARTS=${PARTS:-shards dirichlet}
METHODS=${METHODS:-fedavg fedglcl fedprox moon}
SEEDS=${SEEDS:-0 1 2}
FLL=${FLL:-fl-lightning}
MODEL=${MODEL:-cnn}
case $MODEL in
  cnn) suffix="" bn="" ;;
  cnn_bn) suffix="_bn" bn="fl.bn_stats=recompute" ;;
  *) echo "unknown MODEL $MODEL (cnn | cnn_bn)" >&2; exit 2 ;;
esac
# The issue's schedule: 1 local epoch over all 60,000 training images (10 clients), 5 rounds,
# batch 64, SGD lr 0.01 without momentum; all 10,000 test images after every round.
COMMON="data=fmnist model=$MODEL $bn text=minilm fl.num_clients=10 fl.rounds=5 fl.local_epochs=1
        fl.batch_size=64 optim.lr=0.01 optim.momentum=0 runtime=serial logger=none
        output_dir=$OUT"
for p in $PARTS; do
  case $p in
    shards) part="data.partition=shards data.classes_per_client=2" exp=evidence_shards2 ;;
    dirichlet) part="data.partition=dirichlet data.alpha=0.3" exp=evidence_dir03 ;;
    *) echo "unknown partition $p" >&2; exit 2 ;;
  esac
  exp=$exp$suffix
  for method in $METHODS; do
    for seed in $SEEDS; do
      dir="$OUT/$exp/${method}_s${seed}"
      claim "$dir" || continue  # done, or held by a live run
      $FLL run method=$method $part seed=$seed experiment=$exp run_id=${method}_s${seed} \
        $COMMON --quiet
    done
  done
done
