"""Host emulation of csrc/cuda/chain_verify_ut.cu variant 4 (tensor-core products) for one warp pair and one
tile: the kernel's index maps transcribed (stage read order, fold, stores, PTX m16n8k8 fragments, the pair
exchange), exact float64 arithmetic; checks U / Q and the stored tile against direct products. Run:
``python benchmarks/prof/emulate_ut_var4.py`` (numpy only; session 7, before any GPU run). Variant 5: the
pending fold as MMAs on the tile's C fragments, with k^ staged in fold-fragment order."""
import numpy as np
rng = np.random.default_rng(1)
K, TM = 256, 8
XS = K + 16

def mma(D, A, B):
    # D, A, B as per-lane fragment lists; build matrices from fragments (PTX layouts), multiply, scatter back
    Am = np.full((16, 8), np.nan); Bm = np.full((8, 8), np.nan)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        a = A[lane]; b = B[lane]
        for (r, c), val in zip([(g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4)], a):
            assert np.isnan(Am[r, c]); Am[r, c] = val
        for (k, n), val in zip([(t, g), (t + 4, g)], b):
            assert np.isnan(Bm[k, n]); Bm[k, n] = val
    Cm = Am @ Bm
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for i, (r, c) in enumerate([(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)]):
            D[lane][i] += Cm[r, c]

for VAR, trial in [(v, t) for v in (4, 5) for t in range(20)]:
    T = int(rng.integers(1, TM + 1)); P = int(rng.integers(0, TM + 1))
    S = rng.normal(size=(16, K))                  # the pair's 16 rows (old state)
    xk = np.full((TM, XS), np.nan); xq = np.full((TM, XS), np.nan)
    xk[:T, :K] = rng.normal(size=(T, K)); xq[:T, :K] = rng.normal(size=(T, K))
    kp = rng.normal(size=(max(P, 1), K)); vp = rng.normal(size=(TM, 16)); cp = rng.normal(size=TM); gam = 0.7
    stage = S.reshape(-1).copy()                  # [16][K] contiguous (one TMA copy)
    Sp = gam * S + sum(cp[j] * np.outer(vp[j], kp[j]) for j in range(P)) if P > 0 else S.copy()
    stored = np.full((16, K), np.nan)
    X = {0: np.zeros((2, TM, 8)), 1: np.zeros((2, TM, 8))}  # ws.X of warp kh (buf 0)
    accs = {}
    for kh in (0, 1):
        tiles = {}
        for lane in range(32):
            tg, tq = lane >> 2, lane & 3
            par = tg & 1
            tile = [[None] * 8 for _ in range(2)]
            for rr in range(2):
                base = (tg + 8 * rr) * K + 128 * kh + 4 * tq
                for i in range(0, 8, 2):
                    a = stage[base + 16 * (i + par): base + 16 * (i + par) + 4]
                    b = stage[base + 16 * (i + 1 - par): base + 16 * (i + 1 - par) + 4]
                    tile[rr][i] = (b if par else a).copy(); tile[rr][i + 1] = (a if par else b).copy()
            # fold (exact): a[rr] = c * vp[j][vr0 + 8 rr], x = kp4[j*(K/4) + pc0 + 4 i], pc0 = 32 kh + tq
            if P > 0 and VAR == 5:
                pass  # the MMA fold runs below, per warp
            elif P > 0:
                for rr in range(2):
                    for i in range(8): tile[rr][i] = tile[rr][i] * gam
                for j in range(P):
                    for rr in range(2):
                        a_ = cp[j] * vp[j][tg + 8 * rr]
                        for i in range(8):
                            pc = 32 * kh + tq + 4 * i
                            tile[rr][i] = tile[rr][i] + a_ * kp[j][4 * pc: 4 * pc + 4]
                # store_tile_map<8, 4>: rows (row_w - 8 kh + tg) + 8 rr, pieces pc0 + 4 i
                for rr in range(2):
                    for i in range(8):
                        pc = 32 * kh + tq + 4 * i
                        assert np.isnan(stored[tg + 8 * rr, 4 * pc]).all()
                        stored[tg + 8 * rr, 4 * pc: 4 * pc + 4] = tile[rr][i]
            tiles[lane] = tile
        if P > 0 and VAR == 5:
            # staging into fold-fragment order (all TM pending rows, zeros past P), as the kernel writes it
            kpf = np.full(2 * 8 * 2 * 32 * 2, np.nan)
            for c in range(TM * (K // 4)):
                j, key0 = c % TM, (c // TM) * 4
                kh2, m2, t2 = key0 // 128, (key0 % 128) // 16, (key0 % 16) // 4
                for d in range(4):
                    blk, ln = (kh2 * 8 + m2) * 2 + d // 2, 4 * (2 * t2 + d % 2) + j % 4
                    idx = (blk * 32 + ln) * 2 + j // 4
                    assert np.isnan(kpf[idx]); kpf[idx] = kp[j][key0 + d] if j < P else 0.0
            assert not np.isnan(kpf).any()
            for lane in range(32):
                for rr in range(2):
                    for i in range(8): tiles[lane][rr][i] = tiles[lane][rr][i] * gam
            Af = []
            for lane in range(32):
                tg, tq = lane >> 2, lane & 3
                a4 = []
                for q2 in range(4):
                    j, rrow = tq + 4 * (q2 >> 1), tg + 8 * (q2 & 1)
                    a4.append(cp[j] * vp[j][rrow] if j < P else 0.0)
                Af.append(a4)
            for i in range(8):
                for e in range(2):
                    Bf = []; C = []
                    for lane in range(32):
                        blk = ((kh * 8 + i) * 2 + e) * 32 + lane
                        Bf.append([kpf[blk * 2], kpf[blk * 2 + 1]])
                        C.append([0.0, 0.0, 0.0, 0.0])  # zero accumulators, then one add to the tile
                    mma(C, Af, Bf)
                    for lane in range(32):
                        t = tiles[lane]
                        t[0][i][2 * e] += C[lane][0]; t[0][i][2 * e + 1] += C[lane][1]
                        t[1][i][2 * e] += C[lane][2]; t[1][i][2 * e + 1] += C[lane][3]
            for lane in range(32):
                tg, tq = lane >> 2, lane & 3
                for rr in range(2):
                    for i in range(8):
                        pc = 32 * kh + tq + 4 * i
                        assert np.isnan(stored[tg + 8 * rr, 4 * pc]).all()
                        stored[tg + 8 * rr, 4 * pc: 4 * pc + 4] = tiles[lane][rr][i]
        au = [[0.0] * 4 for _ in range(32)]; aq = [[0.0] * 4 for _ in range(32)]
        for i in range(8):
            for e in range(2):
                A = []; Bk = []; Bq = []
                for lane in range(32):
                    tg, tq = lane >> 2, lane & 3
                    tile = tiles[lane]
                    kf = xk[tg, 128 * kh + 4 * tq + 16 * i: 128 * kh + 4 * tq + 16 * i + 4]
                    qf = xq[tg, 128 * kh + 4 * tq + 16 * i: 128 * kh + 4 * tq + 16 * i + 4]
                    A.append([tile[0][i][2 * e], tile[1][i][2 * e], tile[0][i][2 * e + 1], tile[1][i][2 * e + 1]])
                    Bk.append([kf[2 * e], kf[2 * e + 1]]); Bq.append([qf[2 * e], qf[2 * e + 1]])
                mma(au, A, Bk); mma(aq, A, Bq)
        accs[kh] = (au, aq)
    # exchange
    U = {}; Q = {}
    for kh in (0, 1):
        au, aq = accs[kh]
        for lane in range(32):
            tg, tq = lane >> 2, lane & 3
            Xp = X[1 - kh]
            Xp[0][2 * tq][tg] = au[lane][0] if kh else au[lane][2]
            Xp[0][2 * tq + 1][tg] = au[lane][1] if kh else au[lane][3]
            Xp[1][2 * tq][tg] = aq[lane][0] if kh else aq[lane][2]
            Xp[1][2 * tq + 1][tg] = aq[lane][1] if kh else aq[lane][3]
    for kh in (0, 1):
        au, aq = accs[kh]
        U[kh] = np.full((TM, 8), np.nan); Q[kh] = np.full((TM, 8), np.nan)
        for lane in range(32):
            tg, tq = lane >> 2, lane & 3
            U[kh][2 * tq][tg] = (au[lane][2] if kh else au[lane][0]) + X[kh][0][2 * tq][tg]
            U[kh][2 * tq + 1][tg] = (au[lane][3] if kh else au[lane][1]) + X[kh][0][2 * tq + 1][tg]
            Q[kh][2 * tq][tg] = (aq[lane][2] if kh else aq[lane][0]) + X[kh][1][2 * tq][tg]
            Q[kh][2 * tq + 1][tg] = (aq[lane][3] if kh else aq[lane][1]) + X[kh][1][2 * tq + 1][tg]
        # expected: warp kh's rows 8 kh + ri, tokens t < T: U_t = S' k_t
        for t in range(T):
            for ri in range(8):
                row = 8 * kh + ri
                assert abs(U[kh][t][ri] - Sp[row] @ xk[t, :K]) < 1e-9 * (1 + abs(U[kh][t][ri])), (trial, kh, t, ri)
                assert abs(Q[kh][t][ri] - Sp[row] @ xq[t, :K]) < 1e-9 * (1 + abs(Q[kh][t][ri]))
    if P > 0:
        assert np.allclose(stored, Sp, atol=1e-12), trial
print("variant-4 / 5 emulation OK")
