#!/bin/bash

# Parameters
#SBATCH --account='<BANK>'
#SBATCH --array=0-2%3
#SBATCH --cpus-per-task=21
#SBATCH --error=/scratch/scalegnn/fig7-tuolumne/.submitit/%A_%a/%A_%a_0_log.err
#SBATCH --job-name=scalegnn-fig7-16x4
#SBATCH --nodes=16
#SBATCH --ntasks-per-node=4
#SBATCH --open-mode=append
#SBATCH --output=/scratch/scalegnn/fig7-tuolumne/.submitit/%A_%a/%A_%a_0_log.out
#SBATCH --partition=pbatch
#SBATCH --qos=normal
#SBATCH --signal=USR2@120
#SBATCH --time=60
#SBATCH --wckey=submitit

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

# command
export SUBMITIT_EXECUTOR=slurm
srun --unbuffered --output /scratch/scalegnn/fig7-tuolumne/.submitit/%A_%a/%A_%a_%t_log.out --error /scratch/scalegnn/fig7-tuolumne/.submitit/%A_%a/%A_%a_%t_log.err --gpus-per-task=1 --gpu-bind=closest --cpu-bind=cores python3 -u -m submitit.core._submit /scratch/scalegnn/fig7-tuolumne/.submitit/%j
