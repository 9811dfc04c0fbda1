#!/bin/bash

# Parameters
#SBATCH --account='<ACCOUNT>'
#SBATCH --array=0-3%4
#SBATCH --constraint=cpu
#SBATCH --cpus-per-task=128
#SBATCH --error=/scratch/scalegnn/fig7-perlmutter/.submitit/%A_%a/%A_%a_0_log.err
#SBATCH --job-name=scalegnn-fig7-stage
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --open-mode=append
#SBATCH --output=/scratch/scalegnn/fig7-perlmutter/.submitit/%A_%a/%A_%a_0_log.out
#SBATCH --qos=shared
#SBATCH --signal=USR2@120
#SBATCH --time=120
#SBATCH --wckey=submitit

# setup
module load pytorch/2.6.0
source ${SCALEGNN_VENV:?set SCALEGNN_VENV to a virtualenv made with --system-site-packages on top of the pytorch module, with scalegnn installed}/bin/activate
export GLOO_SOCKET_IFNAME="hsn0"
export NCCL_NET="AWS Libfabric"
export NCCL_SOCKET_IFNAME="hsn"
export NCCL_NET_GDR_LEVEL="PHB"
export NCCL_CROSS_NIC="1"
export FI_PROVIDER="cxi"
export FI_CXI_DISABLE_HOST_REGISTER="1"
export FI_MR_CACHE_MONITOR="userfaultfd"
export FI_CXI_DEFAULT_CQ_SIZE="131072"
export OMP_NUM_THREADS="16"
export OMP_NUM_THREADS=128  # staging: its task's CPUs

# command
export SUBMITIT_EXECUTOR=slurm
srun --unbuffered --output /scratch/scalegnn/fig7-perlmutter/.submitit/%A_%a/%A_%a_%t_log.out --error /scratch/scalegnn/fig7-perlmutter/.submitit/%A_%a/%A_%a_%t_log.err "${SCALEGNN_VENV}/bin/python" -u -m submitit.core._submit /scratch/scalegnn/fig7-perlmutter/.submitit/%j
