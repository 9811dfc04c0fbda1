"""Validate :mod:`scalegnn.perfmodel` on recorded runs: fit, leave-one-out, volumes.

``validation_frame(runs)`` fits the model's coefficients (non-negative least
squares, relative error) on the runs of the ``perfmodel`` sweep of each cluster,
and returns one row per run: observed epoch time, the prediction of the model
fitted on all runs, and the leave-one-out prediction (fitted without that run: the
honest estimate of the error on a configuration the fit has not seen).
``volume_check(runs)`` compares the bytes per epoch the model predicts for each
collective kind with the bytes rank 0 recorded.
"""

from __future__ import annotations

import pandas as pd

from scalegnn.perfmodel import TERMS, Machine, Workload, fit, predict, predicted_bytes_per_step
from scalegnn.systems import SCALEGNN_SYSTEMS

from .figures import select

__all__ = ["workload_from_row", "machines_of", "validation_frame", "volume_check", "error_summary", "fit_from_runs"]


def _get(row, key, default=None):
    value = row.get(key, default) if hasattr(row, "get") else default
    return default if value is None or (isinstance(value, float) and pd.isna(value)) else value


def workload_from_row(row) -> Workload:
    """The model's workload from a ``load_runs`` row (graph, model and batch of the run)."""
    n = int(_get(row, "graph.num_nodes"))
    batch = _get(row, "batch_size")
    dtype = next((str(row[c]) for c in row.index if c.endswith("comm_dtype") and isinstance(row[c], str)), "")
    return Workload(num_nodes=n, nnz=int(_get(row, "graph.adjacency_nnz")),
                    num_features=int(_get(row, "graph.num_features")), num_classes=int(_get(row, "graph.num_classes")),
                    hidden=int(_get(row, "config.model.hidden", 256)), layers=int(_get(row, "config.model.layers", 3)),
                    batch_size=None if batch is None or int(batch) >= n else int(batch),
                    norm=bool(_get(row, "config.model.norm", True)),
                    residual=bool(_get(row, "config.model.residual", True)),
                    pmm_bytes=2 if dtype.lower() in ("bf16", "bfloat16", "torch.bfloat16") else 4)


def machines_of(manifests: list[dict]) -> dict[str, Machine]:
    """{cluster: Machine} from the sweep manifests: every sweep records what the
    performance model needs of its cluster (GPUs per node, bandwidths, throughputs),
    so the analysis needs nothing but the recorded files."""
    return {m["cluster"]: Machine.from_dict(m["machine"]) for m in manifests if m.get("machine")}


def _grid(row) -> tuple[int, int, int, int]:
    return tuple(int(row[f"grid.{a}"]) for a in ("dp", "x", "y", "z"))


def validation_frame(runs: pd.DataFrame, machines: dict[str, Machine], figure: str = "perfmodel",
                     min_runs: int = 8) -> pd.DataFrame:
    """Observed vs predicted epoch time on the model-validation runs (see module doc),
    per cluster of ``machines`` (:func:`machines_of`); clusters without one are skipped.

    The model describes the engine, which every grid runs, a single process included.
    Records written before the engine was one (a single process then ran a separate
    serial engine, recognizable by its ``forward_backward`` component) describe a
    different implementation: they are left out of the fit and listed in
    ``attrs["excluded"]`` with the model's prediction for them."""
    frame = select(runs, figure)
    frame = frame[(frame["sweep.figure"] == figure) & frame["system"].isin(list(SCALEGNN_SYSTEMS))
                  & frame["epoch_time_s"].notna()]
    retired = frame["time.forward_backward"].notna() if "time.forward_backward" in frame \
        else pd.Series(False, index=frame.index)
    serial = frame[retired]
    frame = frame[~retired]
    out = []
    coefs = {}
    for cluster, sub in frame.groupby(frame["sweep.cluster"].fillna("local")):
        if len(sub) < max(min_runs, len(TERMS) + 1) or cluster not in machines:
            continue
        machine = machines[cluster]
        base = []
        for _, row in sub.iterrows():
            p = predict(workload_from_row(row), _grid(row), machine)
            base.append((p.parts, float(row["epoch_time_s"])))
        coef = fit(base)
        coefs[cluster] = coef
        for i, (_, row) in enumerate(sub.iterrows()):
            loo_coef = fit(base[:i] + base[i + 1:])
            parts, observed = base[i]
            pred = sum(coef[t] * parts[t] for t in TERMS)
            loo = sum(loo_coef[t] * parts[t] for t in TERMS)
            out.append({"cluster": cluster, "dataset": row["dataset"], "grid": row["grid_str"],
                        "world_size": int(row["world_size"]), "observed_s": observed, "predicted_s": pred,
                        "loo_s": loo, "error": pred / observed - 1, "loo_error": loo / observed - 1,
                        **{f"part.{t}": coef[t] * parts[t] for t in TERMS}, "run_id": row["run_id"]})
    result = pd.DataFrame(out)
    result.attrs["coefficients"] = coefs
    excluded = []
    for _, row in serial.iterrows():
        cluster = row.get("sweep.cluster") or "local"
        if cluster in coefs:
            pred = predict(workload_from_row(row), _grid(row), machines[cluster], coefs[cluster]).epoch_s
            excluded.append({"grid": row["grid_str"], "observed_s": float(row["epoch_time_s"]), "predicted_s": pred,
                             "error": pred / float(row["epoch_time_s"]) - 1,
                             "reason": "written by the retired serial engine, which the model does not describe"})
    result.attrs["excluded"] = excluded
    return result


def error_summary(v: pd.DataFrame) -> dict:
    """Mean/max absolute relative error, fitted and leave-one-out, and rank agreement."""
    if v.empty:
        return {}
    obs_rank = v["observed_s"].rank()
    return {
        "runs": len(v),
        "mape_fit": float(v["error"].abs().mean()), "max_fit": float(v["error"].abs().max()),
        "mape_loo": float(v["loo_error"].abs().mean()), "max_loo": float(v["loo_error"].abs().max()),
        "spearman_loo": float(obs_rank.corr(v["loo_s"].rank())),
        "fastest_observed": v.loc[v["observed_s"].idxmin(), "grid"],
        "fastest_predicted_loo": v.loc[v["loo_s"].idxmin(), "grid"],
    }


def volume_check(runs: pd.DataFrame, figure: str = "perfmodel") -> pd.DataFrame:
    """Bytes per epoch per collective kind: model vs rank 0's record, for every run
    with recorded bytes (one row per run and kind)."""
    frame = select(runs, figure)
    frame = frame[frame["system"].isin(list(SCALEGNN_SYSTEMS))]
    rows = []
    for _, row in frame.iterrows():
        w = workload_from_row(row)
        grid = _grid(row)
        steps = int(_get(row, "steps_per_epoch", w.steps_per_epoch(grid[0])))
        pred = {k: v * steps for k, v in predicted_bytes_per_step(w, grid).items()}
        kinds = set(pred) | {c[len("bytes."):] for c in row.index if c.startswith("bytes.")
                             and not pd.isna(row[c])}
        for kind in sorted(kinds - {"clip", "eval"}):
            rec = _get(row, f"bytes.{kind}", 0.0)
            rows.append({"grid": row["grid_str"], "kind": kind, "predicted_bytes": pred.get(kind, 0.0),
                         "recorded_bytes": float(rec),
                         "ratio": pred.get(kind, 0.0) / rec if rec else float("nan")})
    return pd.DataFrame(rows)



def fit_from_runs(runs: pd.DataFrame, cluster: str, machine: Machine):
    """Coefficients fitted on the ok multi-rank ScaleGNN runs recorded by a sweep on
    ``cluster`` (whose hardware is ``machine``) without optimization variants (for
    ``scalegnn plan --fit``)."""
    if runs.empty:  # no records at all: the frame has none of the columns asked below
        runs = pd.DataFrame(columns=["status", "system", "epoch_time_s", "sweep.cluster", "world_size",
                                     "sweep.variant"])
    variant = runs["sweep.variant"].fillna("").astype(str)
    frame = runs[(runs["status"] == "ok") & runs["system"].isin(list(SCALEGNN_SYSTEMS))
                 & runs["epoch_time_s"].notna() & (runs["sweep.cluster"] == cluster) & (runs["world_size"] > 1)
                 & (variant == "")]
    if len(frame) < len(TERMS):
        raise ValueError(f"only {len(frame)} ScaleGNN runs recorded on {cluster} with epoch times; the fit needs "
                         f"at least {len(TERMS)} (run `scalegnn sweep perfmodel --cluster {cluster}` first)")
    samples = [(predict(workload_from_row(r), _grid(r), machine).parts, float(r["epoch_time_s"]))
               for _, r in frame.iterrows()]
    return fit(samples)
