#!/usr/bin/env python3
# Emulation of qk_norm_rope_vec_bf16 (kernels/attention.cu): its thread mapping (G threads per head),
# butterfly and rotate-half shuffle against rms_norm_bf16 + rope_bf16 (kernels/elementwise.cu) as
# sequential fp32 with bf16 roundings; prints "identical" per shape. Usage: python3 tools/bench/qk_vec_emu.py
import numpy as np
def rb(x):
    x=np.asarray(x,dtype=np.float32); u=x.view(np.uint32).astype(np.uint64)
    u=(u+0x7fff+((u>>16)&1))&0xffff0000
    return u.astype(np.uint32).view(np.float32)
f32=np.float32
def ref(xrow, hq, hk, hd, wq, wk, eps, p, inv, rd, inter):
    # rms_norm_bf16 (vector order) then rope_bf16, per head
    out=xrow.copy()
    for h in range(hq+hk):
        v=xrow[h*hd:(h+1)*hd]; w=wq if h<hq else wk
        lanes=[f32(0)]*32
        for l in range(32):
            if l*8<hd:
                s=f32(0)
                for j in range(8): s=f32(s+f32(v[l*8+j]*v[l*8+j]))   # fma-ish: emulate as fp32 ops (order only)
                lanes[l]=s
        for o in (16,8,4,2,1):
            lanes=[f32(lanes[l]+lanes[l^o]) for l in range(32)]
        r=f32(1/np.sqrt(f32(lanes[0]/f32(hd))+f32(eps)))
        y=rb(rb(v*r)*w)
        half=rd//2
        o_=y.copy()
        for i in range(half):
            c=rb(np.cos(f32(p)*inv[i])); s=rb(np.sin(f32(p)*inv[i]))
            ia,ib=(2*i,2*i+1) if inter else (i,i+half)
            a,b=y[ia],y[ib]
            o_[ia]=rb(rb(a*c)+rb(-b*s)); o_[ib]=rb(rb(b*c)+rb(a*s))
        out[h*hd:(h+1)*hd]=o_
    return out
def vec(xrow, hq, hk, hd, wq, wk, eps, p, inv, rd, inter):
    out=xrow.copy(); nh=hq+hk; half=rd//2; cph=hd//8; G=1
    while G<cph: G*=2
    hpi=256//G; P=rd>>4
    cos=[rb(np.cos(f32(p)*inv[i])) for i in range(half)]; sin=[rb(np.sin(f32(p)*inv[i])) for i in range(half)]
    for h0 in range(0,nh,hpi):
        Y={};SS={}
        for tid in range(256):
            head=h0+tid//G; c=tid&(G-1); act=head<nh and c<cph
            f=xrow[head*hd+c*8:head*hd+c*8+8] if act else np.zeros(8,np.float32)
            s=f32(0)
            for j in range(8): s=f32(s+f32(f[j]*f[j]))
            SS[tid]=s
        o=G>>1
        while o>0:
            SS={t:f32(SS[t]+SS[t^o]) for t in range(256)}; o>>=1
        for tid in range(256):
            head=h0+tid//G; c=tid&(G-1); act=head<nh and c<cph
            r=f32(1/np.sqrt(f32(SS[tid]/f32(hd))+f32(eps)))
            if act:
                w=(wq if head<hq else wk)[c*8:c*8+8]; f=xrow[head*hd+c*8:head*hd+c*8+8]
                Y[tid]=rb(rb(f*r)*w)
            else: Y[tid]=np.zeros(8,np.float32)
        for tid in range(256):
            head=h0+tid//G; c=tid&(G-1); act=head<nh and c<cph
            y=Y[tid]; q=np.zeros(8,np.float32) if inter else Y[tid^(P if P>0 else 1)]
            outc=np.zeros(8,np.float32)
            if c*8<rd:
                if inter:
                    for j in range(0,8,2):
                        i=(c*8+j)>>1; a,b=y[j],y[j+1]
                        outc[j]=rb(a*cos[i])+rb(-b*sin[i]); outc[j+1]=rb(b*cos[i])+rb(a*sin[i])
                else:
                    first=(c&P)==0
                    for j in range(8):
                        i=(c&(P-1))*8+j
                        outc[j]=rb(y[j]*cos[i])+(rb(-q[j]*sin[i]) if first else rb(q[j]*sin[i]))
            else: outc=y.copy()
            if act: out[head*hd+c*8:head*hd+c*8+8]=rb(outc)
    return out
rng=np.random.default_rng(1)
for (hq,hk,hd,rd,inter) in [(32,8,128,128,0),(9,3,64,64,0),(4,2,128,32,0),(4,2,64,64,1),(3,1,256,256,0),(5,5,128,64,1)]:
    x=rb(rng.standard_normal((hq+hk)*hd+77).astype(np.float32)); wq=rb(1+0.3*rng.standard_normal(hd)); wk=rb(1+0.3*rng.standard_normal(hd))
    inv=np.array([1/ (1e6**(2*i/rd)) for i in range(rd//2)],np.float32); p=1234
    a=ref(x,hq,hk,hd,wq,wk,1e-6,p,inv,rd,inter); b=vec(x,hq,hk,hd,wq,wk,1e-6,p,inv,rd,inter)
    print(hq,hk,hd,rd,inter, "max diff", float(np.abs(a-b).max()), "identical" if np.array_equal(a,b) else "DIFF")
