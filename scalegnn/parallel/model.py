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
RMSNorm + ReLU + dropout + residual in ``torch.compile``-d phases, the dropout mask
hashed inside the kernel that applies it (V-C);
``pc.overlap`` with :meth:`ParallelScaleGNN.defer_weight_grad_sync` overlaps the
backward all-reduces (V-D); ``pc.bucket`` with it merges the weight-gradient ones.
With a double-permuted batch (``batch.alt``, Plexus 5.1) even layers multiply ``A``
with rows in sigma ids and odd layers ``A`` with columns in sigma ids, so activations
alternate between the two labelings; dropout masks are keyed by vertex, so they equal
the serial ones.

The full-graph evaluation (:meth:`ParallelScaleGNN.evaluate_logits`) runs the same
layer operators on row chunks, with every activation split over all G ranks between
layers instead of replicated along the layout's third axis.
"""

from __future__ import annotations

import torch
from torch import nn

from .._elementwise import DropoutBlock
from ..model import ModelConfig, ScaleGNN, dropout_key
from ..sampling import SampledBlock
from .context import ParallelContext
from .dist_sampling import ShardedBatch
from ..ranges import split_bounds, split_range
from .grid import PMM_AXES, ProcessGrid, third_axis
from .layout import INPUT_LAYOUT, head_layout, interval_overlap, layer_layout
from .products import (csr_chunk_pointers, csr_rows, gather_row_pieces, reshard, row_chunks, sharded_gemm,
                       sharded_spmm)
from .tail import layer_tail, parallel_rms_norm

__all__ = ["ParallelScaleGNN", "ParamShard", "param_shards", "full_shapes", "assemble_shards", "EVAL_CHUNK_BYTES"]

# Bytes of one row chunk of a layer output in the full-graph evaluation: small beside a
# block (N H / G), large enough that the chunks' collectives cost little per byte.
EVAL_CHUNK_BYTES = 4 << 20


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


def param_shards(in_dim: int, num_classes: int, config: ModelConfig, grid: ProcessGrid) -> dict[str, ParamShard]:
    """Where each of this grid rank's parameter shards sits in the serial parameter of the
    same name (``w_in``, ``w.<l>``, ``norm.<l>``, ``w_out``), in the serial model's
    parameter order. A function of the grid's shape and the rank's coordinates only, so a
    :meth:`ProcessGrid.virtual` grid places the shards of any rank of any grid (a
    checkpoint's, to consolidate or reshard it)."""
    h = config.hidden

    def rng(n, ax):
        return split_range(n, grid.axis_size(ax), grid.axis_index(ax))

    _, c = INPUT_LAYOUT  # W_in on (z, y): rows F over z, cols H over y
    shards = {"w_in": ParamShard(rng(in_dim, "z"), rng(h, c), "z", c)}
    for layer in range(config.layers):
        wr, wc = layer_layout(layer).w
        shards[f"w.{layer}"] = ParamShard(rng(h, wr), rng(h, wc), wr, wc)
    if config.norm:
        for layer in range(config.layers):
            oc = norm_layout(config, layer)[1]
            shards[f"norm.{layer}"] = ParamShard(None, rng(h, oc), None, oc)
    br, bc = head_layout(config.layers).w
    shards["w_out"] = ParamShard(rng(h, br), rng(num_classes, bc), br, bc)
    return shards


def norm_layout(config: ModelConfig, layer: int) -> tuple[str, str]:
    """(row axis, column axis) of the block layer ``layer``'s RMSNorm sees: its output
    (t, r) for the paper's post-convolution norm, its input (r, c) for a pre-norm."""
    lay = layer_layout(layer)
    return lay.feat if config.pre_norm else lay.out


def full_shapes(in_dim: int, num_classes: int, config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The serial model's parameter shapes by name, in the order of ``parameters()`` (and
    so of an optimizer's state): a module's own parameters first (``w_in``, ``w_out``),
    then its parameter lists (``w.<l>``, ``norm.<l>``)."""
    h = config.hidden
    shapes = {"w_in": (in_dim, h), "w_out": (h, num_classes), **{f"w.{layer}": (h, h) for layer in range(config.layers)}}
    if config.norm:
        shapes.update({f"norm.{layer}": (h,) for layer in range(config.layers)})
    return shapes


def assemble_shards(pieces: dict[int, dict[str, torch.Tensor]], shape: tuple[int, int, int, int], in_dim: int,
                    num_classes: int, config: ModelConfig) -> dict[str, torch.Tensor]:
    """Whole serial tensors from shards: ``pieces[rank][name]`` is rank ``rank``'s shard of
    ``name`` on the grid ``shape`` (Gd, Gx, Gy, Gz), as :func:`param_shards` places it (a
    parameter or anything shaped like one: AdamW's moments). Any set of ranks that covers
    every element will do (one replica of each shard suffices); an element no piece
    covers is a ``ValueError`` naming the parameter."""
    shapes = full_shapes(in_dim, num_classes, config)
    full: dict[str, torch.Tensor] = {}
    covered: dict[str, torch.Tensor] = {}
    for rank, named in sorted(pieces.items()):
        places = param_shards(in_dim, num_classes, config, ProcessGrid.virtual(*shape, rank=rank))
        for name, piece in named.items():
            if name not in shapes:
                raise ValueError(f"shard {name!r} of rank {rank} is no parameter of this model ({', '.join(shapes)})")
            if name not in full:
                full[name] = piece.new_zeros(shapes[name])
                covered[name] = torch.zeros(shapes[name], dtype=torch.bool)
            place = places[name]
            if tuple(place.slice_of(full[name]).shape) != tuple(piece.shape):
                raise ValueError(f"shard {name!r} of rank {rank} has shape {tuple(piece.shape)}; the grid "
                                 f"{'x'.join(map(str, shape))} places {tuple(place.slice_of(full[name]).shape)} there")
            place.slice_of(full[name]).copy_(piece)
            place.slice_of(covered[name]).fill_(True)
    for name in shapes:
        if name not in covered or not bool(covered[name].all()):
            raise ValueError(f"the shards given do not cover all of {name!r}: a rank's file is missing")
    return full


class ParallelScaleGNN(nn.Module):
    """This rank's shard of :class:`scalegnn.model.ScaleGNN`; same parameter names."""

    def __init__(self, in_dim: int, num_classes: int, config: ModelConfig, grid: ProcessGrid, seed: int = 0,
                 reference: ScaleGNN | None = None):
        super().__init__()
        self.config, self.grid = config, grid
        self.in_dim, self.num_classes = in_dim, num_classes
        ref = reference if reference is not None else ScaleGNN(in_dim, num_classes, config, seed=seed)
        self.shards: dict[str, ParamShard] = param_shards(in_dim, num_classes, config, grid)
        full = dict(ref.named_parameters())

        def take(name):
            return nn.Parameter(self.shards[name].slice_of(full[name].detach()).clone().contiguous())

        self.w_in = take("w_in")
        self.w = nn.ParameterList([take(f"w.{layer}") for layer in range(config.layers)])
        self.norm = nn.ParameterList([take(f"norm.{layer}") for layer in range(config.layers)]) \
            if config.norm else None
        self.head = head_layout(config.layers)
        self.w_out = take("w_out")
        self.class_range = split_range(num_classes, grid.axis_size(self.head.class_axis),
                                       grid.axis_index(self.head.class_axis))

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
            if shard.rows is None:  # norm.<l>: its gradient sums over the rows of the block it normalizes
                axis, norm = norm_layout(self.config, int(name.split(".")[1]))[0], True
            else:
                (axis,), norm = shard.replicated, False
            hook = pc.weight_grad_hook(param, axis, norm=norm)
            if hook is not None:
                param.register_post_accumulate_grad_hook(hook)

    def is_owner(self, name: str) -> bool:
        """True on exactly one replica of each shard (index 0 along its replicated axes):
        sums over owners count every parameter element once (e.g. the global grad norm)."""
        return all(self.grid.axis_index(a) == 0 for a in self.shards[name].replicated)

    # ------------------------------------------------------------------ one layer's parts
    # The training forward and the evaluation forward share these: the layer formula
    # lives here once, whether it runs on a whole block or on a chunk of its rows.
    def _check_permutation(self, batch: ShardedBatch) -> None:
        if batch.alt is not None and self.config.residual:
            raise ValueError("double permutation needs residual connections off (--no-residual): the residual add "
                             "would need an all-to-all row permutation per layer (Plexus' model has none)")

    @staticmethod
    def _plane(batch: ShardedBatch, layer: int):
        """(A shard, row partition and vertex ids of the output rows) of ``layer``. With a
        double-permuted batch (``batch.alt``) even layers multiply A with rows in sigma
        ids (id-order input, sigma-order output), odd layers A with columns in sigma ids
        (sigma-order input, id-order output)."""
        alt = batch.alt
        if alt is None:
            return batch.adj[layer % 3], batch.rows, batch.nodes
        if layer % 2 == 0:
            return alt.adj[layer % 3], alt.rows, alt.ids
        return alt.adj_t[layer % 3], batch.rows, batch.nodes

    def _transform(self, x: torch.Tensor, adj: SampledBlock, layer: int, pc: ParallelContext,
                   defer: bool = False) -> torch.Tensor:
        """Z = AR_c(AR_r(A[t, r] @ X[r, c]) @ W_l[c, r]) on (t, r) (Eqs. 5-6, 27-28); ``adj``
        may hold a chunk of A's rows (then Z holds the same rows)."""
        lay = layer_layout(layer)
        agg = sharded_spmm(x, adj.adj, adj.adj_t, pc, lay.spmm_axis, grad_axis=lay.adj[0])
        return sharded_gemm(agg, self.w[layer], pc, reduce_axis=lay.gemm_axis, dh_axis=lay.w[1],
                            dw_axis=lay.h[0], defer_dw=defer)

    def _tail(self, z: torch.Tensor, res: torch.Tensor | None, drop: DropoutBlock | None, layer: int,
              pc: ParallelContext) -> torch.Tensor:
        """dropout(relu(rmsnorm_r(Z))) + residual (Eqs. 7-10, 29) on the layer's output
        layout; ``res`` the layer input resharded to it (None: no residual)."""
        cfg = self.config
        row_ax, col_ax = layer_layout(layer).out
        norm_w = self.norm[layer] if cfg.post_norm else None
        # RMSNorm + ReLU + dropout + residual: one autograd node, one kernel a phase
        # (with pc.fused, the torch.compile-d phases, the mask hashed inside: V-C)
        return layer_tail(z, norm_w, res, drop, pc, col_ax, row_ax, cfg.hidden, cfg.norm_eps, cfg.post_norm)

    def _input_norm(self, x: torch.Tensor, layer: int, pc: ParallelContext) -> torch.Tensor:
        """The layer input itself, or with ``--norm-position pre`` its RMSNorm on the input
        layout (r, c): the row sums all-reduced over c, g's gradient summed over r."""
        cfg = self.config
        if not cfg.pre_norm:
            return x
        row_ax, col_ax = layer_layout(layer).feat
        return parallel_rms_norm(x, self.norm[layer], pc, col_ax, row_ax, cfg.hidden, cfg.norm_eps)

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
        self._check_permutation(batch)
        defer = pc is getattr(self, "_defer_pc", None) and torch.is_grad_enabled()  # the hooks reduce dW
        # X_h0 = AR_z(X_in[x, z] W_in[z, y]) on (x, y); dW_in summed over x (Eq. 18).
        x = sharded_gemm(batch.x, self.w_in, pc, reduce_axis="z", dh_axis="y", dw_axis="x", defer_dw=defer,
                         h_t=batch.x_t)
        for layer in range(cfg.layers):
            lay = layer_layout(layer)
            adj, out_rows, out_ids = self._plane(batch, layer)
            z = self._transform(self._input_norm(x, layer, pc), adj, layer, pc, defer)
            row_ax, col_ax = lay.out
            drop = None
            if use_dropout:
                c0, c1 = split_range(hidden, self.grid.axis_size(col_ax), self.grid.axis_index(col_ax))
                lo, hi = out_rows.block(row_ax)  # the mask is keyed by vertex (id labeling): the serial mask
                drop = DropoutBlock(dropout_key(dropout_seed, step, layer), out_ids[lo:hi].to(z.device),
                                    torch.arange(c0, c1, device=z.device), cfg.dropout)
            res = reshard(x, lay.feat, lay.out, rows, hidden, pc) if cfg.residual else None
            x = self._tail(z, res, drop, layer, pc)
        head = self.head
        return sharded_gemm(x, self.w_out, pc, reduce_axis=head.reduce_axis, dh_axis=head.w[1],
                            dw_axis=head.feat[0], defer_dw=defer)

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def evaluate_logits(self, batch: ShardedBatch, pc: ParallelContext,
                        chunk_bytes: int = EVAL_CHUNK_BYTES) -> torch.Tensor:
        """The logits block of :meth:`forward` in eval mode (the same values; bit for bit
        on the CPU where every all-reduce has at most two members), holding activations
        at ~1/G per rank: the full-graph evaluation (paper VII-B), whose B = N
        activations are the run's largest arrays.

        Between layers a layer input on (r, c) is not replicated along its third axis t
        as in training: each member of t keeps one row piece of the block
        (``split_bounds`` over t), N H / G per rank. A layer then

          1. gathers X[r, c] over t into one tensor (:func:`gather_row_pieces`), the only
             block-sized array (N H / (G_r G_c)); the piece is dropped;
          2. runs the layer on chunks of its output rows (``chunk_bytes`` of Z each): the
             SpMM of the chunk's rows of A, the GEMM, the residual's reshard of those rows
             and the tail (:meth:`_transform`, :meth:`_tail`: the training layer's
             operators), all-reducing over r and c as in training;
          3. keeps of each chunk the rows of its own piece of the output block along the
             next layer's third axis (c), written into its piece buffer.

        The input projection is chunked the same way (pieces along z); the head gathers
        the last layer's output over its third axis and runs as in training. Per layer
        the peak is the gathered input, the output piece and a few chunks, instead of
        the input, H, Z, the tail's output and the reshard's buffers at N H / (G_r G_c)
        each."""
        cfg = self.config
        self._check_permutation(batch)
        hidden = cfg.hidden
        rows_of = max(2, chunk_bytes // max(1, hidden * self.w_in.element_size()))
        r, c = INPUT_LAYOUT
        lo, hi = batch.rows.block(r)
        n = hi - lo

        # Each matrix's chunks, and their CSR row pointers read to the host once (not twice per chunk)
        chunks = row_chunks(n, rows_of)
        xptr = csr_chunk_pointers(batch.x, chunks) if batch.x.is_sparse_csr else None

        def projection(r0, r1):  # X_h0 = AR_z(X_in[x, z] W_in[z, y]) of rows [r0, r1) of the x block (Eq. 4)
            xin = csr_rows(batch.x, r0, r1, xptr) if batch.x.is_sparse_csr else batch.x[r0:r1]
            return sharded_gemm(xin, self.w_in, pc, reduce_axis="z", dh_axis="y", dw_axis="x")

        x = self._row_pieces(n, third_axis(r, c), c, projection, chunks, pc)
        in_rows = batch.rows
        for layer in range(cfg.layers):
            lay = layer_layout(layer)
            (r, c), t = lay.feat, lay.adj[0]
            adj, out_rows, _ = self._plane(batch, layer)
            lo, hi = in_rows.block(r)
            xg = gather_row_pieces(x, hi - lo, pc, t)  # X[r, c], the layer's one block-sized array
            del x
            xn = self._input_norm(xg, layer, pc)  # xg itself unless pre-norm (then a second block)
            t0, t1 = out_rows.block(t)
            chunks = row_chunks(t1 - t0, rows_of)
            ptr = csr_chunk_pointers(adj.adj, chunks)

            def layer_rows(r0, r1, layer=layer, lay=lay, adj=adj, xg=xg, xn=xn, t0=t0, ptr=ptr):
                a = SampledBlock(adj=csr_rows(adj.adj, r0, r1, ptr), adj_t=None, row_offset=adj.row_offset + r0,
                                 col_offset=adj.col_offset)
                z = self._transform(xn, a, layer, pc)
                res = (reshard(xg, lay.feat, lay.out, batch.rows, hidden, pc, target=(t0 + r0, t0 + r1))
                       if cfg.residual else None)
                return self._tail(z, res, None, layer, pc)

            x = self._row_pieces(t1 - t0, c, r, layer_rows, chunks, pc)
            del xg, xn, layer_rows  # the closure holds the gathered block too: all go before the next gather
            in_rows = out_rows
        head = self.head
        a, b = head.feat
        lo, hi = in_rows.block(a)
        xg = gather_row_pieces(x, hi - lo, pc, head.out[1])
        del x
        return sharded_gemm(xg, self.w_out, pc, reduce_axis=head.reduce_axis, dh_axis=head.w[1],
                            dw_axis=head.feat[0])

    def _row_pieces(self, n: int, axis: str, col_axis: str, rows_fn, chunks: list[tuple[int, int]],
                    pc: ParallelContext) -> torch.Tensor:
        """My piece along ``axis`` (rows ``split_bounds(n, G_axis)``) of an n-row block,
        columns the hidden range of ``col_axis``, that ``rows_fn(r0, r1)`` computes chunk
        by chunk (``chunks``: :func:`row_chunks` of the n rows), replicated along ``axis``
        (every member runs every chunk: the chunk's collectives need them all)."""
        bounds = split_bounds(n, self.grid.axis_size(axis))
        k = self.grid.axis_index(axis)
        mine = (bounds[k], bounds[k + 1])
        out = None
        for r0, r1 in chunks:
            y = rows_fn(r0, r1)
            if out is None:
                out = y.new_empty((mine[1] - mine[0], y.shape[1]))
            lo, hi = interval_overlap((r0, r1), mine)
            if hi > lo:
                out[lo - mine[0]: hi - mine[0]] = y[lo - r0: hi - r0]
        if out is None:  # an empty block: no chunk ran (nor on the peers, which share the block)
            c0, c1 = split_range(self.config.hidden, self.grid.axis_size(col_axis), self.grid.axis_index(col_axis))
            out = self.w_in.new_empty((0, c1 - c0))
        return out
