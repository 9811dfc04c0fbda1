"""A GPU job's launch on the virtual GPU: ``--device cuda:N`` with several NCCL ranks per
node is refused under every launcher before any process group starts (each rank would
bind GPU N: NCCL's "Duplicate GPU detected"), as the ``--nproc`` path refuses it."""

from __future__ import annotations

import pytest

from scalegnn.launch.environment import check_one_gpu_per_rank, init_from_env, local_backend
from scalegnn.parallel.grid import ParallelConfig
from tests.vgpu.virtual import VirtualGpu

TORCHRUN = {"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "1"}
SRUN = {"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_LOCALID": "0", "SLURM_STEP_ID": "0",
        "SLURM_NODELIST": "n[1-2]", "SLURM_STEP_TASKS_PER_NODE": "4(x2)", "SLURM_NODEID": "0"}
FLUX = {"FLUX_TASK_RANK": "0", "FLUX_JOB_SIZE": "4", "FLUX_TASK_LOCAL_ID": "0", "FLUX_JOB_NNODES": "1",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}


@pytest.mark.parametrize("env", [TORCHRUN, SRUN, FLUX], ids=["torchrun", "srun", "flux"])
def test_cuda_n_with_several_nccl_ranks_per_node_is_refused_by_every_launcher(env, monkeypatch):
    for var in ("SLURM_PROCID", "FLUX_TASK_RANK", "SUBMITIT_EXECUTOR"):
        monkeypatch.delenv(var, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with VirtualGpu(), pytest.raises(ValueError, match=r"--device cuda:0 with 4 ranks per node .* --device cuda"):
        init_from_env(device="cuda:0")


def test_what_stays_allowed():
    check_one_gpu_per_rank("cuda:0", "nccl", 1, "srun")  # one rank per node binds the GPU it names
    check_one_gpu_per_rank("cuda:0", "gloo", 4, "torchrun")  # ranks sharing one GPU on purpose (tests)
    check_one_gpu_per_rank("cuda", "nccl", 4, "torchrun")  # each rank its local rank's GPU
    with VirtualGpu(), pytest.raises(ValueError, match="NCCL runs one rank per GPU"):
        local_backend(ParallelConfig(device="cuda:0", grid=(2, 1, 1, 1), nproc=2), 2)  # the --nproc path
