"""Bring your own graph in one step: sparse features kept sparse from the file to the
engine, the --split flag, and node data beside an edge list."""

from __future__ import annotations

import json
import logging
import re

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from scalegnn.cli import main
from scalegnn.config import make_config
from scalegnn.datasets import DatasetError, load_dataset
from scalegnn.graph import Graph, GraphValidationError
from scalegnn.launch import launch, local_rank


N, F, C = 120, 64, 3
N, F, C = 120, 64, 3
N, F, C = 120, 64, 3


def _graph_arrays(seed=0):
    """A small planted-community graph with one-hot features (density 1/F, as a
    user's sparse one-hot file) that carry the label, and a few unlabeled vertices."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, C, N)
    y[:5] = -1
    cols = (np.maximum(y, 0) * (F // C) + rng.integers(0, F // C, N)).astype(np.int64)
    x = sp.csr_matrix((np.ones(N, np.float32), (np.arange(N), cols)), shape=(N, F))
    src = rng.integers(0, N, 600)
    dst = np.where(rng.random(600) < 0.8, rng.permutation(src), rng.integers(0, N, 600))
    return np.stack([src, dst]), x, y


def sparse_npz(path, dense=False, x=None, **extra):
    """The graph as an npz without a split: features as CSR parts, or ``dense``."""
    ei, x_sp, y = _graph_arrays()
    x_sp = x_sp if x is None else sp.csr_matrix(x)
    feats = {"x": x_sp.toarray()} if dense else {"x_indptr": x_sp.indptr, "x_indices": x_sp.indices,
                                                 "x_data": x_sp.data, "x_shape": np.array(x_sp.shape)}
    np.savez(path, edge_index=ei, y=y, **feats, **extra)
    return path


def _record(out):
    files = sorted(out.glob("*.json"))
    assert len(files) == 1, files
    return json.loads(files[0].read_text())


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
    rec = _record(out)
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


# --------------------------------------------------------------------------- Graph and files
def _csr(rows, cols, vals, shape):
    """A torch CSR tensor holding exactly the given entries (rows non-decreasing), in
    their order, duplicates and zeros included: no canonical form imposed."""
    ptr = torch.zeros(shape[0] + 1, dtype=torch.int64)
    ptr[1:] = torch.cumsum(torch.bincount(torch.tensor(rows, dtype=torch.int64), minlength=shape[0]), 0)
    return torch.sparse_csr_tensor(ptr, torch.tensor(cols), torch.tensor(vals), shape, check_invariants=False)


def _tiny(x, n=4):
    src, dst = torch.tensor([0, 1, 2]), torch.tensor([1, 2, 3])
    g = Graph(torch.zeros(n + 1, dtype=torch.long), [], [], x, torch.tensor([0, 1, 0, 1]), [0, 1], [2], [3], 2)
    return g.with_edges(src, dst).symmetrize()


def test_graph_keeps_a_sparse_x_sparse_and_canonical():
    """Unsorted columns, a duplicate entry and an explicit zero: the graph holds the
    canonical float32 CSR (sorted, duplicates summed, zero dropped); COO, scipy and
    integer input become the same; permute and subgraph keep it CSR and equal the dense."""
    rows, cols, vals = [0, 0, 0, 2, 2, 3], [3, 1, 1, 0, 2, 4], [1.0, 2.0, 3.0, 0.0, 4.0, 5.0]
    dense = torch.zeros(4, 5)
    for r, c, v in zip(rows, cols, vals):
        dense[r, c] += v
    g = _tiny(_csr(rows, cols, vals, (4, 5)))
    assert g.x.layout == torch.sparse_csr and g.x.dtype == torch.float32 and g.x.col_indices().dtype == torch.int64
    assert g.x.crow_indices().tolist() == [0, 2, 2, 3, 4] and g.x.col_indices().tolist() == [1, 3, 2, 4]
    assert g.x.values().tolist() == [5.0, 1.0, 4.0, 5.0]
    for other in (dense.to_sparse(), sp.csr_matrix(dense.numpy()), dense.to(torch.int64).to_sparse_csr()):
        x = _tiny(other).x
        assert x.layout == torch.sparse_csr and torch.equal(x.to_dense(), dense)
    perm = torch.tensor([2, 0, 3, 1])
    assert torch.equal(g.permute(perm).x.to_dense(), _tiny(dense).permute(perm).x)
    sub = g.subgraph(torch.tensor([3, 0, 2]))
    assert sub.x.layout == torch.sparse_csr and torch.equal(sub.x.to_dense(), dense[[3, 0, 2]])
    assert g.stats()["sparse_features"] and g.record_info()["sparse_features"]


@pytest.mark.parametrize("x, message", ids=["rows", "column", "nan", "complex"], argvalues=[
    (lambda: _csr([0, 1], [0, 1], [1.0, 1.0], (3, 2)), r"features must be an \(N, F\) matrix with N=4 rows"),
    (lambda: torch.sparse_csr_tensor(torch.tensor([0, 1, 1, 1, 2]), torch.tensor([0, 7]), torch.tensor([1., 1.]),
                                     (4, 3), check_invariants=False), r"column id 7 is outside \[0, 3\)"),
    (lambda: _csr([1], [0], [float("nan")], (4, 2)), r"NaN or inf \(first at row 1\)"),
    (lambda: torch.sparse_csr_tensor(torch.tensor([0, 1, 1, 1, 1]), torch.tensor([0]),
                                     torch.tensor([1 + 1j]), (4, 2)), "real values"),
])
def test_graph_refuses_a_bad_sparse_x_in_one_line(x, message):
    with pytest.raises(GraphValidationError, match=message) as err:
        _tiny(x())
    assert "\n" not in str(err.value)


def test_cache_round_trip_keeps_csr_and_the_dense_stay_dense(isolated_data):
    s, d = sparse_npz(isolated_data / "s.npz"), sparse_npz(isolated_data / "d.npz", dense=True)
    for path, layout in ((s, torch.sparse_csr), (d, torch.strided)):
        built, cached = (load_dataset(f"npz:{path}") for _ in range(2))
        assert not built.meta["from_cache"] and cached.meta["from_cache"]
        assert built.x.layout == cached.x.layout == layout
        assert torch.equal(built.x.to_dense(), cached.x.to_dense())


def test_from_pyg_keeps_a_sparse_x_sparse():
    from torch_geometric.data import Data

    x = torch.zeros(4, 6)
    x[0, 5] = x[3, 1] = 1.0
    data = Data(x=x.to_sparse_csr(), y=torch.tensor([0, 1, 0, 1]), edge_index=torch.tensor([[0, 1, 2], [1, 2, 3]]))
    g = Graph.from_pyg(data)
    assert g.x.layout == torch.sparse_csr and torch.equal(g.x.to_dense(), x)


def test_dir_form_reads_scipy_save_npz_features(isolated_data):
    ei, x, y = _graph_arrays()
    folder = isolated_data / "arrays"
    folder.mkdir()
    np.save(folder / "edge_index.npy", ei)
    np.save(folder / "y.npy", y)
    sp.save_npz(folder / "x.npz", x)
    g = load_dataset(f"dir:{folder}")
    assert g.x.layout == torch.sparse_csr and torch.equal(g.x.to_dense(), torch.from_numpy(x.toarray()))
    sp.save_npz(folder / "x.npz", x.tocsc())
    with pytest.raises(DatasetError, match=r"expected a CSR matrix saved by scipy.sparse.save_npz, got format 'csc'"):
        load_dataset(f"dir:{folder}", cache=False)


@pytest.mark.parametrize("change, message", ids=["both", "missing", "column", "shape", "indptr"], argvalues=[
    (lambda a: a.update(x=np.zeros((N, F), np.float32)), r"holds both 'x' and 'x_indptr'"),
    (lambda a: a.pop("x_data"), r"sparse features need all of .*; missing x_data"),
    (lambda a: a.update(x_indices=a["x_indices"] + F), r"column id \d+ is outside \[0, 64\)"),
    (lambda a: a.update(x_shape=np.array([N, F, 1])), r"'x_shape' must be two integers"),
    (lambda a: a.update(x_indptr=a["x_indptr"][:-1]), r"'indptr' has 120 entries; a matrix of 120 rows needs 121"),
])
def test_bad_sparse_features_in_a_file_are_one_line_errors(isolated_data, change, message):
    path = sparse_npz(isolated_data / "g.npz")
    with np.load(path) as z:
        a = dict(z)
    change(a)
    np.savez(path, **a)
    with pytest.raises(DatasetError, match=message) as err:
        load_dataset(f"npz:{path}", cache=False)
    assert "\n" not in str(err.value)


# --------------------------------------------------------------------------- --split
def _split_sizes(g):
    return tuple(t.numel() for t in (g.train_idx, g.val_idx, g.test_idx))


def test_split_flag_replaces_the_files_split_and_the_record_says_so(isolated_data):
    """A file with its own split: --split wins, drawn over the labeled vertices with
    --split-seed (default --seed); the record's graph.split names it and what it replaced."""
    ei, x, y = _graph_arrays()
    path = sparse_npz(isolated_data / "g.npz", train_idx=np.arange(5, 20), val_idx=np.arange(20, 30),
                      test_idx=np.arange(30, 40))
    cfg = make_config(dataset=f"npz:{path}", split="random:0.6,0.2,0.2", split_seed=7, epochs=1, hidden=8,
                      progress=False, out_dir=str(isolated_data / "runs"))
    assert cfg.data.split == "random:0.6,0.2,0.2"
    rec = launch(cfg)
    assert rec["graph"]["split"] == ("random 60/20/20 seed 7 (--split random:0.6,0.2,0.2; replaces: "
                                     f"{load_dataset(f'npz:{path}').meta['split']})")
    g = load_dataset(f"npz:{path}", split="random:0.6,0.2,0.2", split_seed=7)
    assert _split_sizes(g) == (69, 23, 23)  # of the 115 labeled: round(69.0), round(23.0), the rest
    assert not set(torch.cat([g.train_idx, g.val_idx, g.test_idx]).tolist()) & set(range(5))  # unlabeled left out
    other = load_dataset(f"npz:{path}", split="random:0.6,0.2,0.2", split_seed=8)
    assert not torch.equal(g.train_idx, other.train_idx)
    part = load_dataset(f"npz:{path}", split="random:0.2,0.1,0.1")  # below 1: the rest is in no split
    assert _split_sizes(part) == (23, 12, 12)


@pytest.mark.parametrize("flags, message", ids=["sum", "negative", "count", "numbers", "kind", "seed"], argvalues=[
    (["--split", "random:0.5,0.5,0.5"], r"sum to 1.5 > 1"),
    (["--split", "random:0.5,-0.1,0.2"], r"every fraction must be in \(0, 1\]"),
    (["--split", "random:0.5,0.25"], r"2 fractions, not 3"),
    (["--split", "random:a,b,c"], r"not three numbers"),
    (["--split", "planetoid"], r"the only kind is 'random'"),
    (["--split-seed", "3"], r"--split-seed needs --split"),
])
def test_bad_split_flags_are_one_line_errors(isolated_data, capsys, flags, message):
    path = sparse_npz(isolated_data / "g.npz")
    try:
        code = main(["train", "--dataset", f"npz:{path}", "--out", str(isolated_data / "runs"), *flags])
    except SystemExit as stop:  # argparse's usage error
        code = stop.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(("scalegnn: error:", "scalegnn train: error:")) and re.search(message, err)
    assert "random:TRAIN,VAL,TEST" in err or "--split-seed" in err
    assert not (isolated_data / "runs").exists()  # refused before any work


def test_split_flag_applies_to_every_file_form_and_pyg_graphs(isolated_data):
    ei, x, y = _graph_arrays()
    folder = isolated_data / "arrays"
    folder.mkdir()
    for key, value in (("edge_index", ei), ("x", x.toarray()), ("y", y)):
        np.save(folder / f"{key}.npy", value)
    (isolated_data / "g.txt").write_text("\n".join(f"{s} {d}" for s, d in ei.T))
    sp_adj = sp.coo_matrix((np.ones(ei.shape[1]), (ei[0], ei[1])), shape=(N, N))
    import scipy.io

    scipy.io.mmwrite(isolated_data / "g.mtx", sp_adj)
    for name in (f"npz:{sparse_npz(isolated_data / 'g.npz')}", f"dir:{folder}", f"edgelist:{isolated_data / 'g.txt'}",
                 f"mtx:{isolated_data / 'g.mtx'}", "csbm:n=200"):
        g = load_dataset(name, split="random:0.6,0.2,0.2")
        assert g.meta["split"].startswith("random 60/20/20 seed 0 (--split random:0.6,0.2,0.2; replaces: "), name
    from torch_geometric.data import Data

    import scalegnn

    data = Data(x=torch.from_numpy(x.toarray()), y=torch.from_numpy(y), edge_index=torch.from_numpy(ei))
    rec = scalegnn.train(data, split="random:0.6,0.2,0.2", epochs=1, hidden=8, progress=False,
                         out_dir=str(isolated_data / "runs"))
    assert rec["graph"]["split"].startswith("random 60/20/20 seed 0 (--split random:0.6,0.2,0.2; replaces: random "
                                            "50/25/25 seed 0 (the PyG object has no masks))")


@pytest.mark.parametrize("system", ["graphsage", "bns-gcn"])
def test_compared_systems_take_sparse_features_and_the_split(isolated_data, system):
    """The baselines read the same graph: CSR features (rows selected per batch), the
    --split split, both in their record."""
    import scalegnn

    path = sparse_npz(isolated_data / "g.npz")
    rec = scalegnn.train(system=system, dataset=f"npz:{path}", split="random:0.6,0.2,0.2", epochs=1, hidden=8,
                         progress=False, out_dir=str(isolated_data / "runs"))
    assert rec["status"] == "ok", rec.get("error")
    assert rec["graph"]["sparse_features"] and rec["graph"]["split"].startswith("random 60/20/20 seed 0 (--split")


def test_shards_remember_their_split(isolated_data, capsys):
    path = sparse_npz(isolated_data / "g.npz")
    shards = isolated_data / "shards"
    assert main(["data", "shard", f"npz:{path}", "--grid", "1x1x1x1", "--out", str(shards),
                 "--split", "random:0.6,0.2,0.2"]) == 0
    base = ["train", "--dataset", f"npz:{path}", "--shard-dir", str(shards), "--epochs", "1", "--hidden", "8",
            "--quiet", "--out", str(isolated_data / "runs")]
    assert main(base) == 2
    assert "written with --split random:0.6,0.2,0.2 but the run has no --split" in capsys.readouterr().err
    assert main(base + ["--split", "random:0.6,0.2,0.2"]) == 0
    assert _record(isolated_data / "runs")["graph"]["split"].startswith("random 60/20/20 seed 0 (--split")
    # --split-seed defaults to --seed (0): saying it is the same split, another seed is not
    assert main(base + ["--split", "random:0.6,0.2,0.2", "--split-seed", "0"]) == 0
    assert main(base + ["--split", "random:0.6,0.2,0.2", "--split-seed", "1"]) == 2
    assert "but the run has --split random:0.6,0.2,0.2 --split-seed 1" in capsys.readouterr().err


# --------------------------------------------------------------------------- node data beside an edge list
def test_features_and_labels_beside_an_edge_list(isolated_data):
    """`<stem>.features.npz` (scipy CSR) and `<stem>.labels.npy` beside `<stem>.txt`:
    row v is vertex v (ids kept, N from the rows: vertex N-1 has no edge here), the
    features stay sparse, no stand-in is announced; the cache follows the side files."""
    ei, x, y = _graph_arrays()
    keep = (ei < N - 1).all(0)
    edges = isolated_data / "g.txt"
    edges.write_text("\n".join(f"{s} {d}" for s, d in ei[:, keep].T))
    sp.save_npz(isolated_data / "g.features.npz", x)
    np.save(isolated_data / "g.labels.npy", y)
    g = load_dataset(f"edgelist:{edges}")
    assert g.num_nodes == N and not g.meta["ids_renumbered"] and "stand_in" not in g.meta
    assert g.x.layout == torch.sparse_csr and torch.equal(g.x.to_dense(), torch.from_numpy(x.toarray()))
    assert torch.equal(g.y, torch.from_numpy(y)) and g.num_classes == C
    assert g.meta["features"].startswith("from ") and g.meta["labels"] == f"from {isolated_data / 'g.labels.npy'}"
    assert not set(torch.cat([g.train_idx, g.val_idx, g.test_idx]).tolist()) & set(range(5))  # unlabeled
    relabeled = np.where(y >= 0, (y + 1) % C, y)
    np.save(isolated_data / "g.labels.npy", relabeled)
    assert torch.equal(load_dataset(f"edgelist:{edges}").y, torch.from_numpy(relabeled))  # not the stale cache
    np.save(isolated_data / "g.labels.npy", y[:50])
    with pytest.raises(DatasetError, match=r"must be \(120,\) or \(120, C\) to match the features"):
        load_dataset(f"edgelist:{edges}")


def test_beside_file_errors_name_the_fix(isolated_data):
    ei, x, y = _graph_arrays()
    edges = isolated_data / "g.edges"
    edges.write_text("\n".join(f"{s} {d}" for s, d in ei.T))
    np.save(isolated_data / "g.labels.npy", y[:100])
    with pytest.raises(DatasetError, match=r"vertex id 11\d but g.labels.npy has 100 rows; .*row v belongs to "
                                           r"vertex v, so ids must be < 100"):
        load_dataset(f"edgelist:{edges}")
    np.save(isolated_data / "g.labels.npy", y[:0])
    with pytest.raises(DatasetError, match=r"g.labels.npy: the labels file is empty \(0 rows\); give one label per vertex"):
        load_dataset(f"edgelist:{edges}")
    np.save(isolated_data / "g.labels.npy", np.full(len(y), -1))
    with pytest.raises(DatasetError, match=r"g.labels.npy: every entry of the labels file is -1 or NaN, so no vertex is labeled"):
        load_dataset(f"edgelist:{edges}")
    np.save(isolated_data / "g.labels.npy", y)
    np.save(isolated_data / "g.features.npy", x.toarray())
    sp.save_npz(isolated_data / "g.features.npz", x)
    with pytest.raises(DatasetError, match=r"both g.features.npy and g.features.npz lie beside it; keep one"):
        load_dataset(f"edgelist:{edges}")
    (isolated_data / "g.features.npz").unlink()
    g = load_dataset(f"edgelist:{edges}")  # dense features beside it stay dense
    assert g.x.layout == torch.strided and torch.equal(g.x, torch.from_numpy(x.toarray()))


class _Lines(logging.Handler):
    """The messages of one logger, whatever the logging set-up (`scalegnn` does not
    propagate to the root logger once the CLI configured it)."""

    def __init__(self, name):
        super().__init__(logging.WARNING)
        self.lines, self.logger = [], logging.getLogger(name)

    def emit(self, record):
        self.lines.append(record.getMessage())

    def __enter__(self):
        self.logger.addHandler(self)
        return self

    def __exit__(self, *exc):
        self.logger.removeHandler(self)

    @property
    def text(self):
        return "\n".join(self.lines)


def test_missing_node_data_is_stated_not_silent(isolated_data):
    """Labels beside a Matrix Market file but no features: the stand-in features are
    logged as a warning and recorded (graph.stand_in, graph.features); a bare edge list
    states both stand-ins."""
    import scipy.io

    ei, x, y = _graph_arrays()
    scipy.io.mmwrite(isolated_data / "g.mtx", sp.coo_matrix((np.ones(ei.shape[1]), (ei[0], ei[1])), shape=(N, N)))
    np.save(isolated_data / "g.labels.npy", y)
    with _Lines("scalegnn.datasets") as log:
        cfg = make_config(dataset=f"mtx:{isolated_data / 'g.mtx'}", epochs=1, hidden=8, progress=False,
                          out_dir=str(isolated_data / "runs"))
        rec = launch(cfg)
    graph = rec["graph"]
    assert graph["features"] == "random N(0,1), dim 128" and graph["labels"].startswith("from ")
    assert graph["stand_in"] == ("random N(0,1), dim 128 stand in for the features (no features file beside "
                                 "g.mtx; looked for g.features.npy, g.features.npz, g.labels.npy)")
    assert graph["stand_in"] in log.text
    (isolated_data / "bare.txt").write_text("0 1\n1 2\n2 3\n3 0\n0 2\n")
    with _Lines("scalegnn.datasets") as log:
        g = load_dataset(f"edgelist:{isolated_data / 'bare.txt'}")
    assert "stand in for the features; 32 balanced degree classes stand in for the labels" in g.meta["stand_in"]
    assert g.meta["stand_in"] in log.text


def test_data_list_names_the_new_forms(capsys):
    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out
    assert "<stem>.features.npy" in out and "<stem>.labels.npy" in out and "x_indptr/x_indices/x_data/x_shape" in out
    assert "x.npz (scipy.sparse.save_npz)" in out
