"""OGB node property prediction graphs: ogbn-arxiv, ogbn-products, ogbn-papers100M.

Read through ``ogb.nodeproppred.NodePropPredDataset(name, root=data_root)`` so the
on-disk layout is ogb's own (``<root>/ogbn_arxiv/{RELEASE_v1.txt, raw/, processed/,
split/}``). Three things make that call safe for batch jobs:

- ogb asks on stdin before a download larger than 1 GB and before replacing an
  outdated copy. We answer for it: a download proceeds without asking (the user
  asked for the dataset), unless ``SCALEGNN_OFFLINE=1`` or the server cannot be
  reached, which raises :class:`DatasetError` naming the folder expected. An
  existing folder without ``RELEASE_v<version>.txt`` raises instead of prompting.
  Download once, on a node with internet, before launching distributed jobs.
- ogb reads its ``processed/data_processed`` (``torch.save`` of numpy arrays, pickle
  protocol 4, which torch's weights-only loader cannot parse) and any
  ``split/*/split_dict.pt`` with ``torch.load``. While ogb runs, its module sees a
  ``torch`` whose ``load`` reads them through a restricted unpickler that admits only
  numpy's array and scalar types (:mod:`scalegnn.datasets.safe_pickle`), so a crafted
  file is refused instead of running code; the patch is undone afterwards.
- ``exit(-1)`` on a refused download is unreachable: we never refuse, we raise.

Labels: arxiv and products are single-label ints; papers100M labels are float with
NaN for the ~98% unlabeled papers, mapped to -1. Graphs are made undirected
(arxiv and papers100M are directed citation graphs in ogb; symmetrizing them is the
standard practice for GCN), self loops and duplicates dropped. The split is ogb's
(``get_idx_split``): time-based for arxiv/papers100M, sales rank for products.
"""

from __future__ import annotations

import os
import threading
import urllib.request
from pathlib import Path

import numpy as np
import torch

from ._core import DATA_ROOT_HINT, DatasetError, make_graph, undirected_csr
from .safe_pickle import OGB_TYPES, load_torch_file

OGB_DATASETS = ("ogbn-arxiv", "ogbn-products", "ogbn-papers100M")
_LOCK = threading.Lock()  # the patches below are module attributes of ogb: one load at a time


def _offline() -> bool:
    return os.environ.get("SCALEGNN_OFFLINE", "").strip().lower() not in ("", "0", "false", "no")


class _TorchForOgb:
    """``torch`` as ogb's dataset module sees it during one load (see module docstring)."""

    def __getattr__(self, attr):
        return getattr(torch, attr)

    def load(self, f, *args, **kwargs):
        processed = Path(f).parent.name == "processed"  # the other file is a split_dict.pt
        fix = ("delete the processed folder next to it (ogb rebuilds it from raw/)" if processed
               else "re-download the dataset")
        return load_torch_file(f, OGB_TYPES, "a file of ogb's numpy graph format", fix)


def ogbn_release_files(name: str, root: Path) -> list[Path]:
    """ogb's RELEASE file when the dataset folder exists (it keys the processed-graph
    cache; a missing folder is no error here: ogb may download it)."""
    folder = root / name.replace("-", "_")
    return sorted(folder.glob("RELEASE_v*.txt")) if folder.is_dir() else []


def _no_data_error(name: str, folder: Path, url: str, why: str) -> DatasetError:
    return DatasetError(
        f"{name}: no local copy at {folder} (ogb needs RELEASE_v*.txt and processed/data_processed or raw/) "
        f"and it cannot be downloaded from {url}: {why}. Download it once on a machine with internet "
        f"(load_dataset('{name}', data_root=...)), or unzip {url.rsplit('/', 1)[-1]} into the data root and "
        f"rename the extracted folder to {folder.name}; then {DATA_ROOT_HINT} pointing to its parent folder"
    )


def load_ogbn(name: str, root: Path):
    try:
        import ogb.nodeproppred.dataset as ogb_ds
    except ImportError as e:
        raise DatasetError(f"{name} needs the 'ogb' package: pip install 'ogb>=1.3.6' (or scalegnn[datasets])") from e
    import pandas as pd

    master = pd.read_csv(Path(ogb_ds.__file__).with_name("master.csv"), index_col=0, keep_default_na=False)
    info = master[name]
    folder = root / name.replace("-", "_")
    release = folder / f"RELEASE_v{info['version']}.txt"
    if folder.is_dir() and not release.is_file():
        raise DatasetError(
            f"{name}: {folder} exists but has no {release.name}: it is an outdated or incomplete copy "
            f"(ogb would ask to delete it). Remove the folder to download it again, or fix the copy"
        )
    if folder.is_dir() and not (folder / "processed").exists():
        try:
            (folder / "processed").mkdir()  # ogb writes processed/data_processed without creating it
        except OSError:
            pass

    def decide_download(u):
        if _offline():
            raise _no_data_error(name, folder, u, "SCALEGNN_OFFLINE is set")
        try:
            with urllib.request.urlopen(u, timeout=20) as r:
                size = int(r.info().get("Content-Length") or 0)
        except Exception as e:  # noqa: BLE001 - any network failure
            raise _no_data_error(name, folder, u, f"{type(e).__name__}: {e}") from e
        import sys

        print(f"scalegnn: downloading {u} ({size / 2**30:.2f} GiB) into {root}", file=sys.stderr)
        return True

    def no_prompt(prompt=""):
        raise DatasetError(f"{name}: ogb asked {prompt.strip()!r} under {folder}; fix the folder by hand")

    patches = {"torch": _TorchForOgb(), "decide_download": decide_download, "input": no_prompt}
    with _LOCK:
        saved = {k: ogb_ds.__dict__[k] for k in patches if k in ogb_ds.__dict__}
        ogb_ds.__dict__.update(patches)
        try:
            ds = ogb_ds.NodePropPredDataset(name=name, root=str(root))
            split = ds.get_idx_split()
        except DatasetError:
            raise
        except Exception as e:  # noqa: BLE001 - ogb's parsers raise anything on a bad file
            raise DatasetError(f"{name}: ogb failed to read {folder}: {type(e).__name__}: {e}") from e
        finally:
            for k in patches:
                if k in saved:
                    ogb_ds.__dict__[k] = saved[k]
                else:
                    ogb_ds.__dict__.pop(k, None)

    g, labels = ds[0]
    n = int(g["num_nodes"])
    if g.get("node_feat") is None:
        raise DatasetError(f"{name}: {folder} has no node features (node_feat); re-download it")
    labels = np.asarray(labels).reshape(n, -1)
    if labels.shape[1] != 1:
        raise DatasetError(f"{name}: expected one label column, got {labels.shape[1]}")
    labels = labels[:, 0]
    if np.issubdtype(labels.dtype, np.floating):
        y = np.where(np.isnan(labels), -1, labels).astype(np.int64)
    else:
        y = labels.astype(np.int64)
    edge_index = np.asarray(g["edge_index"])
    indptr, indices, values, counts = undirected_csr(edge_index[0], edge_index[1], n)
    parts = [
        torch.as_tensor(np.sort(np.asarray(split[k]).reshape(-1).astype(np.int64))) for k in ("train", "valid", "test")
    ]
    return make_graph(
        name,
        indptr=indptr,
        indices=indices,
        values=values,
        x=torch.from_numpy(np.asarray(g["node_feat"], dtype=np.float32)),
        y=torch.from_numpy(y),
        train_idx=parts[0],
        val_idx=parts[1],
        test_idx=parts[2],
        num_classes=int(ds.num_classes),
        name=name,
        meta={"source": str(folder), "split": f"ogb {info['split']}", "labeled": int((y >= 0).sum()), **counts},
    )
