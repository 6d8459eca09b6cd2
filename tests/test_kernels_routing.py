"""The Triton routing kernel (fusedmoe.kernels.routing.fused_topk) equals the reference.

ids must match exactly (same tie rule), weights to fp32 rounding. Without CUDA the
kernel runs under TRITON_INTERPRET=1 (set here, before Triton is imported); with CUDA
the same cases run compiled, and the ``gpu`` tests add bf16 logits, large T and CUDA
graph capture.
"""
import importlib
import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"

triton = pytest.importorskip("triton")

import fusedmoe.kernels.routing as kr  # noqa: E402
from fusedmoe.config import Routing  # noqa: E402
from fusedmoe.reference.routing import route  # noqa: E402

if not HAS_CUDA and type(kr._fused_topk_kernel).__name__ != "InterpretedFunction":
    kr = importlib.reload(kr)  # imported earlier without the interpreter: re-decorate

DEVICE = "cuda" if HAS_CUDA else "cpu"
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")


def run_kernel(logits, top_k, routing: Routing, bias=None, **out):
    return kr.fused_topk(logits, top_k, sigmoid=routing.scoring == "sigmoid", renormalize=routing.renormalize,
                         correction_bias=bias, num_groups=routing.num_groups, topk_groups=routing.topk_groups,
                         routed_scaling_factor=routing.routed_scaling_factor, **out)


def assert_matches(logits, top_k, routing, bias=None):
    ref = route(logits, top_k, routing, bias)
    w, ids = run_kernel(logits, top_k, routing, bias)
    assert ids.dtype == torch.int32 and w.dtype == torch.float32
    assert ids.shape == w.shape == (logits.shape[0], top_k)
    torch.testing.assert_close(ids, ref.topk_ids, rtol=0, atol=0)
    torch.testing.assert_close(w, ref.topk_weights, rtol=1e-5, atol=1e-6)


def randn(*shape, seed, scale=1.0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=g)).to(dtype).to(DEVICE)


# ----------------------------------------------------------------------------------------- #
@pytest.mark.parametrize("T", [1, 7, 33])
@pytest.mark.parametrize("E, k", [
    (8, 2),    # Mixtral
    (60, 4),   # E not a power of two: padded lanes
    (128, 8),  # Qwen3-MoE
])
@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
@pytest.mark.parametrize("renormalize", [True, False])
def test_topk(T, E, k, scoring, renormalize):
    logits = randn(T, E, seed=T * 1000 + E, scale=2.0)
    assert_matches(logits, k, Routing(scoring=scoring, renormalize=renormalize))


@pytest.mark.parametrize("T", [1, 7, 33])
def test_bias_without_groups(T):
    # sigmoid + bias + renormalize, no groups (MiniMax-style), with a scaling factor
    logits = randn(T, 64, seed=T)
    bias = randn(64, seed=99, scale=0.2)
    assert_matches(logits, 6, Routing(scoring="sigmoid", has_correction_bias=True, routed_scaling_factor=2.5), bias)


@pytest.mark.parametrize("T", [1, 7, 33])
@pytest.mark.parametrize("E, k, G, Gk, scoring, bias, renorm, scale", [
    (256, 8, 8, 4, "sigmoid", True, True, 2.5),     # DeepSeek-V3
    (64, 6, 8, 3, "sigmoid", True, True, 1.0),      # small grouped + bias
    (64, 6, 8, 3, "softmax", False, True, 1.0),     # group score = max (no bias)
    (160, 6, 8, 3, "softmax", False, False, 16.0),  # DeepSeek-V2: 20 experts per group (not a power of 2)
    (96, 4, 4, 2, "sigmoid", True, False, 1.0),     # 24 per group, bias, no renorm
])
def test_grouped(T, E, k, G, Gk, scoring, bias, renorm, scale):
    logits = randn(T, E, seed=7 * T + E, scale=1.5)
    b = randn(E, seed=E, scale=0.1) if bias else None
    r = Routing(scoring=scoring, renormalize=renorm, num_groups=G, topk_groups=Gk, has_correction_bias=bias,
                routed_scaling_factor=scale)
    assert_matches(logits, k, r, b)


@pytest.mark.parametrize("grouped", [False, True])
def test_ties_lower_index(grouped):
    # logits and bias from a handful of values: many exact ties among experts and groups
    g = torch.Generator().manual_seed(5)
    logits = torch.randint(-2, 3, (33, 64), generator=g).float().to(DEVICE)
    bias = (torch.randint(0, 3, (64,), generator=g).float() * 0.25).to(DEVICE)
    if grouped:
        r = Routing(scoring="sigmoid", num_groups=8, topk_groups=3, has_correction_bias=True)
        assert_matches(logits, 8, r, bias)
    else:
        assert_matches(logits, 8, Routing())
        assert_matches(logits, 8, Routing(scoring="sigmoid", has_correction_bias=True), bias)
    # all-equal rows: experts 0..k-1
    w, ids = run_kernel(torch.zeros(3, 64, device=DEVICE), 4, Routing())
    assert ids.tolist() == [[0, 1, 2, 3]] * 3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_logits(dtype):
    # half logits are scored in fp32, as in the reference (bf16 has many ties)
    logits = randn(33, 60, seed=3, scale=2.0, dtype=dtype)
    assert_matches(logits, 4, Routing())
    assert_matches(logits, 4, Routing(scoring="sigmoid", renormalize=False))


def test_strided_logits_and_preallocated_outputs():
    # logits a column slice of a wider buffer; outputs are views into larger buffers
    T, E, k = 7, 60, 4
    big = randn(T, 2 * E, seed=11)
    logits = big[:, 3:3 + E]                                        # row stride 2E
    ref = route(logits, k, Routing())
    w_buf = torch.full((T, k + 2), -7.0, device=DEVICE)
    id_buf = torch.full((T, k + 2), -7, dtype=torch.int32, device=DEVICE)
    w_out, id_out = w_buf[:, 1:1 + k], id_buf[:, 1:1 + k]
    w, ids = run_kernel(logits, k, Routing(), out_weights=w_out, out_ids=id_out)
    assert w is w_out and ids is id_out
    assert torch.equal(id_buf[:, 1:1 + k], ref.topk_ids)
    torch.testing.assert_close(w_buf[:, 1:1 + k], ref.topk_weights)
    assert (w_buf[:, 0] == -7).all() and (w_buf[:, -1] == -7).all() and (id_buf[:, -1] == -7).all()
    # transposed (column-major) logits
    assert_matches(randn(E, T, seed=12).t(), k, Routing(scoring="sigmoid"))


def test_empty_batch():
    w, ids = run_kernel(torch.empty(0, 16, device=DEVICE), 2, Routing())
    assert w.shape == ids.shape == (0, 2) and w.dtype == torch.float32 and ids.dtype == torch.int32


def test_top_k_equals_e_and_top_1():
    logits = randn(7, 8, seed=13)
    assert_matches(logits, 8, Routing())                           # k == E
    assert_matches(logits, 1, Routing(scoring="sigmoid", renormalize=False))  # Llama-4 style top-1


# ----------------------------------------------------------------------------------------- #
# GPU: compiled kernel, bf16, many tokens, CUDA graphs
# ----------------------------------------------------------------------------------------- #
@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 33, 4096])
@pytest.mark.parametrize("case", ["mixtral", "qwen3", "deepseek_v3", "deepseek_v2", "e60_sigmoid"])
def test_gpu_matches_reference(dtype, T, case):
    E, k, r = {
        "mixtral": (8, 2, Routing()),
        "qwen3": (128, 8, Routing()),
        "deepseek_v3": (256, 8, Routing(scoring="sigmoid", num_groups=8, topk_groups=4, has_correction_bias=True,
                                        routed_scaling_factor=2.5)),
        "deepseek_v2": (160, 6, Routing(renormalize=False, num_groups=8, topk_groups=3, routed_scaling_factor=16.0)),
        "e60_sigmoid": (60, 4, Routing(scoring="sigmoid", renormalize=False)),
    }[case]
    logits = randn(T, E, seed=T + E, scale=2.0, dtype=dtype)
    bias = randn(E, seed=1, scale=0.1) if r.has_correction_bias else None
    assert_matches(logits, k, r, bias)


@gpu
@needs_cuda
def test_gpu_cuda_graph_replay():
    # captured once with pre-allocated outputs, replayed on new logits written in place
    T, E, k = 64, 256, 8
    r = Routing(scoring="sigmoid", num_groups=8, topk_groups=4, has_correction_bias=True, routed_scaling_factor=2.5)
    logits = randn(T, E, seed=1)
    bias = randn(E, seed=2, scale=0.1)
    w = torch.empty(T, k, device="cuda")
    ids = torch.empty(T, k, dtype=torch.int32, device="cuda")
    run_kernel(logits, k, r, bias, out_weights=w, out_ids=ids)  # compile outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run_kernel(logits, k, r, bias, out_weights=w, out_ids=ids)
    for seed in (3, 4):
        logits.copy_(randn(T, E, seed=seed))
        graph.replay()
        ref = route(logits, k, r, bias)
        torch.testing.assert_close(ids, ref.topk_ids, rtol=0, atol=0)
        torch.testing.assert_close(w, ref.topk_weights, rtol=1e-5, atol=1e-6)
