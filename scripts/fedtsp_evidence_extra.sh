#!/bin/bash
# Extra runs: fedtgp seed 0 again (its server step now runs single-threaded, like seeds 1-2),
# and a diagnostic FedTSP with lambda = 1 (the paper's cross-device value).
cd "$(dirname "$0")/.."
# data root: $FL_LIGHTNING_DATA (default ~/.cache/fl_lightning/data)
COMMON="data=fmnist data.partition=dirichlet data.alpha=0.1 data.client_test_fraction=0.25 data.train_subset=12000 data.test_subset=1000 model=htfe_cnn3 model.feature_dim=384 fl.num_clients=20 fl.rounds=10 fl.local_epochs=1 fl.batch_size=32 optim.lr=0.01 optim.momentum=0.9 runtime=serial logger=none experiment=fedtsp_evidence output_dir=runs"
run() { id=$1; seed=$2; shift 2; [ -f runs/fedtsp_evidence/${id}_s${seed}/summary.json ] && return
  echo "$(date +%T) start ${id} seed ${seed}"; .venv/bin/fl-lightning run method=$@ $COMMON seed=$seed run_id=${id}_s${seed} --quiet || echo "FAILED ${id} ${seed}"; }
run fedtgp 0 fedtgp
for seed in 0 1 2; do run fedtsp_lam1 $seed fedtsp method.lam=1; done
echo "$(date +%T) all done"
