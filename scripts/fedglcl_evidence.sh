#!/usr/bin/env bash
# FedGLCL vs label-driven baselines on Fashion-MNIST (docs/results.md, issue 5 point 6).
# 4 methods x 2 label-skew partitions x 3 seeds, same CNN, rounds and data for all.
# PARTS=shards or PARTS=dirichlet runs one half (two halves can run side by side); runs
# that already have a summary.json are skipped.
set -euo pipefail
OUT=${OUT:-runs}
PARTS=${PARTS:-shards dirichlet}
# Reduced from the paper (60k images, 5 local epochs, batch 256) to fit 2 CPU cores: the
# first 6,000 training images, 20 rounds of 1 local epoch; lr/batch keeps the paper's ratio
# (0.1/256 ~ 0.02/64 per sample). Test: the first 2,000 test images.
COMMON="data=fmnist data.train_subset=6000 data.test_subset=2000 model=cnn fl.num_clients=10
        fl.rounds=20 fl.local_epochs=1 fl.batch_size=64 optim.lr=0.02 runtime=serial
        runtime.threads_per_client=1 logger=none output_dir=$OUT"
for p in $PARTS; do
  case $p in
    shards) part="shards data.classes_per_client=2" ;;
    dirichlet) part="dirichlet data.alpha=0.3" ;;
  esac
  for method in fedavg fedprox moon fedglcl; do
    for seed in 0 1 2; do
      [ -f "$OUT/fmnist_$p/${method}_s${seed}/summary.json" ] && continue
      rm -rf "$OUT/fmnist_$p/${method}_s${seed}"  # an interrupted run starts over
      fl-lightning run method=$method data.partition=$part seed=$seed experiment=fmnist_$p \
        run_id=${method}_s${seed} $COMMON --quiet
    done
  done
done
