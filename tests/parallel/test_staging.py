"""Out-of-core staging (scalegnn/parallel/staging.py): shards of a generated graph written
from memory-mapped arrays in chunks are byte for byte those of the in-memory staging
(their SHA-256 checksums), with several processes too; a killed staging resumes; a
shard that does not match its manifest's checksum is refused at load; bad input is one line."""

from __future__ import annotations

import json

import pytest

from scalegnn.cli import main
from scalegnn.datasets import load_dataset
from scalegnn.datasets.streaming import generate
from scalegnn.parallel.sharding import _mp_coords, load_shard, shard_command
from scalegnn.parallel.staging import _write_rank, file_sha256, parse_size, stage_out_of_core

KINDS = {"powerlaw": "powerlaw:n=2500,avg_degree=10,exponent=2.3",
         "csbm": "csbm:n=1800,avg_degree=8,classes=4,feature_dim=12"}


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    root = tmp_path_factory.mktemp("generated")
    for name, kind in KINDS.items():
        generate(kind, root / name, seed=3, chunk_edges=4000)
    return root


def _in_memory(folder, shape, out, permute="none"):
    shard_command(load_dataset(f"dir:{folder}", seed=3, cache=False), shape, out, seed=3, permute=permute)
    return json.loads((out / "manifest.json").read_text())


def _manifest(out):
    return json.loads((out / "manifest.json").read_text())


@pytest.mark.parametrize("kind, permute", [(k, p) for k in KINDS for p in ("none", "single", "double")])
@pytest.mark.parametrize("shape", [(1, 2, 2, 2), (1, 3, 1, 2), (1, 1, 1, 1)], ids=lambda s: "x".join(map(str, s)))
def test_out_of_core_shards_are_the_in_memory_ones(generated, tmp_path, kind, permute, shape):
    """Rows read 300 stored entries at a time (the graphs hold ~20,000): same files, with
    the seed's relabeling (--permute single) and the double permutation too."""
    want = _in_memory(generated / kind, shape, tmp_path / "mem", permute)
    stage_out_of_core(generated / kind, shape, tmp_path / "ooc", seed=3, chunk_entries=300, permute=permute)
    got = _manifest(tmp_path / "ooc")
    assert got["permute"] == want["permute"] == permute
    assert len(got["sha256"]) == shape[1] * shape[2] * shape[3]
    assert got["sha256"] == want["sha256"] and got["nnz_per_shard"] == want["nnz_per_shard"]
    for key in ("grid_shape", "name", "num_nodes", "num_edges", "num_features", "num_classes", "graph", "seed"):
        assert got[key] == want[key], key
    assert not list((tmp_path / "ooc").glob("*.sha256")) and not list((tmp_path / "ooc").glob("*.tmp"))


def test_several_processes_write_the_same_files_and_a_killed_staging_resumes(generated, tmp_path):
    shape = (1, 2, 1, 2)
    want = _in_memory(generated / "powerlaw", shape, tmp_path / "mem")["sha256"]
    stage_out_of_core(generated / "powerlaw", shape, tmp_path / "par", seed=3, workers=2, chunk_entries=500)
    assert _manifest(tmp_path / "par")["sha256"] == want
    out = tmp_path / "killed"  # a staging killed after two rank files, one of them then damaged
    out.mkdir()
    first, second = (_write_rank(str((generated / "powerlaw").resolve()), 3, shape, c, str(out),
                                 f"dir:{(generated / 'powerlaw').resolve()}", 500) for c in _mp_coords(shape)[:2])
    (out / second["file"]).write_bytes(b"half a file")
    stage_out_of_core(generated / "powerlaw", shape, out, seed=3, chunk_entries=500)
    got = _manifest(out)
    assert got["sha256"] == want and got["staged"]["resumed"] == 1  # the intact one kept, the damaged one rewritten


def test_a_shard_that_does_not_match_its_checksum_is_refused(generated, tmp_path):
    stage_out_of_core(generated / "csbm", (1, 1, 1, 2), tmp_path, seed=3)
    shard = load_shard(tmp_path, 1, (2, 1, 1, 2))
    assert shard.num_nodes == 1800 and shard.grid_shape == (2, 1, 1, 2)
    victim = tmp_path / _manifest(tmp_path)["files"][1]
    data = bytearray(victim.read_bytes())
    data[-100] ^= 0xFF
    victim.write_bytes(bytes(data))
    assert file_sha256(victim) != _manifest(tmp_path)["sha256"][victim.name]
    with pytest.raises(ValueError, match="does not match the SHA-256 its manifest lists") as err:
        load_shard(tmp_path, 1)
    assert "\n" not in str(err.value) and str(victim) in str(err.value)
    load_shard(tmp_path, 0)  # the others still load


def test_the_cli_stages_out_of_core_and_names_bad_input(generated, tmp_path, capsys):
    assert main(["data", "shard", f"dir:{generated / 'csbm'}", "--grid", "1x1x2x1", "--out", str(tmp_path / "s"),
                 "--seed", "3", "--memory-budget", "64M"]) == 0
    assert "out of core" in capsys.readouterr().out
    assert _manifest(tmp_path / "s")["staged"]["memory_budget"] == 64 << 20
    assert parse_size("512M") == 512 << 20 and parse_size("1.5GiB") == 3 << 29 and parse_size("4096") == 4096
    for argv, message in (
            (["cora", "--memory-budget", "1G"], "stages a dir: folder written by `scalegnn data generate`"),
            ([f"dir:{tmp_path / 's'}", "--memory-budget", "1G"], "has no graph.json); stage this graph without"),
            ([f"dir:{generated / 'csbm'}", "--memory-budget", "12Q"], "is not a size; give e.g. 512M"),
            ([f"dir:{generated / 'csbm'}", "--memory-budget", "1G", "--split", "random"], "does not apply --split")):
        assert main(["data", "shard", *argv, "--grid", "1x1x2x1", "--out", str(tmp_path / "bad")]) != 0
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err and "Traceback" not in err, err
