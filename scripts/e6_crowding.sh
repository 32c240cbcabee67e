#!/usr/bin/env bash
# E6 follow-up, exploratory (written after E6's result, not pre-registered): E6's oracle and
# oracle_permuted rows again at seeds 0-2 with eval.per_class=true (E6's settings; the reruns are
# not bit-identical to E6's runs: 3 of 6 final accuracies equal E6's, the others differ by
# 0.05-0.35 points), then scripts/e6_crowding.py relates each class's
# final accuracy to how close its target sits to another class's (docs/reproduce/README.md, E6).
#   OUT=runs/e6x  SEEDS="0 1 2"
set -euo pipefail
OUT=${OUT:-runs/e6x}
SEEDS=${SEEDS:-0 1 2}
FLL=${FLL:-fl-lightning}
BASE=(data=fmnist_digits20_eff model=mlp model.batch_norm=false data.partition=dirichlet data.alpha=0.3
      fl.num_clients=20 fl.rounds=30 fl.local_epochs=2 fl.batch_size=64 optim.lr=0.1 optim.momentum=0.9
      optim.weight_decay=0.00001 text=minilm runtime=serial logger=none eval.per_class=true
      method=fedglcl method.projector=linear "output_dir=$OUT" experiment=e6x)
for s in $SEEDS; do
  for t in oracle oracle_permuted; do
    [ -f "$OUT/e6x/${t}_s$s/summary.json" ] || $FLL run "${BASE[@]}" method.targets=$t seed=$s run_id=${t}_s$s --quiet
  done
done
python "$(dirname "$0")/e6_crowding.py" "$OUT/e6x" $SEEDS > docs/reproduce/controls_fedglcl_oracle/exploratory_crowding.json
