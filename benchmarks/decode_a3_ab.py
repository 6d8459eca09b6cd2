"""Decode GEMM2's activation tile in the weight tile's layout (kernels/decode.py A3), A/B on the GPU.

    python3 benchmarks/decode_a3_ab.py [--cases qwen3-30b-a3b:1:none,...] [--tokens 1,2]

Session 27: under triton 3.9 the [KP, BN, BK] weight tile of the decode GEMM2 takes warps
[2, 4, 1] (3.6: [8, 1, 1]), so the [KP, BK] activation tile goes through shared memory to
the slice layout every K step (101 registers against 64). With A3 the activation rows are
loaded as [KP, BN, BK] (each row BN times, from L1) in the weight tile's own layout.
Per case: GEMM2 alone at T=1 (decode_config's tile and BK halved), A3 off / on, then the
layer at each T, A3 off / on in alternating rounds (decode_ab.variants_ab).
--bk: the layer with the 16-bit k-slot GEMM2's BK as decode_config's and halved. --sf: SLOTS_FIRST
(kernels/decode.py gemm2_slots_first) off / on / on with 3.6's A3 and BK rules. (Both ran on the
H100 in session 27 as separate loops, since merged into ``layer_rounds``, not run since.)"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import decode_ab as dab  # noqa: E402
from fusedmoe.bench import harness as hz  # noqa: E402
from fusedmoe.kernels.decode import decode_config  # noqa: E402
from fusedmoe.kernels.launcher import next_power_of_2  # noqa: E402
from fusedmoe.presets import get_preset  # noqa: E402

VAR = "FUSEDMOE_DECODE_A3"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="qwen3-30b-a3b:1:none,deepseek-v3:8:none,deepseek-v3:8:fp8_block,"
                    "qwen3-30b-a3b:1:fp8_channel,qwen3-30b-a3b:1:int8_channel,mixtral-8x7b:1:none")
    ap.add_argument("--tokens", default="1,2")
    ap.add_argument("--kernel", default="none", help="schemes whose GEMM2 is also timed alone")
    ap.add_argument("--bk", action="store_true", help="instead: the layer with decode_config's GEMM2 BK and "
                    "with it halved (16-bit weights), in alternating rounds")
    ap.add_argument("--sf", action="store_true", help="instead: SLOTS_FIRST off / on / on with triton 3.6's A3 "
                    "and BK rules, in alternating rounds (session 27's measurement, before SLOTS_FIRST shipped)")
    a = ap.parse_args()
    if a.bk:
        return bk_ab(a)
    if a.sf:
        return sf_ab(a)
    bw = hz.measure_ceilings("cuda").copy_gbps
    import triton
    print(f"triton {triton.__version__} copy {bw:.0f} GB/s", flush=True)
    for case in a.cases.split(","):
        name, tp, scheme = case.split(":")
        cfg = get_preset(name).to_config(tp=int(tp))
        if scheme in a.kernel.split(","):
            w = hz.make_weights(cfg, scheme, "cuda", seed=0)
            sets = hz.make_input_sets(cfg, 1, "cuda", seed=1).sets
            esize = 1 if scheme != "none" else 2
            d = decode_config(next_power_of_2(cfg.top_k), 1, cfg.hidden_size, cfg.intermediate_size, esize, gemm2=True)
            confs = [d, dict(d, BLOCK_K=d["BLOCK_K"] // 2)]
            for v in ("0", "1"):
                os.environ[VAR] = v
                rows, _ = dab.kernel_sweep(cfg, w, sets, bw, False, scheme, True, False, {"gemm2": confs})
                for r in rows:
                    print(f"K {case:28s} A3={v} gemm2 BN{r['BLOCK_N']} BK{r['BLOCK_K']} w{r['num_warps']} "
                          + (f"{r['us']:7.2f} us {r['pct']:.0f}%" if "us" in r else r.get("error", "")), flush=True)
            os.environ.pop(VAR, None)
            del w
        rows = dab.variants_ab(name, int(tp), scheme, bw, [int(t) for t in a.tokens.split(",")],
                               {"a3=0": {VAR: "0"}, "a3=1": {VAR: "1"}}, rounds=4)
        for r in rows:
            print(f"L {case:28s} T={r['T']} {r['variant']} graph {r['us_graph']:7.2f} eager {r['us_eager']:6.1f} us "
                  f"{r['pct']:5.1f}% ok={r['ok']} err={r['err']:.1e}", flush=True)
        torch.cuda.empty_cache()
    return 0


def layer_rounds(a, variants, rounds: int) -> int:
    """The layer (prepare_experts('triton')) of each case at each T under each variant, best of
    ``rounds`` alternating rounds. variants: (name, env dict, decode_config, _triton_at_least):
    the module's functions for the variant (patched in, caches cleared)."""
    from fusedmoe.kernels import decode as dk
    from fusedmoe.layer import prepare_experts
    bw = hz.measure_ceilings("cuda").copy_gbps
    import triton
    print(f"triton {triton.__version__} copy {bw:.0f} GB/s", flush=True)
    real = (dk.decode_config, dk._triton_at_least)
    for case in a.cases.split(","):
        name, tp, scheme = case.split(":")
        cfg = get_preset(name).to_config(tp=int(tp))
        w = hz.make_weights(cfg, scheme, "cuda", seed=0)
        per_expert = hz.expert_bytes(cfg.hidden_size, cfg.intermediate_size, scheme)
        for T in [int(t) for t in a.tokens.split(",")]:
            sets = hz.make_input_sets(cfg, T, "cuda", seed=T, weight_bytes=0)
            roof = hz.moe_bytes(T, cfg.hidden_size, sets.experts_hit, per_expert) / (bw * 1e9) * 1e6
            best = {}
            for _ in range(rounds):
                for var, envs, config_fn, at_least in variants:
                    os.environ.update(envs)
                    dk.decode_config, dk._triton_at_least = config_fn or real[0], at_least or real[1]
                    dk._cached_config.cache_clear()
                    pe = prepare_experts(cfg, w, "triton")
                    chk = hz.check_against(pe, hz.make_check_case(cfg, w, T, "cuda"))
                    t = hz.time_impl(pe, sets, graph=True, eager=False)
                    b = best.setdefault(var, [t.us_graph, chk.ok])
                    b[0], b[1] = min(b[0], t.us_graph), b[1] and chk.ok
                    for key in envs:
                        os.environ.pop(key, None)
            dk.decode_config, dk._triton_at_least = real
            dk._cached_config.cache_clear()
            for var, (us, ok) in best.items():
                print(f"L {case:28s} T={T} {var:12s} graph {us:7.2f} us {100 * roof / us:5.1f}% ok={ok}", flush=True)
        del w
        torch.cuda.empty_cache()
    return 0


def bk_ab(a) -> int:
    """The layer with decode_config's GEMM2 tile and with its BK halved (16-bit weights,
    KP >= 4 rows: the k-slot GEMM2), best of 4 alternating rounds."""
    from fusedmoe.kernels import decode as dk
    rule = dk.decode_config

    def halved(rows, programs, n_out, K, esize, num_sms=132, group_k=None):
        c = rule(rows, programs, n_out, K, esize, num_sms, group_k)
        if rows >= 4 and esize == 2 and c["BLOCK_K"] >= 32:
            c = dict(c, BLOCK_K=c["BLOCK_K"] // 2)
        return c
    return layer_rounds(a, (("bk=rule", {}, None, None), ("bk=half", {}, halved, None)), 4)


def sf_ab(a) -> int:
    """SLOTS_FIRST off, on, and on with A3 off and decode_config's BK as under triton 3.6
    (``_triton_at_least`` patched to False), best of 3 alternating rounds."""
    return layer_rounds(a, (("sf=0", {"FUSEDMOE_DECODE_SLOTS_FIRST": "0"}, None, None),
                            ("sf=1", {"FUSEDMOE_DECODE_SLOTS_FIRST": "1"}, None, None),
                            ("sf=1 rules36", {"FUSEDMOE_DECODE_SLOTS_FIRST": "1", "FUSEDMOE_DECODE_A3": "0"}, None,
                             lambda major, minor: False)), 3)


if __name__ == "__main__":
    sys.exit(main())
