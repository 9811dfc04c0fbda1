"""A graph of your own in one step (docs/datasets.md), from the file to the engine: an npz
with CSR features and no split trains in one command; the sparse features are never
densified on the way (load, cache, permutation, shard files, sampling, training and
evaluation, on one process and on spawned ranks); a sparse file trains exactly as the
same matrix stored dense. The file forms themselves are in tests/unit/datasets/test_files.py."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from scalegnn.cli import main
from scalegnn.config import make_config
from scalegnn.launch import launch, local_rank
from tests.files import F, N, only_record, sparse_npz


def _losses(rec):
    return [row["loss"] for row in rec["epochs"]]


def forbid_densify():
    """Make every dense conversion of a sparse matrix raise: torch's to_dense and
    scipy's toarray / todense (the conversions this code base has)."""
    def refuse(self, *args, **kwargs):
        raise AssertionError(f"a {tuple(self.shape)} sparse matrix was densified")

    torch.Tensor.to_dense = refuse
    sp._base._spbase.toarray = refuse
    sp._base._spbase.todense = refuse


def _no_densify_worker(rank, world, cfg, graph, run_id, backend):
    forbid_densify()  # in this spawned rank (a fresh process: the parent's patches are not inherited)
    return local_rank(rank, world, cfg, graph, run_id, backend)


# --------------------------------------------------------------------------- (a) one command
def test_sparse_npz_without_split_trains_in_one_command(isolated_data, capsys):
    """`scalegnn train --dataset npz:<file>` on a file with CSR features and no split:
    it trains, and the record says which split was used (the seeded default) and that
    the features stayed sparse."""
    path = sparse_npz(isolated_data / "g.npz")
    out = isolated_data / "runs"
    code = main(["train", "--dataset", f"npz:{path}", "--epochs", "2", "--hidden", "8", "--batch-ratio", "0.3",
                 "--out", str(out), "--quiet"])
    assert code == 0, capsys.readouterr()
    rec = only_record(out)
    assert rec["status"] == "ok"
    assert rec["graph"]["split"] == "random 50/25/25 seed 0 (the file has no split)"
    assert rec["graph"]["sparse_features"] is True and rec["graph"]["num_features"] == F


# --------------------------------------------------------------------------- (b) never densified
@pytest.mark.distributed
def test_the_sparse_path_never_densifies_the_features(isolated_data, monkeypatch):
    """With every dense conversion made to raise: load (parse, then from the cache),
    permutation, sharding to files (`scalegnn data shard`) and back, sampling, training
    and full-graph evaluation every epoch, on one process and on a 1x2x1x2 grid of
    spawned gloo ranks (rows and feature columns both split), ScaleGNN and the
    fullgraph-3d system (B = N, double permutation). The same runs densify when
    csr_block is planted to (checked by hand, see the report)."""
    path = sparse_npz(isolated_data / "g.npz")
    forbid = [(torch.Tensor, "to_dense"), (sp._base._spbase, "toarray"), (sp._base._spbase, "todense")]
    for owner, name in forbid:
        monkeypatch.setattr(owner, name, getattr(owner, name))  # restored after the test
    forbid_densify()
    with pytest.raises(AssertionError, match="densified"):  # the guard is armed
        torch.eye(2).to_sparse_csr().to_dense()
    base = dict(dataset=f"npz:{path}", epochs=2, eval_every=1, hidden=8, progress=False,
                out_dir=str(isolated_data / "runs"))
    for _ in range(2):  # parsed, then from the cache
        rec = launch(make_config(batch_ratio=0.3, permute="single", **base))
        assert rec["status"] == "ok" and rec["graph"]["sparse_features"], rec.get("error")
    shards = isolated_data / "shards"
    assert main(["data", "shard", f"npz:{path}", "--grid", "1x2x1x2", "--out", str(shards)]) == 0
    runs = [make_config(batch_ratio=0.3, grid=(1, 2, 1, 2), nproc=4, **base),
            make_config(batch_ratio=0.3, grid=(1, 2, 1, 2), nproc=4, shard_dir=str(shards), **base),
            make_config("fullgraph-3d", grid=(1, 2, 1, 2), nproc=4, **base)]
    for cfg in runs:
        rec = launch(cfg, timeout_s=240, rank_main=_no_densify_worker)
        assert rec["status"] == "ok", rec.get("error")
        assert all(row["test_acc"] is not None for row in rec["epochs"])  # evaluated every epoch
        assert rec["graph"]["sparse_features"] is True


# --------------------------------------------------------------------------- (c) parity
@pytest.mark.parametrize("grid", [pytest.param((1, 1, 1, 1), id="1x1x1x1"),
                                  pytest.param((1, 2, 1, 2), id="1x2x1x2", marks=pytest.mark.distributed)])
def test_sparse_file_trains_exactly_as_the_same_matrix_stored_dense(isolated_data, grid):
    """Equal epoch losses and accuracies, bit for bit. Why exact, not close: the engine
    turns a dense x sparser than 5 % (here 1/F) into CSR before any arithmetic
    (sampling.training_features), and that CSR is the canonical form the sparse file
    is brought to (columns sorted, no zeros: csr.csr_matrix), sliced the same way; so
    every product sees the same operands in the same order."""
    sparse = sparse_npz(isolated_data / "s.npz")
    dense = sparse_npz(isolated_data / "d.npz", dense=True)
    recs = []
    for path in (sparse, dense):
        cfg = make_config(dataset=f"npz:{path}", epochs=3, eval_every=1, hidden=8, batch_ratio=0.3, grid=grid,
                          nproc=None if grid == (1, 1, 1, 1) else 4, progress=False,
                          out_dir=str(isolated_data / "runs"))
        recs.append(launch(cfg, timeout_s=240))
    assert recs[0]["graph"]["sparse_features"] and not recs[1]["graph"]["sparse_features"]
    assert _losses(recs[0]) == _losses(recs[1])
    for a, b in zip(recs[0]["epochs"], recs[1]["epochs"]):
        assert (a["train_acc"], a["val_acc"], a["test_acc"]) == (b["train_acc"], b["val_acc"], b["test_acc"])


def test_denser_features_agree_within_float_rounding(isolated_data):
    """Above 5 % density the dense matrix stays dense (a GEMM) while the sparse file
    stays CSR (an SpMM): two kernels summing the same products. On this CPU they come
    out equal (observed), but nothing promises their summation order (a GPU GEMM
    blocks its sums), so equality is asked only up to float32 rounding: rtol 1e-5,
    while one wrong feature entry moves the loss by far more."""
    rng = np.random.default_rng(3)
    x = (rng.random((N, F)) < 0.2) * rng.random((N, F)).astype(np.float32)
    sparse = sparse_npz(isolated_data / "s.npz", x=x)
    dense = sparse_npz(isolated_data / "d.npz", dense=True, x=x)
    recs = [launch(make_config(dataset=f"npz:{p}", epochs=3, hidden=8, batch_ratio=0.3, progress=False,
                                     out_dir=str(isolated_data / "runs"))) for p in (sparse, dense)]
    assert _losses(recs[0]) == pytest.approx(_losses(recs[1]), rel=1e-5)
