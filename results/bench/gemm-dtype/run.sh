# Test accuracy at best validation, FP32 vs bf16 GEMM operands, Table I settings, seeds 0-2 (docs/benchmarks.md).
cd "$(dirname "$0")/../../.."
for seed in 0 1 2; do for d in facebook twitch-de; do for g in fp32 bf16; do
  OMP_NUM_THREADS=1 ${PY:-.venv/bin/python} -m scalegnn train --dataset $d --data-root ../shared/data --quiet --epochs 100 --eval-every 2 --seed $seed --gemm-dtype $g --out results/bench/gemm-dtype/$g > /tmp/gemm-dtype-$d-$seed-$g.log 2>&1
done; done; done
