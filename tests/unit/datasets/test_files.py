"""A graph of your own as a file (scalegnn/datasets/files.py): npz and folder arrays (dense
or CSR features, with or without a split), edge lists, Matrix Market, named featureless
graphs, node data beside an edge list, and every bad file refused before any work with
one line naming the file, the problem and the fix.

Every test runs with its own cache folder and with ``SCALEGNN_OFFLINE=1`` (conftest.py).

Bad graph npz files: one with 0 vertices crashed ("zero-size array to reduction
operation maximum"); fractional or NaN vertex ids (edges, CSR, splits) were truncated
and training reported ``ok``. Now ``<npz>: 'x' has 0 rows: the graph has no vertices;
save x as an (N, F) array with N >= 1 rows, one per vertex`` and ``<npz>: 'edge_index'
holds non-integer vertex ids (first: 0.5); save it as an int64 array of the intended
ids``, for ``scalegnn train`` and ``scalegnn data shard`` alike.

Properties (hypothesis): the loaders (``edgelist:`` files with random non-contiguous
ids, comments, headers, blank lines and extra columns; ``npz:`` arrays) give the
undirected, self-loop-free pattern of the input over the renumbered ids, or a
DatasetError (a ValueError with a message), never another exception.
"""

from __future__ import annotations

import logging
import re
import tempfile
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp
import torch
from hypothesis import given
from hypothesis import strategies as st

from scalegnn.config import make_config
from scalegnn.datasets import DatasetError, describe, load_dataset
from scalegnn.launch import launch
from tests.files import C, F, N, assert_same_graph, graph_arrays, sparse_npz
from tests.graphs import assert_csr_invariants, assert_raw, split_sizes
from tests.runs import one_line_error
from tests.strategies import SETTINGS, edge_lists


def _byo_arrays(n=10):
    rng = np.random.default_rng(1)
    return {
        "edge_index": np.array([[0, 1, 2, 3, 3, 9], [1, 2, 0, 4, 3, 8]]),
        "x": rng.standard_normal((n, 3)).astype(np.float32),
        "y": np.array([0, 1, 2, 0, 1, 2, 0, 1, 2, -1]),
        "train_idx": np.array([0, 1, 2, 3]),
        "val_idx": np.array([4, 5]),
        "test_idx": np.array([6, 7, 8]),
    }


def test_byo_npz_and_dir_agree(tmp_path):
    a = _byo_arrays()
    np.savez(tmp_path / "g.npz", **a)
    folder = tmp_path / "arrays"
    folder.mkdir()
    for k, v in a.items():
        np.save(folder / f"{k}.npy", v)
    g = load_dataset(f"npz:{tmp_path / 'g.npz'}")
    h = load_dataset(f"dir:{folder}")
    assert g.name == f"npz:{tmp_path / 'g.npz'}" and h.name == f"dir:{folder}"
    assert (g.num_nodes, g.num_classes, g.num_edges) == (10, 3, 10)  # loop 3-3 dropped, symmetrized
    for f in ("indptr", "indices", "x", "y", "train_idx", "val_idx", "test_idx"):
        assert torch.equal(getattr(g, f), getattr(h, f)), f
    assert_raw(g)


def test_byo_csr_masks_and_directed(tmp_path):
    n = 4
    masks = {s: np.zeros(n, bool) for s in ("train_mask", "valid_mask", "test_mask")}
    masks["train_mask"][:2], masks["valid_mask"][2], masks["test_mask"][3] = True, True, True
    np.savez(
        tmp_path / "d.npz",
        indptr=np.array([0, 2, 3, 3, 4]),
        indices=np.array([1, 2, 2, 0]),
        values=np.array([2.0, 3.0, 4.0, 5.0]),
        x=np.ones((n, 2)),
        y=np.array([[1, 0], [0, 1], [1, 1], [0, 0]]),
        undirected=np.array(False),
        **masks,
    )
    g = load_dataset(f"npz:{tmp_path / 'd.npz'}")
    assert g.multilabel and g.num_classes == 2
    assert g.indptr.tolist() == [0, 2, 3, 3, 4] and g.values.tolist() == [2.0, 3.0, 4.0, 5.0]  # kept as given
    assert split_sizes(g) == (2, 1, 1)


def test_byo_weights_made_undirected_are_used_not_dropped(tmp_path, caplog):
    """values with the default undirected=True: used (each pair the mean of its two
    directions' weights), the graph marked weighted and, one-way edges given, symmetrized
    with a warning; all-one values are the unweighted graph."""
    a = {**_byo_arrays(), "edge_index": np.array([[0, 1, 2, 1, 9], [1, 0, 3, 2, 8]]),
         "values": np.array([2.0, 4.0, 5.0, 1.0, 7.0])}
    np.savez(tmp_path / "w.npz", **a)
    with caplog.at_level(logging.WARNING, logger="scalegnn"):
        g = load_dataset(f"npz:{tmp_path / 'w.npz'}", cache=False)
    dense = g.to_torch_csr().to_dense()
    assert dense[0, 1] == dense[1, 0] == 3.0 and dense[2, 3] == dense[3, 2] == 5.0 and dense[8, 9] == 7.0
    assert dense[1, 2] == dense[2, 1] == 1.0 and g.meta["weighted"] and g.meta["symmetrized"]
    assert g.meta["input_edges"] == 5 and "the edges given are not symmetric (5 edges" in caplog.text
    np.savez(tmp_path / "ones.npz", **{**a, "values": np.ones(5)})
    assert "weighted" not in load_dataset(f"npz:{tmp_path / 'ones.npz'}", cache=False).meta


def test_a_users_edge_list_given_one_way_is_said_a_named_dataset_is_not(tmp_path, caplog, shared_data):
    (tmp_path / "one-way.txt").write_text("0 1\n1 2\n2 0\n2 3\n")
    (tmp_path / "both.txt").write_text("0 1\n1 0\n1 2\n2 1\n2 3\n3 2\n0 3\n3 0\n")
    with caplog.at_level(logging.WARNING, logger="scalegnn"):
        one_way = load_dataset(f"edgelist:{tmp_path / 'one-way.txt'}", cache=False)
        both = load_dataset(f"edgelist:{tmp_path / 'both.txt'}", cache=False)
        cora = load_dataset("cora", data_root=shared_data)
    assert one_way.record_info()["symmetrized"] and one_way.record_info()["input_edges"] == 4
    assert "symmetrized" not in both.meta and "symmetrized" not in cora.meta
    said = [r.getMessage() for r in caplog.records if "not symmetric" in r.getMessage()]
    assert len(said) == 1 and "one-way.txt" in said[0] and "(8 entries)" in said[0]
    assert not any("not read" in r.getMessage() for r in caplog.records)


def test_the_values_of_a_users_file_are_said_not_read(tmp_path, caplog):
    """An edge list's third column, a real Matrix Market file's values: said (a warning,
    the record's graph.unread), never silently dropped; a pattern file says nothing."""
    ring = [(i, (i + 1) % 12) for i in range(12)]
    ring += [(j, i) for i, j in ring]
    (tmp_path / "w.txt").write_text("src dst weight\n" + "".join(f"{i} {j} {0.5 + i}\n" for i, j in ring))
    rows, cols = np.array(ring).T
    scipy.io.mmwrite(tmp_path / "w.mtx", sp.coo_matrix((np.full(rows.size, 2.5), (rows, cols))))
    scipy.io.mmwrite(tmp_path / "p.mtx", sp.coo_matrix((np.ones(rows.size), (rows, cols))), field="pattern")
    with caplog.at_level(logging.WARNING, logger="scalegnn"):
        listed = load_dataset(f"edgelist:{tmp_path / 'w.txt'}", cache=False, seed=1)
        market = load_dataset(f"mtx:{tmp_path / 'w.mtx'}", cache=False, seed=1)
        pattern = load_dataset(f"mtx:{tmp_path / 'p.mtx'}", cache=False, seed=1)
    assert listed.record_info()["unread"].startswith("columns 3 to 3 of w.txt (weights, timestamps) are not read")
    assert market.record_info()["unread"].startswith("the real values of w.mtx are not read")
    assert "unread" not in pattern.meta and bool((listed.values == 1).all())
    assert sum("are not read" in r.getMessage() for r in caplog.records) == 2


def test_byo_missing_key_names_key_and_shape(tmp_path):
    a = _byo_arrays()
    del a["test_idx"]
    np.savez(tmp_path / "g.npz", **a)
    with pytest.raises(DatasetError, match=r"missing key 'test_idx' \(expected a 1-D int array.*'test_mask'.*or none"):
        load_dataset(f"npz:{tmp_path / 'g.npz'}")
    a = _byo_arrays()
    del a["edge_index"]
    np.savez(tmp_path / "h.npz", **a)
    with pytest.raises(DatasetError, match=r"missing key 'edge_index' \(expected a \(2, E\) int array\)"):
        load_dataset(f"npz:{tmp_path / 'h.npz'}")


def test_byo_without_a_split_gets_the_seeded_random_split(tmp_path):
    """No split keys at all: the labeled vertices (9 of 10 here) are split 50/25/25 by
    the seed, the graph says so, and another seed is another split (not a cached one)."""
    a = {k: v for k, v in _byo_arrays().items() if not k.endswith("_idx")}
    np.savez(tmp_path / "g.npz", **a)
    folder = tmp_path / "arrays"
    folder.mkdir()
    for k, v in a.items():
        np.save(folder / f"{k}.npy", v)
    for name in (f"npz:{tmp_path / 'g.npz'}", f"dir:{folder}"):
        g, again, other = (load_dataset(name, seed=s) for s in (3, 3, 4))
        assert g.meta["split"] == "random 50/25/25 seed 3 (the file has no split)"
        assert sorted(torch.cat([g.train_idx, g.val_idx, g.test_idx]).tolist()) == list(range(9))  # 9 unlabeled
        assert split_sizes(g) == (4, 2, 3)  # round(4.5) = 4, round(2.25) = 2, the rest
        assert torch.equal(g.train_idx, again.train_idx)
        assert not torch.equal(g.train_idx, other.train_idx) and other.meta["split"].endswith("seed 4 (the file has no split)")


EDGELIST = """# a comment
% another comment style
src,dst
10,20
20,10
20,30,0.5
30,30
40,10
10,20
"""


def test_edgelist_featureless_protocol(tmp_path):
    f = tmp_path / "g.csv"
    f.write_text(EDGELIST)
    g = load_dataset(f"edgelist:{f}", seed=3)
    # ids {10, 20, 30, 40} -> 0..3; edges 0-1, 1-2, 3-0 (loop 30-30 and repeats dropped)
    assert g.num_nodes == 4 and g.num_edges == 6
    assert g.indptr.tolist() == [0, 2, 4, 5, 6] and g.indices.tolist() == [1, 3, 0, 2, 1, 0]
    assert (g.num_features, g.num_classes) == (128, 32)
    assert_raw(g)
    again = load_dataset(f"edgelist:{f}", seed=3, cache=False)
    other = load_dataset(f"edgelist:{f}", seed=4, cache=False)
    assert_same_graph(g, again)
    assert not torch.equal(g.x, other.x)


def test_edgelist_whitespace_and_bad_line(tmp_path):
    f = tmp_path / "g.txt"
    f.write_text("0 1\n1\t2 7\n\n2  3\n")
    assert load_dataset(f"edgelist:{f}").num_edges == 6
    h = tmp_path / "h.csv"  # SNAP-like: '#' comments, then a header, then pairs
    h.write_text("# Directed graph\n# Nodes: 5\nFromNodeId,ToNodeId\n0,1\n1,2\n2,3\n3,4\n4,0\n")
    g = load_dataset(f"edgelist:{h}")
    assert (g.num_nodes, g.num_edges) == (5, 10)
    bad = tmp_path / "bad.txt"
    bad.write_text("0 1\n1 2\nthree four\n")
    with pytest.raises(DatasetError, match=rf"{re.escape(str(bad))}, line 3: expected two integer vertex ids"):
        load_dataset(f"edgelist:{bad}")


def test_mtx_symmetric_and_general(tmp_path):
    a = sp.coo_matrix((np.ones(3), ([1, 2, 3], [0, 1, 1])), shape=(6, 6))  # lower triangle
    scipy.io.mmwrite(tmp_path / "sym.mtx", a, symmetry="symmetric")
    g = load_dataset(f"mtx:{tmp_path / 'sym.mtx'}")
    assert g.num_nodes == 6 and g.num_edges == 6  # vertices 4, 5 isolated but kept
    assert describe(g)["isolated"] == 2
    b = sp.coo_matrix((np.ones(4), ([0, 1, 2, 2], [1, 0, 2, 0])), shape=(4, 4))
    scipy.io.mmwrite(tmp_path / "gen.mtx", b)
    h = load_dataset(f"mtx:{tmp_path / 'gen.mtx'}")
    assert h.num_nodes == 4 and h.num_edges == 4 and h.meta["self_loops_dropped"] == 1
    assert_raw(g)
    assert_raw(h)
    scipy.io.mmwrite(tmp_path / "rect.mtx", sp.coo_matrix(np.ones((2, 3))))
    with pytest.raises(DatasetError, match="must be square"):
        load_dataset(f"mtx:{tmp_path / 'rect.mtx'}")


def test_named_featureless_graph_found_under_root(tmp_path):
    (tmp_path / "europe_osm").mkdir()
    a = sp.coo_matrix((np.ones(3), ([1, 2, 3], [0, 1, 2])), shape=(4, 4))
    scipy.io.mmwrite(tmp_path / "europe_osm" / "europe_osm.mtx", a, symmetry="symmetric")
    g = load_dataset("europe-osm", data_root=tmp_path)
    assert (g.name, g.num_nodes, g.num_edges, g.num_features) == ("europe-osm", 4, 6, 128)
    with pytest.raises(
        DatasetError,
        match=rf"isolate-3-8m: no graph file found; expected {re.escape(str(tmp_path / 'isolate-3-8m.mtx'))}",
    ):
        load_dataset("isolate-3-8m", data_root=tmp_path)


# ----------------------------------------------------------------------------- sparse features, node data beside
def test_dir_form_reads_scipy_save_npz_features(isolated_data):
    ei, x, y = graph_arrays()
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


# --------------------------------------------------------------------------- node data beside an edge list
def test_features_and_labels_beside_an_edge_list(isolated_data):
    """`<stem>.features.npz` (scipy CSR) and `<stem>.labels.npy` beside `<stem>.txt`:
    row v is vertex v (ids kept, N from the rows: vertex N-1 has no edge here), the
    features stay sparse, no stand-in is announced; the cache follows the side files."""
    ei, x, y = graph_arrays()
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
    ei, x, y = graph_arrays()
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

    ei, x, y = graph_arrays()
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


# ----------------------------------------------------------------------------- bad data, refused before any work
def _byo(path: Path, n: int = 40, **over) -> Path:
    rng = np.random.default_rng(0)
    arrays = dict(x=rng.standard_normal((n, 8)).astype(np.float32), y=rng.integers(0, 3, n),
                  edge_index=rng.integers(0, max(n, 1), (2, 4 * n)), train_idx=np.arange(n // 2),
                  val_idx=np.arange(n // 2, 3 * n // 4), test_idx=np.arange(3 * n // 4, n))
    arrays.update(over)
    np.savez(path, **{k: v for k, v in arrays.items() if v is not None})
    return path


BAD_NPZ = {
    "empty graph": (dict(n=0), "'x' has 0 rows: the graph has no vertices"),
    "fractional edge ids": (dict(edge_index=np.array([[0.5, 1.0], [2.0, 3.0]])),
                            "'edge_index' holds non-integer vertex ids (first: 0.5)"),
    "NaN edge id": (dict(edge_index=np.array([[np.nan, 1.0], [2.0, 3.0]])),
                    "'edge_index' holds non-integer vertex ids (first: nan)"),
    "fractional CSR ids": (dict(edge_index=None, indptr=np.array([0] + [1] * 40), indices=np.array([2.5])),
                           "'indices' holds non-integer vertex ids (first: 2.5)"),
    "fractional split ids": (dict(train_idx=np.array([0.0, 1.25, 2.0])),
                             "'train_idx' holds non-integer vertex ids (first: 1.25)"),
}


@pytest.mark.parametrize("case", list(BAD_NPZ))
@pytest.mark.parametrize("command", ["train", "data shard"])
def test_bad_graph_npz_is_one_line_before_any_work(tmp_path, capsys, monkeypatch, case, command):
    """The empty npz crashed ('zero-size array to reduction operation maximum');
    fractional ids were truncated and the run reported ok."""
    monkeypatch.setenv("SCALEGNN_CACHE_DIR", str(tmp_path / "cache"))
    over, message = BAD_NPZ[case]
    npz = _byo(tmp_path / "g.npz", **over)
    out = tmp_path / "out"
    if command == "train":
        argv = ["train", "--dataset", f"npz:{npz}", "--epochs", "1", "--out", str(out), "--quiet"]
    else:
        argv = ["data", "shard", f"npz:{npz}", "--grid", "1x2x1x1", "--out", str(out)]
    err = one_line_error(capsys, argv)
    assert message in err and str(npz) in err, err
    assert "save" in err  # the fix: how to write the array
    assert not out.exists() or not any(out.iterdir())  # no record, no shard


def test_integral_float_ids_are_still_accepted(tmp_path, monkeypatch):
    """Arrays saved from float tensors (0.0, 1.0, ...) hold valid ids: not an error."""
    monkeypatch.setenv("SCALEGNN_CACHE_DIR", str(tmp_path / "cache"))
    a = _byo(tmp_path / "a.npz")
    with np.load(a) as z:
        arrays = dict(z)
    np.savez(tmp_path / "b.npz", **{**arrays, "edge_index": arrays["edge_index"].astype(np.float64),
                                    "train_idx": arrays["train_idx"].astype(np.float32)})
    ints, floats = load_dataset(f"npz:{a}"), load_dataset(f"npz:{tmp_path / 'b.npz'}")
    assert torch.equal(ints.indptr, floats.indptr) and torch.equal(ints.indices, floats.indices)
    assert torch.equal(ints.train_idx, floats.train_idx)


# ----------------------------------------------------------------------------- properties (hypothesis)
@st.composite
def edge_list_files(draw):
    """Text of an edge list with random ids (not contiguous), comments, a header,
    blank lines, comma or whitespace separators and extra columns."""
    ids = draw(st.lists(st.integers(0, 10_000), min_size=1, max_size=12, unique=True))
    pair = st.tuples(st.sampled_from(ids), st.sampled_from(ids))
    edges = draw(st.lists(pair, min_size=1, max_size=30))
    sep = draw(st.sampled_from([" ", "\t", ",", "  "]))
    lines = []
    if draw(st.booleans()):
        lines.append(draw(st.sampled_from(["# a comment", "% matrix-ish comment", "# src dst"])))
    if draw(st.booleans()):
        lines.append(f"source{sep}target")
    for u, v in edges:
        extra = draw(st.sampled_from(["", f"{sep}1.5", f"{sep}7{sep}x"]))
        lines.append(f"{u}{sep}{v}{extra}")
        if draw(st.integers(0, 9)) == 0:
            lines.append("")
    return "\n".join(lines) + "\n", edges


def _undirected_without_loops(edges, relabel) -> set:
    out = set()
    for u, v in edges:
        if u != v:
            out |= {(relabel[u], relabel[v]), (relabel[v], relabel[u])}
    return out


@SETTINGS
@given(edge_list_files())
def test_edge_list_loader_gives_the_undirected_loop_free_graph_or_a_clear_error(data):
    text, edges = data
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "g.txt"
        path.write_text(text)
        try:
            g = load_dataset(f"edgelist:{path}", data_root=tmp, cache=False)
        except DatasetError as exc:  # e.g. too few vertices for a train/val/test split
            assert str(exc) and not isinstance(exc, (KeyError, IndexError))
            return
    distinct = sorted({x for e in edges for x in e})
    relabel = {old: new for new, old in enumerate(distinct)}
    assert g.num_nodes == len(distinct)
    assert_csr_invariants(g)
    assert {(int(r), int(c)) for r, c in zip(g.row_ids(), g.indices)} == _undirected_without_loops(edges, relabel)


@SETTINGS
@given(edge_lists(min_nodes=3), st.booleans(), st.booleans())
def test_npz_loader_keeps_isolated_vertices_and_cleans_edges(data, transpose, float_labels):
    n, edges = data
    rng = np.random.default_rng(n)
    y = rng.integers(0, 3, n)
    y[0] = 2
    arrays = {"x": rng.standard_normal((n, 4)).astype(np.float32),
              "y": y.astype(np.float64) if float_labels else y,
              "train_idx": np.arange(n), "val_idx": np.arange(n), "test_idx": np.arange(n)}
    ei = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    # (E, 2) is accepted too, except when E == 2, where (2, E) is the documented reading
    arrays["edge_index"] = ei if transpose and len(edges) != 2 else ei.T
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "g.npz"
        np.savez(path, **arrays)
        try:
            g = load_dataset(f"npz:{path}", data_root=tmp, cache=False)
        except DatasetError as exc:
            assert len(edges) == 0 or "edge" in str(exc), exc  # an empty edge list may be refused, clearly
            return
    assert g.num_nodes == n  # vertices come from x: isolated ones are kept
    assert_csr_invariants(g)
    want = _undirected_without_loops(edges, {v: v for v in range(n)})
    assert {(int(r), int(c)) for r, c in zip(g.row_ids(), g.indices)} == want


def test_a_graph_file_without_labels_trains_only_on_the_explicit_switch(tmp_path, capsys, monkeypatch):
    """An edge list with no labels file beside it: ``scalegnn train`` and ``scalegnn data
    shard`` refuse in one line naming the files looked for and the switch, with no
    record and no shard; with --stand-in-labels the run trains on the degree classes
    and its record says so; a labels file beside it needs no switch, even without
    features (random features stand in: the featureless protocol for features alone)."""
    monkeypatch.setenv("SCALEGNN_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.default_rng(0)
    edges = tmp_path / "g.txt"
    edges.write_text("".join(f"{a} {b}\n" for a, b in rng.integers(0, 40, (160, 2)) if a != b))
    out = tmp_path / "out"
    for argv in (["train", "--dataset", f"edgelist:{edges}", "--epochs", "1", "--out", str(out), "--quiet"],
                 ["data", "shard", f"edgelist:{edges}", "--grid", "1x2x1x1", "--out", str(out)]):
        err = one_line_error(capsys, argv)
        assert "32 balanced degree classes stand in for the labels" in err and "g.labels.npy" in err, err
        assert "pass --stand-in-labels (Python: stand_in_labels=True)" in err
        assert not out.exists() or not any(out.iterdir())
    rec = launch(make_config(dataset=f"edgelist:{edges}", epochs=1, hidden=8, progress=False,
                             out_dir=str(tmp_path / "runs"), stand_in_labels=True))
    assert rec["status"] == "ok" and "stand in for the labels" in rec["graph"]["stand_in"]
    assert rec["config"]["data"]["stand_in_labels"] is True
    nodes = 1 + max(int(w) for line in edges.read_text().split("\n") if line for w in line.split())
    np.save(tmp_path / "g.labels.npy", rng.integers(0, 3, nodes))
    rec = launch(make_config(dataset=f"edgelist:{edges}", epochs=1, hidden=8, progress=False,
                             out_dir=str(tmp_path / "runs2")))
    stand_in = rec["graph"]["stand_in"]
    assert rec["status"] == "ok" and "stand in for the features" in stand_in and "for the labels" not in stand_in
