"""The 3D-parallel ScaleGNN: this rank's shards of the serial model's parameters.

Shape legend (per rank, see :mod:`scalegnn.parallel.layout`):
    F_z    input features of the z range       H_a   hidden dims of the a range
    C_d    classes of the d range              Br_a  batch rows of the a block

    X_h0 = AR_z(X_in[x, z] @ W_in[z, y])                         on (x, y)        (Eq. 4)
    for layer l with input on (r, c), third axis t (rotation, period 3):
        H   = AR_r(A_l[t, r] @ X[r, c])                          on (t, c)        (Eq. 5, 27)
        Z   = AR_c(H @ W_l[c, r])                                on (t, r)        (Eq. 6, 28)
        X   = dropout(relu(rmsnorm_r(Z))) + reshard(X, (r, c) -> (t, r))          (Eqs. 7-10, 29)
    O    = AR_b(X[a, b] @ W_out[b, d])                           on (a, d)        (Eq. 11)

Parameter shards (the replicated axes hold identical copies):

    w_in    (F_z, H_y)  of W_in  (F, H)      replicated along x
    w[l]    (H_c, H_r)  of W_l   (H, H)      replicated along t
    norm[l] (H_r,)      of g_l   (H,)        replicated along t and c
    w_out   (H_b, C_d)  of W_out (H, C)      replicated along a

Initialization slices the full tensors of a serial ``ScaleGNN(in_dim, C, cfg, seed)``
built with the same seed, so the parallel model starts from exactly the serial
weights. Memory caveat: every rank briefly holds the full parameters
(F*H + L*H^2 + H*C floats) during construction; for the model sizes of the paper
(H <= 1024) that is a few MB, far below the graph shards.

Paper V switches, carried by the :class:`ParallelContext`: ``pc.fused`` evaluates
RMSNorm + ReLU + dropout as one (``torch.compile``-d) element-wise function (V-C);
``pc.overlap`` with :meth:`ParallelScaleGNN.defer_weight_grad_sync` overlaps the
backward all-reduces (V-D); ``pc.bucket`` with it merges the weight-gradient ones.
With a double-permuted batch (``batch.alt``, Plexus 5.1) even layers multiply ``A``
with rows in sigma ids and odd layers ``A`` with columns in sigma ids, so activations
alternate between the two labelings; dropout masks are keyed by vertex, so they equal
the serial ones.
"""

from __future__ import annotations

import torch
from torch import nn

from ..model import ModelConfig, ScaleGNN, dropout_key
from .dist_sampling import ShardedBatch
from ..ranges import split_range
from .grid import PMM_AXES, ProcessGrid
from .layout import INPUT_LAYOUT, head_layout, layer_layout
from .pmm import DropoutBlock, ParallelContext, fused_layer_tail, layer_tail, reshard, sharded_gemm, sharded_spmm

__all__ = ["ParallelScaleGNN", "ParamShard"]


class ParamShard:
    """Where a parameter shard sits in the full tensor: global row/col ranges and the
    grid axes along which it is replicated (its row/col split axes are the others)."""

    def __init__(self, rows: tuple[int, int] | None, cols: tuple[int, int], row_axis: str | None, col_axis: str):
        self.rows, self.cols = rows, cols
        self.row_axis, self.col_axis = row_axis, col_axis
        self.replicated = tuple(a for a in PMM_AXES if a not in (row_axis, col_axis))

    def slice_of(self, full: torch.Tensor) -> torch.Tensor:
        if self.rows is None:
            return full[self.cols[0]: self.cols[1]]
        return full[self.rows[0]: self.rows[1], self.cols[0]: self.cols[1]]

    def __repr__(self) -> str:
        return f"ParamShard(rows={self.rows}, cols={self.cols}, replicated={self.replicated})"


class ParallelScaleGNN(nn.Module):
    """This rank's shard of :class:`scalegnn.model.ScaleGNN`; same parameter names."""

    def __init__(self, in_dim: int, num_classes: int, config: ModelConfig, grid: ProcessGrid, seed: int = 0,
                 reference: ScaleGNN | None = None):
        super().__init__()
        self.config, self.grid = config, grid
        self.in_dim, self.num_classes = in_dim, num_classes
        ref = reference if reference is not None else ScaleGNN(in_dim, num_classes, config, seed=seed)
        h = config.hidden

        def rng(n, ax):
            return split_range(n, grid.axis_size(ax), grid.axis_index(ax))

        self.shards: dict[str, ParamShard] = {}

        def take(name, full, shard):
            self.shards[name] = shard
            return nn.Parameter(shard.slice_of(full.detach()).clone().contiguous())

        r, c = INPUT_LAYOUT  # W_in on (z, y): rows F over z, cols H over y
        self.w_in = take("w_in", ref.w_in, ParamShard(rng(in_dim, "z"), rng(h, c), "z", c))
        ws, norms = [], []
        for layer in range(config.layers):
            lay = layer_layout(layer)
            wr, wc = lay.w
            ws.append(take(f"w.{layer}", ref.w[layer], ParamShard(rng(h, wr), rng(h, wc), wr, wc)))
            if config.norm:
                oc = lay.out[1]
                norms.append(take(f"norm.{layer}", ref.norm[layer], ParamShard(None, rng(h, oc), None, oc)))
        self.w = nn.ParameterList(ws)
        self.norm = nn.ParameterList(norms) if config.norm else None
        head = head_layout(config.layers)
        self.head = head
        br, bc = head.w
        self.w_out = take("w_out", ref.w_out, ParamShard(rng(h, br), rng(num_classes, bc), br, bc))
        self.class_range = rng(num_classes, head.class_axis)

    def defer_weight_grad_sync(self, pc: ParallelContext) -> None:
        """Paper V-D (``pc.overlap``) and buckets (``pc.bucket``): the GEMMs leave each weight
        gradient partial and a post-accumulate-grad hook hands it to
        :meth:`ParallelContext.reduce_weight_grad` (an all-reduce over the axis along which
        the shard is replicated) as soon as autograd has accumulated it;
        ``pc.wait_pending()`` completes them all. RMSNorm gains (replicated along their
        layer's row and third axes, summed over the row axis) join the buckets; without
        buckets they keep their synchronous reduction inside the norm's backward."""
        if getattr(self, "_defer_pc", None) is not None:
            raise RuntimeError("weight-gradient hooks are already installed")
        self._defer_pc = pc
        for name, param in self.named_parameters():
            shard = self.shards[name]
            if shard.rows is None:  # norm.<l>: its gradient sums over the rows of layer l's output
                axis, norm = layer_layout(int(name.split(".")[1])).out[0], True
            else:
                (axis,), norm = shard.replicated, False
            hook = pc.weight_grad_hook(param, axis, norm=norm)
            if hook is not None:
                param.register_post_accumulate_grad_hook(hook)

    def is_owner(self, name: str) -> bool:
        """True on exactly one replica of each shard (index 0 along its replicated axes):
        sums over owners count every parameter element once (e.g. the global grad norm)."""
        return all(self.grid.axis_index(a) == 0 for a in self.shards[name].replicated)

    def forward(self, batch: ShardedBatch, pc: ParallelContext, dropout_seed: int = 0, step: int = 0) -> torch.Tensor:
        """Logits block (Br_a, C_d) on the head layout (a, d) for this rank's batch shard.

        Dropout (training mode, p > 0) draws the serial mask's block for the global
        vertex ids of the rows and global hidden ids of the columns, keyed by
        ``dropout_key(dropout_seed, step, layer)`` exactly as the serial model.
        """
        cfg = self.config
        rows = batch.rows
        hidden = cfg.hidden
        use_dropout = self.training and cfg.dropout > 0
        alt = batch.alt  # double permutation: layers alternate between the two labelings
        if alt is not None and cfg.residual:
            raise ValueError("double permutation needs residual connections off (--no-residual): the residual add "
                             "would need an all-to-all row permutation per layer (Plexus' model has none)")
        defer = pc is getattr(self, "_defer_pc", None) and torch.is_grad_enabled()  # the hooks reduce dW
        # X_h0 = AR_z(X_in[x, z] W_in[z, y]) on (x, y); dW_in summed over x (Eq. 18).
        x = sharded_gemm(batch.x, self.w_in, pc, reduce_axis="z", dh_axis="y", dw_axis="x", defer_dw=defer,
                         h_t=batch.x_t)
        for layer in range(cfg.layers):
            lay = layer_layout(layer)
            if alt is None:
                adj, out_rows, out_ids = batch.adj[layer % 3], rows, batch.nodes
            elif layer % 2 == 0:  # A with rows in sigma ids: id-order input, sigma-order output
                adj, out_rows, out_ids = alt.adj[layer % 3], alt.rows, alt.ids
            else:  # A with columns in sigma ids: sigma-order input, id-order output
                adj, out_rows, out_ids = alt.adj_t[layer % 3], rows, batch.nodes
            agg = sharded_spmm(x, adj, pc, lay.spmm_axis, grad_axis=lay.adj[0])
            z = sharded_gemm(agg, self.w[layer], pc, reduce_axis=lay.gemm_axis, dh_axis=lay.w[1],
                             dw_axis=lay.h[0], defer_dw=defer)
            row_ax, col_ax = lay.out
            drop = None
            if use_dropout:
                c0, c1 = split_range(hidden, self.grid.axis_size(col_ax), self.grid.axis_index(col_ax))
                lo, hi = out_rows.block(row_ax)  # the mask is keyed by vertex (id labeling): the serial mask
                drop = DropoutBlock(dropout_key(dropout_seed, step, layer), out_ids[lo:hi].to(z.device),
                                    torch.arange(c0, c1, device=z.device), cfg.dropout)
            norm_w = self.norm[layer] if cfg.norm else None
            if pc.fused is not None:  # RMSNorm + ReLU + dropout in one torch.compile-d function (V-C)
                keep = drop.keep() if drop is not None else None
                z = fused_layer_tail(z, norm_w, keep, pc, col_ax, row_ax, hidden, cfg.norm_eps, cfg.dropout,
                                     cfg.norm)
                x = z + reshard(x, lay.feat, lay.out, rows, hidden, pc) if cfg.residual else z
            else:  # RMSNorm + ReLU + dropout + residual: one autograd node, one kernel a phase
                res = reshard(x, lay.feat, lay.out, rows, hidden, pc) if cfg.residual else None
                x = layer_tail(z, norm_w, res, drop, pc, col_ax, row_ax, hidden, cfg.norm_eps, cfg.norm)
        head = self.head
        return sharded_gemm(x, self.w_out, pc, reduce_axis=head.reduce_axis, dh_axis=head.w[1],
                            dw_axis=head.feat[0], defer_dw=defer)
