"""Issue rate of int32 -> fp32 conversion (I2FP.F32.S32) on this GPU against integer and fp32 ops.

    python3 benchmarks/i2f_rate.py

Why: int8 W8A8 GEMMs convert every int32 accumulator in their epilogue (fp8's are fp32 already);
at qwen3-30b-a3b T=16384 that is ~500 M conversions, and the int8 GEMMs trail fp8's by ~143 µs
(docs/BENCHMARKS.md, twenty-third session). Each thread loops over ITERS steps on 8 independent
values: v' = v ^ i (LOP3), then MODE 0 adds float(v') (I2FP + FADD), MODE 1 adds v' reinterpreted
(FADD only), MODE 2 the one-add trick for |v| < 2^22 (IADD + 2 FADD). Prints ns per element-step
and conversions per clock per SM from the difference MODE 0 - MODE 1.
"""
import torch
import triton
import triton.language as tl


@triton.jit
def _k(x_ptr, out_ptr, ITERS: tl.constexpr, MODE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x_ptr + offs)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for i in range(ITERS):
        w = v ^ i
        if MODE == 0:
            acc += w.to(tl.float32)
        elif MODE == 1:
            acc += w.to(tl.float32, bitcast=True)
        else:
            acc += (w + 0x4B400000).to(tl.float32, bitcast=True) - 12582912.0
    tl.store(out_ptr + offs, acc)


def main():
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    block, warps = 2048, 8                     # 8 values a thread
    n = sms * 8 * block
    x = torch.randint(-2 ** 20, 2 ** 20, (n,), dtype=torch.int32, device="cuda")
    out = torch.empty(n, dtype=torch.float32, device="cuda")
    iters = 512
    res = {}
    for mode in (0, 1, 2):
        f = lambda: _k[(n // block,)](x, out, ITERS=iters, MODE=mode, BLOCK=block, num_warps=warps)
        f()
        torch.cuda.synchronize()
        ms = triton.testing.do_bench(f, warmup=10, rep=100)
        res[mode] = ms * 1e6 / (n * iters)       # ns per element-step
        print(f"MODE {mode}: {ms * 1e3:8.1f} us  {res[mode] * 1e3:.3f} ps per element-step", flush=True)
    clock_ghz = 1.755                            # H100 SXM boost (nvidia-smi -q -d CLOCK shows the real one)
    extra_ns = res[0] - res[1]
    if extra_ns > 0:
        print(f"I2FP: ~{1 / (extra_ns * clock_ghz * sms):.1f} conversions a clock an SM "
              f"(from MODE 0 - MODE 1 at {clock_ghz} GHz)")


if __name__ == "__main__":
    main()
