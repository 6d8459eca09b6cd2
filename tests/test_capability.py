"""Capability checks as data: a backend that cannot serve a configuration says so at selection
(a ``Reason`` from its spec), on every device, so the oracle picks the next backend and
``fusedmoe explain`` shows why. Nothing reaches a kernel that would raise inside it.

Legend: E experts, k top-k, H hidden, I intermediate, T tokens.
"""
from __future__ import annotations

import pytest
import torch

import fusedmoe.oracle as oracle
from fusedmoe import FusedMoE, MoEConfig
from fusedmoe.backends.registry import row_alignment
from fusedmoe.config import QuantScheme
from fusedmoe.layer import prepare_experts
from fusedmoe.plan import check
from fusedmoe.platform import Platform
from fusedmoe.reference.moe import reference_moe
from fusedmoe.tolerances import rel_error, tolerance

CPU = Platform.preset("cpu")


# ------------------------------------------------------------------------------ 16-byte rows
def test_the_issue_repro_runs_and_says_why_grouped_mm_was_skipped(builtin_only):
    torch.manual_seed(0)
    cfg = MoEConfig(4, 2, 33, 17, dtype="float32")
    m = FusedMoE.from_float(cfg, torch.randn(4, 34, 33), torch.randn(4, 33, 17))
    out = m(torch.randn(3, 33), torch.randn(3, 4))
    assert out.shape == (3, 33) and torch.isfinite(out).all()
    assert m.selection.winner in ("torch_ref", "triton")      # triton where the interpreter is on
    [r] = m.selection.candidate("grouped_mm").reasons
    assert r.code == "shape" and "H=33 and I=17" in r.text and "16-byte" in r.text
    assert "[shape] torch's grouped_mm needs 16-byte rows" in m.selection.explain()


# (H, I, dtype): rows of H or I elements that are not multiples of 16 bytes
UNALIGNED = [(33, 16, "float32"), (32, 17, "float32"), (34, 18, "float32"),
             (36, 20, "bfloat16"), (32, 12, "float16")]


@pytest.mark.parametrize("H,I,dtype", UNALIGNED, ids=[f"H{h}-I{i}-{d}" for h, i, d in UNALIGNED])
def test_grouped_mm_refuses_unaligned_rows_on_cpu_and_torch_ref_serves(builtin_only, mk, H, I, dtype):
    cfg = mk.config(E=4, k=2, H=H, I=I, dtype=dtype)
    sel = oracle.select_backend(cfg, "none", CPU)
    assert sel.winner == "torch_ref"
    assert [r.code for r in sel.candidate("grouped_mm").reasons] == ["shape"]
    w = mk.weights(cfg, seed=1)
    x = mk.x(cfg, 7, seed=2)
    tw, ti = mk.topk(7, 4, 2, seed=3)
    pe = prepare_experts(cfg, w)
    assert rel_error(pe(x, tw, ti), reference_moe(x, w, tw, ti, cfg)) <= tolerance(dtype, "none")


@pytest.mark.parametrize("H,I,dtype", [(36, 20, "float32"), (40, 24, "bfloat16"), (40, 24, "float16")])
def test_grouped_mm_still_serves_aligned_rows(builtin_only, mk, H, I, dtype):
    cfg = mk.config(E=4, k=2, H=H, I=I, dtype=dtype)
    assert oracle.select_backend(cfg, "none", CPU).winner == "grouped_mm"
    w = mk.weights(cfg, seed=1)
    x = mk.x(cfg, 7, seed=2)
    tw, ti = mk.topk(7, 4, 2, seed=3)
    pe = prepare_experts(cfg, w, "grouped_mm")
    assert rel_error(pe(x, tw, ti), reference_moe(x, w, tw, ti, cfg)) <= tolerance(dtype, "none")


@pytest.mark.parametrize("scheme", ["fp8_channel", "int8_w8a16", "fp8_tensor"])
def test_emulation_serves_unaligned_rows_through_the_reference_loop(builtin_only, mk, scheme):
    # emulation runs grouped_mm over its dequantized weights only where grouped_mm's check passes
    cfg = mk.config(E=4, k=2, H=33, I=17, dtype="bfloat16")
    w = mk.weights(cfg, scheme, seed=1)
    x = mk.x(cfg, 5, seed=2)
    tw, ti = mk.topk(5, 4, 2, seed=3)
    pe = prepare_experts(cfg, w, platform=CPU)
    assert pe.selection.winner == "emulation"
    assert rel_error(pe(x, tw, ti), reference_moe(x, w, tw, ti, cfg)) <= tolerance("bfloat16", scheme)


def test_row_alignment_reason_names_the_dims_and_the_multiple():
    cfg = MoEConfig(4, 2, 36, 20, dtype="bfloat16")
    assert row_alignment(cfg, 4, 16, "x") == []
    [r] = row_alignment(cfg, 2, 16, "engine")
    assert r.code == "shape" and "H=36 and I=20 must be multiples of 8 for 2-byte elements" in r.text
    [r] = row_alignment(MoEConfig(4, 2, 48, 20), 1, 16, "engine")
    assert "I=20" in r.text and "H=" not in r.text and "multiples of 16" in r.text


# ------------------------------------------------------------------------------ fp8_block tiles
@pytest.mark.parametrize("block", [(16, 16), (32, 16), (128, 48)])
def test_fp8_block_k_group_that_no_fp8_dot_fits_is_refused_on_cuda(builtin_only, block):
    # BLOCK_K divides bk in every Triton path; an 8-bit tl.dot on NVIDIA needs K >= 32
    cfg = MoEConfig(8, 2, 384, 256, dtype="bfloat16")
    q = f"fp8_block:b{block[0]}x{block[1]}"
    sel = oracle.select_backend(cfg, q, Platform.preset("h100"))
    assert sel.winner == "emulation"
    [r] = sel.candidate("triton").reasons
    assert r.code == "block_shape" and f"bk={block[1]} must be a multiple of 32 on CUDA" in r.text
    assert "bk=%d must be a multiple of 32" % block[1] in sel.explain()


@pytest.mark.parametrize("block", [(32, 32), (16, 64), (128, 96), (128, 128)])
def test_fp8_block_k_group_of_whole_fp8_dots_is_served_on_cuda(builtin_only, block):
    cfg = MoEConfig(8, 2, 384, 256, dtype="bfloat16")
    sel = oracle.select_backend(cfg, f"fp8_block:b{block[0]}x{block[1]}", Platform.preset("h100"))
    assert sel.winner == "triton" and sel.candidate("triton").ok


def test_fp8_block_16_is_left_to_the_interpreter_on_cpu():
    # the interpreter has no minimum dot size: BLOCK_K 16 runs there
    cfg = MoEConfig(8, 2, 64, 32, dtype="float32")
    assert check(cfg, QuantScheme.parse("fp8_block:b16x16"), CPU) == []
    assert [c for c, _ in check(cfg, QuantScheme.parse("fp8_block:b16x16"), Platform.preset("h100"))] == \
        ["block_shape"]


@pytest.mark.parametrize("bk", [16, 32, 64])
def test_fp8_block_small_groups_run_with_default_configs(bk):
    # the shape-aware default BLOCK_SIZE_K must divide the scale group: before, the defaults
    # ignored the block shape and the grouped GEMM asserted at launch for bk < 128
    from fusedmoe.reference.moe import reference_moe
    torch.manual_seed(bk)
    cfg = MoEConfig(8, 2, 64, 64, dtype="float32")
    m = FusedMoE.from_float(cfg, torch.randn(8, 128, 64) / 8, torch.randn(8, 64, 64) / 8, f"fp8_block:b{bk}x{bk}",
                            backend="triton")
    x, lg = torch.randn(20, 64), torch.randn(20, 8)
    tw, ti = m.route(x, lg)
    want = reference_moe(x, m.prepared.weights, tw, ti, cfg)
    got = m(x, lg)
    assert ((got - want).norm() / want.norm()) < 3e-2


def test_triton_batched_refuses_fp8_block_k_groups_below_its_k_tile():
    # its 8-bit K tile is at least 32 on every device: a 16-wide group asserted at launch
    from fusedmoe.backends.triton_batched import _check_batched
    cfg = MoEConfig(4, 2, 64, 64, dtype="float32")
    small = [r.code for r in _check_batched(cfg, QuantScheme.parse("fp8_block:b16x16"), Platform.preset("cpu"))]
    assert "block_shape" in small
    assert not _check_batched(cfg, QuantScheme.parse("fp8_block:b32x32"), Platform.preset("cpu"))
