#!/usr/bin/env bash
# Issue L: a products-scale generated graph (2.4 M vertices, 62 M edges, 100 features, 47 classes):
# ScaleGNN two epochs in one process, then PyG full-batch GCN two epochs, each under /usr/bin/time -v.
# Usage: DATA=/scratch/dir bash benchmarks/products_scale.sh   (about 13 minutes and 23 GiB here)
cd "$(dirname "$0")/.."
DS="csbm:n=2400000,avg_degree=51,classes=47,feature_dim=100"
echo "== scalegnn $(date +%T) $(uptime)"
/usr/bin/time -v .venv/bin/python -m scalegnn train --dataset "$DS" --data-root "${DATA:-/tmp/products-data}" --epochs 2 --eval-every 2 \
  --batch-ratio 0.1 --out "${OUT:-results/bench/products-scale}" 2>&1 | grep -v USDT | grep -E "status|record|Maximum resident|Elapsed|User time|System time"
echo "== pyg $(date +%T) $(uptime)"
/usr/bin/time -v .venv/bin/python - "$DS" "${DATA:-/tmp/products-data}" <<'PY' 2>&1 | grep -v USDT | grep -E "^pyg|Maximum resident|Elapsed|User time|System time|Error|error"
import sys, time, torch
from scalegnn.datasets import load_dataset
from scalegnn.benchmarks.gpu import pyg_gcn_section
t = time.time()
g = load_dataset(sys.argv[1], data_root=sys.argv[2]).gcn_normalize()
print(f"pyg graph N={g.num_nodes} nnz={g.num_edges} loaded+normalized in {time.time()-t:.1f} s, threads {torch.get_num_threads()}", flush=True)
res = pyg_gcn_section(g, torch.device("cpu"), target=1.01, max_epochs=2, max_seconds=1e9)
print("pyg", {k: v for k, v in res.items() if k != "curve"}, "per-epoch", [round(a, 3) for _, a in res["curve"]], flush=True)
PY
echo "== end $(date +%T) $(uptime)"
