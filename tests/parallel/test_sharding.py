"""Sharding (scalegnn/parallel/sharding.py) and the shard files (scalegnn/shards/): shard files round-trip (and keep their split),
a damaged one is one line naming the file and the fix, the shard command, and rotation
planes that share storage (one block for equal ranges, a row slice for rows inside
another plane's over the same columns): the same numbers as separate copies, with less
memory; shard files keep the sharing, and files whose planes are separate copies still
load (and are shared once loaded). Loading maps the file (nothing is read until
touched) and hashes it once: a file checked before is trusted while it is the same
file, and one damaged since is hashed again and refused."""

from __future__ import annotations

import json

import pytest
import torch

from scalegnn.cli import main
from scalegnn.launch.job import spawn
from scalegnn.parallel.dist_sampling import DistributedSampler
from scalegnn.parallel.grid import PMM_AXES, ProcessGrid
from scalegnn.parallel.layout import PLANES
from scalegnn.parallel.sharding import RankShard, build_shard, row_slice, share_planes
from scalegnn.shards import format as shard_format
from scalegnn.shards import load_shard, save_shards, shard_command
from scalegnn.sampling import CSRBlock, UniformVertexSampler
from tests.files import only_record, sparse_npz
from tests.graphs import grid_coords, grid_id, parallel_graph, unshared_shard


def test_save_and_load_shards_round_trip(tmp_path):
    graph = parallel_graph(n=37, m=160, multilabel=True)
    shape = (2, 2, 1, 2)
    paths = save_shards(graph, shape, tmp_path / "shards")
    assert len(paths) == 2 * 1 * 2 + 1 and paths[-1].name == "manifest.json"
    assert not list((tmp_path / "shards").glob("*.tmp"))  # atomic writes leave no temp files
    manifest = json.loads(paths[-1].read_text())
    assert manifest["grid_shape"] == list(shape) and manifest["num_nodes"] == 37
    for rank in range(8):
        grid = ProcessGrid.virtual(*shape, rank)
        got = load_shard(tmp_path / "shards", rank, grid_shape=shape)
        want = build_shard(graph, shape, grid.coords)
        assert got.coords == {a: grid.axis_index(a) for a in PMM_AXES}  # dp replicas share the x,y,z file
        assert got.multilabel and got.num_classes == graph.num_classes
        for a, b in zip(got.adj, want.adj):
            assert torch.equal(a.indptr, b.indptr) and torch.equal(a.indices, b.indices)
            assert torch.equal(a.values, b.values)
            assert (a.row_start, a.row_end, a.col_start, a.col_end) == (b.row_start, b.row_end, b.col_start, b.col_end)
        assert torch.equal(got.x, want.x)
        for ax in PMM_AXES:
            assert torch.equal(got.y[ax], want.y[ax]) and torch.equal(got.test_mask[ax], want.test_mask[ax])
    with pytest.raises(ValueError, match="written for the 3D grid 2x1x2 .* re-shard with .*--grid 1x1x2x2"):
        load_shard(tmp_path / "shards", 0, grid_shape=(2, 1, 2, 2))
    with pytest.raises(FileNotFoundError, match="scalegnn data shard"):
        load_shard(tmp_path / "nothing", 0)


@pytest.mark.parametrize("damage", ["random bytes", "truncated", "missing", "not a shard", "bad manifest"])
def test_a_damaged_shard_is_one_line_naming_the_file_and_the_fix(tmp_path, damage):
    """A shard file that is damaged, missing, or not one scalegnn wrote: one line that
    names the file and how to re-write it (torch's own message spans six lines and
    suggests weights_only=False)."""
    paths = save_shards(parallel_graph(n=37, m=160), (1, 1, 1, 2), tmp_path)
    victim = paths[1]
    if damage == "random bytes":
        victim.write_bytes(bytes(range(256)) * 8)
    elif damage == "truncated":
        victim.write_bytes(victim.read_bytes()[:200])
    elif damage == "missing":
        victim.unlink()
    elif damage == "not a shard":
        torch.save({"format": torch.load(victim, weights_only=True)["format"], "x": torch.zeros(2)}, victim)
    else:
        victim = paths[-1]
        victim.write_text('{"grid_shape": [1, 1')
    with pytest.raises((ValueError, FileNotFoundError)) as err:
        load_shard(tmp_path, 1)
    message = str(err.value)
    assert "\n" not in message and str(victim) in message and "scalegnn data shard" in message
    assert "weights_only=False" not in message


def test_coinciding_planes_are_one_block_stored_and_extracted_once(tmp_path):
    """Planes with the same row and column ranges (all three on 1x1x1x1; the diagonal
    ranks of 1x2x2x2) are one block in memory, still one after a round trip through
    the shard files, and one extraction per sample; other ranks keep three."""
    graph = parallel_graph(n=37, m=160)
    single = build_shard(graph, (1, 1, 1, 1), {"x": 0, "y": 0, "z": 0})
    assert single.adj[0] is single.adj[1] is single.adj[2]
    diag = build_shard(graph, (1, 2, 2, 2), {"x": 1, "y": 1, "z": 1})
    assert diag.adj[0] is diag.adj[1] is diag.adj[2]
    off = build_shard(graph, (1, 2, 2, 2), {"x": 1, "y": 0, "z": 0})
    assert len({id(b) for b in off.adj}) == 3
    save_shards(graph, (1, 1, 1, 1), tmp_path / "s")
    loaded = load_shard(tmp_path / "s", 0)
    assert len({b.indices.data_ptr() for b in loaded.adj}) == 1  # torch.save keeps the sharing
    for shard in (single, loaded):
        sampler = DistributedSampler(shard, ProcessGrid.single(), 15, seed=0)
        assert len({id(m) for m in sampler.index_maps}) == 1
        batch = sampler.sample(3)
        assert batch.adj[0] is batch.adj[1] is batch.adj[2]
        ref = UniformVertexSampler(graph, 15, seed=0).sample(3)
        assert torch.equal(batch.adj[0].adj.to_dense(), ref.adj.to_dense())


def test_shards_of_a_3d_grid_serve_every_data_parallel_size(tmp_path):
    """A shard is the data of one (x, y, z): files written for 1x2x2x2 are what every
    rank of 2x2x2x2 (or 4x2x2x2) would cut for itself, replica by replica, and load with
    the run's grid; a run whose 3D part differs, or a rank past the run's grid, is refused."""
    graph = parallel_graph(n=37, m=160)
    save_shards(graph, (1, 2, 2, 2), tmp_path)
    for shape in ((2, 2, 2, 2), (4, 2, 2, 2)):
        for rank in range(shape[0] * 8):
            grid = ProcessGrid.virtual(*shape, rank)
            got, want = load_shard(tmp_path, rank, shape), build_shard(graph, shape, grid.coords)
            assert got.grid_shape == shape and got.coords == want.coords
            assert all(_same_block(a, b) for a, b in zip(got.adj, want.adj)) and torch.equal(got.x, want.x)
    with pytest.raises(ValueError, match="outside the grid"):
        load_shard(tmp_path, 16, (2, 2, 2, 2))
    with pytest.raises(ValueError, match="3D grid 2x2x2"):
        load_shard(tmp_path, 0, (2, 2, 2, 1))


RUN_DP = dict(hidden=8, layers=3, batch=13, steps=4)


def _dp_from_shards_worker(rank, world, shape, folders):
    from scalegnn.model import ModelConfig
    from scalegnn.optim import OptimConfig
    from scalegnn.parallel.engine import ParallelEngine

    grid = ProcessGrid(*shape)
    out = []
    for folder in folders:
        eng = ParallelEngine(None, ModelConfig(hidden=RUN_DP["hidden"], layers=RUN_DP["layers"], dropout=0.2),
                             OptimConfig(lr=1e-2), RUN_DP["batch"], seed=3, epochs=2, grid=grid,
                             shard=load_shard(folder, grid.rank, shape))
        steps = [eng.train_step(step) for step in range(RUN_DP["steps"])]
        out.append({"steps": [(r.loss, r.correct, r.count) for r in steps], "eval": eng.evaluate().as_dict(),
                    "params": {k: v["value"] for k, v in eng.parameters_for_test().items()}})
        eng.close()
    return out


@pytest.mark.distributed
def test_a_data_parallel_run_trains_alike_from_the_shards_of_its_3d_grid(tmp_path):
    """Gd = 2 on 2x1x1x2 from shards staged for 1x1x1x2 (what a sweep stages once for
    every Gd) and from shards written for 2x1x1x2 itself: the same steps, evaluation and
    parameters, bit for bit."""
    graph = parallel_graph(n=41, m=170)
    shape = (2, 1, 1, 2)
    save_shards(graph, (1, 1, 1, 2), tmp_path / "3d")
    save_shards(graph, shape, tmp_path / "4d")
    results = spawn(_dp_from_shards_worker, 4, shape, [str(tmp_path / "3d"), str(tmp_path / "4d")], timeout_s=180)
    for shared, own in results:
        assert shared["steps"] == own["steps"] and shared["eval"] == own["eval"]
        assert shared["params"].keys() == own["params"].keys()
        assert all(torch.equal(shared["params"][k], own["params"][k]) for k in shared["params"])


def test_shard_command_normalizes_a_raw_graph_and_sampler_checks_its_shard(tmp_path):
    raw = parallel_graph().replace(meta={})
    with pytest.raises(ValueError, match="gcn_normalize"):
        build_shard(raw, (1, 1, 1, 1), {"x": 0, "y": 0, "z": 0})
    paths = shard_command(raw, (1, 1, 2, 1), tmp_path)
    assert [p.name for p in paths] == ["shard_x0_y0_z0.pt", "shard_x0_y1_z0.pt", "manifest.json"]
    shard = load_shard(tmp_path, 1)
    with pytest.raises(ValueError, match="given to rank 0"):
        DistributedSampler(shard, ProcessGrid.virtual(1, 1, 2, 1, 0), 10)


def test_double_permuted_shard_files_train_like_the_in_memory_double_permutation(tmp_path):
    """`scalegnn data shard --permute double` writes what the engine builds in memory
    for --permute double: the same steps and evaluation; a run with another --permute
    or --seed, or with the residual on, is refused with the fix named."""
    from scalegnn.model import ModelConfig
    from scalegnn.optim import OptimConfig
    from scalegnn.parallel.engine import ParallelEngine
    from scalegnn.numerics import NumericsConfig
    from scalegnn.shards import check_shard_manifest
    from scalegnn.permutation import random_permutation

    raw = parallel_graph(n=41, m=170).replace(meta={})
    shard_command(raw, (1, 1, 1, 1), tmp_path, permute="double", seed=3)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["permute"] == "double" and manifest["seed"] == 3
    model = ModelConfig(hidden=8, layers=3, dropout=0.2, residual=False)
    numerics = NumericsConfig(permute="double")
    grid = ProcessGrid.single()
    from_files = ParallelEngine(None, model, OptimConfig(lr=1e-2), 13, seed=3, epochs=1, grid=grid,
                                shard=load_shard(tmp_path, 0), numerics=numerics)
    prepared = raw.permute(random_permutation(raw.num_nodes, 3)).gcn_normalize()
    in_memory = ParallelEngine(prepared, model, OptimConfig(lr=1e-2), 13, seed=3, epochs=1, grid=grid,
                               numerics=numerics)
    for step in range(3):
        a, b = from_files.train_step(step), in_memory.train_step(step)
        assert (a.loss, a.correct, a.count) == (b.loss, b.correct, b.count)
    assert from_files.evaluate().as_dict() == in_memory.evaluate().as_dict()
    from_files.close(), in_memory.close()
    check_shard_manifest(manifest, "double", 3, where="d")
    with pytest.raises(ValueError, match="--permute double but the run asks for --permute none"):
        check_shard_manifest(manifest, "none", 3, where="d")
    with pytest.raises(ValueError, match="re-shard with --seed 0"):
        check_shard_manifest(manifest, "double", 0, where="d")
    with pytest.raises(ValueError, match="--no-residual"):
        ParallelEngine(None, ModelConfig(hidden=8, layers=3, residual=True), OptimConfig(), 13, seed=3, grid=grid,
                       shard=load_shard(tmp_path, 0), numerics=numerics)


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
    rec = only_record(isolated_data / "runs")
    assert rec["graph"]["split"].startswith("random 60/20/20 seed 0 (--split")
    # what reading the shard cost this rank, and its time from process start to the end of step 1
    (load_s,), (first_s,), (rss,) = (rec[f"{k}_per_rank"] for k in ("load_s", "time_to_first_step_s",
                                                                     "rss_after_load_bytes"))
    assert 0 < load_s < first_s and 0 < rss <= rec["peak_rss_bytes_per_rank"][0]
    # --split-seed defaults to --seed (0): saying it is the same split, another seed is not
    assert main(base + ["--split", "random:0.6,0.2,0.2", "--split-seed", "0"]) == 0
    assert main(base + ["--split", "random:0.6,0.2,0.2", "--split-seed", "1"]) == 2
    assert "but the run has --split random:0.6,0.2,0.2 --split-seed 1" in capsys.readouterr().err


# ----------------------------------------------------------------------------- planes that share storage
SHAPES = [(1, 1, 1, 1), (1, 2, 1, 1), (1, 1, 2, 1), (1, 1, 1, 2), (1, 2, 2, 1), (1, 2, 2, 2), (1, 3, 1, 2)]


def _same_block(a: CSRBlock, b: CSRBlock) -> bool:
    return (a.row_start, a.row_end, a.col_start, a.col_end) == (b.row_start, b.row_end, b.col_start, b.col_end) \
        and all(x.dtype == y.dtype and torch.equal(x, y) for x, y in
                zip((a.indptr, a.indices, a.values), (b.indptr, b.indices, b.values)))


def test_row_slice_is_the_block_cut_from_the_graph_and_shares_its_arrays():
    graph = parallel_graph(n=37, m=160)
    whole = CSRBlock.from_graph(graph, (0, 37), (12, 25))
    for r0, r1 in [(0, 37), (0, 12), (12, 25), (25, 37), (30, 30)]:
        got = row_slice(whole, r0, r1)
        assert _same_block(got, CSRBlock.from_graph(graph, (r0, r1), (12, 25)))
        assert got.indices.untyped_storage().data_ptr() == whole.indices.untyped_storage().data_ptr()
        assert got.values.untyped_storage().data_ptr() == whole.values.untyped_storage().data_ptr()
    with pytest.raises(ValueError, match="not inside"):
        row_slice(CSRBlock.from_graph(graph, (5, 20), (0, 37)), 0, 10)


@pytest.mark.parametrize("shape", SHAPES, ids=grid_id)
def test_planes_equal_the_unshared_blocks_and_hold_each_array_once(shape):
    """On every rank each plane equals the block cut on its own from the graph; the
    arrays held are those of the distinct (row range, column range) blocks that no other
    plane's rows contain, and nothing else: 1 block on 1x1x1x1, and on 1x2x1x1 the
    (x, y) plane is a row slice of the unsplit (y, z) plane."""
    graph = parallel_graph(n=37, m=160)
    for c in grid_coords(shape):
        shard = build_shard(graph, shape, c)
        vr = shard.vertex_ranges
        want = [CSRBlock.from_graph(graph, vr[r], vr[k]) for r, k in PLANES]
        assert all(_same_block(a, b) for a, b in zip(shard.adj, want))
        keys = {(vr[r], vr[k]) for r, k in PLANES}
        kept = [key for key in keys if not any(o != key and o[1] == key[1] and o[0][0] <= key[0][0]
                                               and key[0][1] <= o[0][1] for o in keys)]
        storage = shard.adjacency_storage()
        assert storage["blocks"] == len(keys)
        nnz_bytes = sum(CSRBlock.from_graph(graph, *key).nnz * 8 for key in kept)  # int32 ids + float32 values
        ptr_bytes = sum((key[0][1] - key[0][0] + 1) * 8 for key in keys)  # every distinct block's own row pointers
        assert storage["bytes"] == nnz_bytes + ptr_bytes
        unshared = unshared_shard(shard).adjacency_storage()
        assert unshared["blocks"] == 3 and unshared["bytes"] >= storage["bytes"]
    if shape == (1, 1, 1, 1):
        assert storage["storages"] == 3 and unshared["bytes"] == 3 * storage["bytes"]
    if shape == (1, 2, 1, 1):  # the (x, y) plane of either x rank: indices and values are views of (y, z)'s
        assert storage["storages"] == 2 * 3 + 1


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (1, 2, 1, 1), (1, 2, 2, 1), (1, 2, 2, 2)], ids=grid_id)
@pytest.mark.parametrize("permute", ["none", "double"])
def test_shard_files_round_trip_with_the_sharing(tmp_path, shape, permute):
    """A shard file holds a shared array once; loaded back, every plane equals the built
    one and holds the same bytes. A file whose planes are separate copies (as written
    before the sharing) loads to the same planes, shared again."""
    from scalegnn.permutation import double_sigma

    graph = parallel_graph(n=37, m=160)
    paths = save_shards(graph, shape, tmp_path / "new", permute=permute, seed=2)
    sigma = double_sigma(37, 2) if permute == "double" else None
    for rank, c in enumerate(grid_coords(shape)):
        built = build_shard(graph, shape, c, sigma=sigma)
        old = unshared_shard(built)
        torch.save(old.to_state(), tmp_path / "old.pt")
        for loaded in (load_shard(tmp_path / "new", rank), RankShard.from_state(torch.load(tmp_path / "old.pt",
                                                                                           weights_only=True))):
            assert all(_same_block(a, b) for a, b in zip(loaded.planes(), built.planes()))
            assert loaded.adjacency_storage() == built.adjacency_storage()
            assert torch.equal(loaded.x, built.x)
        if shape == (1, 1, 1, 1) and permute == "none":  # two copies of ids and values fewer
            assert paths[rank].stat().st_size < (tmp_path / "old.pt").stat().st_size - 2 * built.adj[0].nnz * 8


def test_share_planes_keeps_separate_blocks_separate():
    graph = parallel_graph(n=37, m=160)
    a = CSRBlock.from_graph(graph, (0, 18), (0, 37))
    b = CSRBlock.from_graph(graph, (18, 37), (0, 37))
    c = CSRBlock.from_graph(graph, (0, 18), (18, 37))
    assert share_planes((a, b, c)) == (a, b, c) and all(x is y for x, y in zip(share_planes((a, b, c)), (a, b, c)))
    a2 = CSRBlock.from_graph(graph, (0, 18), (0, 37))
    got = share_planes((a, a2, c))
    assert got[0] is got[1] and (got[0] is a or got[0] is a2) and got[2] is c


def test_a_shard_is_mapped_and_hashed_once_while_it_is_the_same_file(tmp_path, monkeypatch):
    """load_shard maps the file (it is in the process's memory maps while the shard
    lives) and equals a shard built in memory; the SHA-256 is computed by the first load
    only (a marker beside the file records it with the file's identity), ``verify=
    "always"`` hashes again, and a file damaged in place after it was checked (same
    size) is hashed again and refused in one line."""
    import os
    import time

    graph = parallel_graph(n=37, m=160)
    paths = save_shards(graph, (1, 1, 2, 1), tmp_path)
    hashed = []
    real = shard_format.file_sha256
    monkeypatch.setattr(shard_format, "file_sha256", lambda path, *a: hashed.append(path) or real(path, *a))
    first = load_shard(tmp_path, 1)
    want = build_shard(graph, (1, 1, 2, 1), {"x": 0, "y": 1, "z": 0})
    assert all(torch.equal(getattr(a, k), getattr(b, k)) for a, b in zip(first.adj, want.adj)
               for k in ("indptr", "indices", "values")) and torch.equal(first.x, want.x)
    assert first.nbytes() == want.nbytes() and first.nbytes()["total"] > 0
    if os.path.exists("/proc/self/maps"):
        assert str(paths[1]) in open("/proc/self/maps").read()  # mapped, not read into memory
    assert hashed == [paths[1]] and (tmp_path / (paths[1].name + ".verified")).is_file()
    load_shard(tmp_path, 1)
    load_shard(tmp_path, 3, (2, 1, 2, 1))  # a replica of rank 1: the same file, checked already
    assert hashed == [paths[1]]
    load_shard(tmp_path, 1, verify="always")
    assert hashed == [paths[1]] * 2
    time.sleep(0.05)  # damage comes later than the check (file times have a clock tick's resolution)
    data = bytearray(paths[1].read_bytes())
    data[len(data) // 2] ^= 0xFF
    paths[1].write_bytes(bytes(data))
    with pytest.raises(ValueError, match="does not match the SHA-256 its manifest lists") as err:
        load_shard(tmp_path, 1)
    assert "\n" not in str(err.value) and str(paths[1]) in str(err.value)
    with pytest.raises(ValueError, match="verify must be once or always"):
        load_shard(tmp_path, 0, verify="never")
