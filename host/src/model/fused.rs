//! Fused ops with their own backward, for the differentiable (training) path on CPU in f32.
//!
//! candle keeps every intermediate of the autograd graph alive until the loss is dropped, and
//! its backward adds each gradient into a fresh zero tensor. Built from elementary ops, an RMS
//! norm, rotary embeddings, a masked softmax, SiLU-gating and the log-softmax over a vocabulary
//! each leave several activation-sized tensors behind and cost as many passes again in
//! backward. Each op here produces one tensor and computes its gradient in one or two passes:
//! a SmolLM2 LoRA train step (8 × 128 tokens) needs less than half the memory (BENCHMARKS.md).
//! Other devices and dtypes take the elementary ops ([`applies`] decides);
//! `tests/model_kernels.rs` checks every op and its gradients against them.

use candle_core::backend::BackendStorage;
use candle_core::{
    bail, CpuStorage, CustomOp1, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor, D,
};
/// Whether the fused ops can take these tensors: CPU, f32, and `enabled` (the base's
/// [`Kernels::fused_ops`](super::Kernels)).
pub(crate) fn applies(enabled: bool, ts: &[&Tensor]) -> bool {
    enabled
        && ts
            .iter()
            .all(|t| t.device().is_cpu() && t.dtype() == DType::F32)
}

fn f32s<'a>(s: &'a CpuStorage, l: &Layout, op: &str) -> Result<&'a [f32]> {
    let CpuStorage::F32(v) = s else {
        bail!("{op}: expected f32, got {:?}", s.dtype())
    };
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&v[a..b]),
        None => bail!("{op}: expected a contiguous tensor"),
    }
}

fn tensor_f32s<'a>(s: &'a candle_core::Storage, l: &Layout, op: &str) -> Result<&'a [f32]> {
    match s {
        candle_core::Storage::Cpu(s) => f32s(s, l, op),
        _ => bail!("{op}: expected a CPU tensor"),
    }
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

// ---------------------------------------------------------------------------------------
// RMS norm: y = x / sqrt(mean(x²) + eps) * w over the last dimension.

struct RmsNorm {
    eps: f32,
}

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        "rms-norm-trainable"
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        xl: &Layout,
        w: &CpuStorage,
        wl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let xs = f32s(x, xl, "rms-norm")?;
        let ws = f32s(w, wl, "rms-norm weight")?;
        let h = ws.len();
        let mut y = vec![0f32; xs.len()];
        for (xr, yr) in xs.chunks_exact(h).zip(y.chunks_exact_mut(h)) {
            let ms = xr.iter().map(|v| v * v).sum::<f32>() / h as f32;
            let r = 1.0 / (ms + self.eps).sqrt();
            for ((y, x), w) in yr.iter_mut().zip(xr).zip(ws) {
                *y = x * r * w;
            }
        }
        Ok((CpuStorage::F32(y), xl.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _y: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let g = g.contiguous()?;
        let grad_x = if x.track_op() {
            Some(x.apply_op3_no_bwd(w, &g, &RmsNormGrad { eps: self.eps })?)
        } else {
            None
        };
        let grad_w = if w.track_op() {
            let r = (x.sqr()?.mean_keepdim(D::Minus1)? + self.eps as f64)?
                .sqrt()?
                .recip()?;
            let n = x.broadcast_mul(&r)?;
            let h = w.dim(0)?;
            Some((g * n)?.reshape(((), h))?.sum(0)?)
        } else {
            None
        };
        Ok((grad_x, grad_w))
    }
}

/// dL/dx of the RMS norm: r (g w) − r³ x (Σ g w x) / h per row.
struct RmsNormGrad {
    eps: f32,
}

impl CustomOp3 for RmsNormGrad {
    fn name(&self) -> &'static str {
        "rms-norm-grad"
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        xl: &Layout,
        w: &CpuStorage,
        wl: &Layout,
        g: &CpuStorage,
        gl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let xs = f32s(x, xl, "rms-norm grad")?;
        let ws = f32s(w, wl, "rms-norm grad weight")?;
        let gs = f32s(g, gl, "rms-norm grad")?;
        let h = ws.len();
        let mut out = vec![0f32; xs.len()];
        for ((xr, gr), or) in xs
            .chunks_exact(h)
            .zip(gs.chunks_exact(h))
            .zip(out.chunks_exact_mut(h))
        {
            let ms = xr.iter().map(|v| v * v).sum::<f32>() / h as f32;
            let r = 1.0 / (ms + self.eps).sqrt();
            let dot: f32 = xr.iter().zip(gr).zip(ws).map(|((x, g), w)| x * g * w).sum();
            let c = r * r * r * dot / h as f32;
            for (((o, x), g), w) in or.iter_mut().zip(xr).zip(gr).zip(ws) {
                *o = r * g * w - c * x;
            }
        }
        Ok((CpuStorage::F32(out), xl.shape().clone()))
    }
}

/// RMS norm over the last dimension, differentiable in `x` and `w`.
pub(crate) fn rms_norm(x: &Tensor, w: &Tensor, eps: f32) -> Result<Tensor> {
    x.contiguous()?.apply_op2(&w.contiguous()?, RmsNorm { eps })
}

// ---------------------------------------------------------------------------------------
// Rotary embeddings (non-interleaved halves), (batch, heads, t, d) with cos/sin (t, d/2).

struct Rope {
    cos: Tensor,
    sin: Tensor,
    /// +1 rotates forward; -1 rotates back (the transpose, used by backward).
    sign: f32,
}

impl CustomOp1 for Rope {
    fn name(&self) -> &'static str {
        "rope-trainable"
    }

    fn cpu_fwd(&self, x: &CpuStorage, xl: &Layout) -> Result<(CpuStorage, Shape)> {
        let xs = f32s(x, xl, "rope")?;
        let (_, _, t, d) = xl.shape().dims4()?;
        let half = d / 2;
        let (cs, cl) = self.cos.storage_and_layout();
        let (ss, sl) = self.sin.storage_and_layout();
        let cos = tensor_f32s(&cs, cl, "rope cos")?;
        let sin = tensor_f32s(&ss, sl, "rope sin")?;
        if cos.len() != t * half || sin.len() != t * half {
            bail!("rope: cos/sin do not cover {t} positions of {half} frequencies");
        }
        let mut y = vec![0f32; xs.len()];
        for (k, (xr, yr)) in xs.chunks_exact(d).zip(y.chunks_exact_mut(d)).enumerate() {
            let i = k % t;
            let (c, s) = (&cos[i * half..][..half], &sin[i * half..][..half]);
            let (x1, x2) = xr.split_at(half);
            let (y1, y2) = yr.split_at_mut(half);
            for j in 0..half {
                let sn = self.sign * s[j];
                y1[j] = x1[j] * c[j] - x2[j] * sn;
                y2[j] = x2[j] * c[j] + x1[j] * sn;
            }
        }
        Ok((CpuStorage::F32(y), xl.shape().clone()))
    }

    fn bwd(&self, _x: &Tensor, _y: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        // A rotation's transpose is the rotation back.
        let back = Rope {
            cos: self.cos.clone(),
            sin: self.sin.clone(),
            sign: -self.sign,
        };
        Ok(Some(g.contiguous()?.apply_op1_no_bwd(&back)?))
    }
}

/// Rotary embeddings over x (batch, heads, t, d), with cos and sin (t, d/2).
pub(crate) fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    x.contiguous()?.apply_op1(Rope {
        cos: cos.contiguous()?,
        sin: sin.contiguous()?,
        sign: 1.0,
    })
}

// ---------------------------------------------------------------------------------------
// Attention weights: softmax(scores · scale + mask) over the last dimension.

struct MaskedSoftmax {
    scale: f32,
    /// (batch, 1, t, s), additive, or None.
    mask: Option<Tensor>,
}

impl CustomOp1 for MaskedSoftmax {
    fn name(&self) -> &'static str {
        "masked-softmax"
    }

    fn cpu_fwd(&self, a: &CpuStorage, al: &Layout) -> Result<(CpuStorage, Shape)> {
        let xs = f32s(a, al, "masked-softmax")?;
        let (b, h, t, s) = al.shape().dims4()?;
        let guard = self.mask.as_ref().map(|m| m.storage_and_layout());
        let mask = match &guard {
            Some((ms, ml)) => {
                let m = tensor_f32s(ms, ml, "masked-softmax mask")?;
                if m.len() != b * t * s {
                    bail!("masked-softmax: the mask does not cover ({b}, 1, {t}, {s})");
                }
                Some(m)
            }
            None => None,
        };
        let mut y = vec![0f32; xs.len()];
        for (k, (xr, yr)) in xs.chunks_exact(s).zip(y.chunks_exact_mut(s)).enumerate() {
            let (bi, i) = (k / (h * t), k % t);
            match mask {
                Some(m) => {
                    let mr = &m[(bi * t + i) * s..][..s];
                    for ((y, x), m) in yr.iter_mut().zip(xr).zip(mr) {
                        *y = x * self.scale + m;
                    }
                }
                None => {
                    for (y, x) in yr.iter_mut().zip(xr) {
                        *y = x * self.scale;
                    }
                }
            }
            let max = yr.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0f32;
            for y in yr.iter_mut() {
                *y = (*y - max).exp();
                sum += *y;
            }
            let inv = 1.0 / sum;
            for y in yr.iter_mut() {
                *y *= inv;
            }
        }
        Ok((CpuStorage::F32(y), al.shape().clone()))
    }

    fn bwd(&self, _a: &Tensor, y: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(y.apply_op2_no_bwd(
            &g.contiguous()?,
            &SoftmaxGrad { scale: self.scale },
        )?))
    }
}

/// dL/dscores of the scaled softmax: scale · y (g − Σ g y) per row.
struct SoftmaxGrad {
    scale: f32,
}

impl CustomOp2 for SoftmaxGrad {
    fn name(&self) -> &'static str {
        "softmax-grad"
    }

    fn cpu_fwd(
        &self,
        y: &CpuStorage,
        yl: &Layout,
        g: &CpuStorage,
        gl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let ys = f32s(y, yl, "softmax grad")?;
        let gs = f32s(g, gl, "softmax grad")?;
        let s = yl.dims()[yl.dims().len() - 1];
        let mut out = vec![0f32; ys.len()];
        for ((yr, gr), or) in ys
            .chunks_exact(s)
            .zip(gs.chunks_exact(s))
            .zip(out.chunks_exact_mut(s))
        {
            let dot: f32 = yr.iter().zip(gr).map(|(y, g)| y * g).sum();
            for ((o, y), g) in or.iter_mut().zip(yr).zip(gr) {
                *o = self.scale * y * (g - dot);
            }
        }
        Ok((CpuStorage::F32(out), yl.shape().clone()))
    }
}

/// softmax(scores · scale + mask) over the last dimension of scores (batch, heads, t, s);
/// the mask (batch, 1, t, s) is additive and carries no gradient.
pub(crate) fn masked_softmax(scores: &Tensor, scale: f64, mask: Option<&Tensor>) -> Result<Tensor> {
    scores.contiguous()?.apply_op1(MaskedSoftmax {
        scale: scale as f32,
        mask: mask.map(|m| m.contiguous()).transpose()?,
    })
}

// ---------------------------------------------------------------------------------------
// SiLU gating: silu(g) · u.

struct SiluMul;

impl CustomOp2 for SiluMul {
    fn name(&self) -> &'static str {
        "silu-mul"
    }

    fn cpu_fwd(
        &self,
        g: &CpuStorage,
        gl: &Layout,
        u: &CpuStorage,
        ul: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let gs = f32s(g, gl, "silu-mul")?;
        let us = f32s(u, ul, "silu-mul")?;
        let y = gs
            .iter()
            .zip(us)
            .map(|(g, u)| g * sigmoid(*g) * u)
            .collect();
        Ok((CpuStorage::F32(y), gl.shape().clone()))
    }

    fn bwd(
        &self,
        g: &Tensor,
        u: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let dy = dy.contiguous()?;
        let grad_g = if g.track_op() {
            Some(g.apply_op3_no_bwd(u, &dy, &SiluMulGrad { wrt_gate: true })?)
        } else {
            None
        };
        let grad_u = if u.track_op() {
            Some(g.apply_op3_no_bwd(u, &dy, &SiluMulGrad { wrt_gate: false })?)
        } else {
            None
        };
        Ok((grad_g, grad_u))
    }
}

/// The gradient of silu(g) · u with respect to g (`wrt_gate`) or u.
struct SiluMulGrad {
    wrt_gate: bool,
}

impl CustomOp3 for SiluMulGrad {
    fn name(&self) -> &'static str {
        "silu-mul-grad"
    }

    fn cpu_fwd(
        &self,
        g: &CpuStorage,
        gl: &Layout,
        u: &CpuStorage,
        ul: &Layout,
        dy: &CpuStorage,
        dl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let gs = f32s(g, gl, "silu-mul grad")?;
        let us = f32s(u, ul, "silu-mul grad")?;
        let ds = f32s(dy, dl, "silu-mul grad")?;
        let out = if self.wrt_gate {
            gs.iter()
                .zip(us)
                .zip(ds)
                .map(|((g, u), d)| {
                    let s = sigmoid(*g);
                    d * u * s * (1.0 + g * (1.0 - s))
                })
                .collect()
        } else {
            gs.iter()
                .zip(ds)
                .map(|(g, d)| d * g * sigmoid(*g))
                .collect()
        };
        Ok((CpuStorage::F32(out), gl.shape().clone()))
    }
}

/// silu(g) · u, differentiable in both.
pub(crate) fn silu_mul(g: &Tensor, u: &Tensor) -> Result<Tensor> {
    g.contiguous()?.apply_op2(&u.contiguous()?, SiluMul)
}

// ---------------------------------------------------------------------------------------
// Token log-probs and entropies from logits, without materialising the log-softmax.

struct TokenLogprobs {
    targets: Vec<u32>,
}

/// Per row: the log-sum-exp and E_p[z].
fn lse_and_mean(z: &[f32]) -> (f32, f32) {
    let max = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let (mut sum, mut zsum) = (0f32, 0f32);
    for &v in z {
        let e = (v - max).exp();
        sum += e;
        zsum += e * v;
    }
    (max + sum.ln(), zsum / sum)
}

impl CustomOp1 for TokenLogprobs {
    fn name(&self) -> &'static str {
        "token-logprobs"
    }

    fn cpu_fwd(&self, z: &CpuStorage, zl: &Layout) -> Result<(CpuStorage, Shape)> {
        let zs = f32s(z, zl, "token-logprobs")?;
        let (m, v) = zl.shape().dims2()?;
        if self.targets.len() != m {
            bail!(
                "token-logprobs: {} targets for {m} rows",
                self.targets.len()
            );
        }
        let mut out = Vec::with_capacity(2 * m);
        for (zr, &t) in zs.chunks_exact(v).zip(&self.targets) {
            let Some(&zt) = zr.get(t as usize) else {
                bail!("token-logprobs: token {t} is outside the vocabulary of {v}")
            };
            let (lse, mean) = lse_and_mean(zr);
            out.push(zt - lse);
            out.push(lse - mean);
        }
        Ok((CpuStorage::F32(out), Shape::from((m, 2))))
    }

    fn bwd(&self, z: &Tensor, _y: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        let grad = TokenLogprobsGrad {
            targets: self.targets.clone(),
        };
        Ok(Some(z.apply_op2_no_bwd(&g.contiguous()?, &grad)?))
    }
}

/// d/dz_j: g_lp (1[j = t] − p_j) − g_H p_j (z_j − E_p[z]).
struct TokenLogprobsGrad {
    targets: Vec<u32>,
}

impl CustomOp2 for TokenLogprobsGrad {
    fn name(&self) -> &'static str {
        "token-logprobs-grad"
    }

    fn cpu_fwd(
        &self,
        z: &CpuStorage,
        zl: &Layout,
        g: &CpuStorage,
        gl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let zs = f32s(z, zl, "token-logprobs grad")?;
        let gs = f32s(g, gl, "token-logprobs grad")?;
        let (_, v) = zl.shape().dims2()?;
        let mut out = vec![0f32; zs.len()];
        for (((zr, gr), or), &t) in zs
            .chunks_exact(v)
            .zip(gs.chunks_exact(2))
            .zip(out.chunks_exact_mut(v))
            .zip(&self.targets)
        {
            let (lse, mean) = lse_and_mean(zr);
            let (g_lp, g_h) = (gr[0], gr[1]);
            for (o, z) in or.iter_mut().zip(zr) {
                let p = (z - lse).exp();
                *o = -g_lp * p - g_h * p * (z - mean);
            }
            or[t as usize] += g_lp;
        }
        Ok((CpuStorage::F32(out), zl.shape().clone()))
    }
}

/// For logits (rows, vocab) and one target token per row: (rows, 2) holding each row's
/// log-prob of its target and the entropy of its distribution, differentiable in the logits.
pub(crate) fn token_logprobs(logits: &Tensor, targets: Vec<u32>) -> Result<Tensor> {
    logits.contiguous()?.apply_op1(TokenLogprobs { targets })
}
