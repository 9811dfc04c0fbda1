"""Run records (scalegnn/records.py): atomic writes, validation, unique run ids (across
concurrent processes too), the collective calls they carry, loading into pandas, older
schemas, and the documented settings table."""

from __future__ import annotations

import json
import os
from concurrent.futures import ProcessPoolExecutor

import pytest

from scalegnn import records
from scalegnn.analysis import load_epochs, load_runs
from tests.files import REPO, minimal_record, schema_2_config


def test_write_then_read_round_trip(tmp_path):
    rec = minimal_record()
    path = records.write_record(rec, tmp_path)
    assert path.name == f"{rec['run_id']}.json"
    assert records.read_record(path)["epochs"] == rec["epochs"]
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp file left


def test_interrupted_write_leaves_no_file(tmp_path, monkeypatch):
    rec = minimal_record()
    real_dump = json.dump

    def dump_half_then_die(obj, f, **kw):
        f.write(json.dumps(obj, **{k: v for k, v in kw.items() if k != "default"}, default=str)[:50])
        raise KeyboardInterrupt("killed mid-write")

    monkeypatch.setattr(json, "dump", dump_half_then_die)
    with pytest.raises(KeyboardInterrupt):
        records.write_record(rec, tmp_path)
    monkeypatch.setattr(json, "dump", real_dump)
    assert list(tmp_path.iterdir()) == []
    # a failure in the rename step also leaves nothing
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError):
        records.write_record(rec, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_validation_errors():
    with pytest.raises(records.RecordError, match="missing fields"):
        records.validate_record({"schema_version": 1})
    with pytest.raises(records.RecordError, match="newer than this scalegnn"):
        records.validate_record(minimal_record(schema_version=records.SCHEMA_VERSION + 1))
    with pytest.raises(records.RecordError, match="status"):
        records.validate_record(minimal_record(status="great"))


def test_run_ids_are_unique():
    ids = {records.new_run_id("scalegnn", "x") for _ in range(2000)}
    assert len(ids) == 2000


def test_time_to_target():
    rows = minimal_record()["epochs"]
    assert records.time_to_target(rows, 0.5) == 1.0  # epoch 2 reaches 0.6
    assert records.time_to_target(rows, 0.9) is None
    assert records.time_to_target(rows, None) is None


def test_load_into_pandas_reports_corrupt_files(tmp_path):
    records.write_record(minimal_record(), tmp_path)
    records.write_record(minimal_record(system="graphsage"), tmp_path)
    bad = tmp_path / "truncated.json"
    bad.write_text('{"schema_version": 1, "run_id": "x", "epo')
    with pytest.warns(UserWarning, match="truncated.json"):
        runs = load_runs(tmp_path)
    assert sorted(runs["system"]) == ["graphsage", "scalegnn"]
    assert runs["config.model.hidden"].tolist() == [8, 8]
    assert runs.attrs["skipped"][0][0] == str(bad)
    with pytest.warns(UserWarning):
        epochs = load_epochs(tmp_path)
    assert len(epochs) == 4 and epochs["time.sampling"].tolist() == [0.1] * 4
    assert set(epochs["bytes.dp"]) == {8}


def test_a_cancelled_run_is_a_valid_status():
    assert records.validate_record(minimal_record(status="cancelled", error="SLURM job 7 was cancelled"))


def test_reading_a_results_folder_that_is_not_there_is_an_error(tmp_path):
    """An empty result would read as "no runs yet" and hide a typo in the path."""
    from scalegnn.analysis.report import write_report

    missing = tmp_path / "no-such-folder"
    for read in (load_runs, load_epochs):
        with pytest.raises(FileNotFoundError, match=r"results folder '.*no-such-folder' does not exist: give the "
                                                    r"folder the runs wrote their records to"):
            read(missing)
    (tmp_path / "a-file").write_text("")
    with pytest.raises(FileNotFoundError, match="is a file, not a folder"):
        load_runs(tmp_path / "a-file")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        write_report(missing, missing / "report")  # its default output folder would have created it
    assert not missing.exists()
    assert load_runs(tmp_path).empty  # a folder without records: an empty result, as before


def test_an_interrupted_run_is_a_valid_status():
    assert records.validate_record(minimal_record(status="interrupted",
                                                  error="interrupted by SIGTERM after epoch 3 of 50; ..."))


def test_a_sweep_folders_bookkeeping_is_not_read_as_records(tmp_path):
    """Checkpoint meta.json, staged shards' manifest.json, Flux task files and
    submitted.json sit next to the records of a sweep: they are neither records nor
    skipped (broken) records; a broken record among them still is reported."""
    run = tmp_path / "runs" / "k"
    records.write_record(minimal_record(), run)
    for path in (run / "submitted.json", run / "checkpoint" / "step-000000004" / "meta.json",
                 tmp_path / "shards" / "s" / "manifest.json", tmp_path / ".flux" / "tasks" / "k.json"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text('{"not": "a record"}')
    (run / "broken.json").write_text('{"schema_version": 1')
    with pytest.warns(UserWarning, match="broken.json"):
        runs = load_runs(tmp_path)
    assert len(runs) == 1 and [p for p, _ in runs.attrs["skipped"]] == [str(run / "broken.json")]


def test_every_committed_record_loads_into_a_run_configuration():
    """Records written before the typed configuration (schema 1: a flat config) and
    after it (schema 2: nested sections) both load, and their configuration rebuilds
    the RunConfig that ran them; schema 1's flat values land in their sections, and
    the settings both kept in perf (comm and GEMM dtype, permutation) in numerics."""
    import glob
    from pathlib import Path

    from scalegnn.config import RunConfig

    root = Path(__file__).resolve().parents[2] / "results"
    versions = {}
    for path in sorted(glob.glob(str(root / "**" / "*.json"), recursive=True)):
        raw = json.loads(Path(path).read_text())
        if not isinstance(raw, dict) or "run_id" not in raw:
            continue  # manifests, sweep notes, benchmark outputs
        flat = dict(raw["config"]) if raw["schema_version"] == 1 else None
        rec = records.read_record(path)
        cfg = RunConfig.from_dict(rec["config"])
        assert (cfg.system, cfg.data.dataset, cfg.seed) == (rec["system"], rec["dataset"], rec["seed"]), path
        if flat is not None:
            assert (cfg.loop.epochs, cfg.optim.lr, cfg.model.hidden) == \
                (flat["epochs"], flat["optim"]["lr"], flat["model"]["hidden"]), path
        perf = raw["config"].get("perf") or {}  # schemas 1 and 2: numerics' settings were perf's
        assert {k: getattr(cfg.numerics, k) for k in ("comm_dtype", "gemm_dtype", "permute") if k in perf} == \
            {k: perf[k] for k in ("comm_dtype", "gemm_dtype", "permute") if k in perf}, path
        versions[raw["schema_version"]] = versions.get(raw["schema_version"], 0) + 1
    assert versions.get(1, 0) >= 100, versions  # the committed results of earlier sessions are schema 1


def test_a_schema_2_record_is_read_into_the_numerics_section(tmp_path):
    """Schema 3 split schema 2's perf section: comm_dtype, gemm_dtype and permute (they
    change the numbers) moved into numerics, the speed-only switches stayed. A schema-2
    file is read into that layout (read_record), its configuration rebuilds the
    RunConfig that ran it, and the file is not rewritten; a schema-1 record takes both
    steps; upgrading leaves the caller's dicts as they were and a current record as it is."""
    import copy

    from scalegnn.config import RunConfig, make_config

    cfg = make_config(dataset="cora", comm_dtype="bf16", gemm_dtype="bf16", permute="double", residual=False,
                      prefetch=True, sampler="torch")
    now = json.loads(json.dumps(cfg.to_dict()))
    old = schema_2_config(now)
    assert "numerics" not in old and old["perf"]["permute"] == "double" and old["perf"]["prefetch"] is True
    path = tmp_path / "old.json"
    path.write_text(json.dumps(minimal_record(schema_version=2, config=old)))
    rec = records.read_record(path)
    assert rec["schema_version"] == records.SCHEMA_VERSION == 4
    assert rec["config"] == now and list(rec["config"]) == list(now)  # numerics before perf, as RunConfig has it
    assert rec["config"]["numerics"] == {"comm_dtype": "bf16", "gemm_dtype": "bf16", "permute": "double"}
    assert RunConfig.from_dict(rec["config"]) == cfg
    assert json.loads(path.read_text())["schema_version"] == 2  # read, never rewritten
    kept = copy.deepcopy(old)
    records.upgrade(minimal_record(schema_version=2, config=old))
    assert old == kept  # the caller's configuration is not changed in place
    current = minimal_record(config=copy.deepcopy(now))
    assert records.upgrade(copy.deepcopy(current)) == current
    flat = {"system": "scalegnn", "seed": 0, "dataset": "cora", "epochs": 3, "grid": [1, 1, 1, 1],
            "perf": {"prefetch": False, "comm_dtype": "bf16", "permute": "single"}}
    v1 = records.upgrade(minimal_record(schema_version=1, config=flat))
    assert v1["schema_version"] == 4 and v1["config"]["numerics"] == {"comm_dtype": "bf16", "permute": "single"}
    assert v1["config"]["perf"] == {"prefetch": False, "cuda_graphs": False} and v1["config"]["loop"] == {"epochs": 3}
    numerics = RunConfig.from_dict(v1["config"]).numerics
    assert (numerics.comm_dtype, numerics.gemm_dtype, numerics.permute) == ("bf16", "fp32", "single")


def test_the_documented_settings_table_is_the_generated_one():
    """results/README.md lists every flag with its setting path: the table is
    generated from the configuration dataclasses and the registry, so it cannot drift."""
    from pathlib import Path

    from scalegnn.config import flag_table_markdown

    readme = (Path(__file__).resolve().parents[2] / "results" / "README.md").read_text()
    assert flag_table_markdown() in readme


def test_records_are_readable_as_the_umask_allows(tmp_path):
    """A record gets 0666 less the umask, as open() would give it (a temporary file's
    private 0600 hid records from a project group on shared storage)."""
    import stat
    import subprocess
    import sys

    for umask in (0o022, 0o002, 0o077):
        code = (f"import os; os.umask({umask}); from scalegnn import records; from tests.files import minimal_record; "
                f"print(records.write_record(minimal_record(), {str(tmp_path / oct(umask))!r}))")
        path = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              cwd=REPO).stdout.strip()
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o666 & ~umask, oct(umask)


def test_a_configuration_saved_by_an_older_schema_builds_todays_config():
    """A sweep task's configuration is saved at submission (RunConfig.to_dict) and built
    when the job starts, perhaps after an upgrade: schema 2's numerics settings inside
    ``perf`` and schema 1's flat keys still give the same RunConfig; a configuration in
    today's layout, and a partial one, are left as they are."""
    from scalegnn.config import RunConfig, make_config

    cfg = make_config(dataset="cora", comm_dtype="bf16", permute="single", epochs=7, grid=(1, 2, 1, 1), nproc=2)
    now = cfg.to_dict()
    old = schema_2_config(now)
    assert records.config_schema(old) == 2 and records.config_schema(now) == records.SCHEMA_VERSION
    assert RunConfig.from_dict(old) == cfg and old == schema_2_config(now)  # the caller's dict is left as it was
    flat = {"system": "scalegnn", "seed": 0, "dataset": "cora", "epochs": 7, "grid": [1, 2, 1, 1], "nproc": 2,
            **{k: v for k, v in old.items() if k not in ("system", "seed", "data", "loop", "parallel", "sampling")}}
    assert records.config_schema(flat) == 1
    rebuilt = RunConfig.from_dict(flat)
    assert (rebuilt.data.dataset, rebuilt.loop.epochs, rebuilt.parallel.grid, rebuilt.numerics.comm_dtype) == \
        ("cora", 7, (1, 2, 1, 1), "bf16")
    # partial: today's layout, with a setting added since at the value it had before it existed
    assert records.current_config({"model": {"hidden": 8}}) == {"model": {"hidden": 8, "norm_position": "post"},
                                                                "tuned_from": None}


# ----------------------------------------------------------------------------- records, settings, analysis
def test_records_carry_comm_calls_and_the_summary_gives_them_per_step(tmp_path):
    from scalegnn.analysis.load import load_epochs, runs_from_records
    from scalegnn.records import RecordError, new_epoch_row, new_record, summarize, validate_record, write_record

    rec = new_record(system="scalegnn", dataset="d", config={}, grid={"dp": 1, "x": 2, "y": 1, "z": 1},
                     world_size=2, seed=0, env={}, graph=None, batch_size=4, steps_per_epoch=4, target_acc=None)
    for epoch in (1, 2):
        row = new_epoch_row(epoch, 1.0 * epoch, 0.5, None, {}, {"pmm_x": 400, "loss": 32},
                            comm_calls={"pmm_x": 8 * epoch, "loss": 12})
        row.update(train_acc=0.5, val_acc=0.5, test_acc=0.5, eval_time_s=0.1)
        rec["epochs"].append(row)
    rec["status"] = "ok"
    summarize(rec)
    assert rec["summary"]["comm_calls_per_step"] == {"loss": 3.0, "pmm_x": 4.0}  # the last epoch / 4 steps
    assert rec["summary"]["comm_bytes_per_step"] == {"loss": 8.0, "pmm_x": 100.0}
    validate_record(rec)
    path = write_record(rec, tmp_path)
    epochs = load_epochs(tmp_path)
    assert epochs["calls.pmm_x"].tolist() == [8, 16] and epochs["bytes.loss"].tolist() == [32, 32]
    runs = runs_from_records([dict(rec, record_file=str(path))])
    assert "calls.loss" in runs.columns
    # Older records and systems that do not count calls: no comm_calls, still valid.
    plain = new_epoch_row(1, 1.0, 0.5, None, {}, {})
    assert "comm_calls" not in plain
    old = dict(rec, epochs=[dict(plain, train_acc=None, val_acc=None, test_acc=None, eval_time_s=None)])
    validate_record(old)
    bad = dict(rec, epochs=[dict(rec["epochs"][0], comm_calls=7)])
    with pytest.raises(RecordError, match="comm_calls must be an object"):
        validate_record(bad)


# ----------------------------------------------------------------------------- result integrity
def _ids(n):
    return [records.new_run_id("scalegnn", "ogbn-products") for _ in range(n)]


def test_run_ids_are_unique_across_concurrent_processes():
    """Array jobs start in the same second on many nodes: ids differ by their 48 random bits."""
    import multiprocessing

    with ProcessPoolExecutor(4, mp_context=multiprocessing.get_context("fork")) as pool:
        ids = [i for chunk in pool.map(_ids, [5000] * 8) for i in chunk]
    assert len(set(ids)) == len(ids) == 40000


def test_a_schema_3_record_reads_its_edge_count_as_the_trained_matrixs():
    """Schema 3's graph.num_edges counted the trained matrix (ScaleGNN's with the self
    loops it added), unlike ``scalegnn data info``; schema 4 keeps that number as
    adjacency_nnz and num_edges for the graph's own, unknown (None) in an upgraded record.
    A run today records both: Cora's own 10,556 entries and 13,264 with its self loops."""
    from scalegnn.graph import Graph
    from tests.graphs import random_graph

    old = records.upgrade(minimal_record(schema_version=3, graph={"num_nodes": 10, "num_edges": 40,
                                                                  "num_features": 2, "num_classes": 2}))
    assert old["schema_version"] == 4 and old["graph"]["adjacency_nnz"] == 40 and old["graph"]["num_edges"] is None
    g = random_graph(n=30, m=90, seed=1)
    raw = Graph(g.indptr, g.indices, g.values, g.x, g.y, g.train_idx, g.val_idx, g.test_idx, g.num_classes)
    info = raw.gcn_normalize().record_info()
    loops = int((raw.row_ids() == raw.indices).sum())
    assert info["num_edges"] == raw.num_edges == raw.stats()["num_edges"]
    assert info["adjacency_nnz"] == raw.num_edges + raw.num_nodes - loops == raw.gcn_normalize().num_edges


def test_a_record_from_before_a_setting_existed_reads_with_the_value_it_ran_with():
    """``--norm-position`` came after records were written: such a record's model section
    reads as the paper's post-convolution norm (the only placement then), the stored
    dicts untouched; a record that names a placement keeps it."""
    import copy

    model = {"dropout": 0.2, "hidden": 16, "layers": 2, "norm": True, "norm_eps": 1e-06, "residual": True}
    stored = minimal_record(config={"system": "scalegnn", "model": dict(model)})
    kept = copy.deepcopy(stored)
    rec = records.upgrade(copy.copy(stored))
    assert rec["config"]["model"] == {**model, "norm_position": "post"}
    assert stored == kept
    pre = minimal_record(config={"system": "scalegnn", "model": {**model, "norm_position": "pre"}})
    assert records.upgrade(copy.deepcopy(pre))["config"]["model"]["norm_position"] == "pre"
    # --cuda-graphs and --tuned-from came later still: off and none
    old = minimal_record(config={"system": "scalegnn", "model": dict(model), "perf": {"prefetch": False}})
    rec = records.upgrade(copy.deepcopy(old))
    assert rec["config"]["perf"] == {"prefetch": False, "cuda_graphs": False} and rec["config"]["tuned_from"] is None
    tuned = minimal_record(config={"system": "scalegnn", "tuned_from": "s/tune.json", "perf": {"cuda_graphs": True}})
    rec = records.upgrade(copy.deepcopy(tuned))
    assert rec["config"]["tuned_from"] == "s/tune.json" and rec["config"]["perf"]["cuda_graphs"] is True


def test_a_record_from_before_resumes_had_records_of_their_own_reads_with_no_parent(tmp_path):
    """``resumed_from`` came with one record per resume (a resume used to rewrite its parent's
    record under the same run id): an older record reads as continuing no other run, the file
    untouched; a resumed run's record keeps its parent."""
    old = {k: v for k, v in minimal_record().items() if k != "resumed_from"}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    assert records.read_record(path)["resumed_from"] is None
    assert "resumed_from" not in json.loads(path.read_text())  # read, never rewritten
    child = minimal_record(resumed_from=old["run_id"])
    assert records.upgrade(dict(child))["resumed_from"] == old["run_id"]
