//! The training path's attention on the CPU, row by row over each row's live keys.
//!
//! A decoder's mask is causal and pads on the left, so about half of every (t, s) matrix of
//! attention weights is masked. The batched products computed all of it: the scores, the
//! weights' product with the values, and in backward three more products of that size, each
//! into an output candle had zeroed first, with head dimensions (16 for the quickstart's
//! model, 64 for SmolLM2's) too small for gemm's packing to pay. Here each query row is
//! computed against the keys its mask leaves live and no others:
//!
//! - forward: the scores against the keys stored transposed (8 columns to a register, 4
//!   query rows to each load), the weights by
//!   [`rows::softmax_scaled`](super::rows::softmax_scaled) (the training rounding), then the
//!   output as a sum of value rows;
//! - backward, from the kept weights: dp = g · vⱼ the same way, ds = scale · p (dp − Σ p dp),
//!   then dq as a sum of key rows, and each key's and value's gradient row updated once for
//!   4 query rows.
//!
//! The weights kept for backward ([`Weights`]) are each block of 4 query rows' weights over
//! the union of their live columns, and nothing else: under a causal mask about half of the
//! (t, s) matrix, written once (no zeroed buffer first).
//!
//! The head dimension is compiled in for 16, 32, 64 and 128 (its rows then live in
//! registers); other sizes take the same code with the size known at run time.
//!
//! A column is dead when its mask value is more than 1e8 below the row's largest: its weight
//! is then e^(−1e8 + score differences), exactly 0 in f32 for any scores under 5e7 in
//! magnitude (the product of a query and a key, times the scale). A row whose columns are all
//! masked alike (a padding row) keeps every column, as a softmax over it would.
//!
//! Each group of query heads that shares a key head is one rayon task, its rows computed in a
//! fixed order, so the results do not depend on the number of threads. Portable Rust; on
//! x86-64 with AVX2 the same code is compiled for it too and chosen at run time (the same
//! operations in the same order: no fused multiply-adds, so both give the same bits).

use rayon::prelude::*;

/// Shapes: q (b, g, rt, d) with rt = n_rep · t query rows per group (row r is position
/// r mod t), k and v (b, g, s, d), the mask (b, 1, t, s).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Dims {
    pub b: usize,
    pub g: usize,
    pub rt: usize,
    pub t: usize,
    pub s: usize,
    pub d: usize,
}

impl Dims {
    fn check(&self, q: usize, kv: usize, mask: Option<usize>) -> Result<(), String> {
        let Dims { b, g, rt, t, s, d } = *self;
        if t == 0 || rt % t != 0 {
            return Err(format!(
                "{rt} query rows are not whole groups of {t} positions"
            ));
        }
        if q != b * g * rt * d || kv != b * g * s * d {
            return Err(format!(
                "q holds {q} and k, v {kv} values, not ({b}, {g}, {rt}, {d}) and ({b}, {g}, {s}, {d})"
            ));
        }
        if let Some(m) = mask {
            if m != b * t * s {
                return Err(format!("the mask holds {m} values, not ({b}, 1, {t}, {s})"));
            }
        }
        Ok(())
    }
}

/// What one group of query heads sharing a key head reads, or (from [`forward`] and
/// [`backward`]) the whole batch's, which [`Group::part`] slices.
#[derive(Clone, Copy)]
struct Group<'a> {
    /// (rt, d) for one group.
    q: &'a [f32],
    /// (s, d) for one group.
    k: &'a [f32],
    v: &'a [f32],
    /// (t, s) for one group's sequence.
    mask: Option<&'a [f32]>,
    /// t for one group's sequence: each mask row's live columns.
    spans: &'a [(usize, usize)],
    dims: Dims,
    scale: f32,
    /// Whether forward keeps the weights for a backward (not when inferring).
    keep: bool,
}

impl<'a> Group<'a> {
    /// Group `bg` (batch bg / g, key head bg mod g) of the whole batch's inputs.
    fn part(&self, bg: usize) -> Group<'a> {
        let Dims { g, rt, t, s, d, .. } = self.dims;
        let bi = bg / g;
        Group {
            q: &self.q[bg * rt * d..][..rt * d],
            k: &self.k[bg * s * d..][..s * d],
            v: &self.v[bg * s * d..][..s * d],
            mask: self.mask.map(|m| &m[bi * t * s..][..t * s]),
            spans: &self.spans[bi * t..][..t],
            ..*self
        }
    }
}

/// The attention weights that [`forward`] keeps for [`backward`]: for each group of query
/// heads, in order, each block of query rows' weights over the union [lo, hi) of the rows'
/// live columns, (rows, hi − lo) row-major, 0 outside a row's own live columns. Blocks are
/// BLOCK rows, then single rows for what is left over, as the kernels walk them.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Weights {
    groups: Vec<Vec<f32>>,
    /// The live columns of each mask row, as forward found them.
    spans: Vec<(usize, usize)>,
    dims: Dims,
}

impl Weights {
    /// The values held, over all groups.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.groups.iter().map(Vec::len).sum()
    }

    /// The whole (b, g, rt, s) matrix, 0 on every column not kept.
    #[cfg(test)]
    fn dense(&self) -> Vec<f32> {
        let Dims { g, rt, t, s, .. } = self.dims;
        let mut out = vec![0f32; self.groups.len() * rt * s];
        for (bg, kept) in self.groups.iter().enumerate() {
            let spans = &self.spans[bg / g * t..][..t];
            let mut at = 0;
            for (r0, rows) in blocks(rt) {
                let (lo, hi) = union(spans, r0, rows, t);
                for i in 0..rows {
                    let row = &kept[at + i * (hi - lo)..][..hi - lo];
                    out[(bg * rt + r0 + i) * s + lo..][..hi - lo].copy_from_slice(row);
                }
                at += rows * (hi - lo);
            }
        }
        out
    }
}

/// The blocks of query rows the kernels walk, (first row, rows): BLOCK rows at a time, then
/// one at a time.
fn blocks(rt: usize) -> impl Iterator<Item = (usize, usize)> {
    let whole = rt / BLOCK * BLOCK;
    (0..whole)
        .step_by(BLOCK)
        .map(|r0| (r0, BLOCK))
        .chain((whole..rt).map(|r0| (r0, 1)))
}

/// The values one group's kept weights hold for a sequence's `spans`.
fn kept_len(spans: &[(usize, usize)], rt: usize, t: usize) -> usize {
    blocks(rt)
        .map(|(r0, rows)| {
            let (lo, hi) = union(spans, r0, rows, t);
            rows * (hi - lo)
        })
        .sum()
}

/// The live columns [lo, hi) of each mask row, (b · t) of them; every column outside is dead
/// (see the module's notes).
fn spans(mask: Option<&[f32]>, dims: Dims) -> Vec<(usize, usize)> {
    let Dims { b, t, s, .. } = dims;
    let Some(mask) = mask else {
        return vec![(0, s); b * t];
    };
    mask.chunks_exact(s).map(live_columns).collect()
}

/// The live columns [lo, hi) of one additive mask row, every column outside dead (see the
/// module's notes); the whole row when every column is masked alike.
pub(super) fn live_columns(row: &[f32]) -> (usize, usize) {
    let top = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let live = |m: &f32| *m >= top - 1e8;
    match row.iter().position(live) {
        Some(lo) => (lo, row.len() - row.iter().rev().position(live).unwrap_or(0)),
        None => (0, row.len()),
    }
}

/// `xs` (rows, d) transposed into (d, rows).
#[inline(always)]
fn transposed(xs: &[f32], d: usize) -> Vec<f32> {
    let rows = xs.len() / d;
    let mut out = vec![0f32; xs.len()];
    for (j, x) in xs.chunks_exact(d).enumerate() {
        for (c, v) in x.iter().enumerate() {
            out[c * rows + j] = *v;
        }
    }
    out
}

/// acc[j] += a · x[j], over acc's length; with `D` > 0 that length is D, known when compiled
/// (the head dimension: a few vector registers, unrolled).
#[inline(always)]
fn axpy<const D: usize>(acc: &mut [f32], a: f32, x: &[f32]) {
    if D > 0 {
        let (acc, x) = (&mut acc[..D], &x[..D]);
        for i in 0..D {
            acc[i] += a * x[i];
        }
    } else {
        for (y, x) in acc.iter_mut().zip(x) {
            *y += a * x;
        }
    }
}

/// For each of R rows x_i (of d): out[i · len + j] = Σ_c x_i[c] · xt[c · stride + j], j < len:
/// rows against the columns of a transposed matrix, LANES columns at a time (an AVX2
/// register) per row across all of x, each column load shared by the R rows. Each output is
/// summed over c in order, whatever R.
#[inline(always)]
fn rows_times<const D: usize, const R: usize>(
    out: &mut [f32],
    len: usize,
    x: &[f32],
    d: usize,
    xt: &[f32],
    stride: usize,
) {
    let d = if D > 0 { D } else { d };
    let x = &x[..R * d];
    let mut j0 = 0;
    while j0 + LANES <= len {
        let mut acc = [[0f32; LANES]; R];
        for c in 0..d {
            let col = &xt[c * stride + j0..][..LANES];
            for (r, acc) in acc.iter_mut().enumerate() {
                let xc = x[r * d + c];
                for i in 0..LANES {
                    acc[i] += xc * col[i];
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            out[r * len + j0..][..LANES].copy_from_slice(acc);
        }
        j0 += LANES;
    }
    for j in j0..len {
        for r in 0..R {
            let mut acc = 0f32;
            for c in 0..d {
                acc += x[r * d + c] * xt[c * stride + j];
            }
            out[r * len + j] = acc;
        }
    }
}

/// row += Σ_i w[i] · xs_i over R rows xs_i of d, added in order of i: one load and store of
/// `row` for R rows' updates.
#[inline(always)]
fn add_rows<const D: usize, const R: usize>(row: &mut [f32], w: &[f32; R], xs: &[f32]) {
    if D > 0 {
        let mut acc = [0f32; D];
        acc.copy_from_slice(&row[..D]);
        for (i, &wi) in w.iter().enumerate() {
            axpy::<D>(&mut acc, wi, &xs[i * D..]);
        }
        row[..D].copy_from_slice(&acc);
    } else {
        let d = row.len();
        for (i, &wi) in w.iter().enumerate() {
            axpy::<0>(row, wi, &xs[i * d..][..d]);
        }
    }
}

/// The union [lo, hi) of `rows` consecutive query rows' live spans, from row r0.
#[inline(always)]
fn union(spans: &[(usize, usize)], r0: usize, rows: usize, t: usize) -> (usize, usize) {
    (0..rows).fold((usize::MAX, 0), |(lo, hi), i| {
        let (l, h) = spans[(r0 + i) % t];
        (lo.min(l), hi.max(h))
    })
}

/// Runs `$block` for each whole block of BLOCK rows from `$r0`, then `$single` for each row
/// left over: the walk of [`blocks`], which the kept weights' layout follows.
macro_rules! in_blocks {
    ($rows:expr, $r0:ident => $block:expr, $single:expr) => {{
        for ($r0, rows) in blocks($rows) {
            if rows == BLOCK {
                $block;
            } else {
                $single;
            }
        }
    }};
}

/// Query rows computed together: their key (and value) loads are shared.
const BLOCK: usize = 4;

/// Score columns computed together, in one register per query row.
const LANES: usize = 8;

/// Σ_j w[j] · rows[j] (rows of d) into out (d): the accumulator stays in registers when D > 0.
#[inline(always)]
fn weighted_rows<const D: usize>(out: &mut [f32], w: &[f32], rows: &[f32]) {
    if D > 0 {
        let mut acc = [0f32; D];
        for (j, &wj) in w.iter().enumerate() {
            axpy::<D>(&mut acc, wj, &rows[j * D..]);
        }
        for (o, a) in out[..D].iter_mut().zip(acc) {
            *o += a;
        }
    } else {
        let d = out.len();
        for (j, &wj) in w.iter().enumerate() {
            axpy::<0>(out, wj, &rows[j * d..][..d]);
        }
    }
}

/// Σ x[j] y[j] in 8 interleaved sums (vectorisable), added in a fixed order.
#[inline(always)]
fn dot(x: &[f32], y: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (xc, yc) = (x.chunks_exact(8), y.chunks_exact(8));
    let (xr, yr) = (xc.remainder(), yc.remainder());
    for (a, b) in xc.zip(yc) {
        for i in 0..8 {
            acc[i] += a[i] * b[i];
        }
    }
    let mut sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (a, b) in xr.iter().zip(yr) {
        sum += a * b;
    }
    sum
}

/// One group's forward: y (rt, d), zeroed by the caller, and the kept weights appended to
/// `p` (see [`Weights`]). `D` is the head dimension when compiled for it, else 0.
#[inline(always)]
fn group_forward<const D: usize>(group: Group, y: &mut [f32], p: &mut Vec<f32>) {
    let Group {
        q,
        k,
        v,
        mask,
        spans,
        dims,
        scale,
        keep,
    } = group;
    let Dims { rt, d, s, .. } = dims;
    let kt = transposed(k, d);
    let mut scores = vec![0f32; BLOCK * s];
    // A macro, not a closure: a closure would be compiled apart, without the caller's
    // instruction set.
    macro_rules! rows {
        ($r0:expr, $r:expr) => {{
            const R: usize = $r;
            let r0 = $r0;
            let (lo, hi) = union(spans, r0, R, dims.t);
            let len = hi - lo;
            rows_times::<D, R>(&mut scores, len, &q[r0 * d..], d, &kt[lo..], s);
            for i in 0..R {
                let r = r0 + i;
                let tr = r % dims.t;
                let (l, h) = spans[tr];
                let row = &mut scores[i * len..(i + 1) * len];
                let live = &mut row[l - lo..h - lo];
                let mr = mask.map(|m| &m[tr * s + l..tr * s + h]);
                super::rows::softmax_scaled(live, mr, scale);
                weighted_rows::<D>(&mut y[r * d..][..d], live, &v[l * d..h * d]);
                row[..l - lo].fill(0.0);
                row[h - lo..].fill(0.0);
            }
            if keep {
                p.extend_from_slice(&scores[..R * len]);
            }
        }};
    }
    in_blocks!(rt, r0 => rows!(r0, BLOCK), rows!(r0, 1));
}

/// One group's backward from its kept weights p (see [`Weights`]) and the output's gradient
/// g (rt, d): adds into dq (rt, d), dk and dv (s, d), zeroed by the caller; an empty one is
/// not wanted.
#[inline(always)]
fn group_backward<const D: usize>(
    group: Group,
    p: &[f32],
    g: &[f32],
    dq: &mut [f32],
    dk: &mut [f32],
    dv: &mut [f32],
) {
    let Group {
        q,
        k,
        v,
        spans,
        dims,
        scale,
        ..
    } = group;
    let Dims { rt, t, s, d, .. } = dims;
    debug_assert_eq!(p.len(), kept_len(spans, rt, t));
    let scores_wanted = !dq.is_empty() || !dk.is_empty();
    let vt = if scores_wanted {
        transposed(v, d)
    } else {
        Vec::new()
    };
    let mut ds = vec![0f32; BLOCK * s];
    // Where the current block's weights start in p.
    let mut at = 0;
    // Rows r0.. (R of them) over the union [lo, hi) of their spans; outside its own span a
    // row's weights are 0 (kept so by forward) and so is its ds (set so here).
    macro_rules! rows {
        ($r0:expr, $r:expr) => {{
            const R: usize = $r;
            let r0 = $r0;
            let (lo, hi) = union(spans, r0, R, t);
            let len = hi - lo;
            let p = &p[at..at + R * len];
            at += R * len;
            if !dv.is_empty() {
                for j in 0..len {
                    let w: [f32; R] = std::array::from_fn(|i| p[i * len + j]);
                    add_rows::<D, R>(&mut dv[(lo + j) * d..][..d], &w, &g[r0 * d..]);
                }
            }
            if scores_wanted {
                rows_times::<D, R>(&mut ds, len, &g[r0 * d..], d, &vt[lo..], s);
                for i in 0..R {
                    let r = r0 + i;
                    let (l, h) = spans[r % t];
                    let row = &mut ds[i * len..(i + 1) * len];
                    let pr = &p[i * len + l - lo..i * len + h - lo];
                    let live = &mut row[l - lo..h - lo];
                    let sum = dot(pr, live);
                    for (x, &pj) in live.iter_mut().zip(pr) {
                        *x = scale * pj * (*x - sum);
                    }
                    row[..l - lo].fill(0.0);
                    row[h - lo..].fill(0.0);
                    if !dq.is_empty() {
                        let live = &row[l - lo..h - lo];
                        weighted_rows::<D>(&mut dq[r * d..][..d], live, &k[l * d..h * d]);
                    }
                }
                if !dk.is_empty() {
                    for j in 0..len {
                        let w: [f32; R] = std::array::from_fn(|i| ds[i * len + j]);
                        add_rows::<D, R>(&mut dk[(lo + j) * d..][..d], &w, &q[r0 * d..]);
                    }
                }
            }
        }};
    }
    in_blocks!(rt, r0 => rows!(r0, BLOCK), rows!(r0, 1));
}

/// Calls `$m::$f::<D>` with D the head dimension $d when it is one compiled for, else 0.
macro_rules! by_head_dim {
    ($d:expr, $m:ident :: $f:ident, ( $($arg:expr),* )) => {
        match $d {
            16 => $m::$f::<16>($($arg),*),
            32 => $m::$f::<32>($($arg),*),
            64 => $m::$f::<64>($($arg),*),
            128 => $m::$f::<128>($($arg),*),
            _ => $m::$f::<0>($($arg),*),
        }
    };
}

/// The kernels compiled for one instruction set.
macro_rules! compiled_for {
    ($name:ident, $(#[$feature:meta])* $($unsafe:ident)?) => {
        mod $name {
            use super::*;

            $(#[$feature])*
            pub(super) $($unsafe)? fn group_forward<const D: usize>(
                group: Group,
                y: &mut [f32],
                p: &mut Vec<f32>,
            ) {
                super::group_forward::<D>(group, y, p)
            }

            $(#[$feature])*
            pub(super) $($unsafe)? fn group_backward<const D: usize>(
                group: Group,
                p: &[f32],
                g: &[f32],
                dq: &mut [f32],
                dk: &mut [f32],
                dv: &mut [f32],
            ) {
                super::group_backward::<D>(group, p, g, dq, dk, dv)
            }
        }
    };
}

compiled_for!(portable,);
#[cfg(target_arch = "x86_64")]
compiled_for!(avx2, #[target_feature(enable = "avx2")] unsafe);

/// Which compiled kernels run: the widest this CPU has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
}

impl Path {
    /// Every path this CPU can run, the widest last.
    fn available() -> Vec<Path> {
        #[allow(unused_mut)]
        let mut paths = vec![Path::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") {
                paths.push(Path::Avx2);
            }
        }
        paths
    }

    fn best() -> Path {
        *Path::available().last().unwrap_or(&Path::Portable)
    }

    fn group_forward(self, group: Group, y: &mut [f32], p: &mut Vec<f32>) {
        let d = group.dims.d;
        match self {
            Path::Portable => by_head_dim!(d, portable::group_forward, (group, y, p)),
            // SAFETY: `available` found the instruction set.
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 => unsafe { by_head_dim!(d, avx2::group_forward, (group, y, p)) },
        }
    }

    fn group_backward(
        self,
        group: Group,
        p: &[f32],
        g: &[f32],
        dq: &mut [f32],
        dk: &mut [f32],
        dv: &mut [f32],
    ) {
        let d = group.dims.d;
        match self {
            Path::Portable => {
                by_head_dim!(d, portable::group_backward, (group, p, g, dq, dk, dv))
            }
            // SAFETY: `available` found the instruction set.
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 => unsafe {
                by_head_dim!(d, avx2::group_backward, (group, p, g, dq, dk, dv))
            },
        }
    }
}

/// softmax(q kᵀ · scale + mask) v: the output (b, g, rt, d) and the weights over the live
/// columns that [`backward`] takes.
pub(crate) fn forward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    mask: Option<&[f32]>,
    dims: Dims,
    scale: f32,
) -> Result<(Vec<f32>, Weights), String> {
    forward_on(Path::best(), q, k, v, mask, dims, scale, true)
}

/// [`forward`]'s output alone, keeping no weights: prefill and scoring, which need no
/// backward, round as the training forward does.
pub(crate) fn infer(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    mask: Option<&[f32]>,
    dims: Dims,
    scale: f32,
) -> Result<Vec<f32>, String> {
    forward_on(Path::best(), q, k, v, mask, dims, scale, false).map(|(y, _)| y)
}

#[allow(clippy::too_many_arguments)]
fn forward_on(
    path: Path,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    mask: Option<&[f32]>,
    dims: Dims,
    scale: f32,
    keep: bool,
) -> Result<(Vec<f32>, Weights), String> {
    dims.check(q.len(), k.len(), mask.map(<[f32]>::len))?;
    if v.len() != k.len() {
        return Err(format!("v holds {} values, k {}", v.len(), k.len()));
    }
    let Dims { b, g, rt, t, s, d } = dims;
    let spans = spans(mask, dims);
    let all = Group {
        q,
        k,
        v,
        mask,
        spans: &spans,
        dims,
        scale,
        keep,
    };
    let mut y = vec![0f32; b * g * rt * d];
    let kept = |bg: usize| match keep {
        true => kept_len(&spans[bg / g * t..][..t], rt, t),
        false => 0,
    };
    let mut groups: Vec<Vec<f32>> = (0..b * g).map(|bg| Vec::with_capacity(kept(bg))).collect();
    if !y.is_empty() && s > 0 {
        y.par_chunks_mut(rt * d)
            .zip(groups.par_iter_mut())
            .enumerate()
            .for_each(|(bg, (y, p))| path.group_forward(all.part(bg), y, p));
    }
    Ok((
        y,
        Weights {
            groups,
            spans,
            dims,
        },
    ))
}

/// The gradients of [`forward`]'s output (its gradient `grad`) with respect to q, k and v,
/// from the weights `p` it kept; `None` for what `wanted` leaves out.
pub(crate) fn backward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    p: &Weights,
    grad: &[f32],
    scale: f32,
    wanted: [bool; 3],
) -> Result<[Option<Vec<f32>>; 3], String> {
    backward_on(Path::best(), q, k, v, p, grad, scale, wanted)
}

#[allow(clippy::too_many_arguments, clippy::type_complexity)]
fn backward_on(
    path: Path,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    p: &Weights,
    grad: &[f32],
    scale: f32,
    wanted: [bool; 3],
) -> Result<[Option<Vec<f32>>; 3], String> {
    let dims = p.dims;
    dims.check(q.len(), k.len(), None)?;
    let Dims { b, g, rt, t, s, d } = dims;
    if v.len() != k.len() || grad.len() != q.len() {
        return Err(format!(
            "v ({}) or the gradient ({}) do not match {dims:?}",
            v.len(),
            grad.len(),
        ));
    }
    let spans = &p.spans;
    // (Without a row, a column or a head dimension there is nothing to compute, and forward
    // kept nothing.)
    let computes = b * g * rt * d > 0 && s > 0;
    if computes
        && (spans.len() != b * t
            || p.groups.len() != b * g
            || (p.groups.iter().enumerate())
                .any(|(bg, x)| x.len() != kept_len(&spans[bg / g * t..][..t], rt, t)))
    {
        return Err(format!("the kept weights do not match {dims:?}"));
    }
    let all = Group {
        q,
        k,
        v,
        mask: None,
        spans,
        dims,
        scale,
        keep: false,
    };
    let size = |want: bool, n: usize| if want { n } else { 0 };
    let (nq, nk, nv) = (
        size(wanted[0], rt * d),
        size(wanted[1], s * d),
        size(wanted[2], s * d),
    );
    let mut dq = vec![0f32; b * g * nq];
    let mut dk = vec![0f32; b * g * nk];
    let mut dv = vec![0f32; b * g * nv];
    if computes {
        // A group's part of each buffer; empty ones for what is not wanted.
        fn split(x: &mut [f32], n: usize, groups: usize) -> Vec<&mut [f32]> {
            match n {
                0 => (0..groups).map(|_| <&mut [f32]>::default()).collect(),
                n => x.chunks_mut(n).collect(),
            }
        }
        let (dqs, dks, dvs) = (
            split(&mut dq, nq, b * g),
            split(&mut dk, nk, b * g),
            split(&mut dv, nv, b * g),
        );
        dqs.into_par_iter()
            .zip(dks)
            .zip(dvs)
            .enumerate()
            .for_each(|(bg, ((dq, dk), dv))| {
                let g = &grad[bg * rt * d..][..rt * d];
                path.group_backward(all.part(bg), &p.groups[bg], g, dq, dk, dv)
            });
    }
    let keep = |want: bool, x: Vec<f32>| want.then_some(x);
    Ok([
        keep(wanted[0], dq),
        keep(wanted[1], dk),
        keep(wanted[2], dv),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn random(n: usize, rng: &mut rand_chacha::ChaCha8Rng) -> Vec<f32> {
        (0..n).map(|_| rng.random_range(-2.0..2.0)).collect()
    }

    /// A decoder's mask: causal after `offset` cached positions, each sequence padded on the
    /// left by its `pads` (its first rows then masked whole).
    fn mask(pads: &[usize], t: usize, offset: usize) -> Vec<f32> {
        let s = offset + t;
        let mut m = Vec::new();
        for &pad in pads {
            for i in 0..t {
                m.extend((0..s).map(|j| if j > offset + i || j < pad { -1e9 } else { 0.0 }));
            }
        }
        m
    }

    /// The output and q's, k's and v's gradients (for the output's gradient `w`), in f64,
    /// over every column.
    fn reference(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        w: &[f32],
        mask: Option<&[f32]>,
        dims: Dims,
        scale: f64,
    ) -> [Vec<f64>; 4] {
        let Dims { b, g, rt, t, s, d } = dims;
        let mut out = [
            vec![0f64; q.len()],
            vec![0f64; q.len()],
            vec![0f64; k.len()],
            vec![0f64; v.len()],
        ];
        for bg in 0..b * g {
            let (bi, qo, ko) = (bg / g, bg * rt * d, bg * s * d);
            for r in 0..rt {
                let mr = |j: usize| mask.map_or(0.0, |m| m[(bi * t + r % t) * s + j]);
                let dotf = |x: &[f32], y: &[f32]| -> f64 {
                    x.iter().zip(y).map(|(a, b)| *a as f64 * *b as f64).sum()
                };
                let qr = &q[qo + r * d..][..d];
                let z: Vec<f64> = (0..s)
                    // The mask added in f32, as a decoder does: a padding row's scores
                    // all round to the same multiple of 64 near −1e9.
                    .map(|j| ((dotf(qr, &k[ko + j * d..][..d]) * scale) as f32 + mr(j)) as f64)
                    .collect();
                let max = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = z.iter().map(|x| (x - max).exp()).collect();
                let sum: f64 = e.iter().sum();
                let p: Vec<f64> = e.iter().map(|x| x / sum).collect();
                let wr = &w[qo + r * d..][..d];
                let dp: Vec<f64> = (0..s).map(|j| dotf(wr, &v[ko + j * d..][..d])).collect();
                let mean: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
                for j in 0..s {
                    let ds = scale * p[j] * (dp[j] - mean);
                    for c in 0..d {
                        out[0][qo + r * d + c] += p[j] * v[ko + j * d + c] as f64;
                        out[1][qo + r * d + c] += ds * k[ko + j * d + c] as f64;
                        out[2][ko + j * d + c] += ds * qr[c] as f64;
                        out[3][ko + j * d + c] += p[j] * wr[c] as f64;
                    }
                }
            }
        }
        out
    }

    /// (b, g, n_rep, t, cached positions, d, the sequences' padding or none).
    type Case = (
        usize,
        usize,
        usize,
        usize,
        usize,
        usize,
        Option<&'static [usize]>,
    );
    const CASES: [Case; 10] = [
        (2, 2, 2, 5, 0, 4, Some(&[0, 2])),
        (2, 1, 3, 4, 3, 4, Some(&[1, 0])),
        (2, 3, 1, 6, 0, 16, Some(&[5, 0])),
        (1, 1, 1, 1, 0, 1, Some(&[0])),
        (3, 2, 1, 33, 0, 16, Some(&[0, 20, 32])),
        (1, 3, 3, 17, 8, 64, Some(&[4])),
        (2, 2, 2, 9, 0, 5, None),
        (1, 1, 1, 40, 0, 24, Some(&[39])),
        (1, 2, 1, 12, 0, 32, Some(&[3])),
        (1, 1, 2, 10, 2, 128, Some(&[0])),
    ];

    /// A case's shapes, q, k, v, the output's gradient and the mask.
    type Inputs = (
        Dims,
        Vec<f32>,
        Vec<f32>,
        Vec<f32>,
        Vec<f32>,
        Option<Vec<f32>>,
    );

    fn case(i: usize) -> Inputs {
        let (b, g, r, t, offset, d, pads) = CASES[i];
        let dims = Dims {
            b,
            g,
            rt: r * t,
            t,
            s: offset + t,
            d,
        };
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(i as u64);
        let q = random(b * g * r * t * d, &mut rng);
        let k = random(b * g * dims.s * d, &mut rng);
        let v = random(k.len(), &mut rng);
        let w = random(q.len(), &mut rng);
        (dims, q, k, v, w, pads.map(|p| mask(p, t, offset)))
    }

    #[test]
    fn outputs_and_gradients_match_a_full_softmax_in_f64() {
        for i in 0..CASES.len() {
            let (dims, q, k, v, w, m) = case(i);
            let scale = 1.0 / (dims.d as f32).sqrt();
            let (y, p) = forward(&q, &k, &v, m.as_deref(), dims, scale).unwrap();
            let [dq, dk, dv] = backward(&q, &k, &v, &p, &w, scale, [true; 3]).unwrap();
            let want = reference(&q, &k, &v, &w, m.as_deref(), dims, scale as f64);
            let got = [y, dq.unwrap(), dk.unwrap(), dv.unwrap()];
            for (name, (got, want)) in ["y", "dq", "dk", "dv"].iter().zip(got.iter().zip(&want)) {
                // (Over one column the weights are constant: no gradient through them.)
                let moves = dims.s > 1 || ["y", "dv"].contains(name);
                assert!(
                    !moves || want.iter().any(|x| x.abs() > 1e-3),
                    "case {i}, {name}: 0"
                );
                for (j, (a, e)) in got.iter().zip(want).enumerate() {
                    let err = (*a as f64 - e).abs();
                    assert!(
                        err < 2e-5 * (1.0 + e.abs()),
                        "case {i}, {name}[{j}]: {a} vs {e}"
                    );
                }
            }
            // Each weight row sums to 1; its dead columns weigh exactly 0. Under a causal
            // mask about half of the matrix is kept (with the rows' blocks' overlap).
            let live = |r: usize| {
                let (l, h) = p.spans[r / dims.rt / dims.g * dims.t + r % dims.t];
                h - l
            };
            let rows = dims.b * dims.g * dims.rt;
            let (all, kept) = ((0..rows).map(live).sum::<usize>(), p.len());
            assert!(
                kept >= all && kept <= all + rows * (BLOCK - 1),
                "case {i}: {kept} kept"
            );
            for (r, row) in p.dense().chunks_exact(dims.s).enumerate() {
                let sum: f32 = row.iter().sum();
                assert!((sum - 1.0).abs() < 1e-5, "case {i}, row {r} sums to {sum}");
                if let Some(m) = &m {
                    let (bi, tr) = (r / dims.rt / dims.g, r % dims.t);
                    let mr = &m[(bi * dims.t + tr) * dims.s..][..dims.s];
                    if mr.contains(&0.0) {
                        for (j, (x, mj)) in row.iter().zip(mr).enumerate() {
                            assert!(*mj == 0.0 || *x == 0.0, "case {i}, row {r}, column {j}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn only_the_wanted_gradients_are_computed_and_they_do_not_change() {
        let (dims, q, k, v, w, m) = case(4);
        let (_, p) = forward(&q, &k, &v, m.as_deref(), dims, 0.25).unwrap();
        let all = backward(&q, &k, &v, &p, &w, 0.25, [true; 3]).unwrap();
        for wanted in [
            [true, false, false],
            [false, true, false],
            [false, false, true],
        ] {
            let some = backward(&q, &k, &v, &p, &w, 0.25, wanted).unwrap();
            for x in 0..3 {
                match wanted[x] {
                    true => assert_eq!(some[x], all[x], "{wanted:?}"),
                    false => assert!(some[x].is_none(), "{wanted:?}"),
                }
            }
        }
    }

    #[test]
    fn results_are_the_same_bits_on_any_thread_count_and_every_path() {
        let (dims, q, k, v, w, m) = case(5);
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                let (y, p) = forward(&q, &k, &v, m.as_deref(), dims, 0.125).unwrap();
                let g = backward(&q, &k, &v, &p, &w, 0.125, [true; 3]);
                (y, p, g.unwrap())
            })
        };
        let one = run(1);
        assert_eq!(one, run(3));
        // Every compiled path gives the same bits (the portable one and AVX2: the same
        // operations in the same order, only wider), on every case.
        for i in 0..CASES.len() {
            let (dims, q, k, v, w, m) = case(i);
            let run = |path: Path| {
                let (y, p) = forward_on(path, &q, &k, &v, m.as_deref(), dims, 0.5, true).unwrap();
                let g = backward_on(path, &q, &k, &v, &p, &w, 0.5, [true; 3]);
                (y, p, g.unwrap())
            };
            let best = run(Path::best());
            for path in Path::available() {
                assert!(
                    run(path) == best,
                    "case {i}: {path:?} against {:?}",
                    Path::best()
                );
            }
        }
    }

    #[test]
    fn inferring_gives_the_training_forwards_output_and_keeps_nothing() {
        for i in 0..CASES.len() {
            let (dims, q, k, v, _, m) = case(i);
            let (y, _) = forward(&q, &k, &v, m.as_deref(), dims, 0.5).unwrap();
            assert_eq!(
                infer(&q, &k, &v, m.as_deref(), dims, 0.5).unwrap(),
                y,
                "case {i}"
            );
            for path in Path::available() {
                let (y, p) = forward_on(path, &q, &k, &v, m.as_deref(), dims, 0.5, false).unwrap();
                assert!(
                    p.groups.iter().all(Vec::is_empty),
                    "case {i}: {path:?} kept weights"
                );
                assert_eq!(
                    infer(&q, &k, &v, m.as_deref(), dims, 0.5).unwrap(),
                    y,
                    "case {i}"
                );
            }
        }
    }

    #[test]
    fn shapes_that_do_not_fit_are_refused() {
        let (dims, q, k, v, w, m) = case(0);
        let bad = Dims { d: 3, ..dims };
        let e = forward(&q, &k, &v, m.as_deref(), bad, 1.0).unwrap_err();
        assert!(e.contains("not (2, 2, 10, 3) and (2, 2, 5, 3)"), "{e}");
        let e = forward(&q, &k, &v, Some(&[0.0; 3]), dims, 1.0).unwrap_err();
        assert!(
            e.contains("the mask holds 3 values, not (2, 1, 5, 5)"),
            "{e}"
        );
        let (_, p) = forward(&q, &k, &v, m.as_deref(), dims, 1.0).unwrap();
        let e = backward(&q, &k, &v, &p, &w[1..], 1.0, [true; 3]).unwrap_err();
        assert!(e.contains("the gradient (159)"), "{e}");
        let mut short = p.clone();
        short.groups[1].pop();
        let e = backward(&q, &k, &v, &short, &w, 1.0, [true; 3]).unwrap_err();
        assert!(e.contains("the kept weights do not match"), "{e}");
        // Empty batches give empty results.
        let empty = Dims { b: 0, ..dims };
        let (y, p) = forward(&[], &[], &[], None, empty, 1.0).unwrap();
        assert!(y.is_empty() && p.len() == 0);
        // So do heads of no dimension, in backward too.
        let flat = Dims { d: 0, ..dims };
        let (y, p) = forward(&[], &[], &[], m.as_deref(), flat, 1.0).unwrap();
        assert!(y.is_empty() && p.len() == 0);
        let grads = backward(&[], &[], &[], &p, &[], 1.0, [true; 3]).unwrap();
        assert!(grads.iter().all(|x| x.as_ref().is_some_and(Vec::is_empty)));
    }

    #[test]
    fn spans_cover_the_live_columns_and_keep_whole_masked_rows() {
        let dims = Dims {
            b: 1,
            g: 1,
            rt: 4,
            t: 4,
            s: 4,
            d: 1,
        };
        let x = -1e9f32;
        #[rustfmt::skip]
        let mask = [
            x, x, x, x,       // a padding row: every column alike
            x, 0.0, x, x,     // one live column
            x, 0.0, 0.0, x,
            0.0, x, 0.0, 0.0, // a dead column inside the span stays, masked
        ];
        assert_eq!(
            spans(Some(&mask), dims),
            vec![(0, 4), (1, 2), (1, 3), (0, 4)]
        );
        assert_eq!(spans(None, dims), vec![(0, 4); 4]);
        // Masks a little below the top stay live: only −1e8 and further is dead.
        let soft = [0.0, -50.0, -1e7, -2e8];
        let one = Dims {
            rt: 1,
            t: 1,
            ..dims
        };
        assert_eq!(spans(Some(&soft), one), vec![(0, 3)]);
    }
}
