#!/bin/bash
# flux: --nodes=16
# flux: --time-limit=60m
# flux: --job-name=scalegnn-fig7-16x4
# flux: --output=/scratch/scalegnn/fig7-tuolumne/.flux/scalegnn-fig7-16x4-{{id}}.out
# flux: --bank=<BANK>
# flux: --queue=pbatch
# flux: --exclusive

# setup
module load rocm/6.2.1
source ${SCALEGNN_VENV:?set SCALEGNN_VENV to a virtualenv with the ROCm torch wheel and scalegnn installed}/bin/activate
export LD_LIBRARY_PATH=${AWS_OFI_RCCL_LIB:?set AWS_OFI_RCCL_LIB to the lib folder of the aws-ofi-rccl plugin}:$LD_LIBRARY_PATH
export NCCL_SOCKET_IFNAME="hsn0"
export NCCL_NET_GDR_LEVEL="3"
export NCCL_CROSS_NIC="1"
export FI_PROVIDER="cxi"
export FI_CXI_ATS="0"
export FI_CXI_RDZV_PROTO="alt_read"
export FI_MR_CACHE_MONITOR="kdreg2"
export FI_CXI_DEFAULT_CQ_SIZE="131072"
export HSA_XNACK="1"
export OMP_NUM_THREADS="21"

# data staged once: `scalegnn data shard`, one task (skipped when its shards exist)
flux run -N 1 -n 1 --cores-per-task=21 python3 -u -m scalegnn.sweeps.flux /scratch/scalegnn/fig7-tuolumne/.flux/tasks/stage-isolate-3-8m-4x4x2x2-none-s0-b49c77ce2f.json || echo "staging isolate-3-8m-4x4x2x2-none-s0-b49c77ce2f failed: exit $?"
flux run -N 1 -n 1 --cores-per-task=21 python3 -u -m scalegnn.sweeps.flux /scratch/scalegnn/fig7-tuolumne/.flux/tasks/stage-products-14m-2x4x4x2-none-s0-3b253da50f.json || echo "staging products-14m-2x4x4x2-none-s0-3b253da50f failed: exit $?"
flux run -N 1 -n 1 --cores-per-task=21 python3 -u -m scalegnn.sweeps.flux /scratch/scalegnn/fig7-tuolumne/.flux/tasks/stage-ogbn-papers100m-1x4x4x4-none-s0-f9818429b8.json || echo "staging ogbn-papers100m-1x4x4x4-none-s0-f9818429b8 failed: exit $?"

# one `flux run` per run, one after another in this allocation
flux run -N 16 -n 64 --cores-per-task=21 --gpus-per-task=1 -o gpu-affinity=per-task -o cpu-affinity=per-task --signal=SIGUSR2@120s python3 -u -m scalegnn.sweeps.flux /scratch/scalegnn/fig7-tuolumne/.flux/tasks/scalegnn-isolate-3-8m-g64-4x4x2x2-s0-d4da301fae.json || echo "run scalegnn-isolate-3-8m-g64-4x4x2x2-s0-d4da301fae failed: exit $?"
flux run -N 16 -n 64 --cores-per-task=21 --gpus-per-task=1 -o gpu-affinity=per-task -o cpu-affinity=per-task --signal=SIGUSR2@120s python3 -u -m scalegnn.sweeps.flux /scratch/scalegnn/fig7-tuolumne/.flux/tasks/scalegnn-products-14m-g64-2x4x4x2-s0-2b979d6040.json || echo "run scalegnn-products-14m-g64-2x4x4x2-s0-2b979d6040 failed: exit $?"
flux run -N 16 -n 64 --cores-per-task=21 --gpus-per-task=1 -o gpu-affinity=per-task -o cpu-affinity=per-task --signal=SIGUSR2@120s python3 -u -m scalegnn.sweeps.flux /scratch/scalegnn/fig7-tuolumne/.flux/tasks/scalegnn-ogbn-papers100m-g64-1x4x4x4-s0-9b8e3ebb64.json || echo "run scalegnn-ogbn-papers100m-g64-1x4x4x4-s0-9b8e3ebb64 failed: exit $?"
