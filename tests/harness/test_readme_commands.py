"""The README's shell commands run as written on a laptop (issue W: never surprise the user).

Every command of README.md's ``bash`` blocks is one test: bash runs the line as written, in
a working folder of its block (a user pastes a block into one shell, so ``scalegnn report
results/sweeps`` reads what the block's local sweep wrote), with no ``$PSCRATCH`` and no
``$USER`` (a laptop before logging in to a site), no network (``SCALEGNN_OFFLINE=1``) and a
data root and dataset cache of its own. The folder's parent holds ``shared/data`` (the real
graphs beside the repository, for ``--data-root ../shared/data``) and the files the README
says a user brings (``my_graph.npz``, ``g.txt``). A command that cannot run here is in
:data:`SKIPPED`, with why; one that takes over a minute on 2 cores is in :data:`SLOW`
(marked ``readme``: the tier ``make test-readme``, which ``.ci/run`` runs, keeping the
main suite short). Both lists name README commands: a stale entry fails, so every command
the README gains or changes is run, or skipped for a stated reason. The Python block is
``tests/integration/test_api.py``'s.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from tests.files import REPO, SHARED_DATA, graph_arrays, sparse_npz

README = REPO / "README.md"

SKIPPED = {
    "make demo": "creates .venv and installs torch and PyG from the package index (network), then a 90 s demo",
    "make test": "the whole test suite, this test included",
    "scalegnn train --dataset ogbn-products --batch-ratio 0.1 --device cuda --prefetch --compile":
        "needs a GPU (and downloads ogbn-products)",
    "torchrun --nproc-per-node 4 -m scalegnn train --dataset ogbn-products --grid 1x1x2x2 --prefetch --comm-dtype bf16":
        "the 4-GPU command: downloads ogbn-products (network)",
    "srun -N 2 --ntasks-per-node 4 --gpus-per-task 1 python -m scalegnn train --dataset ogbn-products --grid 2x1x2x2":
        "needs a SLURM cluster with GPUs",
    "scalegnn sweep fig7 --cluster perlmutter --account m1234_g --staging-account m1234":
        "a real submission: sbatch on Perlmutter",
    "scalegnn sweep fig7 --cluster frontier --account abc123": "a real submission: sbatch on Frontier",
    "scalegnn sweep fig7 --cluster tuolumne --account mybank": "a real submission: flux batch on Tuolumne",
}
SLOW = {  # seconds measured on 2 idle cores
    "scalegnn train --dataset facebook --data-root ../shared/data --batch-ratio 0.1 --layers 3 --hidden 256 "
    "--epochs 200": "about 190 s: 200 epochs of Facebook page-page",
    "scalegnn train --dataset csbm:n=100000,avg_degree=20 --nproc 8 --grid 1x2x2x2 --epochs 20":
        "about 250 s: 8 ranks on 2 cores",
    "scalegnn train --dataset edgelist:g.txt --nproc 4 --grid 1x2x2x1": "about 65 s: 4 ranks, 100 epochs",
}
AFTER = {  # a command that reads what an earlier command of its block wrote
    "scalegnn report results/sweeps --out results/report": "scalegnn sweep fig7 --cluster local",
}
NOT_SET = ("PSCRATCH", "USER")  # what a site's login node sets and a laptop does not


def readme_commands(text: str) -> list[tuple[int, str, str]]:
    """(block, line, command) of every line of the ``bash`` blocks: the line as written,
    and the command without its comment (the key of :data:`SKIPPED`, :data:`SLOW`)."""
    found = []
    for block, body in enumerate(re.findall(r"^```(?:bash|sh|shell)\n(.*?)^```", text, re.S | re.M)):
        for line in body.replace("\\\n", " ").splitlines():
            command = re.sub(r"\s+#.*$", "", line).strip()
            if command and not command.startswith("#"):
                found.append((block, line.strip(), command))
    return found


COMMANDS = readme_commands(README.read_text())


def _param(block: int, line: str, command: str):
    marks = [pytest.mark.skip(reason=SKIPPED[command])] if command in SKIPPED else []
    marks += [pytest.mark.readme] if command in SLOW else []
    return pytest.param(block, line, command, marks=marks, id=command[:80])


def _users_files(folder: Path) -> None:
    """The graphs the README's "your own graph" commands name: an npz (CSR features, no
    split) and an edge list with its features and labels beside it."""
    sparse_npz(folder / "my_graph.npz")
    edges, x, y = graph_arrays()
    np.savetxt(folder / "g.txt", edges.T, fmt="%d")
    sp.save_npz(folder / "g.features.npz", x)
    np.save(folder / "g.labels.npy", y)


@pytest.fixture(scope="module")
def blocks(tmp_path_factory):
    """block -> (its working folder, the commands already run there)."""
    made: dict[int, tuple[Path, set[str]]] = {}

    def folder(block: int) -> tuple[Path, set[str]]:
        if block not in made:
            base = tmp_path_factory.mktemp(f"readme-block-{block}")
            (base / "work").mkdir()
            if SHARED_DATA.is_dir():
                (base / "shared").mkdir()
                (base / "shared" / "data").symlink_to(SHARED_DATA, target_is_directory=True)
            _users_files(base / "work")
            made[block] = (base / "work", set())
        return made[block]

    return folder


def _run(line: str, work: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in NOT_SET}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",  # this venv's scalegnn
               SCALEGNN_OFFLINE="1", SCALEGNN_DATA_ROOT=str(work.parent / "data-root"),
               SCALEGNN_CACHE_DIR=str(work.parent / "cache"))
    return subprocess.run(["bash", "-c", line], cwd=work, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.parametrize("block, line, command", [_param(*c) for c in COMMANDS])
def test_a_readme_command_runs_as_written(block, line, command, blocks):
    if "../shared/data" in command and not SHARED_DATA.is_dir():
        pytest.skip(f"reads ../shared/data, absent here ({SHARED_DATA}); elsewhere it would download")
    work, done = blocks(block)
    for earlier in [AFTER[command]] if command in AFTER else []:
        if earlier not in done:  # this test alone (-k): its block's earlier command first
            before = _run(earlier, work)
            assert before.returncode == 0, f"{earlier}\n{before.stdout[-3000:]}\n{before.stderr[-3000:]}"
            done.add(earlier)
    proc = _run(line, work)
    assert proc.returncode == 0, f"{line}\nexit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    done.add(command)


def test_every_listed_command_is_in_the_readme():
    """SKIPPED, SLOW and AFTER name the README's commands exactly: an entry the README no
    longer has fails here (and the changed command runs, unless listed again)."""
    commands = {c for _, _, c in COMMANDS}
    stale = sorted((set(SKIPPED) | set(SLOW) | set(AFTER) | set(AFTER.values())) - commands)
    assert not stale, f"not a README command any more: {stale}"
    assert len(commands) > len(SKIPPED)  # something runs
    assert "scalegnn sweep fig7 --cluster perlmutter --dry-run" in commands  # the dry run a laptop runs first
