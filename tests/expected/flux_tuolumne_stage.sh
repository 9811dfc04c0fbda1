#!/bin/bash
# flux: --nodes=1
# flux: --time-limit=120m
# flux: --job-name=scalegnn-fig7-stage
# flux: --output=/scratch/scalegnn/fig7-tuolumne/.flux/scalegnn-fig7-stage-{{id}}.out
# flux: --bank=<BANK>
# flux: --queue=pbatch
# flux: --exclusive

# setup
module load rocm/6.2.1
source ${SCALEGNN_VENV:?set SCALEGNN_VENV to a virtualenv with the ROCm torch wheel and scalegnn installed}/bin/activate
export LD_LIBRARY_PATH=${AWS_OFI_RCCL_LIB:-/collab/usr/global/tools/rccl/${SYS_TYPE}/rocm-6.2.1/install/lib}:$LD_LIBRARY_PATH
export GLOO_SOCKET_IFNAME="hsi0"
export NCCL_SOCKET_IFNAME="hsi0"
export NCCL_NET_GDR_LEVEL="3"
export NCCL_CROSS_NIC="1"
export FI_PROVIDER="cxi"
export FI_CXI_ATS="0"
export FI_CXI_RDZV_PROTO="alt_read"
export FI_MR_CACHE_MONITOR="kdreg2"
export FI_CXI_DEFAULT_CQ_SIZE="131072"
export HSA_XNACK="1"
export MIOPEN_USER_DB_PATH="/tmp/miopen-${USER}"
export MIOPEN_CUSTOM_CACHE_DIR="/tmp/miopen-${USER}"
export OMP_NUM_THREADS="21"
export OMP_NUM_THREADS=84  # staging: its task's CPUs

# data staged once: `scalegnn data shard` of each shard set of one graph, one task (a set whose shards exist is skipped)
flux run -N 1 -n 1 --cores-per-task=84 "${SCALEGNN_VENV}/bin/python" -u -m scalegnn.sweeps.flux /scratch/scalegnn/fig7-tuolumne/.flux/tasks/stage-isolate-3-8m-1x4x2x2-none-s0-9a3212880b.json
