#!/usr/bin/env bash
# A second, short GPU call after benchmarks/gpu_check.sh (2026-11-27): the cold start with
# `runtime=gpu`'s own placement, and where a round's time goes with `runtime.batched` and
# without, in one process (`runtime=serial` on the GPU: no Ray between the rounds and the
# numbers), sampled by py-spy (100 Hz, raw stacks). Needs what gpu_prepare.py wrote into .gpu/
# and py-spy's wheel in .gpu/prof/.  usage: bash benchmarks/gpu_batched_probe.sh OUT
# ALT=<a patch (.diff) or a folder of `<path>.alt` files>: first an A/B of the batched run, this
# tree against a copy with the patch applied (or those files swapped in), alternating twice. The
# batched path's host-side cut (issue 57 item 4), as a patch against this tree's runtime/:
# ALT=benchmarks/results/gpu/batched_host_on_cpu.diff MODES= COLD=0 (whole `.alt` files go stale
# once runtime/ changes: 2026-11-27's are in h100_2026-11-27/probe_attempt/alt).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bash benchmarks/gpu_batched_probe.sh OUT}
py=${PYTHON:-python3}
[[ $py == */* ]] && py="$(cd "$(dirname "$py")" && pwd)/$(basename "$py")"  # the A/B runs elsewhere
site=/tmp/fl_lightning_site
[ -n "${SKIP_INSTALL:-}" ] || "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --disable-pip-version-check --target "$site" .gpu/wheels/*.whl .gpu/prof/*.whl || exit 1
export PYTHONPATH="$site:$PWD" FL_LIGHTNING_DATA="$PWD/.gpu/data" WANDB_MODE=disabled PYTHONUNBUFFERED=1
spy=${PYSPY:-$site/bin/py-spy}
work=$(mktemp -d)
if [ -n "${ALT:-}" ]; then
    # A/B in one call (timings from two machines do not compare): a copy of the repository with
    # ALT's `<path>.alt` files in place of `<path>`, run alternately with this one, no py-spy
    alt=$work/alt_repo && mkdir -p "$alt" && cp -r fl_lightning conf "$alt/"
    if [ -f "$ALT" ]; then
        diff=$(cd "$(dirname "$ALT")" && pwd)/$(basename "$ALT")
        (cd "$alt" && { git apply "$diff" 2>/dev/null || patch -p1 -s < "$diff"; }) || { echo "ALT: $ALT does not apply"; exit 1; }
    else
        (cd "$ALT" && find . -name '*.alt') | while read -r f; do cp "$ALT/$f" "$alt/${f%.alt}"; done
    fi
    for rep in 1 2; do
        for variant in base alt; do
            root=$PWD; [ "$variant" = alt ] && root=$alt
            (cd "$root" && PYTHONPATH="$site:$root" timeout 90 "$py" -m fl_lightning run \
                method=fedavg data=fmnist data.partition=iid fl.num_clients=200 data.train_subset=12000 \
                data.test_subset=2000 fl.clients_per_round=50 fl.rounds=${ROUNDS:-5} fl.local_epochs=1 \
                fl.batch_size=10 optim.lr=0.05 optim.momentum=0 eval.clients=false logger=none seed=0 \
                runtime=serial runtime.accelerator=${ACCEL:-gpu} runtime.threads_per_client=1 \
                runtime.batched=50 output_dir="$work" experiment=ab run_id="${variant}_$rep" --quiet)
            echo "ab $variant $rep: exit $?"
            cp "$work/ab/${variant}_$rep/metrics.jsonl" "$out/metrics_ab_${variant}_$rep.jsonl" 2>/dev/null
        done
    done
fi
for mode in ${MODES-batched sequential}; do
    extra=(); [ "$mode" = batched ] && extra=(runtime.batched=50)
    SECONDS=0
    timeout 90 "$spy" record -r 100 -f raw -o "$out/pyspy_$mode.txt" -- "$py" -m fl_lightning run \
        method=fedavg data=fmnist data.partition=iid fl.num_clients=200 data.train_subset=12000 \
        data.test_subset=2000 fl.clients_per_round=50 fl.rounds=${ROUNDS:-5} fl.local_epochs=1 fl.batch_size=10 \
        optim.lr=0.05 optim.momentum=0 eval.clients=false logger=none seed=0 \
        runtime=serial runtime.accelerator=${ACCEL:-gpu} runtime.threads_per_client=1 "${extra[@]}" \
        output_dir="$work" experiment=probe run_id="$mode" --quiet
    echo "$mode: exit $? in $SECONDS s"
    cp "$work/probe/$mode/metrics.jsonl" "$out/metrics_$mode.jsonl" 2>/dev/null
    cp "$work/probe/$mode/summary.json" "$out/summary_$mode.json" 2>/dev/null
    gzip -f "$out/pyspy_$mode.txt"
done
[ "${COLD:-1}" = 0 ] || timeout 150 "$py" benchmarks/cold_start.py --reps 1 --rounds 1 --runtime ${COLD_RUNTIME:-gpu} --clients 8 \
    --out "$out/cold_start.json"
echo "cold_start: exit $?"
