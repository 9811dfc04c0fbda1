"""DistDGL roles, run inside the DGL environment (.venv-dgl: torch 2.1.2, dgl 2.1.0).

Self-contained on purpose: it imports nothing from scalegnn (whose code needs torch
2.13). The harness (``baselines/distdgl/harness.py``) starts it as a subprocess:

    dgl_run.py partition --graph G.npz --out DIR --parts K --method metis|random [--balance-train] [--balance-edges]
    dgl_run.py server                      (roles and addresses come from DGL_* variables, as DGL's launch.py sets)
    dgl_run.py trainer --spec SPEC.json    (DistGraph + DistNodeDataLoader + NeighborSampler + DDP)

The trainer with torch rank 0 writes ``<out>/result.json``: one row per epoch in
the run-record format of ``results/README.md`` (cumulative training time excluding
evaluation, loss, accuracies, evaluation time), the environment and per-rank peak
memory. Every other rank writes nothing but its log.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
import traceback


def _partition(a) -> int:
    import dgl
    import numpy as np
    import torch

    z = np.load(a.graph)
    n = int(z["num_nodes"])
    g = dgl.graph((torch.from_numpy(z["src"]), torch.from_numpy(z["dst"])), num_nodes=n)
    g.ndata["feat"] = torch.from_numpy(z["x"])
    g.ndata["label"] = torch.from_numpy(z["y"])
    for split in ("train", "val", "test"):
        mask = torch.zeros(n, dtype=torch.bool)
        mask[torch.from_numpy(z[f"{split}_idx"])] = True
        g.ndata[f"{split}_mask"] = mask
    dgl.distributed.partition_graph(
        g, a.name, a.parts, a.out, part_method=a.method,
        balance_ntypes=g.ndata["train_mask"] if a.balance_train else None,
        balance_edges=a.balance_edges, num_trainers_per_machine=a.trainers_per_machine,
    )
    return 0


def _server(a) -> int:
    import dgl

    dgl.distributed.initialize(os.environ["DGL_IP_CONFIG"])  # runs the server; never returns
    return 0


class _Timeout:
    pass


def _trainer(a) -> int:
    spec = json.loads(open(a.spec).read())
    machine = int(spec["machine"])
    import dgl
    import dgl.distributed.rpc_client as rpc_client
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    from dgl.nn import SAGEConv

    # Every simulated machine shares 127.0.0.1: tell DGL which machine this trainer is on
    # (it would otherwise pick the first ip_config line for every trainer).
    rpc_client.get_local_machine_id = lambda server_namebook: machine
    torch.manual_seed(spec["seed"])
    dgl.distributed.initialize(spec["ip_config"])
    import datetime

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=spec["collective_timeout_s"]))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(max(1, int(spec.get("threads", 1))))
    g = dgl.distributed.DistGraph(spec["graph_name"], part_config=spec["part_config"])
    pb = g.get_partition_book()
    train_nid = dgl.distributed.node_split(g.ndata["train_mask"], pb, force_even=True)
    any_mask = g.ndata["train_mask"][0 : g.num_nodes()] | g.ndata["val_mask"][0 : g.num_nodes()] | \
        g.ndata["test_mask"][0 : g.num_nodes()]
    eval_nid_all = torch.nonzero(any_mask).flatten()
    eval_nid = eval_nid_all.tensor_split(world)[rank]
    fanouts = spec["fanouts"]
    eval_fanouts = spec["eval_fanouts"]
    layers = len(fanouts)

    class DistSAGE(nn.Module):
        """DGL's ``examples/distributed/graphsage`` model: SAGEConv('mean') x L."""

        def __init__(self, in_feats, hidden, classes, layers, dropout):
            super().__init__()
            dims = [in_feats] + [hidden] * (layers - 1) + [classes]
            self.layers = nn.ModuleList(SAGEConv(dims[i], dims[i + 1], "mean") for i in range(layers))
            self.dropout = nn.Dropout(dropout)

        def forward(self, blocks, x):
            h = x
            for i, (layer, block) in enumerate(zip(self.layers, blocks)):
                h = layer(block, h)
                if i != len(self.layers) - 1:
                    h = self.dropout(F.relu(h))
            return h

    feat_dim = g.ndata["feat"].shape[1]
    num_classes = int(spec["num_classes"])
    model = DistSAGE(feat_dim, spec["hidden"], num_classes, layers, spec["dropout"])
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=spec["lr"], weight_decay=spec["weight_decay"])
    sampler = dgl.dataloading.NeighborSampler(fanouts)
    train_loader = dgl.dataloading.DistNodeDataLoader(g, train_nid, sampler, batch_size=spec["batch_size"],
                                                      shuffle=True, drop_last=False)
    eval_sampler = dgl.dataloading.NeighborSampler(eval_fanouts)
    rows, train_time = [], 0.0
    steps_per_epoch = -(-int(train_nid.numel()) // spec["batch_size"])

    def reduce(vals, op=dist.ReduceOp.SUM):
        t = torch.tensor(vals, dtype=torch.float64)
        dist.all_reduce(t, op=op)
        return t.tolist()

    @torch.no_grad()
    def evaluate():
        model.eval()
        loader = dgl.dataloading.DistNodeDataLoader(g, eval_nid, eval_sampler, batch_size=spec["eval_batch_size"],
                                                    shuffle=False, drop_last=False)
        sums = [0.0] * 6
        for input_nodes, seeds, blocks in loader:
            x = g.ndata["feat"][input_nodes]
            pred = model(blocks, x).argmax(-1)
            y = g.ndata["label"][seeds]
            for k, split in enumerate(("train_mask", "val_mask", "test_mask")):
                m = g.ndata[split][seeds].bool()
                sums[2 * k] += float((pred[m] == y[m]).sum())
                sums[2 * k + 1] += float(m.sum())
        sums = reduce(sums)
        model.train()
        return [sums[2 * k] / sums[2 * k + 1] if sums[2 * k + 1] else float("nan") for k in range(3)]

    status, error = "ok", None
    try:
        for epoch in range(1, spec["epochs"] + 1):
            if spec.get("fail_at_epoch") == epoch:
                raise RuntimeError(f"injected failure at epoch {epoch} (test hook)")
            model.train()
            comp = {"sampling": 0.0, "feature_fetch": 0.0, "forward_backward": 0.0, "optimizer": 0.0}
            loss_sum = loss_n = correct = count = 0.0
            t0 = time.perf_counter()
            with ddp.join():
                it = iter(train_loader)
                while True:
                    ta = time.perf_counter()
                    try:
                        input_nodes, seeds, blocks = next(it)
                    except StopIteration:
                        break
                    tb = time.perf_counter()
                    x = g.ndata["feat"][input_nodes]
                    y = g.ndata["label"][seeds].long()
                    tc = time.perf_counter()
                    out = ddp(blocks, x)
                    loss = F.cross_entropy(out, y)
                    opt.zero_grad()
                    loss.backward()
                    td = time.perf_counter()
                    opt.step()
                    te = time.perf_counter()
                    comp["sampling"] += tb - ta
                    comp["feature_fetch"] += tc - tb
                    comp["forward_backward"] += td - tc
                    comp["optimizer"] += te - td
                    loss_sum += float(loss.detach())
                    loss_n += 1
                    correct += float((out.argmax(-1) == y).sum())
                    count += y.numel()
            elapsed = time.perf_counter() - t0
            loss_sum, loss_n, correct, count = reduce([loss_sum, loss_n, correct, count])
            elapsed = reduce([elapsed], dist.ReduceOp.MAX)[0]
            train_time += elapsed
            row = {"epoch": epoch, "train_time_s": train_time, "loss": loss_sum / max(loss_n, 1),
                   "batch_train_acc": correct / count if count else None,
                   "train_acc": None, "val_acc": None, "test_acc": None, "eval_time_s": None,
                   "components": comp, "comm_bytes": {}}
            if epoch % spec["eval_every"] == 0 or epoch == spec["epochs"]:
                t1 = time.perf_counter()
                tr, va, te = evaluate()
                row["eval_time_s"] = reduce([time.perf_counter() - t1], dist.ReduceOp.MAX)[0]
                row.update(train_acc=tr, val_acc=va, test_acc=te)
            rows.append(row)
            if rank == 0:
                print(f"epoch {epoch} loss {row['loss']:.4f} test {row['test_acc']} time {train_time:.2f}", flush=True)
            target = spec.get("target_acc")
            if spec.get("stop_at_target") and target is not None and (row["test_acc"] or 0.0) >= target:
                break
    except Exception as exc:  # noqa: BLE001 - reported in the result, then re-raised
        status, error = "failed", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}"
    peak = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
    result = {"status": status, "error": error, "epochs": rows, "rank": rank, "world_size": world,
              "steps_per_epoch": steps_per_epoch, "peak_memory_bytes": peak,
              "env": {"torch": torch.__version__, "dgl": dgl.__version__, "python": sys.version.split()[0]},
              "num_train_per_rank": int(train_nid.numel())}
    if status == "ok":
        peaks = [None] * world
        dist.all_gather_object(peaks, peak)
        result["peak_memory_bytes_per_rank"] = peaks
    path = os.path.join(spec["out_dir"], f"result-{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)
    if status != "ok":
        print(error, file=sys.stderr, flush=True)
        os._exit(3)  # no exit_client barrier: the other trainers may be gone; the harness stops the servers
    dist.destroy_process_group()
    dgl.distributed.exit_client()  # the last client stops the servers
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="dgl_run.py")
    sub = p.add_subparsers(dest="role", required=True)
    pp = sub.add_parser("partition")
    pp.add_argument("--graph", required=True)
    pp.add_argument("--out", required=True)
    pp.add_argument("--name", default="graph")
    pp.add_argument("--parts", type=int, required=True)
    pp.add_argument("--method", choices=("metis", "random"), default="metis")
    pp.add_argument("--balance-train", action="store_true")
    pp.add_argument("--balance-edges", action="store_true")
    pp.add_argument("--trainers-per-machine", type=int, default=1)
    sub.add_parser("server")
    pt = sub.add_parser("trainer")
    pt.add_argument("--spec", required=True)
    a = p.parse_args(argv)
    return {"partition": _partition, "server": _server, "trainer": _trainer}[a.role](a)


if __name__ == "__main__":
    sys.exit(main())
