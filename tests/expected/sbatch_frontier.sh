#!/bin/bash

# Parameters
#SBATCH --account='<PROJECT>'
#SBATCH --array=0-2%3
#SBATCH --cpus-per-task=7
#SBATCH --dependency='afterok:<staging job>'
#SBATCH --error=/scratch/scalegnn/fig7-frontier/.submitit/%A_%a/%A_%a_0_log.err
#SBATCH --job-name=scalegnn-fig7-8x8
#SBATCH --kill-on-invalid-dep=yes
#SBATCH --nodes=8
#SBATCH --ntasks-per-node=8
#SBATCH --open-mode=append
#SBATCH --output=/scratch/scalegnn/fig7-frontier/.submitit/%A_%a/%A_%a_0_log.out
#SBATCH --partition=batch
#SBATCH --signal=USR2@120
#SBATCH --time=60
#SBATCH --wckey=submitit

# setup
module load PrgEnv-gnu rocm/6.2.4 craype-accel-amd-gfx90a miniforge3
source ${SCALEGNN_VENV:?set SCALEGNN_VENV to a virtualenv with the ROCm torch wheel and scalegnn installed}/bin/activate
export LD_LIBRARY_PATH=${AWS_OFI_RCCL_LIB:?set AWS_OFI_RCCL_LIB to the lib folder of the aws-ofi-rccl plugin}:$LD_LIBRARY_PATH
export GLOO_SOCKET_IFNAME="hsn0"
export NCCL_SOCKET_IFNAME="hsn0"
export NCCL_NET_GDR_LEVEL="3"
export NCCL_CROSS_NIC="1"
export FI_PROVIDER="cxi"
export FI_CXI_ATS="0"
export FI_CXI_RDZV_PROTO="alt_read"
export FI_MR_CACHE_MONITOR="kdreg2"
export FI_CXI_DEFAULT_CQ_SIZE="131072"
export FI_CXI_DEFAULT_TX_SIZE="2048"
export FI_CXI_RX_MATCH_MODE="hybrid"
export MIOPEN_USER_DB_PATH="/tmp/miopen-${USER}"
export MIOPEN_CUSTOM_CACHE_DIR="/tmp/miopen-${USER}"
export OMP_NUM_THREADS="7"
# start-of-job check: torch build vs the loaded ROCm/CUDA, the network plugin, the python (sweeps/preflight.py)
"${SCALEGNN_VENV}/bin/python" -m scalegnn.sweeps.preflight --device rocm --net-plugin librccl-net.so || exit 1

# command
export SUBMITIT_EXECUTOR=slurm
srun --unbuffered --output /scratch/scalegnn/fig7-frontier/.submitit/%A_%a/%A_%a_%t_log.out --error /scratch/scalegnn/fig7-frontier/.submitit/%A_%a/%A_%a_%t_log.err --gpus-per-task=1 --gpu-bind=closest --cpu-bind=cores "${SCALEGNN_VENV}/bin/python" -u -m submitit.core._submit /scratch/scalegnn/fig7-frontier/.submitit/%j
