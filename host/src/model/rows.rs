//! Kernels for decoding a few rows at a time: `y = x Wᵀ` without gemm's packing, attention of
//! the new positions against the KV cache, and the log-sum-exp over the vocabulary that every
//! sampled token's log-prob needs. Also the training path's row kernels: the attention
//! weights' softmax, and the log-sum-exp, mean and gradient of each response token's log-prob
//! and entropy, with the same AVX2 exponentials.
//!
//! At 2 to 16 rows, gemm spends much of its time packing operands and runs its 8 × 6
//! microkernel on panels it had to transpose. Here each group of 3 weight rows is read once,
//! from where it lies, against 4 rows of x at a time: 12 AVX2 accumulators, 7 loads per 12
//! FMAs, the rows of x staying in L1, the weight rows two tiles ahead prefetched. Weight rows
//! are split over the rayon pool. At 8 rows a 1536 × 576 weight takes 131 µs (108 GFLOP/s)
//! against gemm's 266 µs on this machine. x86-64 with AVX2 and FMA only (detected at run
//! time); the tests below check it against the plain product. With AVX-512F as well, two rows
//! of x share each 512-bit register and the weight's 8 lanes are broadcast to both halves: the
//! same 12 accumulators cover 3 weight rows × 8 rows of x (7 loads per 24 8-lane FMAs), and
//! each half runs exactly the AVX2 chain, so both paths give the same bits (tested).

use rayon::prelude::*;

/// Whether this CPU runs the kernel.
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether this CPU also has AVX-512F, for [`x_wt`]'s 16-lane path.
fn wide_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        available() && std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `x (m, k) · Wᵀ` with `W (n, k)`, both row-major, as (m, n) row-major. Call only when
/// [`available`]. With AVX-512 two rows of x share each register (see [`pair_rows`]); the
/// result is the same, bit for bit, as the AVX2 path's.
pub(crate) fn x_wt(x: &[f32], w: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
    x_wt_with(x, w, m, n, k, wide_available())
}

fn x_wt_with(x: &[f32], w: &[f32], m: usize, n: usize, k: usize, wide: bool) -> Vec<f32> {
    assert!(available() && x.len() == m * k && w.len() == n * k);
    assert!(!wide || wide_available());
    // (n, m): each block of weight rows writes its own contiguous part.
    const BLOCK: usize = 64;
    let mut yt = vec![0f32; n * m];
    let pairs = if wide { pair_rows(x, m, k) } else { vec![] };
    let run = |(bi, out): (usize, &mut [f32])| {
        let o0 = bi * BLOCK;
        let rows = out.len() / m;
        let w = &w[o0 * k..(o0 + rows) * k];
        // SAFETY: available() checked AVX2 and FMA (and wide_available() AVX-512F when
        // `wide`); the slices hold the rows they index.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            if wide {
                avx2::block_wide(w, x, &pairs, rows, m, k, out)
            } else {
                avx2::block(w, x, rows, m, k, out)
            }
        };
    };
    if rayon::current_num_threads() > 1 && n >= 4 * BLOCK {
        yt.par_chunks_mut(BLOCK * m).enumerate().for_each(run);
    } else {
        yt.chunks_mut(BLOCK * m).enumerate().for_each(run);
    }
    let mut y = vec![0f32; m * n];
    for (o, col) in yt.chunks_exact(m).enumerate() {
        for (r, v) in col.iter().enumerate() {
            y[r * n + o] = *v;
        }
    }
    y
}

/// The rows of x (m, k) two by two, interleaved by blocks of 8: for rows 2p and 2p + 1 and
/// each whole block c of 8 columns, 16 floats (row 2p's block c, then row 2p + 1's; zeros
/// when m is odd and 2p + 1 = m). One 512-bit load then holds both rows' block, and the
/// weight's block broadcast to both halves makes each half the AVX2 path's 8-lane chain.
fn pair_rows(x: &[f32], m: usize, k: usize) -> Vec<f32> {
    let k8 = k / 8 * 8;
    let mut out = vec![0f32; m.div_ceil(2) * 2 * k8];
    if k8 == 0 {
        return out;
    }
    for (r, row) in x.chunks_exact(k).enumerate() {
        let (p, half) = (r / 2, r % 2);
        for (c, block) in row[..k8].chunks_exact(8).enumerate() {
            let at = p * 2 * k8 + c * 16 + half * 8;
            out[at..at + 8].copy_from_slice(block);
        }
    }
    out
}

/// log Σ exp(x) over a row of logits (sampling needs it for every generated token's log-prob:
/// 49k exponentials per row for SmolLM2), with AVX2 exponentials when the CPU has them.
pub(crate) fn logsumexp(xs: &[f32]) -> f32 {
    let m = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !m.is_finite() {
        return m;
    }
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: available() checked AVX2 and FMA.
        return m + unsafe { avx2::sum_exp(xs, m) }.ln() as f32;
    }
    m + xs.iter().map(|&x| (x - m).exp() as f64).sum::<f64>().ln() as f32
}

/// softmax(row · scale + mask) in place, for the training forward's attention weights: with
/// AVX2 exponentials, maximum and sum when the CPU has them (the sum then rounds in 8 lanes),
/// else one element at a time. Exponentials under e^-87 are 0, so masked positions weigh
/// nothing. `mask`, when given, is as long as `row`, which is not empty.
pub(crate) fn softmax_scaled(row: &mut [f32], mask: Option<&[f32]>, scale: f32) {
    debug_assert!(!row.is_empty() && mask.is_none_or(|m| m.len() == row.len()));
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: available() checked AVX2 and FMA; the mask is as long as the row.
        unsafe { avx2::softmax_scaled(row, mask, scale) };
        return;
    }
    match mask {
        Some(m) => row.iter_mut().zip(m).for_each(|(y, m)| *y = *y * scale + m),
        None => row.iter_mut().for_each(|y| *y *= scale),
    }
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    row.iter_mut().for_each(|y| *y = exp_or_zero(*y - max));
    let inv = 1.0 / row.iter().fold(0f32, |sum, y| sum + y);
    row.iter_mut().for_each(|y| *y *= inv);
}

/// e^d, or 0 below -87 (as the AVX2 path).
fn exp_or_zero(d: f32) -> f32 {
    if d < -87.0 {
        0.0
    } else {
        d.exp()
    }
}

/// out[i] = σ(xs[i]) = 1 / (1 + e^-xs[i]), with AVX2 exponentials when the CPU has them
/// (within a few ulp of the exact value; NaN stays NaN), else one element at a time.
pub(crate) fn sigmoids(xs: &[f32], out: &mut [f32]) {
    assert_eq!(xs.len(), out.len());
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: available() checked AVX2 and FMA; the slices are as long.
        unsafe { avx2::sigmoids(xs, out) };
        return;
    }
    for (o, &x) in out.iter_mut().zip(xs) {
        *o = sigmoid(x);
    }
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Per row of logits: the log-sum-exp and the mean of the logits under their softmax,
/// E_p[z] (the entropy is lse − E_p[z]), with AVX2 exponentials when the CPU has them.
pub(crate) fn lse_and_mean(z: &[f32]) -> (f32, f32) {
    let max = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    #[cfg(target_arch = "x86_64")]
    if available() && max.is_finite() {
        // SAFETY: available() checked AVX2 and FMA.
        let (sum, zsum) = unsafe { avx2::sum_exp_and_weighted(z, max) };
        return (max + sum.ln(), zsum / sum);
    }
    let (mut sum, mut zsum) = (0f32, 0f32);
    for &v in z {
        let e = (v - max).exp();
        sum += e;
        zsum += e * v;
    }
    (max + sum.ln(), zsum / sum)
}

/// out[j] = −g_lp p_j − g_h p_j (z_j − mean) with p_j = e^(z_j − lse): the gradient of a
/// row's target log-prob and entropy (their gradients g_lp and g_h) with respect to its
/// logits, less the target's own g_lp term.
pub(crate) fn logprob_entropy_grad(
    out: &mut [f32],
    z: &[f32],
    lse: f32,
    mean: f32,
    g_lp: f32,
    g_h: f32,
) {
    #[cfg(target_arch = "x86_64")]
    if available() && lse.is_finite() {
        // SAFETY: available() checked AVX2 and FMA; the caller's rows are as long.
        unsafe { avx2::logprob_entropy_grad(out, z, lse, mean, g_lp, g_h) };
        return;
    }
    for (o, z) in out.iter_mut().zip(z) {
        let p = (z - lse).exp();
        *o = -g_lp * p - g_h * p * (z - mean);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::Positions;
    use std::arch::x86_64::*;

    /// [`super::softmax_scaled`].
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn softmax_scaled(row: &mut [f32], mask: Option<&[f32]>, scale: f32) {
        let n = row.len();
        let n8 = n / 8 * 8;
        let p = row.as_mut_ptr();
        let sv = _mm256_set1_ps(scale);
        let mut mx = _mm256_set1_ps(f32::NEG_INFINITY);
        let mut i = 0;
        while i < n8 {
            let mut y = _mm256_mul_ps(_mm256_loadu_ps(p.add(i)), sv);
            if let Some(m) = mask {
                y = _mm256_add_ps(y, _mm256_loadu_ps(m.as_ptr().add(i)));
            }
            _mm256_storeu_ps(p.add(i), y);
            mx = _mm256_max_ps(mx, y);
            i += 8;
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), mx);
        let mut max = lanes.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        for j in n8..n {
            row[j] = row[j] * scale + mask.map_or(0.0, |m| m[j]);
            max = max.max(row[j]);
        }
        let (mv, floor) = (_mm256_set1_ps(max), _mm256_set1_ps(-87.0));
        let mut acc = _mm256_setzero_ps();
        i = 0;
        while i < n8 {
            let d = _mm256_sub_ps(_mm256_loadu_ps(p.add(i)), mv);
            let e = _mm256_and_ps(exp(d), _mm256_cmp_ps::<_CMP_GE_OQ>(d, floor));
            _mm256_storeu_ps(p.add(i), e);
            acc = _mm256_add_ps(acc, e);
            i += 8;
        }
        let mut sum = hsum(acc);
        for y in &mut row[n8..] {
            *y = super::exp_or_zero(*y - max);
            sum += *y;
        }
        let inv = 1.0 / sum;
        let iv = _mm256_set1_ps(inv);
        i = 0;
        while i < n8 {
            _mm256_storeu_ps(p.add(i), _mm256_mul_ps(_mm256_loadu_ps(p.add(i)), iv));
            i += 8;
        }
        for y in &mut row[n8..] {
            *y *= inv;
        }
    }

    /// (Σ e^(z − m), Σ e^(z − m) z) over a row, for m its maximum.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn sum_exp_and_weighted(z: &[f32], m: f32) -> (f32, f32) {
        let mv = _mm256_set1_ps(m);
        let (mut s, mut w) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let chunks = z.chunks_exact(8);
        let tail = chunks.remainder();
        for c in chunks {
            let v = _mm256_loadu_ps(c.as_ptr());
            let e = exp(_mm256_sub_ps(v, mv));
            s = _mm256_add_ps(s, e);
            w = _mm256_fmadd_ps(e, v, w);
        }
        let (mut sum, mut zsum) = (hsum(s), hsum(w));
        for &v in tail {
            let e = (v - m).exp();
            sum += e;
            zsum += e * v;
        }
        (sum, zsum)
    }

    /// [`super::logprob_entropy_grad`].
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn logprob_entropy_grad(
        out: &mut [f32],
        z: &[f32],
        lse: f32,
        mean: f32,
        g_lp: f32,
        g_h: f32,
    ) {
        let n = out.len().min(z.len());
        let n8 = n / 8 * 8;
        let (lv, mv) = (_mm256_set1_ps(lse), _mm256_set1_ps(mean));
        let (glp, gh) = (_mm256_set1_ps(-g_lp), _mm256_set1_ps(-g_h));
        let mut i = 0;
        while i < n8 {
            let v = _mm256_loadu_ps(z.as_ptr().add(i));
            let p = exp(_mm256_sub_ps(v, lv));
            // −g_lp p − g_h p (z − mean) = p (−g_lp − g_h (z − mean))
            let f = _mm256_fmadd_ps(gh, _mm256_sub_ps(v, mv), glp);
            _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_mul_ps(p, f));
            i += 8;
        }
        for j in n8..n {
            let p = (z[j] - lse).exp();
            out[j] = -g_lp * p - g_h * p * (z[j] - mean);
        }
    }

    /// [`super::sigmoids`]: e = e^-|x| (an argument the exponential takes), then 1 / (1 + e)
    /// for x ≥ 0 and e / (1 + e) below.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn sigmoids(xs: &[f32], out: &mut [f32]) {
        let n8 = xs.len() / 8 * 8;
        let one = _mm256_set1_ps(1.0);
        let sign = _mm256_set1_ps(-0.0);
        let mut i = 0;
        while i < n8 {
            let x = _mm256_loadu_ps(xs.as_ptr().add(i));
            let e = exp(_mm256_or_ps(x, sign));
            let d = _mm256_add_ps(one, e);
            let s = _mm256_blendv_ps(_mm256_div_ps(one, d), _mm256_div_ps(e, d), x);
            let s = _mm256_blendv_ps(s, x, _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x));
            _mm256_storeu_ps(out.as_mut_ptr().add(i), s);
            i += 8;
        }
        for j in n8..xs.len() {
            out[j] = super::sigmoid(xs[j]);
        }
    }

    /// Σ exp(x - m) for x ≤ m, in f64 (eight f32 lanes flushed every 512 values).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn sum_exp(xs: &[f32], m: f32) -> f64 {
        let mv = _mm256_set1_ps(m);
        let mut total = 0f64;
        for block in xs.chunks(512) {
            let mut acc = _mm256_setzero_ps();
            let chunks = block.chunks_exact(8);
            let tail = chunks.remainder();
            for c in chunks {
                acc = _mm256_add_ps(acc, exp(_mm256_sub_ps(_mm256_loadu_ps(c.as_ptr()), mv)));
            }
            total += hsum(acc) as f64 + tail.iter().map(|&x| (x - m).exp() as f64).sum::<f64>();
        }
        total
    }

    /// e^x for x ≤ 0 (Cephes' expf: a degree-6 polynomial on x - n ln 2, times 2^n; about
    /// 1 ulp). Below -87 it returns about 0.
    #[inline(always)]
    unsafe fn exp(x: __m256) -> __m256 {
        let x = _mm256_max_ps(x, _mm256_set1_ps(-87.0));
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
        );
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
        let mut p = _mm256_set1_ps(1.987_569_1e-4);
        for c in [
            1.398_199_9e-3,
            8.333_452e-3,
            4.166_579_6e-2,
            0.166_666_65,
            0.5,
        ] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        let y = _mm256_add_ps(
            _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r),
            _mm256_set1_ps(1.0),
        );
        let pow2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        )));
        _mm256_mul_ps(y, pow2)
    }

    /// out (rows, m) = w (rows, k) · x (m, k)ᵀ.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn block(
        w: &[f32],
        x: &[f32],
        rows: usize,
        m: usize,
        k: usize,
        out: &mut [f32],
    ) {
        let mut o = 0;
        while o < rows {
            let wo = (rows - o).min(3);
            let mut r = 0;
            while r < m {
                let xr = (m - r).min(4);
                match (wo, xr) {
                    (3, 4) => tile::<3, 4>(w, x, o, r, m, k, out),
                    (3, 3) => tile::<3, 3>(w, x, o, r, m, k, out),
                    (3, 2) => tile::<3, 2>(w, x, o, r, m, k, out),
                    (3, _) => tile::<3, 1>(w, x, o, r, m, k, out),
                    (2, 4) => tile::<2, 4>(w, x, o, r, m, k, out),
                    (2, 3) => tile::<2, 3>(w, x, o, r, m, k, out),
                    (2, 2) => tile::<2, 2>(w, x, o, r, m, k, out),
                    (2, _) => tile::<2, 1>(w, x, o, r, m, k, out),
                    (_, 4) => tile::<1, 4>(w, x, o, r, m, k, out),
                    (_, 3) => tile::<1, 3>(w, x, o, r, m, k, out),
                    (_, 2) => tile::<1, 2>(w, x, o, r, m, k, out),
                    _ => tile::<1, 1>(w, x, o, r, m, k, out),
                }
                r += xr;
            }
            o += wo;
        }
    }

    /// [`block`] with AVX-512F: `pairs` is x as [`super::pair_rows`] lays it out. Each
    /// 512-bit accumulator holds two rows of x's 8-lane sums, each computed as in [`tile`],
    /// so the results are the same bits.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn block_wide(
        w: &[f32],
        x: &[f32],
        pairs: &[f32],
        rows: usize,
        m: usize,
        k: usize,
        out: &mut [f32],
    ) {
        let np = m.div_ceil(2);
        let mut o = 0;
        while o < rows {
            let wo = (rows - o).min(3);
            let mut p = 0;
            while p < np {
                let n = (np - p).min(4);
                match (wo, n) {
                    (3, 4) => tile_wide::<3, 4>(w, x, pairs, o, p, m, k, out),
                    (3, 3) => tile_wide::<3, 3>(w, x, pairs, o, p, m, k, out),
                    (3, 2) => tile_wide::<3, 2>(w, x, pairs, o, p, m, k, out),
                    (3, _) => tile_wide::<3, 1>(w, x, pairs, o, p, m, k, out),
                    (2, 4) => tile_wide::<2, 4>(w, x, pairs, o, p, m, k, out),
                    (2, 3) => tile_wide::<2, 3>(w, x, pairs, o, p, m, k, out),
                    (2, 2) => tile_wide::<2, 2>(w, x, pairs, o, p, m, k, out),
                    (2, _) => tile_wide::<2, 1>(w, x, pairs, o, p, m, k, out),
                    (_, 4) => tile_wide::<1, 4>(w, x, pairs, o, p, m, k, out),
                    (_, 3) => tile_wide::<1, 3>(w, x, pairs, o, p, m, k, out),
                    (_, 2) => tile_wide::<1, 2>(w, x, pairs, o, p, m, k, out),
                    _ => tile_wide::<1, 1>(w, x, pairs, o, p, m, k, out),
                }
                p += n;
            }
            o += wo;
        }
    }

    /// out[o + i][2 (p + j) + h] = w[o + i] · x[2 (p + j) + h] for i < O, j < P, h < 2 (the
    /// rows of x that exist).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile_wide<const O: usize, const P: usize>(
        w: &[f32],
        x: &[f32],
        pairs: &[f32],
        o: usize,
        p: usize,
        m: usize,
        k: usize,
        out: &mut [f32],
    ) {
        let k8 = k / 8 * 8;
        let wp: [*const f32; O] = std::array::from_fn(|i| w.as_ptr().add((o + i) * k));
        let xp: [*const f32; P] = std::array::from_fn(|j| pairs.as_ptr().add((p + j) * 2 * k8));
        let mut acc = [[_mm512_setzero_ps(); P]; O];
        let next: [*const f32; O] = std::array::from_fn(|i| wp[i].wrapping_add(2 * O * k));
        let mut c = 0;
        while c < k8 {
            if c % 16 == 0 {
                for q in next {
                    _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(c) as *const i8);
                }
            }
            let wv: [__m512; O] = std::array::from_fn(|i| {
                _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(
                    wp[i].add(c),
                ))))
            });
            for j in 0..P {
                let xv = _mm512_loadu_ps(xp[j].add(2 * c));
                for i in 0..O {
                    acc[i][j] = _mm512_fmadd_ps(wv[i], xv, acc[i][j]);
                }
            }
            c += 8;
        }
        for (i, acc) in acc.iter().enumerate() {
            for (j, &acc) in acc.iter().enumerate() {
                let halves = [
                    _mm512_castps512_ps256(acc),
                    _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc))),
                ];
                for (h, half) in halves.into_iter().enumerate() {
                    let r = 2 * (p + j) + h;
                    if r == m {
                        break;
                    }
                    let xr = x.as_ptr().add(r * k);
                    let mut s = hsum(half);
                    for cc in k8..k {
                        s += *wp[i].add(cc) * *xr.add(cc);
                    }
                    out[(o + i) * m + r] = s;
                }
            }
        }
    }

    /// out[o + i][r + j] = w[o + i] · x[r + j] for i < O, j < R.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile<const O: usize, const R: usize>(
        w: &[f32],
        x: &[f32],
        o: usize,
        r: usize,
        m: usize,
        k: usize,
        out: &mut [f32],
    ) {
        let wp: [*const f32; O] = std::array::from_fn(|i| w.as_ptr().add((o + i) * k));
        let xp: [*const f32; R] = std::array::from_fn(|j| x.as_ptr().add((r + j) * k));
        let mut acc = [[_mm256_setzero_ps(); R]; O];
        let k8 = k / 8 * 8;
        let mut c = 0;
        // The weight rows two tiles on follow these ones: fetch them while these compute (the
        // hardware prefetcher alone left the loads waiting on memory; one tile ahead was too
        // close for the lm_head, four too far).
        let next: [*const f32; O] = std::array::from_fn(|i| wp[i].wrapping_add(2 * O * k));
        while c < k8 {
            if c % 16 == 0 {
                for p in next {
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(c) as *const i8);
                }
            }
            let wv: [__m256; O] = std::array::from_fn(|i| _mm256_loadu_ps(wp[i].add(c)));
            for j in 0..R {
                let xv = _mm256_loadu_ps(xp[j].add(c));
                for i in 0..O {
                    acc[i][j] = _mm256_fmadd_ps(wv[i], xv, acc[i][j]);
                }
            }
            c += 8;
        }
        for i in 0..O {
            for j in 0..R {
                let mut s = hsum(acc[i][j]);
                for cc in k8..k {
                    s += *wp[i].add(cc) * *xp[j].add(cc);
                }
                out[(o + i) * m + r + j] = s;
            }
        }
    }

    /// [`super::attend`] with AVX2 + FMA: four keys (and values) at a time, so that the
    /// dot products run as independent chains.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn attend(
        q: &[f32],
        keys: Positions,
        values: Positions,
        mask: Option<&[f32]>,
        scale: f32,
        p: &mut [f32],
        o: &mut [f32],
    ) {
        let hd = q.len();
        let n8 = hd / 8 * 8;
        let s = p.len();
        let mut j = 0;
        while j + 4 <= s {
            scores::<4>(q, &keys.rows::<4>(j), n8, &mut p[j..j + 4]);
            j += 4;
        }
        while j < s {
            scores::<1>(q, &keys.rows::<1>(j), n8, &mut p[j..j + 1]);
            j += 1;
        }
        for (j, pj) in p.iter_mut().enumerate() {
            *pj = *pj * scale + mask.map_or(0.0, |m| m[j]);
        }
        let max = p.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mv = _mm256_set1_ps(max);
        let mut chunks = p.chunks_exact_mut(8);
        let mut acc = _mm256_setzero_ps();
        for c in &mut chunks {
            let e = exp(_mm256_sub_ps(_mm256_loadu_ps(c.as_ptr()), mv));
            _mm256_storeu_ps(c.as_mut_ptr(), e);
            acc = _mm256_add_ps(acc, e);
        }
        let mut sum = hsum(acc);
        for pj in chunks.into_remainder() {
            *pj = (*pj - max).exp();
            sum += *pj;
        }
        let inv = 1.0 / sum;
        for pj in p.iter_mut() {
            *pj *= inv;
        }
        let mut j = 0;
        while j + 4 <= s {
            accumulate::<4>(&values.rows::<4>(j), &p[j..j + 4], n8, o);
            j += 4;
        }
        while j < s {
            accumulate::<1>(&values.rows::<1>(j), &p[j..j + 1], n8, o);
            j += 1;
        }
    }

    /// p[u] = q · keys[u] for G keys.
    #[inline(always)]
    unsafe fn scores<const G: usize>(q: &[f32], keys: &[&[f32]], n8: usize, p: &mut [f32]) {
        let mut acc = [_mm256_setzero_ps(); G];
        let mut c = 0;
        while c < n8 {
            let qv = _mm256_loadu_ps(q.as_ptr().add(c));
            for u in 0..G {
                acc[u] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(keys[u].as_ptr().add(c)), acc[u]);
            }
            c += 8;
        }
        for u in 0..G {
            let tail: f32 = q[n8..].iter().zip(&keys[u][n8..]).map(|(x, y)| x * y).sum();
            p[u] = hsum(acc[u]) + tail;
        }
    }

    /// o += Σ_u p[u] values[u] for G values.
    #[inline(always)]
    unsafe fn accumulate<const G: usize>(values: &[&[f32]], p: &[f32], n8: usize, o: &mut [f32]) {
        let w: [__m256; G] = std::array::from_fn(|u| _mm256_set1_ps(p[u]));
        let mut c = 0;
        while c < n8 {
            let op = o.as_mut_ptr().add(c);
            let mut acc = _mm256_loadu_ps(op);
            for u in 0..G {
                acc = _mm256_fmadd_ps(w[u], _mm256_loadu_ps(values[u].as_ptr().add(c)), acc);
            }
            _mm256_storeu_ps(op, acc);
            c += 8;
        }
        for u in 0..G {
            for (o, v) in o[n8..].iter_mut().zip(&values[u][n8..]) {
                *o += p[u] * v;
            }
        }
    }

    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }
}

/// Attention for a few new positions against the KV cache (decoding), without the batched
/// matmuls' packing: at one query row per head their overhead outweighed the arithmetic.
/// q (b, nh, t, hd) contiguous; k and v (b, nkv, s, hd) views with unit last stride (the
/// cache's buffers); mask (b, 1, t, s) additive or None. Returns (b, nh, t, hd), or None when
/// the tensors are not all f32 on the CPU in those layouts.
pub(crate) fn decode_attention(
    q: &candle_core::Tensor,
    k: &candle_core::Tensor,
    v: &candle_core::Tensor,
    mask: Option<&candle_core::Tensor>,
    scale: f32,
) -> candle_core::Result<Option<candle_core::Tensor>> {
    decode_attention_on(q, k, v, mask, scale, true)
}

/// [`decode_attention`], with the left padding skipped or not (the tests compare both).
fn decode_attention_on(
    q: &candle_core::Tensor,
    k: &candle_core::Tensor,
    v: &candle_core::Tensor,
    mask: Option<&candle_core::Tensor>,
    scale: f32,
    skip_padding: bool,
) -> candle_core::Result<Option<candle_core::Tensor>> {
    use candle_core::{CpuStorage, DType, Storage, Tensor};
    let all_f32 = [Some(q), Some(k), Some(v), mask]
        .into_iter()
        .flatten()
        .all(|t| t.dtype() == DType::F32 && t.device().is_cpu());
    if !all_f32 {
        return Ok(None);
    }
    let (b, nh, t, hd) = q.dims4()?;
    let (_, nkv, s, _) = k.dims4()?;
    let (qs, ql) = q.storage_and_layout();
    let (ks, kl) = k.storage_and_layout();
    let (vs, vl) = v.storage_and_layout();
    let ms = mask.map(|m| m.storage_and_layout());
    let (
        Storage::Cpu(CpuStorage::F32(qv)),
        Storage::Cpu(CpuStorage::F32(kv)),
        Storage::Cpu(CpuStorage::F32(vv)),
    ) = (&*qs, &*ks, &*vs)
    else {
        return Ok(None);
    };
    let Some((q0, _)) = ql.contiguous_offsets() else {
        return Ok(None);
    };
    let (kst, vst) = (kl.stride(), vl.stride());
    if kst[3] != 1 || vst[3] != 1 || v.dims() != k.dims() {
        return Ok(None);
    }
    let mv = match &ms {
        Some((m, ml)) => match (&**m, ml.contiguous_offsets()) {
            (Storage::Cpu(CpuStorage::F32(m)), Some((a, e))) if e - a == b * t * s => {
                Some(&m[a..e])
            }
            _ => return Ok(None),
        },
        None => None,
    };
    let n_rep = nh / nkv;
    // Each mask row's left padding is skipped, from a multiple of 8 on so that the sums see
    // the same lanes in the same order: what changes is only the padding's own weights
    // (e^-87 / sum from the AVX2 exponential, not 0) times its values.
    let firsts: Vec<usize> = match (mv, skip_padding) {
        (Some(m), true) => (m.chunks_exact(s))
            .map(|row| super::attention::live_columns(row).0 / 8 * 8)
            .collect(),
        _ => vec![0; b * t],
    };
    let mut out = vec![0f32; b * nh * t * hd];
    let simd = available();
    let head = |(bh, out): (usize, &mut [f32])| {
        let (bi, h) = (bh / nh, bh % nh);
        let g = h / n_rep;
        let kb = kl.start_offset() + bi * kst[0] + g * kst[1];
        let vb = vl.start_offset() + bi * vst[0] + g * vst[1];
        let mut p = vec![0f32; s];
        for i in 0..t {
            let qr = &qv[q0 + (bh * t + i) * hd..][..hd];
            let mr = mv.map(|m| &m[(bi * t + i) * s..][..s]);
            let lo = firsts[bi * t + i];
            let keys = Positions::new(&kv[kb..], kst[2], hd, lo);
            let values = Positions::new(&vv[vb..], vst[2], hd, lo);
            let (mr, p) = (mr.map(|m| &m[lo..]), &mut p[lo..]);
            let o = &mut out[i * hd..][..hd];
            #[cfg(target_arch = "x86_64")]
            if simd {
                // SAFETY: available() checked AVX2 and FMA.
                unsafe { avx2::attend(qr, keys, values, mr, scale, p, o) };
                continue;
            }
            attend(qr, keys, values, mr, scale, p, o);
        }
    };
    if rayon::current_num_threads() > 1 && b * nh >= 4 {
        out.par_chunks_mut(t * hd).enumerate().for_each(head);
    } else {
        out.chunks_mut(t * hd).enumerate().for_each(head);
    }
    Ok(Some(Tensor::from_vec(out, (b, nh, t, hd), q.device())?))
}

/// The key (or value) rows of one head in the cache: row j at `data[j · stride..][..d]`,
/// counted from `first`.
#[derive(Clone, Copy)]
struct Positions<'a> {
    data: &'a [f32],
    stride: usize,
    d: usize,
    first: usize,
}

impl<'a> Positions<'a> {
    fn new(data: &'a [f32], stride: usize, d: usize, first: usize) -> Positions<'a> {
        Positions {
            data,
            stride,
            d,
            first,
        }
    }

    /// Row `first + j`.
    #[inline(always)]
    fn row(&self, j: usize) -> &'a [f32] {
        &self.data[(self.first + j) * self.stride..][..self.d]
    }

    /// Rows `first + j` to `first + j + G`.
    #[inline(always)]
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn rows<const G: usize>(&self, j: usize) -> [&'a [f32]; G] {
        std::array::from_fn(|u| self.row(j + u))
    }
}

/// One query row against s keys and values: p = softmax(q·k scale + mask), o = Σ p v.
fn attend(
    q: &[f32],
    keys: Positions,
    values: Positions,
    mask: Option<&[f32]>,
    scale: f32,
    p: &mut [f32],
    o: &mut [f32],
) {
    for (j, pj) in p.iter_mut().enumerate() {
        *pj = dot(q, keys.row(j)) * scale + mask.map_or(0.0, |m| m[j]);
    }
    let max = p.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for pj in p.iter_mut() {
        *pj = (*pj - max).exp();
        sum += *pj;
    }
    for (j, pj) in p.iter().enumerate() {
        axpy(o, pj / sum, values.row(j));
    }
}

/// A dot product the compiler vectorises (eight independent partial sums).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ac.zip(bc) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// o += w v
fn axpy(o: &mut [f32], w: f32, v: &[f32]) {
    for (o, v) in o.iter_mut().zip(v) {
        *o += w * v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    fn seq(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 500.0 - 1.0)
            .collect()
    }

    #[test]
    fn x_wt_equals_the_plain_product_for_every_tile_shape() {
        if !available() {
            eprintln!("no AVX2/FMA: the kernel is not used on this CPU");
            return;
        }
        // Rows 1-16 (every tile remainder), odd weight rows, k with and without a tail.
        for &(n, k) in &[(5usize, 13usize), (130, 64), (257, 24), (3, 7), (4, 0)] {
            for m in 1..=16 {
                let (x, w) = (seq(m * k, 7), seq(n * k, 11));
                let y = x_wt(&x, &w, m, n, k);
                for r in 0..m {
                    for o in 0..n {
                        let want: f32 = (0..k).map(|c| x[r * k + c] * w[o * k + c]).sum();
                        let got = y[r * n + o];
                        assert!(
                            (got - want).abs() < 1e-4,
                            "m {m} n {n} k {k} ({r}, {o}): {got} vs {want}"
                        );
                    }
                }
                if wide_available() {
                    let narrow = x_wt_with(&x, &w, m, n, k, false);
                    let wide = x_wt_with(&x, &w, m, n, k, true);
                    let same = narrow
                        .iter()
                        .zip(&wide)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "m {m} n {n} k {k}: the AVX-512 path rounds differently"
                    );
                }
            }
        }
    }

    /// The softmax, log-sum-exp, mean and gradient of the training path against f64, over
    /// every row length up to 40 (whole 8-lane blocks, tails, rows shorter than a block) and
    /// a vocabulary's, with masked positions, large and small spreads.
    #[test]
    fn training_softmax_and_logprob_kernels_match_f64() {
        let lengths = (1..=40).chain([1024, 49152 / 4 + 3]);
        for (case, n) in lengths.enumerate() {
            for spread in [0.0f32, 3.0, 60.0] {
                let z: Vec<f32> = seq(n, case as u32).iter().map(|v| v * spread).collect();
                // Every third position masked, never the first.
                let mask: Vec<f32> = (0..n)
                    .map(|j| if j % 3 == 2 { -1e9 } else { 0.0 })
                    .collect();
                for (m, scale) in [(None, 0.25f32), (Some(&mask[..]), 1.5)] {
                    let mut row = z.clone();
                    softmax_scaled(&mut row, m, scale);
                    let x: Vec<f64> = (0..n)
                        .map(|j| z[j] as f64 * scale as f64 + m.map_or(0.0, |m| m[j] as f64))
                        .collect();
                    let max = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let sum: f64 = x.iter().map(|v| (v - max).exp()).sum();
                    for j in 0..n {
                        let want = (x[j] - max).exp() / sum;
                        // x rounded to f32 moves its exponential by up to |x| · 2^-24.
                        let ulps = 1e-6 + (x[j].abs() + max.abs()) * 2f64.powi(-23);
                        assert!(
                            (row[j] as f64 - want).abs() <= ulps * want.max(1e-3),
                            "n {n}, spread {spread}, position {j}: {} against {want}",
                            row[j]
                        );
                        if m.is_some() && j % 3 == 2 {
                            assert_eq!(row[j], 0.0, "a masked position weighs nothing");
                        }
                    }
                }
                let (lse, mean) = lse_and_mean(&z);
                let max = z.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
                let e: Vec<f64> = z.iter().map(|&v| (v as f64 - max).exp()).collect();
                let sum: f64 = e.iter().sum();
                let want_lse = max + sum.ln();
                let want_mean = e.iter().zip(&z).map(|(e, &v)| e * v as f64).sum::<f64>() / sum;
                assert!((lse as f64 - want_lse).abs() < 1e-5 * want_lse.abs().max(1.0));
                assert!((mean as f64 - want_mean).abs() < 1e-5 * spread.max(1.0) as f64);
                let (g_lp, g_h) = (0.7f32, -1.3f32);
                let mut out = vec![f32::NAN; n];
                logprob_entropy_grad(&mut out, &z, lse, mean, g_lp, g_h);
                // Given the row's lse and mean, each element to a few ulp of its terms, and
                // of its exponent (z − lse, rounded to f32, scales e^(z − lse) by up to
                // |z − lse| · 2^-24).
                let (lse, mean) = (lse as f64, mean as f64);
                for j in 0..n {
                    let (p, d) = ((z[j] as f64 - lse).exp(), z[j] as f64 - mean);
                    let want = -(g_lp as f64) * p - g_h as f64 * p * d;
                    let terms = p * (g_lp.abs() as f64 + g_h.abs() as f64 * d.abs());
                    let ulps = 1e-6 + (z[j] as f64 - lse).abs() * 2f64.powi(-23);
                    assert!(
                        (out[j] as f64 - want).abs() <= ulps * terms + 1e-30,
                        "n {n}, spread {spread}, position {j}: {} against {want}",
                        out[j]
                    );
                }
            }
        }
    }

    #[test]
    fn sigmoids_match_f64_and_keep_nan() {
        // Every tail length, both signs, from tiny to saturated, and the special values.
        let mut xs: Vec<f32> = (-400..=400).map(|i| i as f32 * 0.37).collect();
        xs.extend([0.0, -0.0, 1e-30, -1e-30, 87.5, -87.5, 200.0, -200.0]);
        xs.extend([f32::INFINITY, f32::NEG_INFINITY, f32::MAX, f32::MIN]);
        for n in [xs.len(), 7, 8, 9, 15] {
            let mut out = vec![0f32; n];
            sigmoids(&xs[..n], &mut out);
            for (&x, &s) in xs.iter().zip(&out) {
                let want = 1.0 / (1.0 + (-f64::from(x)).exp());
                let err = (f64::from(s) - want).abs();
                // About 1 ulp of e^-|x| and two roundings; under e^-87 the AVX2 exponential
                // flushes to about 1e-38, which is still within the absolute bound.
                assert!(err <= 4e-7 * want + 1e-37, "σ({x}) = {s}, want {want}");
            }
        }
        let mut out = vec![0f32; 9];
        let mut with_nan = vec![1.0f32; 9];
        with_nan[3] = f32::NAN;
        with_nan[8] = f32::NAN;
        sigmoids(&with_nan, &mut out);
        assert!(out[3].is_nan() && out[8].is_nan(), "{out:?}");
        assert!(out.iter().filter(|s| s.is_nan()).count() == 2, "{out:?}");
    }

    #[test]
    fn logsumexp_matches_f64_to_float_precision() {
        for (n, spread) in [(49152usize, 30.0f32), (1000, 5.0), (13, 100.0), (3, 0.0)] {
            let xs: Vec<f32> = seq(n, 5).iter().map(|v| v * spread).collect();
            let m = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            let want = m + xs.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln();
            let got = logsumexp(&xs) as f64;
            assert!(
                (got - want).abs() <= 2e-6 * want.abs().max(1.0),
                "n {n}: {got} vs {want}"
            );
        }
        assert_eq!(logsumexp(&[f32::NEG_INFINITY; 4]), f32::NEG_INFINITY);
    }

    /// The portable row (the path on CPUs without AVX2) and the AVX2 one agree.
    #[test]
    fn portable_and_avx2_attention_rows_agree() {
        if !available() {
            return;
        }
        let (s, hd) = (11, 20);
        let q = seq(hd, 1);
        let kv: Vec<f32> = (0..s).flat_map(|j| seq(hd, 10 + j as u32)).collect();
        let vv: Vec<f32> = (0..s).flat_map(|j| seq(hd, 40 + j as u32)).collect();
        let mask: Vec<f32> = (0..s).map(|j| if j < 2 { -1e9 } else { 0.0 }).collect();
        let run = |simd: bool| {
            let (mut p, mut o) = (vec![0f32; s], vec![0f32; hd]);
            let keys = Positions::new(&kv, hd, hd, 0);
            let values = Positions::new(&vv, hd, hd, 0);
            if simd {
                // SAFETY: available() checked AVX2 and FMA.
                unsafe { avx2::attend(&q, keys, values, Some(&mask), 0.4, &mut p, &mut o) };
            } else {
                attend(&q, keys, values, Some(&mask), 0.4, &mut p, &mut o);
            }
            o
        };
        let (a, b) = (run(false), run(true));
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() < 1e-5, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn skipping_the_left_padding_changes_only_the_padding_weights() {
        let dev = Device::Cpu;
        // Rows padded by 0 to s positions (every remainder of 8; the last row is masked
        // throughout), head dimensions with and without a tail.
        for (hd, s) in [(16, 29), (12, 20), (64, 9)] {
            let (b, nh, nkv, t, cap) = (s + 1, 4, 2, 1, s + 3);
            let q = Tensor::from_vec(seq(b * nh * t * hd, 5), (b, nh, t, hd), &dev).unwrap();
            let k = Tensor::from_vec(seq(b * nkv * cap * hd, 6), (b, nkv, cap, hd), &dev);
            let k = k.unwrap().narrow(2, 0, s).unwrap();
            let values = seq(b * nkv * cap * hd, 7);
            // Padding values zeroed, or not.
            let zeroed: Vec<f32> = (values.iter().enumerate())
                .map(|(i, &x)| {
                    let (row, j) = (i / (nkv * cap * hd), i / hd % cap);
                    if j < row.min(s - 1) {
                        0.0
                    } else {
                        x
                    }
                })
                .collect();
            let mask: Vec<f32> = (0..b * s)
                .map(|i| if i % s < i / s { -1e9 } else { 0.0 })
                .collect();
            let mask = Tensor::from_vec(mask, (b, 1, t, s), &dev).unwrap();
            let run = |values: &[f32], skip: bool| {
                let v = Tensor::from_vec(values.to_vec(), (b, nkv, cap, hd), &dev).unwrap();
                let v = v.narrow(2, 0, s).unwrap();
                let y = decode_attention_on(&q, &k, &v, Some(&mask), 0.25, skip);
                y.unwrap()
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap()
            };
            // The kernels give padding a weight of e^-87 / sum, not 0: with zero values
            // there, skipping it from a multiple of 8 changes no bit (the same lanes, sums
            // and products).
            let bits = |x: Vec<f32>| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            let (skipped, whole) = (bits(run(&zeroed, true)), bits(run(&zeroed, false)));
            let differ = skipped.iter().zip(&whole).position(|(a, b)| a != b);
            assert_eq!(
                differ, None,
                "hd {hd}, s {s}: the first element that differs"
            );
            // Otherwise the results differ by those weights at most.
            let (skipped, whole) = (run(&values, true), run(&values, false));
            let worst = (skipped.iter().zip(&whole)).fold(0f32, |w, (a, b)| w.max((a - b).abs()));
            assert!(worst < 1e-6, "hd {hd}, s {s}: differs by {worst}");
        }
    }

    #[test]
    fn decode_attention_equals_softmax_attention_on_cache_views() {
        let dev = Device::Cpu;
        let (b, nh, nkv, t, s, cap, hd) = (2, 6, 2, 2, 9, 16, 12);
        let q = Tensor::from_vec(seq(b * nh * t * hd, 1), (b, nh, t, hd), &dev).unwrap();
        // Keys and values as the cache holds them: the first s of cap positions.
        let kb = Tensor::from_vec(seq(b * nkv * cap * hd, 2), (b, nkv, cap, hd), &dev).unwrap();
        let vb = Tensor::from_vec(seq(b * nkv * cap * hd, 3), (b, nkv, cap, hd), &dev).unwrap();
        let (k, v) = (kb.narrow(2, 0, s).unwrap(), vb.narrow(2, 0, s).unwrap());
        // Row 1 has two padding positions.
        let mask: Vec<f32> = (0..b * t * s)
            .map(|i| {
                if i / (t * s) == 1 && i % s < 2 {
                    -1e9
                } else {
                    0.0
                }
            })
            .collect();
        let mask = Tensor::from_vec(mask, (b, 1, t, s), &dev).unwrap();
        let scale = 0.3f32;
        let got = decode_attention(&q, &k, &v, Some(&mask), scale)
            .unwrap()
            .expect("f32 on the CPU");
        let rep = |x: &Tensor| {
            Tensor::cat(&vec![x.unsqueeze(2).unwrap(); nh / nkv], 2)
                .unwrap()
                .reshape((b, nh, s, hd))
                .unwrap()
        };
        let att = (q.matmul(&rep(&k).t().unwrap()).unwrap() * scale as f64)
            .unwrap()
            .broadcast_add(&mask)
            .unwrap();
        let p = candle_nn::ops::softmax_last_dim(&att).unwrap();
        let want = p.matmul(&rep(&v)).unwrap();
        let d = (got - want)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(d < 1e-5, "differs by {d}");
    }
}
