#!/usr/bin/env python3
# Lane-level emulation of flash_attention2 (kernels/attention.cu) against a float64 reference, run on
# the build machine before any device call (docs/cuda.md): byte-addressed shared memory, the kernel's
# own ldmatrix address formulas (asserted equal to the swizzle), mma.sync m16n8k16 fragment layouts
# per the PTX ISA, the heaviest-first block order, double-buffer indices, the skipped rescale.
# Usage: python3 tools/bench/attn2_emu.py [seed] [a|b|c|d|all]   (numpy; d: head dim 256)
# Lane-level emulation of flash_attention2 (kernels/attention.cu, v2): byte-addressed shared
# memory, ldmatrix addresses computed exactly as in the kernel, mma fragment layouts per PTX ISA.
import numpy as np, sys
BM=128; BN=64
# Warp layout per head dim (ATT2_ENTRY): MT m16-tiles per warp, NW warps; MT*NW*16 = BM.
def layout(HD): return (1,8) if HD==256 else (2,4)
def rb(x):
    x=np.asarray(x,dtype=np.float32); u=x.view(np.uint32).astype(np.uint64)
    u=(u+0x7fff+((u>>16)&1))&0xffff0000
    return u.astype(np.uint32).view(np.float32)
def swz(HD,row,col): return row*HD + (((col>>3) ^ (row&7))<<3)   # element offset
def ldsm(sm, lane_addr_bytes, trans=False):
    # sm: float32 array indexed by element (2 bytes each); lane_addr_bytes[l]: row start for lane l
    regs=[[None]*32 for _ in range(4)]
    for i in range(4):
        rows=[]
        for r in range(8):
            a=lane_addr_bytes[8*i+r]; assert a%16==0; e=a//2
            rows.append(sm[e:e+8])
        M=np.array(rows)
        if trans: M=M.T
        for t in range(32): regs[i][t]=(M[t//4,2*(t%4)],M[t//4,2*(t%4)+1])
    return regs
def mma(d, a, b):
    A=np.zeros((16,16),np.float32); B=np.zeros((16,8),np.float32); C=np.zeros((16,8),np.float64)
    for l in range(32):
        g,t=l>>2,l&3
        A[g,2*t:2*t+2]=a[0][l]; A[g+8,2*t:2*t+2]=a[1][l]; A[g,2*t+8:2*t+10]=a[2][l]; A[g+8,2*t+8:2*t+10]=a[3][l]
        B[2*t:2*t+2,g]=b[0][l]; B[2*t+8:2*t+10,g]=b[1][l]
        C[g,2*t:2*t+2]=d[l][0:2]; C[g+8,2*t:2*t+2]=d[l][2:4]
    D=A.astype(np.float64)@B.astype(np.float64)+C
    for l in range(32):
        g,t=l>>2,l&3
        d[l][0:2]=D[g,2*t:2*t+2]; d[l][2:4]=D[g+8,2*t:2*t+2]

def block_order(ranges, tq, ppb):
    # host side (mod.rs): heaviest query blocks first
    nqb=(tq+ppb-1)//ppb; work=[]
    for qb in range(nqb):
        lo1=lo2=2**31; hi1=hi2=-1
        for p in range(qb*ppb, min(tq,(qb+1)*ppb)):
            x,y,z,w=ranges[p]
            if x<y: lo1=min(lo1,x); hi1=max(hi1,y)
            if z<w: lo2=min(lo2,z); hi2=max(hi2,w)
        work.append(max(0,hi1-lo1)+max(0,hi2-lo2))
    return sorted(range(nqb), key=lambda i:(-work[i], i))

def run(q,k,v,ranges,heads,kvh,HD, q_ld=None, kv_ld=None):
    tq=q.shape[0]; tk=k.shape[0]; group=heads//kvh; ppb=BM//group
    MT,NW=layout(HD); assert MT*NW*16==BM
    o=np.full((tq,heads*HD),np.nan,np.float32)
    scale_log2=np.float32(np.log2(np.e)/np.sqrt(HD))
    nqb=(tq+ppb-1)//ppb
    order=block_order(ranges,tq,ppb)
    ROWB=HD*2
    # smem: Qs [128][HD], Ks [2][64][HD], Vs [2][64][HD]  (element offsets)
    QS=0; KS=BM*HD; VS=KS+2*BN*HD; SM=np.zeros(VS+2*BN*HD,np.float32)
    for bid in range(nqb*kvh):
        kv=bid%kvh; qb=order[bid//kvh]; pos0=qb*ppb
        SM[:]=np.float32(12345.0)  # stale garbage: zero-fill must be explicit
        for c in range(BM*HD//8):
            r=c//(HD//8); ch=c%(HD//8); p=pos0+r//group; ok= r<ppb*group and p<tq
            a=QS+swz(HD,r,ch*8)
            SM[a:a+8]= q[p,(kv*group+r%group)*HD+ch*8:(kv*group+r%group)*HD+ch*8+8] if ok else 0
        seg=[2**31-1,-(2**31-1)]*4
        for tid in range(min(ppb,NW*32)):
            p=pos0+tid
            if p<tq:
                x,y,z,w=ranges[p]
                if x<y: seg[0]=min(seg[0],x); seg[1]=max(seg[1],y)
                if z<w: seg[2]=min(seg[2],z); seg[3]=max(seg[3],w)
                seg[5]=max(seg[5],x); seg[4]=min(seg[4],y); seg[7]=max(seg[7],z); seg[6]=min(seg[6],w)
        a_lo,a_hi,b_lo,b_hi=seg[0:4]; fa_lo,fa_hi,fb_lo,fb_hi=seg[5],seg[4],seg[7],seg[6]
        if a_lo>=a_hi: a_lo,a_hi=b_lo,b_hi; b_lo=b_hi=0
        elif b_lo<b_hi and b_lo<=a_hi and a_lo<=b_hi: a_lo=min(a_lo,b_lo); a_hi=max(a_hi,b_hi); b_lo=b_hi=0
        if a_lo>=a_hi: a_lo=a_hi=0
        if b_lo>=b_hi: b_lo=b_hi=0
        na=(a_hi-a_lo+BN-1)//BN; ntiles=na+(b_hi-b_lo+BN-1)//BN
        def load_kv(base,src,row0):
            # fa2_load_kv<HD, NT>'s thread mapping: thread tid copies chunk tid % CPR of rows
            # tid / CPR + i*RPP at the fixed swizzled offset soff (asserted equal to swz()).
            CPR=HD//8; NTh=NW*32; RPP=NTh//CPR; seen=set()
            for tid in range(NTh):
                r0=tid//CPR; ch=tid%CPR; soff=r0*(HD*2)+((ch^(r0&7))<<4)
                for i in range(BN//RPP):
                    r=r0+i*RPP; gr=row0+r; ok=gr<tk
                    a=(base*2+soff+i*RPP*(HD*2))//2
                    assert a==base+swz(HD,r,ch*8); seen.add((r,ch))
                    SM[a:a+8]= src[gr,kv*HD+ch*8:kv*HD+ch*8+8] if ok else 0
            assert len(seen)==BN*CPR
        # warps run sequentially per tile; state per warp
        W=[]
        for warp in range(NW):
            W.append(dict(acc=[[[np.zeros(4) for _ in range(HD//8)] for _ in range(MT)] for _ in range(32)],
                          m=[[[-np.inf,-np.inf] for _ in range(MT)] for _ in range(32)],
                          l=[[[0.,0.] for _ in range(MT)] for _ in range(32)]))
        if ntiles>0: load_kv(KS,k,a_lo); load_kv(VS,v,a_lo)
        tile_in_buf={0:a_lo}
        for t in range(ntiles):
            kt0=a_lo+t*BN if t<na else b_lo+(t-na)*BN
            if t+1<ntiles:
                kn=a_lo+(t+1)*BN if t+1<na else b_lo+(t+1-na)*BN
                load_kv(KS+((t+1)&1)*BN*HD,k,kn); load_kv(VS+((t+1)&1)*BN*HD,v,kn)
            for warp in range(NW):
                st=W[warp]; wrow=warp*16*MT
                yq=[(((l>>4)^(l&7))<<4) for l in range(32)]
                yk=[((((l>>3)&1)^(l&7))<<4) for l in range(32)]
                q_lane=[QS*2+(wrow+(l&15))*ROWB for l in range(32)]
                k_lane=[KS*2+((l&7)+(l>>4)*8)*ROWB + (t&1)*BN*ROWB for l in range(32)]
                v_lane=[VS*2+((l&7)+((l>>3)&1)*8)*ROWB + (t&1)*BN*ROWB for l in range(32)]
                s=[[[np.zeros(4) for _ in range(8)] for _ in range(MT)] for _ in range(32)]
                for kk in range(HD//16):
                    A=[ldsm(SM,[q_lane[l]+mt*16*ROWB+((kk<<5)^yq[l]) for l in range(32)]) for mt in range(MT)]
                    # check against swz formula
                    for l in range(32):
                        assert q_lane[l]+16*ROWB+((kk<<5)^yq[l]) == 2*(QS+swz(HD,wrow+16+(l&15),kk*16+(l>>4)*8))
                    for np_ in range(4):
                        Bm=ldsm(SM,[k_lane[l]+np_*16*ROWB+((kk<<5)^yk[l]) for l in range(32)])
                        for mt in range(MT):
                            d0=[s[l][mt][2*np_] for l in range(32)]; mma(d0,A[mt],[Bm[0],Bm[1]])
                            d1=[s[l][mt][2*np_+1] for l in range(32)]; mma(d1,A[mt],[Bm[2],Bm[3]])
                seg_hi=a_hi if t<na else b_hi
                full=kt0+BN<=seg_hi and ((kt0>=fa_lo and kt0+BN<=fa_hi) or (kt0>=fb_lo and kt0+BN<=fb_hi))
                if not full:
                    for l in range(32):
                        g=l>>2; tig=l&3
                        for mt in range(MT):
                            for h in range(2):
                                r=wrow+mt*16+g+8*h; p=pos0+r//group
                                rg=ranges[p] if (r<ppb*group and p<tq) else (0,0,0,0)
                                inr=lambda j: j<seg_hi and ((rg[0]<=j<rg[1]) or (rg[2]<=j<rg[3]))
                                for nt in range(8):
                                    j=kt0+nt*8+tig*2
                                    if not inr(j): s[l][mt][nt][2*h]=-np.inf
                                    if not inr(j+1): s[l][mt][nt][2*h+1]=-np.inf
                mu=[[[0,0] for _ in range(MT)] for _ in range(32)]; al=[[[0,0] for _ in range(MT)] for _ in range(32)]; same=[True]*32
                for l in range(32):
                    base=l&~3
                    for mt in range(MT):
                        for h in range(2):
                            mx=max(max(max(s[b][mt][nt][2*h],s[b][mt][nt][2*h+1]) for nt in range(8)) for b in range(base,base+4))
                            mn=max(st['m'][l][mt][h], np.float32(mx)*scale_log2)
                            mu[l][mt][h]=0. if mn==-np.inf else mn
                            al[l][mt][h]=2.0**(st['m'][l][mt][h]-mu[l][mt][h])
                            same[l]= same[l] and (mn==st['m'][l][mt][h])
                for l in range(32):
                    base=l&~3
                    for mt in range(MT):
                        for h in range(2):
                            mx=max(max(max(s[b][mt][nt][2*h],s[b][mt][nt][2*h+1]) for nt in range(8)) for b in range(base,base+4))
                            st['m'][l][mt][h]=max(st['m'][l][mt][h], np.float32(mx)*scale_log2)
                            st['l'][l][mt][h]*=al[l][mt][h]
                if not all(same):
                    for l in range(32):
                        for mt in range(MT):
                            for i in range(HD//8):
                                st['acc'][l][mt][i][0:2]*=al[l][mt][0]; st['acc'][l][mt][i][2:4]*=al[l][mt][1]
                else:
                    for l in range(32):
                        for mt in range(MT):
                            for h in range(2): assert al[l][mt][h] in (0.0,1.0)
                pa=[[[[None]*4 for _ in range(4)] for _ in range(MT)] for _ in range(32)]
                for l in range(32):
                    for mt in range(MT):
                        for nt in range(8):
                            p=[2.0**(s[l][mt][nt][e]*scale_log2-mu[l][mt][e//2]) for e in range(4)]
                            st['l'][l][mt][0]+=p[0]+p[1]; st['l'][l][mt][1]+=p[2]+p[3]
                            pa[l][mt][nt>>1][(nt&1)*2]=(rb(p[0]),rb(p[1])); pa[l][mt][nt>>1][(nt&1)*2+1]=(rb(p[2]),rb(p[3]))
                for sl in range(4):
                    for dp in range(HD//16):
                        Bm=ldsm(SM,[v_lane[l]+sl*16*ROWB+((dp<<5)^yq[l]) for l in range(32)],trans=True)
                        for l in range(32):
                            assert v_lane[l]+sl*16*ROWB+((dp<<5)^yq[l]) == 2*(VS+(t&1)*BN*HD+swz(HD,sl*16+(l&7)+((l>>3)&1)*8,dp*16+(l>>4)*8))
                            assert k_lane[l]+sl*16*ROWB+((dp<<5)^yk[l]) == 2*(KS+(t&1)*BN*HD+swz(HD,sl*16+(l&7)+(l>>4)*8,dp*16+((l>>3)&1)*8))
                        for mt in range(MT):
                            Areg=[[pa[l][mt][sl][i] for l in range(32)] for i in range(4)]
                            d0=[st['acc'][l][mt][2*dp] for l in range(32)]; mma(d0,Areg,[Bm[0],Bm[1]])
                            d1=[st['acc'][l][mt][2*dp+1] for l in range(32)]; mma(d1,Areg,[Bm[2],Bm[3]])
        for warp in range(NW):
            st=W[warp]; wrow=warp*16*MT
            for l in range(32):
                base=l&~3; g=l>>2; tig=l&3
                for mt in range(MT):
                    for h in range(2):
                        L=sum(W[warp]['l'][b][mt][h] for b in range(base,base+4))
                        inv=1/L if L>0 else 0.
                        r=wrow+mt*16+g+8*h; p=pos0+r//group
                        if r<ppb*group and p<tq:
                            hh=kv*group+r%group
                            for nt in range(HD//8):
                                d=nt*8+tig*2
                                o[p,hh*HD+d:hh*HD+d+2]=rb(st['acc'][l][mt][nt][2*h:2*h+2]*inv)
    return o
def ref(q,k,v,ranges,heads,kvh,HD):
    tq=q.shape[0]; group=heads//kvh; o=np.zeros((tq,heads*HD))
    for i in range(tq):
        x,y,z,w=ranges[i]; keys=[j for j in range(k.shape[0]) if (x<=j<y) or (z<=j<w)]
        for h in range(heads):
            kv=h//group
            if not keys: continue
            sc=np.array([q[i,h*HD:(h+1)*HD].astype(np.float64)@k[j,kv*HD:(kv+1)*HD] for j in keys])/np.sqrt(HD)
            p=np.exp(sc-sc.max()); p/=p.sum()
            o[i,h*HD:(h+1)*HD]=p@v[keys][:,kv*HD:(kv+1)*HD]
    return o
rng=np.random.default_rng(int(sys.argv[1]) if len(sys.argv)>1 else 0)
def case(name,tq,tk,heads,kvh,HD,ranges):
    q=rb(rng.standard_normal((tq,heads*HD))*1.5); k=rb(rng.standard_normal((tk,kvh*HD))*1.5); v=rb(rng.standard_normal((tk,kvh*HD)))
    o=run(q,k,v,ranges,heads,kvh,HD); r=ref(q,k,v,ranges,heads,kvh,HD)
    assert not np.isnan(o).any(), "unwritten output"
    rel=np.linalg.norm(o-r)/np.linalg.norm(r)
    worst=max(np.linalg.norm(o[i]-r[i])/max(1e-30,np.linalg.norm(r[i])) for i in range(tq) if np.linalg.norm(r[i])>0)
    print(f"{name}: rel {rel:.2e} worst row {worst:.2e}", "OK" if rel<1e-2 and worst<2e-2 else "FAIL", flush=True)

# ---- cases
which=sys.argv[2] if len(sys.argv)>2 else 'all'
if which in('all','a'):
    case("causal offset hd64 G4",20,90,8,2,64,[(0,70+i+1,0,0) for i in range(20)])
    st=[0,30,31,75]; rr=[]
    for a,b in zip(st,st[1:]): rr+= [(a,i+1,0,0) for i in range(a,b)]
    case("varlen G3 hd64",75,75,3,1,64,rr)
    case("decode hd128 G4",1,130,4,1,128,[(0,130,0,0)])
if which in('all','b'):
    ctx=70; B=16; an=[0,33,69]; rr=[]
    for n,a in enumerate(an):
        for o_ in range(B):
            hi=min(a,ctx); rr.append((0,hi,ctx+n*B,ctx+(n+1)*B) if 0<hi else (0,0,ctx+n*B,ctx+(n+1)*B))
    case("blocks G2 hd64",48,ctx+48,4,2,64,rr)
    ctx=150; B=16; an=[3,140,64,149,0]; rr=[]; w=40
    for n,a in enumerate(an):
        for o_ in range(B):
            qpos=a+o_; hi=min(a,ctx); lo=max(0,qpos+1-w); lo2=max(0,o_+1-w); hi2=o_+1
            rr.append(((lo,hi) if lo<hi else (0,0))+(ctx+n*B+lo2,ctx+n*B+hi2))
    case("blocks causal window G4 hd128",80,ctx+80,8,2,128,rr)
if which in('all','c'):
    # long causal prefill, G4 hd128: several tiles, several blocks, unchanged-max skipping
    case("causal prefill 333 G4 hd128",333,333,4,1,128,[(0,i+1,0,0) for i in range(333)])
    st=[0,100,101,250,300]; rr=[]
    for a,b in zip(st,st[1:]): rr+= [(a,i+1,0,0) for i in range(a,b)]
    case("varlen G1 hd64",300,300,1,1,64,rr)
if which in('all','d'):
    # head dim 256 (8 warps x 16 rows): packed ragged lengths 1, 63, 1, 70 at GQA 6:1, and a
    # causal prefill with a cache offset (two key tiles) at GQA 2:1
    st=[0,1,64,65,135]; rr=[]
    for a,b in zip(st,st[1:]): rr+= [(a,i+1,0,0) for i in range(a,b)]
    case("varlen G6 hd256",135,135,6,1,256,rr)
    case("causal offset 60+40 G2 hd256",40,100,2,1,256,[(0,60+i+1,0,0) for i in range(40)])
