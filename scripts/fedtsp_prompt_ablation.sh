#!/usr/bin/env bash
# FedTSP's prompt-tuning ablation at the paper's server budget (docs/results_fedtsp.md): FedTSP with its method defaults (E_s = 20 prompt steps per round,
# prompt lr 0.01 without momentum, logit scale from ln 100, clients' SGD lr 0.01 without
# momentum, as the authors' code) against the same with frozen prompts, 3 seeds.
# server/prototype_shift_mean|max and server/prompt_loss_before|after are in metrics.jsonl.
# The baselines (local training, FedProto, FedTGP) run the same setting and the same client
# optimiser (FedTSP's: SGD lr 0.01 without momentum, as HtFLlib gives every method).
#   SPECS="tuned frozen local fedproto fedtgp"  SEEDS="0 1 2"  OUT=runs
set -euo pipefail
source "$(dirname "$0")/evidence_lib.sh"
OUT=${OUT:-runs}
SEEDS=${SEEDS:-0 1 2}
SPECS=${SPECS:-tuned frozen local fedproto fedtgp}
FLL=${FLL:-fl-lightning}
COMMON="data=fmnist data.partition=dirichlet data.alpha=0.1 data.client_test_fraction=0.25
        data.train_subset=12000 data.test_subset=1000 model=htfe_cnn3 fl.num_clients=20
        fl.rounds=5 fl.local_epochs=1 fl.batch_size=32 optim.lr=0.01 optim.momentum=0
        runtime=serial logger=none
        experiment=fedtsp_prompts output_dir=$OUT"
for seed in $SEEDS; do
  for id in $SPECS; do
    case $id in
      tuned) args="method=fedtsp" ;;
      frozen) args="method=fedtsp method.tune_prompts=false" ;;
      local|fedproto|fedtgp) args="method=$id" ;;
      *) echo "unknown spec $id" >&2; exit 2 ;;
    esac
    dir="$OUT/fedtsp_prompts/${id}_s${seed}"
    claim "$dir" || continue  # done, or held by a live run
    $FLL run $args $COMMON seed=$seed run_id=${id}_s${seed} --quiet
  done
done
