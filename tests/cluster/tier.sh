#!/usr/bin/env bash
# `make test-cluster`: the multi-node tier. Starts a SLURM cluster of NODES (default 3)
# namespaced nodes (localcluster.sh), prints its node count and host names, runs the
# tests marked `cluster` against it, and stops it by pid whatever the tests did.
#   tests/cluster/tier.sh PYTHON [NODES]
set -euo pipefail
py=${1:?usage: tier.sh PYTHON [NODES]}
nodes=${2:-3}
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d /tmp/scalegnn-cluster.XXXXXX)
trap 'bash "$here/localcluster.sh" down "$dir"' EXIT
bash "$here/localcluster.sh" up "$dir" "$nodes" >/dev/null
export SLURM_CONF=$dir/slurm.conf SCALEGNN_CLUSTER_CONF=$dir/slurm.conf
hosts=$(sinfo -h -N -o %N | sort -u | tr '\n' ' ')
echo "test-cluster: $(echo $hosts | wc -w) nodes: ${hosts% }; 2 ranks per node (SLURM_CONF=$SLURM_CONF)"
sinfo -N
# -s: the failure tests print their detection times (srun output stays captured).
"$py" -m pytest -q -s -m cluster "$here/../harness/test_cluster.py"
