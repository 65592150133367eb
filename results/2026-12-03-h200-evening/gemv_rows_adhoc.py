import torch, triton
from specbench.kernels import gemv
torch.manual_seed(0)
d=torch.device("cuda"); bf=torch.bfloat16
def t(fn, n=20):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    g=torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n): fn()
    g.replay(); torch.cuda.synchronize()
    s=torch.cuda.Event(enable_timing=True); e=torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(5): g.replay()
    e.record(); torch.cuda.synchronize(); return s.elapsed_time(e)/n/5*1e3
for name,N,K,kw in [("w13",2*14336,4096,dict(glu=True,norm=True)),("wqkv",6144,4096,dict(norm=True)),("wo",4096,4096,dict(residual=True))]:
    w=torch.randn(N,K,device=d,dtype=bf)
    for M in (1,2,9,16):
        x=torch.randn(M,K,device=d,dtype=bf)
        a=dict(kw)
        if "norm" in a: a["norm"]=torch.ones(K,device=d,dtype=bf)
        if "residual" in a: a["residual"]=torch.randn(M,N,device=d,dtype=bf)
        us=t(lambda: gemv.project(x,w,**a)); ref=t(lambda: gemv.project(x,w,kernel=False,**a))
        k=gemv._vector_kernel if M==1 else (gemv._rows_glu_kernel if kw.get("glu") else gemv._rows_kernel)
        best=getattr(k,"best_config",None)
        print(f"{name} M={M} kernel {us:.1f}us torch {ref:.1f}us floor {N*K*2/4.29e12*1e6:.1f}us best {best}", flush=True)
