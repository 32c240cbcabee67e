#!/bin/bash
# FedTSP evidence (docs/results_fedtsp.md): 5 methods x 3 seeds, one run at a time.
cd "$(dirname "$0")/.."
# data root: $FL_LIGHTNING_DATA (default ~/.cache/fl_lightning/data)
COMMON="data=fmnist data.partition=dirichlet data.alpha=0.1 data.client_test_fraction=0.25 data.train_subset=12000 data.test_subset=1000 model=htfe_cnn3 model.feature_dim=384 fl.num_clients=20 fl.rounds=10 fl.local_epochs=1 fl.batch_size=32 optim.lr=0.01 optim.momentum=0.9 runtime=serial logger=none experiment=fedtsp_evidence output_dir=runs"
for seed in 0 1 2; do
  for spec in "local local" "fedproto fedproto" "fedtgp fedtgp" "fedtsp fedtsp" "fedtsp_notune fedtsp method.tune_prompts=false"; do
    set -- $spec
    id=$1; shift
    if [ -f runs/fedtsp_evidence/${id}_s${seed}/summary.json ]; then continue; fi
    echo "$(date +%T) start ${id} seed ${seed}"
    .venv/bin/fl-lightning run method=$@ $COMMON seed=$seed run_id=${id}_s${seed} --quiet || echo "FAILED ${id} ${seed}"
  done
done
echo "$(date +%T) all done"
