#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py) on a machine that may lack Ray and OmegaConf:
#   bash benchmarks/gpu_check.sh OUT [--dry-run] [more gpu_check.py options]
# run from anywhere in the repository. Where `python3` (or $PYTHON) cannot import ray and
# omegaconf, the wheels that `python benchmarks/gpu_prepare.py` wrote into .gpu/wheels (or
# $GPU_CHECK_PREP/wheels) are installed offline into $GPU_CHECK_SITE (default /tmp/fl_lightning_site)
# and put on PYTHONPATH (Ray's workers inherit it). Where FL_LIGHTNING_DATA is unset, the
# Fashion-MNIST subset carried in .gpu/data is the data root.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bash benchmarks/gpu_check.sh OUT [--dry-run] [gpu_check.py options]}
shift
py=${PYTHON:-python3}
prep=${GPU_CHECK_PREP:-.gpu}
site=${GPU_CHECK_SITE:-/tmp/fl_lightning_site}
if ! "$py" -c 'import ray, omegaconf' 2>/dev/null; then
    shopt -s nullglob
    wheels=("$prep"/wheels/*.whl)
    if [ ${#wheels[@]} -eq 0 ]; then
        echo "gpu_check: $py cannot import ray and omegaconf, and $prep/wheels holds no wheels;" \
             "run \`python benchmarks/gpu_prepare.py\` where PyPI is reachable and carry $prep" >&2
        exit 2
    fi
    echo "gpu_check: installing ${#wheels[@]} wheels from $prep/wheels into $site:" \
         "$(cd "$prep/wheels" && ls | sed 's/-py3.*\|-cp3.*//' | tr '\n' ' ')" >&2
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --disable-pip-version-check --target "$site" "${wheels[@]}"
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
if [ -z "${FL_LIGHTNING_DATA:-}" ] && [ -f "$prep/data/fashion-mnist/subset.json" ]; then
    export FL_LIGHTNING_DATA="$PWD/$prep/data"
    echo "gpu_check: data root $FL_LIGHTNING_DATA (the subset gpu_prepare.py wrote)" >&2
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$py" benchmarks/gpu_check.py --out "$out" "$@"
