"""Algorithm 2 step (sample, extract, rescale, both CSRs) vs the peers' subgraph
extraction, same graph (N = 2e5, nnz = 4e6, B = 2e4). Group "sampler": compare the
rows of one run (pytest-benchmark prints them side by side)."""

import itertools

import pytest
import torch

from scalegnn import _sampling_kernel
from scalegnn.sampling import CompactIndexMap, extract_block, inclusion_probability, sample_vertices
from tests.benchmarks.conftest import B, N

P = inclusion_probability(N, B)
_steps = itertools.count(1)


@pytest.mark.benchmark(group="sampler")
@pytest.mark.parametrize("backend", ["numba", "torch"])
def test_ours(benchmark, block, backend):
    if backend == "numba" and not _sampling_kernel.available():
        pytest.skip("numba not installed")
    cmap = CompactIndexMap(N)
    benchmark(lambda: extract_block(block, sample_vertices(N, B, 0, next(_steps)), P, cmap, backend=backend))


@pytest.mark.benchmark(group="sampler")
def test_pyg_subgraph(benchmark, csr):
    subgraph = pytest.importorskip("torch_geometric.utils").subgraph
    indptr, indices, values = csr
    edge_index = torch.stack([torch.repeat_interleave(torch.arange(N), indptr[1:] - indptr[:-1]), indices])
    gen = torch.Generator().manual_seed(0)
    benchmark(lambda: subgraph(torch.randperm(N, generator=gen)[:B], edge_index, values, relabel_nodes=True,
                               num_nodes=N))


@pytest.mark.benchmark(group="sampler")
def test_torch_sparse_saint_subgraph(benchmark, csr):
    SparseTensor = pytest.importorskip("torch_sparse").SparseTensor
    indptr, indices, values = csr
    adj = SparseTensor(rowptr=indptr, col=indices, value=values, sparse_sizes=(N, N), is_sorted=True, trust_data=True)
    gen = torch.Generator().manual_seed(0)
    benchmark(lambda: adj.saint_subgraph(torch.sort(torch.randperm(N, generator=gen)[:B]).values))


@pytest.mark.benchmark(group="sampler")
def test_pyg_graphsaint_node_sampler_batch(benchmark, csr):
    loader_mod = pytest.importorskip("torch_geometric.loader")
    from torch_geometric.data import Data

    indptr, indices, values = csr
    edge_index = torch.stack([torch.repeat_interleave(torch.arange(N), indptr[1:] - indptr[:-1]), indices])
    loader = loader_mod.GraphSAINTNodeSampler(Data(edge_index=edge_index, num_nodes=N), batch_size=B,
                                              num_steps=10**6, sample_coverage=0)
    benchmark(lambda: loader._collate([loader[0]]))
