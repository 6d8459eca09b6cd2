import torch, triton
from fusedmoe.kernels.routing import fused_topk
from fusedmoe.reference.routing import route
from fusedmoe.config import Routing
print(torch.__version__, triton.__version__, torch.cuda.get_device_name())
cases = {"mixtral": (8,2,Routing(),None), "qwen3": (128,8,Routing(),None),
         "deepseek_v3": (256,8,Routing(scoring="sigmoid",num_groups=8,topk_groups=4,has_correction_bias=True,routed_scaling_factor=2.5),True)}
for name,(E,k,r,b) in cases.items():
    for T in (1, 64, 1024, 16384):
        x = torch.randn(T,E,device="cuda",dtype=torch.bfloat16)
        bias = torch.randn(E,device="cuda")*0.1 if b else None
        w = torch.empty(T,k,device="cuda"); ids=torch.empty(T,k,device="cuda",dtype=torch.int32)
        f = lambda: fused_topk(x,k,sigmoid=r.scoring=="sigmoid",renormalize=r.renormalize,correction_bias=bias,num_groups=r.num_groups,topk_groups=r.topk_groups,routed_scaling_factor=r.routed_scaling_factor,out_weights=w,out_ids=ids)
        g = lambda: route(x,k,r,bias)
        tk = triton.testing.do_bench_cudagraph(f) * 1e3
        tr = triton.testing.do_bench_cudagraph(g) * 1e3
        print(f"{name:12s} T={T:6d}  triton {tk:8.2f} us   torch ref {tr:8.2f} us")
