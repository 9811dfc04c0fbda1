"""The Python API: ``scalegnn.trainer`` on a PyG ``Data`` trains exactly what the
command line trains on the same graph; ``Graph.from_pyg`` / ``to_pyg`` convert both
ways; the README's example runs as written."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import scalegnn
from scalegnn.config import make_config
from scalegnn.graph import Graph
from scalegnn.launch import launch
from tests.files import SHARED_DATA, assert_same_graph
from tests.graphs import random_graph

README = Path(__file__).resolve().parents[2] / "README.md"


def _pyg_cora(root: Path):
    """Cora as PyG's own Planetoid dataset object reads it (raw files copied from the
    shared data, so nothing downloads)."""
    from torch_geometric.datasets import Planetoid

    raw = root / "Cora" / "raw"
    raw.mkdir(parents=True)
    for f in (SHARED_DATA / "planetoid_cora").glob("ind.cora.*"):
        shutil.copy(f, raw / f.name)
    return Planetoid(str(root), "Cora")[0]


def test_a_pyg_cora_is_the_loaders_cora_and_trains_the_same(tmp_path, shared_data):
    data = _pyg_cora(tmp_path / "pyg")
    graph = Graph.from_pyg(data, name="cora")
    assert graph.meta["split"] == "masks of the PyG object"
    # PyG holds x dense, the loader CSR (the layout rule): the same values, and the same
    # training input (sampling.training_features makes the dense one CSR by that rule).
    assert_same_graph(graph, scalegnn.load_dataset("cora", data_root=shared_data), same_layout=False)
    settings = dict(batch_ratio=0.5, layers=2, hidden=32, epochs=4, eval_every=2, seed=3)
    ours = scalegnn.train(data, dataset="cora", out_dir=str(tmp_path / "api"), **settings)
    cli = launch(make_config(dataset="cora", data_root=str(shared_data), out_dir=str(tmp_path / "cli"), **settings))
    assert ours["status"] == "ok" and ours["dataset"] == "cora" and Path(ours["path"]).parent == tmp_path / "api"
    assert [e["loss"] for e in ours["epochs"]] == [e["loss"] for e in cli["epochs"]]
    assert ours["summary"]["test_acc_at_best_val"] == cli["summary"]["test_acc_at_best_val"]


def test_from_pyg_without_masks_splits_the_labeled_vertices_and_says_so():
    from torch_geometric.data import Data

    g = random_graph(n=60, m=200, seed=1)
    y = g.y.clone()
    y[:6] = -1  # unlabeled vertices belong to no split
    data = Data(x=g.x, y=y, edge_index=torch.stack([g.row_ids(), g.indices]))
    got = Graph.from_pyg(data, seed=5)
    assert got.meta["split"] == "random 50/25/25 seed 5 (the PyG object has no masks)"
    from scalegnn.api import as_graph

    assert as_graph(data, seed=5).meta["split"] == got.meta["split"]
    parts = torch.cat([got.train_idx, got.val_idx, got.test_idx])
    assert sorted(parts.tolist()) == list(range(6, 60))
    assert [len(p) for p in (got.train_idx, got.val_idx, got.test_idx)] == [27, 14, 13]
    assert bool((got.values == 1).all()) and not bool((got.row_ids() == got.indices).any())  # raw: no self loops


def _dgl_python() -> str:
    import os

    dgl = os.environ.get("SCALEGNN_DGL_PYTHON") or str(Path(__file__).resolve().parents[2] / ".venv-dgl" / "bin" / "python")
    if not Path(dgl).exists():
        pytest.skip(f"no DGL environment ({dgl}); build it with `make dgl-env` (part of `make test`)")
    return dgl


def test_from_dgl_converts_a_real_dgl_cora_like_from_pyg(tmp_path, shared_data):
    """DGL's own graph object (dgl 2.1 in the DGL environment) built from PyG's Cora:
    Graph.from_dgl gives the loader's Cora with DGL's masks, a seeded random split
    without them, the labels given apart, and a one-line refusal of a heterograph."""
    import numpy as np

    data = _pyg_cora(tmp_path / "pyg")
    src, dst = data.edge_index
    np.savez(tmp_path / "cora.npz", src=src.numpy(), dst=dst.numpy(), n=data.num_nodes, x=data.x.numpy(),
             y=data.y.numpy(), train=data.train_mask.numpy(), val=data.val_mask.numpy(), test=data.test_mask.numpy())
    script = tmp_path / "from_dgl.py"
    script.write_text(
        "import sys, numpy as np, torch, dgl\n"
        "from scalegnn.graph import Graph, GraphValidationError\n"
        "a = np.load(sys.argv[1])\n"
        "g = dgl.graph((torch.from_numpy(a['src']), torch.from_numpy(a['dst'])), num_nodes=int(a['n']))\n"
        "g.ndata['feat'] = torch.from_numpy(a['x'])\n"
        "bare = dgl.graph(g.edges(), num_nodes=g.num_nodes())\n"
        "bare.ndata['feat'] = g.ndata['feat']\n"
        "g.ndata['label'] = torch.from_numpy(a['y'])\n"
        "for s in ('train', 'val', 'test'):\n"
        "    g.ndata[s + '_mask'] = torch.from_numpy(a[s])\n"
        "out = {}\n"
        "for tag, graph in (('masks', Graph.from_dgl(g, name='cora')),\n"
        "                   ('bare', Graph.from_dgl(bare, label=torch.from_numpy(a['y']), seed=4))):\n"
        "    for k in ('indptr', 'indices', 'values', 'x', 'y', 'train_idx', 'val_idx', 'test_idx'):\n"
        "        out[f'{tag}_{k}'] = getattr(graph, k).numpy()\n"
        "    out[f'{tag}_split'] = np.array(graph.meta['split'])\n"
        "    out[f'{tag}_source'] = np.array(graph.meta['source'])\n"
        "hetero = dgl.heterograph({('a', 'x', 'b'): ([0], [1])})\n"
        "try:\n"
        "    Graph.from_dgl(hetero)\n"
        "except GraphValidationError as e:\n"
        "    out['hetero'] = np.array(str(e))\n"
        "np.savez(sys.argv[2], **out)\n")
    import os

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([_dgl_python(), str(script), str(tmp_path / "cora.npz"), str(tmp_path / "out.npz")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = np.load(tmp_path / "out.npz")

    def graph(tag: str) -> Graph:
        arrays = {k: torch.from_numpy(got[f"{tag}_{k}"]) for k in
                  ("indptr", "indices", "values", "x", "y", "train_idx", "val_idx", "test_idx")}
        return Graph(**arrays, num_classes=7, name="cora")

    assert str(got["masks_split"]) == "masks in the DGL graph's ndata" and str(got["masks_source"]) == "DGLGraph"
    assert_same_graph(graph("masks"), scalegnn.load_dataset("cora", data_root=shared_data), same_layout=False)
    bare, pyg = graph("bare"), Graph.from_pyg(data.__class__(x=data.x, y=data.y, edge_index=data.edge_index), seed=4)
    assert str(got["bare_split"]) == "random 50/25/25 seed 4 (the DGL graph has no masks)"
    for k in ("indptr", "indices", "x", "y", "train_idx", "val_idx", "test_idx"):
        assert torch.equal(getattr(bare, k), getattr(pyg, k)), k  # one conversion: from_dgl is from_pyg's
    assert "convert it with dgl.to_homogeneous" in str(got["hetero"])


def test_to_pyg_and_back_is_the_same_graph():
    g = random_graph(n=50, m=180, seed=2)
    raw = g.replace(meta={})  # random_graph is normalized: take its pattern as a raw graph
    raw = Graph.from_pyg(raw.to_pyg(), name=g.name)
    back = Graph.from_pyg(raw.to_pyg(), name=g.name)
    assert_same_graph(raw, back)
    normalized = g.to_pyg()
    assert torch.equal(normalized.edge_weight, g.values)  # a normalized graph hands its weights over


def test_a_bad_object_is_one_line():
    with pytest.raises(TypeError, match="pass a scalegnn Graph, a PyG Data, a DGL graph, or a dataset name"):
        scalegnn.train([1, 2, 3], epochs=1)
    from torch_geometric.data import Data

    with pytest.raises(ValueError, match="no y; scalegnn trains node classification"):
        scalegnn.train(Data(x=torch.zeros(3, 2), edge_index=torch.zeros(2, 0, dtype=torch.long)), epochs=1)


def test_the_readme_example_runs_as_written(tmp_path, shared_data):
    """The README's Python example, verbatim, in a fresh folder whose data/pyg holds
    Cora's raw files (PyG would download them otherwise)."""
    text = README.read_text()
    block = re.search(r"<!-- example: python-api -->\s*```python\n(.*?)```", text, re.S)
    assert block, "README.md lost its Python example"
    code = block.group(1)
    raw = tmp_path / "data" / "pyg" / "Cora" / "raw"
    raw.mkdir(parents=True)
    for f in (shared_data / "planetoid_cora").glob("ind.cora.*"):
        shutil.copy(f, raw / f.name)
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    accuracy = float(out.stdout.strip().splitlines()[-1])
    assert 0.0 <= accuracy <= 1.0
    assert len(list((tmp_path / "results" / "runs").glob("*.json"))) == 1


def test_a_graph_without_masks_is_split_by_the_runs_seed_either_way(tmp_path, monkeypatch):
    """settings (seed=...) or a config (config.seed): the same seed splits the graph."""
    from torch_geometric.data import Data

    import scalegnn.api as api

    seen = []
    monkeypatch.setattr(api, "as_graph", lambda graph, name=None, seed=0: seen.append(seed) or Graph.from_pyg(
        graph, name=name or "pyg", seed=seed))
    g = random_graph(n=40, m=120, seed=3)
    data = Data(x=g.x, y=g.y, edge_index=torch.stack([g.row_ids(), g.indices]))
    common = dict(batch_ratio=0.5, layers=2, hidden=8, epochs=1, out_dir=str(tmp_path))
    scalegnn.train(data, seed=7, **common)
    scalegnn.train(data, config=make_config(dataset="pyg", seed=7, **common))
    assert seen == [7, 7]


@pytest.mark.distributed
def test_a_graph_that_exists_nowhere_on_disk_trains_on_1_2_and_4_processes(tmp_path, isolated_data):
    """A graph built in memory, named like no dataset, given to ``scalegnn.train``: one
    process, and --nproc 2 and 4 (the grid's 3D parallelism), train that graph (the
    record's sizes are its sizes) and give the serial losses and accuracies, to the 3D
    grid's tolerance (tests/parallel/test_engine.py); nothing is loaded by name."""
    g = random_graph(n=120, m=600, seed=11)
    graph = Graph.from_edge_index(torch.stack([g.row_ids(), g.indices]), g.x, g.y, name="directed")
    common = dict(batch_ratio=0.5, layers=2, hidden=8, epochs=2, progress=False)
    serial = scalegnn.train(graph, out_dir=str(tmp_path / "1"), **common)
    for nproc, grid in ((2, "1x2x1x1"), (4, "1x2x1x2")):
        rec = scalegnn.train(graph, nproc=nproc, grid=grid, out_dir=str(tmp_path / str(nproc)), **common)
        assert rec["status"] == "ok" and rec["world_size"] == nproc and rec["dataset"] == "directed"
        assert rec["graph"]["num_nodes"] == graph.num_nodes and rec["graph"] == serial["graph"]
        for key in ("loss", "batch_train_acc", "train_acc", "val_acc", "test_acc"):
            assert [e[key] for e in rec["epochs"]] == pytest.approx([e[key] for e in serial["epochs"]], rel=1e-4,
                                                                    abs=2e-5), (nproc, key)
    for untouched in ("default-root", "cache"):  # nothing was loaded, cached or downloaded by name
        assert not (isolated_data / untouched).exists()


def _weighted_data(seed: int = 5):
    """A PyG Data given one direction of each edge, with a weight per edge."""
    from torch_geometric.data import Data

    g = random_graph(n=80, m=300, seed=seed)
    rows = g.row_ids()
    one_way = rows < g.indices
    src, dst = rows[one_way], g.indices[one_way]
    weight = torch.rand(src.numel(), generator=torch.Generator().manual_seed(seed)) * 4 + 0.1
    return Data(x=g.x, y=g.y, edge_index=torch.stack([src, dst]), edge_weight=weight)


@pytest.mark.parametrize("system", ["scalegnn", "pyg-gcn"])
def test_edge_weights_change_what_is_trained_and_the_record_says_what_was_read(tmp_path, system):
    """The weighted graph trains other losses than the same graph unweighted (the weights
    used to be dropped: identical losses); the record says weighted and symmetrized,
    with the input's edge count."""
    data = _weighted_data()
    settings = dict(system=system, layers=2, hidden=8, epochs=3, seed=1, progress=False)
    if system == "scalegnn":
        settings["batch_ratio"] = 0.5
    weighted = scalegnn.train(data, out_dir=str(tmp_path / "w"), **settings)
    del data.edge_weight
    plain = scalegnn.train(data, out_dir=str(tmp_path / "p"), **settings)
    assert weighted["status"] == plain["status"] == "ok"
    losses = [e["loss"] for e in weighted["epochs"]], [e["loss"] for e in plain["epochs"]]
    assert all(abs(a - b) > 1e-6 for a, b in zip(*losses)), losses
    assert weighted["graph"]["weighted"] is True and "weighted" not in plain["graph"]
    for rec in (weighted, plain):
        assert rec["graph"]["symmetrized"] is True and rec["graph"]["input_edges"] == data.edge_index.shape[1]
        assert rec["graph"]["num_edges"] == 2 * data.edge_index.shape[1]


@pytest.mark.parametrize("system", ["graphsage", "graphsaint", "bns-gcn"])
def test_a_system_that_cannot_use_edge_weights_refuses_them_in_one_line(tmp_path, system, capsys):
    """Python: a ValueError before anything trains; the CLI on a weighted npz file: one
    line, exit 2; both naming the systems that take weights."""
    import numpy as np

    from scalegnn.cli import main

    data = _weighted_data()
    with pytest.raises(ValueError, match=f"--system {system} ignores edge weights .* train it with scalegnn, "):
        scalegnn.train(data, system=system, epochs=1, out_dir=str(tmp_path / "api"), progress=False)
    assert not (tmp_path / "api").exists() or not list((tmp_path / "api").glob("*.json"))
    np.savez(tmp_path / "w.npz", edge_index=data.edge_index.numpy(), values=data.edge_weight.numpy(),
             x=data.x.numpy(), y=data.y.numpy())
    from tests.runs import one_line_error

    err = one_line_error(capsys, ["train", "--system", system, "--dataset", f"npz:{tmp_path / 'w.npz'}", "--epochs",
                                  "1", "--out", str(tmp_path / "cli")])
    assert f"--system {system} ignores edge weights" in err
