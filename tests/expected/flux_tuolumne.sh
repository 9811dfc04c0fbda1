#!/bin/bash
# flux: --nodes=16
# flux: --time-limit=60m
# flux: --job-name=scalegnn-fig7-16x4
# flux: --output=/scratch/scalegnn/fig7-tuolumne/.flux/scalegnn-fig7-16x4-{{id}}.out
# flux: --bank=<BANK>
# flux: --queue=pbatch
# flux: --exclusive
# flux: --dependency=afterok:'<staging job>'

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

# start-of-job check: torch build vs the loaded ROCm/CUDA, the network plugin, the python (sweeps/preflight.py)
"${SCALEGNN_VENV}/bin/python" -m scalegnn.sweeps.preflight --device rocm --net-plugin librccl-net.so || exit 1

# one `flux run` per run, one after another in this allocation
flux run -N 16 -n 64 --cores-per-task=21 --gpus-per-task=1 -o gpu-affinity=per-task -o cpu-affinity=per-task --signal=SIGUSR2@120s "${SCALEGNN_VENV}/bin/python" -u -m scalegnn.sweeps.flux /scratch/scalegnn/fig7-tuolumne/.flux/tasks/scalegnn-isolate-3-8m-g64-4x4x2x2-s0-d4da301fae.json || echo "run scalegnn-isolate-3-8m-g64-4x4x2x2-s0-d4da301fae failed: exit $?"
flux run -N 16 -n 64 --cores-per-task=21 --gpus-per-task=1 -o gpu-affinity=per-task -o cpu-affinity=per-task --signal=SIGUSR2@120s "${SCALEGNN_VENV}/bin/python" -u -m scalegnn.sweeps.flux /scratch/scalegnn/fig7-tuolumne/.flux/tasks/scalegnn-products-14m-g64-2x4x4x2-s0-2b979d6040.json || echo "run scalegnn-products-14m-g64-2x4x4x2-s0-2b979d6040 failed: exit $?"
flux run -N 16 -n 64 --cores-per-task=21 --gpus-per-task=1 -o gpu-affinity=per-task -o cpu-affinity=per-task --signal=SIGUSR2@120s "${SCALEGNN_VENV}/bin/python" -u -m scalegnn.sweeps.flux /scratch/scalegnn/fig7-tuolumne/.flux/tasks/scalegnn-ogbn-papers100m-g64-1x4x4x4-s0-9b8e3ebb64.json || echo "run scalegnn-ogbn-papers100m-g64-1x4x4x4-s0-9b8e3ebb64 failed: exit $?"
