"""The embedding's backward zero-fills the whole weight gradient (PyTorch's
``embedding_dense_backward`` allocates it with ``at::zeros``): checked on this CPU with
torch.profiler, then in the op graph's backward bytes."""
from __future__ import annotations

from dataclasses import replace

import pytest

from simulator.workload import get_preset
from simulator.workload.ops import LayerShape, backward_ops, embedding_ops

torch = pytest.importorskip("torch")


def test_embedding_backward_zero_fills_the_table():
    vocab, hidden, tokens = 4096, 64, 256
    w = torch.nn.Parameter(torch.randn(vocab, hidden))
    idx = torch.randint(0, vocab, (tokens,))
    with torch.profiler.profile(record_shapes=True) as prof:
        torch.nn.functional.embedding(idx, w).sum().backward()
    fills = [e for e in prof.events() if e.name in ("aten::zero_", "aten::fill_")
             and e.input_shapes and list(e.input_shapes[0]) == [vocab, hidden]]
    assert fills, "embedding backward no longer zero-fills a [vocab, hidden] gradient"


def test_op_graph_charges_the_zero_fill_per_tp_shard():
    m = replace(get_preset("small-4l-256"), seq_len=128)
    for tp in (1, 2):
        sh = LayerShape(micro_batch=2, seq_len=128, tp=tp)
        fwd = embedding_ops(m, sh)[0]
        bwd = next(o for o in backward_ops(embedding_ops(m, sh)) if o.name == "embedding_bwd")
        rows = 2 * 128 * m.hidden
        assert fwd.bytes_moved == 2 * rows * sh.act_bytes
        assert bwd.bytes_moved == (4 * rows + m.vocab // tp * m.hidden) * sh.act_bytes
