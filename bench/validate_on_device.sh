#!/usr/bin/env bash
# The one command for a lent GPU machine (an H200 or H100 of the device tool), run from the
# repository root there with .whl carried. That machine has Python 3.12 with jax 0.11.2 and
# the CUDA 13 plugin but cannot install anything, and memprobe's own stack (jaxlib 0.12,
# CUDA 12 plugin) is far over what may travel; so memprobe runs from its source on the
# machine's jax, with flax and optax carried at the versions memprobe was tested with.
# The deviceless H200 (or, on an H100, H100) figures come from reports/ (computed here with
# memprobe's gpu extra).
#
# Prepare here, once:   ./bench/validate_on_device.sh --prepare
# (Extra arguments go to validate_gpu.py, ESTIMATES names another estimates file: for a
# dry run on a small model.)
# Then, with the device tool:  run(command="bash bench/validate_on_device.sh",
#                                  carry=[".whl"], timeout_s=600, kind="nvidia-h200")
# (an H100 works too: its estimates are picked, and steps over its HBM are measured as
# running out of memory, which is the check of a "does not fit" verdict).
set -uo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == "--prepare" ]]; then
    .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        -d .whl flax==0.12.12 optax==0.2.8 && ls -l .whl
    exit
fi

OUT=${OUT:-/tmp/validate-gpu-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# The carried flax needs the machine's treescope, orbax and tensorstore; should they be too
# old for it, the machine's own flax and optax are the next best thing (the log says so).
if ! python3 -c "import flax.nnx, optax" 2>"$OUT/import.err"; then
    echo "validate_on_device: carried flax/optax do not import here (import.err); using the machine's" \
        | tee -a "$OUT/log"
    export PYTHONPATH=$PWD
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/gpu.csv" 2>&1
# The deviceless estimates for the chip that is here: the tool lends an H100 unless an H200
# is asked for. Another chip is measured against the H200's (the table says so).
if [[ -z "${ESTIMATES:-}" ]]; then
    case "$(grep -io 'h100\|h200' "$OUT/gpu.csv" | head -1 | tr 'A-Z' 'a-z')" in
        h100) ESTIMATES=reports/gemma4-e2b-seq8192-b1-h100-1.json ;;
        *) ESTIMATES=reports/gemma4-e2b-seq8192-b1-h200-1.json ;;
    esac
fi
echo "validate_on_device: $(tail -n +2 "$OUT/gpu.csv" | head -1); estimates from $ESTIMATES" | tee -a "$OUT/log"
# 4 on-device compiles at once (16 cores, 128 GiB there; each autotunes on the GPU, so not
# all 8), then one process per strategy;
# all work stops at 480 s, so the table comes back inside the tool's 600 s.
python3 bench/validate_gpu.py --seq 8192 --batch 1 --estimates "$ESTIMATES" --out "$OUT" \
    --jobs 4 --budget "${BUDGET:-480}" "$@" 2>&1 | tee -a "$OUT/log"
