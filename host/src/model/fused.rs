//! Fused ops with their own backward, for the differentiable (training) path on CPU in f32.
//!
//! candle keeps every intermediate of the autograd graph alive until the loss is dropped, and
//! its backward adds each gradient into a fresh zero tensor. Built from elementary ops, an RMS
//! norm, rotary embeddings, attention, SiLU-gating and the log-softmax over a vocabulary
//! each leave several activation-sized tensors behind and cost as many passes again in
//! backward. Each op here produces one tensor and computes its gradient in one or two passes:
//! a SmolLM2 LoRA train step (8 × 128 tokens) needs less than half the memory (BENCHMARKS.md).
//! Attention also has a path without a graph (prefill and scoring) that keeps no weights and
//! rounds as the training forward. Rows are split over the rayon pool, each row computed by one thread
//! in a fixed order, so results do not depend on the number of threads.
//! Other devices and dtypes take the elementary ops ([`applies`] decides);
//! `tests/model_kernels.rs` checks every op and its gradients against them.

use candle_core::backend::BackendStorage;
use candle_core::{
    bail, CpuStorage, CustomOp1, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor, D,
};
use rayon::prelude::*;

use super::rows::lse_and_mean;

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

/// The fewest elements an elementwise op hands to one rayon task.
const ELEMENTS_PER_TASK: usize = 1 << 14;

/// Fills `out` with σ(g) chunk by chunk over the rayon pool ([`super::rows::sigmoids`]),
/// then calls `f(out[i], g[i], i)` on each element of the chunk while it is in cache.
fn by_sigmoid_chunks(out: &mut [f32], g: &[f32], f: impl Fn(&mut f32, f32, usize) + Sync) {
    out.par_chunks_mut(ELEMENTS_PER_TASK)
        .zip(g.par_chunks(ELEMENTS_PER_TASK))
        .enumerate()
        .for_each(|(c, (out, g))| {
            super::rows::sigmoids(g, out);
            for (j, (o, &g)) in out.iter_mut().zip(g).enumerate() {
                f(o, g, c * ELEMENTS_PER_TASK + j);
            }
        });
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
        y.par_chunks_exact_mut(h)
            .zip(xs.par_chunks_exact(h))
            .for_each(|(yr, xr)| {
                let ms = xr.iter().map(|v| v * v).sum::<f32>() / h as f32;
                let r = 1.0 / (ms + self.eps).sqrt();
                for ((y, x), w) in yr.iter_mut().zip(xr).zip(ws) {
                    *y = x * r * w;
                }
            });
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
        out.par_chunks_exact_mut(h)
            .zip(xs.par_chunks_exact(h).zip(gs.par_chunks_exact(h)))
            .for_each(|(or, (xr, gr))| {
                let ms = xr.iter().map(|v| v * v).sum::<f32>() / h as f32;
                let r = 1.0 / (ms + self.eps).sqrt();
                let dot: f32 = xr.iter().zip(gr).zip(ws).map(|((x, g), w)| x * g * w).sum();
                let c = r * r * r * dot / h as f32;
                for (((o, x), g), w) in or.iter_mut().zip(xr).zip(gr).zip(ws) {
                    *o = r * g * w - c * x;
                }
            });
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
        y.par_chunks_exact_mut(d)
            .zip(xs.par_chunks_exact(d))
            .enumerate()
            .for_each(|(k, (yr, xr))| {
                let i = k % t;
                let (c, s) = (&cos[i * half..][..half], &sin[i * half..][..half]);
                let (x1, x2) = xr.split_at(half);
                let (y1, y2) = yr.split_at_mut(half);
                for j in 0..half {
                    let sn = self.sign * s[j];
                    y1[j] = x1[j] * c[j] - x2[j] * sn;
                    y2[j] = x2[j] * c[j] + x1[j] * sn;
                }
            });
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
// Attention: softmax(q kᵀ · scale + mask) v, one differentiable op.

/// The result an op computed before joining the graph, handed to candle by its `cpu_fwd`
/// (once).
type Handed = std::sync::Mutex<Option<(Vec<f32>, Shape)>>;

fn hand_over(slot: &Handed, op: &str) -> Result<(CpuStorage, Shape)> {
    let Some((y, shape)) = slot
        .lock()
        .map_err(|_| candle_core::Error::Msg(format!("{op}: poisoned")))?
        .take()
    else {
        bail!("{op}: the op ran twice")
    };
    Ok((CpuStorage::F32(y), shape))
}

/// The whole attention product as one node of the graph, computed row by row over each row's
/// live keys ([`attention`](super::attention): about half the work of the batched products
/// under a causal mask). Its forward keeps the attention weights (the only activation-sized
/// tensor) and its backward returns q's, k's and v's gradients directly.
struct Attention {
    /// The attention weights over the live columns.
    p: super::attention::Weights,
    /// The result, handed to the graph by `cpu_fwd`.
    y: Handed,
    scale: f32,
}

/// A CPU tensor's storage, read-locked, and its layout: [`Read::f32s`] gives its values.
struct Read<'a>(candle_core::StorageRef<'a>, &'a Layout);

impl<'a> Read<'a> {
    fn new(x: &'a Tensor) -> Read<'a> {
        let (s, l) = x.storage_and_layout();
        Read(s, l)
    }

    /// The values, if contiguous f32 on the CPU; `what` names the tensor in the error.
    fn f32s(&self, what: &str) -> Result<&[f32]> {
        tensor_f32s(&self.0, self.1, what)
    }
}

fn attention_error(e: String) -> candle_core::Error {
    candle_core::Error::Msg(format!("attention: {e}"))
}

impl CustomOp3 for Attention {
    fn name(&self) -> &'static str {
        "attention"
    }

    fn cpu_fwd(
        &self,
        _q: &CpuStorage,
        _ql: &Layout,
        _k: &CpuStorage,
        _kl: &Layout,
        _v: &CpuStorage,
        _vl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        hand_over(&self.y, "attention")
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        _y: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let wanted = [q.track_op(), k.track_op(), v.track_op()];
        if wanted == [false; 3] {
            return Ok((None, None, None));
        }
        let g = g.contiguous()?;
        let [dq, dk, dv] = {
            let (qr, kr, vr, gr) = (Read::new(q), Read::new(k), Read::new(v), Read::new(&g));
            super::attention::backward(
                qr.f32s("attention q")?,
                kr.f32s("attention k")?,
                vr.f32s("attention v")?,
                &self.p,
                gr.f32s("attention gradient")?,
                self.scale,
                wanted,
            )
            .map_err(attention_error)?
        };
        let wrap = |x: Option<Vec<f32>>, like: &Tensor| -> Result<Option<Tensor>> {
            x.map(|x| Tensor::from_vec(x, like.shape(), like.device()))
                .transpose()
        };
        Ok((wrap(dq, q)?, wrap(dk, k)?, wrap(dv, v)?))
    }
}

/// softmax(q kᵀ · scale + mask) v for grouped-query attention: q (batch, kv heads, n_rep · t,
/// head dim), k and v (batch, kv heads, s, head dim), the additive mask (batch, 1, t, s)
/// carrying no gradient. Differentiable in q, k and v. The weights' softmax rounds as
/// [`rows::softmax_scaled`](super::rows::softmax_scaled) (the training rounding).
pub(crate) fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    t: usize,
    scale: f64,
    mask: Option<&Tensor>,
) -> Result<Tensor> {
    let ((q, k, v), (y, p)) = attention_inputs(q, k, v, t, mask, |q, k, v, m, dims| {
        super::attention::forward(q, k, v, m, dims, scale as f32)
    })?;
    q.apply_op3(
        &k,
        &v,
        Attention {
            p,
            y: std::sync::Mutex::new(Some((y, q.shape().clone()))),
            scale: scale as f32,
        },
    )
}

/// The same product without a graph (prefill and scoring): the training forward's output,
/// bit for bit, with no weights kept.
pub(crate) fn attention_inference(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    t: usize,
    scale: f64,
    mask: Option<&Tensor>,
) -> Result<Tensor> {
    let ((q, _, _), y) = attention_inputs(q, k, v, t, mask, |q, k, v, m, dims| {
        super::attention::infer(q, k, v, m, dims, scale as f32)
    })?;
    Tensor::from_vec(y, q.shape(), q.device())
}

/// q, k and v, contiguous.
type Inputs = (Tensor, Tensor, Tensor);

/// q, k and v made contiguous, and what `run` makes of their values, the mask's and their
/// [`Dims`](super::attention::Dims) (t positions a sequence).
fn attention_inputs<T>(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    t: usize,
    mask: Option<&Tensor>,
    run: impl FnOnce(
        &[f32],
        &[f32],
        &[f32],
        Option<&[f32]>,
        super::attention::Dims,
    ) -> std::result::Result<T, String>,
) -> Result<(Inputs, T)> {
    let (q, k, v) = (q.contiguous()?, k.contiguous()?, v.contiguous()?);
    let mask = mask.map(|m| m.contiguous()).transpose()?;
    let (b, g, rt, d) = q.dims4()?;
    let s = k.dim(2)?;
    let dims = super::attention::Dims { b, g, rt, t, s, d };
    let out = {
        let (qr, kr, vr) = (Read::new(&q), Read::new(&k), Read::new(&v));
        let mr = mask.as_ref().map(Read::new);
        let ms = mr.as_ref().map(|m| m.f32s("attention mask")).transpose()?;
        run(
            qr.f32s("attention q")?,
            kr.f32s("attention k")?,
            vr.f32s("attention v")?,
            ms,
            dims,
        )
        .map_err(attention_error)?
    };
    Ok(((q, k, v), out))
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
        if us.len() != gs.len() {
            bail!(
                "silu-mul: {} gate values against {} up values",
                gs.len(),
                us.len()
            );
        }
        let mut y = vec![0f32; gs.len()];
        by_sigmoid_chunks(&mut y, gs, |y, g, i| *y = g * *y * us[i]);
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
        if us.len() != gs.len() || ds.len() != gs.len() {
            bail!(
                "silu-mul grad: {} gate, {} up and {} gradient values",
                gs.len(),
                us.len(),
                ds.len()
            );
        }
        let mut out = vec![0f32; gs.len()];
        if self.wrt_gate {
            by_sigmoid_chunks(&mut out, gs, |o, g, i| {
                let s = *o;
                *o = ds[i] * us[i] * s * (1.0 + g * (1.0 - s));
            });
        } else {
            by_sigmoid_chunks(&mut out, gs, |o, g, i| *o *= ds[i] * g);
        }
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
        if let Some(t) = self.targets.iter().find(|&&t| t as usize >= v) {
            bail!("token-logprobs: token {t} is outside the vocabulary of {v}")
        }
        let mut out = vec![0f32; 2 * m];
        out.par_chunks_exact_mut(2)
            .zip(zs.par_chunks_exact(v).zip(&self.targets))
            .for_each(|(o, (zr, &t))| {
                let (lse, mean) = lse_and_mean(zr);
                o[0] = zr[t as usize] - lse;
                o[1] = lse - mean;
            });
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
        out.par_chunks_exact_mut(v)
            .zip(zs.par_chunks_exact(v).zip(gs.par_chunks_exact(2)))
            .zip(&self.targets)
            .for_each(|((or, (zr, gr)), &t)| {
                let (lse, mean) = lse_and_mean(zr);
                let (g_lp, g_h) = (gr[0], gr[1]);
                super::rows::logprob_entropy_grad(or, zr, lse, mean, g_lp, g_h);
                or[t as usize] += g_lp;
            });
        Ok((CpuStorage::F32(out), zl.shape().clone()))
    }
}

/// For logits (rows, vocab) and one target token per row: (rows, 2) holding each row's
/// log-prob of its target and the entropy of its distribution, differentiable in the logits.
pub(crate) fn token_logprobs(logits: &Tensor, targets: Vec<u32>) -> Result<Tensor> {
    logits.contiguous()?.apply_op1(TokenLogprobs { targets })
}

/// A frozen linear and its LoRA adapter as one node of the graph: `x Wᵀ + scale · (x Aᵀ) Bᵀ`.
/// Its forward is the elementary ops' on the detached inputs (candle's products, in their
/// order: the same numbers). Its backward returns x's, A's and B's gradients directly, where
/// candle's graph would hold the two products, the scaling, the sum and their reshapes, and
/// add each of their gradients into a fresh zero tensor (the update's most frequent ops on a
/// small model).
struct LoraLinear {
    /// The frozen weight, (out, in).
    w: Tensor,
    /// x's shape (.., in); the result's is (.., out).
    x_dims: Vec<usize>,
    scale: f64,
    /// The result, handed to the graph by `cpu_fwd`.
    y: Handed,
}

impl CustomOp3 for LoraLinear {
    fn name(&self) -> &'static str {
        "lora-linear"
    }

    fn cpu_fwd(
        &self,
        _x: &CpuStorage,
        _xl: &Layout,
        _a: &CpuStorage,
        _al: &Layout,
        _b: &CpuStorage,
        _bl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        hand_over(&self.y, "lora-linear")
    }

    fn bwd(
        &self,
        x: &Tensor,
        a: &Tensor,
        b: &Tensor,
        _y: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        // candle's matmul backward's products, in its operand order: each gradient is the
        // elementary ops' bit for bit (x's before it is added to its other uses').
        let track = [x.track_op(), a.track_op(), b.track_op()];
        let (a, b) = (a.detach(), b.detach());
        let in_dim = a.dim(1)?;
        let x = x.detach().reshape(((), in_dim))?;
        let g = g.reshape(((), b.dim(0)?))?.contiguous()?;
        let gs = g.affine(self.scale, 0.0)?;
        let u = x.matmul(&a.t()?)?;
        let grad_b = match track[2] {
            true => Some(u.t()?.matmul(&gs)?.t()?),
            false => None,
        };
        if !track[0] && !track[1] {
            return Ok((None, None, grad_b));
        }
        let du = gs.matmul(&b)?;
        let grad_a = match track[1] {
            true => Some(x.t()?.matmul(&du)?.t()?),
            false => None,
        };
        let grad_x = match track[0] {
            true => Some((g.matmul(&self.w)? + du.matmul(&a)?)?.reshape(self.x_dims.as_slice())?),
            false => None,
        };
        Ok((grad_x, grad_a, grad_b))
    }
}

/// `x Wᵀ (+ bias) + scale · (x Aᵀ) Bᵀ` for a frozen `lin` and an adapter's factors A (r, in)
/// and B (out, r), x (.., in): one node of the graph (no reshapes around it either),
/// differentiable in x, A and B.
pub(crate) fn lora_linear(
    lin: &candle_nn::Linear,
    x: &Tensor,
    a: &Tensor,
    b: &Tensor,
    scale: f64,
) -> Result<Tensor> {
    let w = lin.weight().contiguous()?;
    let dims = x.dims().to_vec();
    let in_dim = *dims.last().unwrap_or(&0);
    let rows: usize = dims[..dims.len().saturating_sub(1)].iter().product();
    let (r, a_in) = a.dims2()?;
    let (out_dim, b_r) = b.dims2()?;
    if w.dims2()? != (out_dim, in_dim) || a_in != in_dim || b_r != r {
        bail!(
            "lora-linear: x {:?}, W {:?}, A {:?} and B {:?} do not fit x Wᵀ + x Aᵀ Bᵀ",
            x.dims(),
            w.dims(),
            a.dims(),
            b.dims()
        )
    }
    let x = x.contiguous()?;
    let xd = x.detach().reshape((rows, in_dim))?;
    // The elementary ops' products and sums, in their order and layouts (frozen.rs's
    // x Wᵀ + bias, then lora.rs's delta), so that the forward is theirs.
    let mut y = xd.matmul(&w.t()?)?;
    if let Some(bias) = lin.bias() {
        y = y.broadcast_add(bias)?;
    }
    let delta = xd.matmul(&a.detach().t()?)?.matmul(&b.detach().t()?)?;
    let mut out = dims.clone();
    if let Some(last) = out.last_mut() {
        *last = out_dim;
    }
    // y + delta.affine(scale, 0) in one pass, rounded as those two ops.
    let mul = scale as f32;
    let y = {
        let (yr, dr) = (Read::new(&y), Read::new(&delta));
        let (ys, ds) = (yr.f32s("lora-linear")?, dr.f32s("lora-linear")?);
        ys.iter()
            .zip(ds)
            .map(|(y, d)| y + (d * mul + 0.0))
            .collect()
    };
    let y = (y, Shape::from(out));
    x.apply_op3(
        a,
        b,
        LoraLinear {
            w,
            x_dims: dims,
            scale,
            y: std::sync::Mutex::new(Some(y)),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};
    use rand::{Rng, SeedableRng};

    fn random(shape: &[usize], seed: u64) -> Tensor {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let n = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|_| rng.random_range(-2.0..2.0)).collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
    }

    /// A decoder's mask: causal after `offset` cached positions, left padding `pads`; the
    /// first rows of a padded sequence are masked whole.
    fn mask(pads: &[usize], t: usize, offset: usize) -> Tensor {
        let s = offset + t;
        let mut m = Vec::new();
        for &pad in pads {
            for i in 0..t {
                for j in 0..s {
                    m.push(if j > offset + i || j < pad {
                        -1e9f32
                    } else {
                        0.0
                    });
                }
            }
        }
        Tensor::from_vec(m, (pads.len(), 1, t, s), &Device::Cpu).unwrap()
    }

    /// The elementary ops the fused attention replaced, on grouped-query shapes.
    fn elementary(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        t: usize,
        scale: f64,
        m: Option<&Tensor>,
        inference: bool,
    ) -> Tensor {
        let (b, g, rt, d) = q.dims4().unwrap();
        let s = k.dim(2).unwrap();
        let nh = g * rt / t;
        let scores = q
            .matmul(&k.t().unwrap())
            .unwrap()
            .reshape((b, nh, t, s))
            .unwrap();
        let mut att = (scores * scale).unwrap();
        if let Some(m) = m {
            att = att.broadcast_add(m).unwrap();
        }
        let p = if inference {
            candle_nn::ops::softmax_last_dim(&att).unwrap()
        } else {
            candle_nn::ops::softmax(&att, D::Minus1).unwrap()
        };
        let y = p.reshape((b, g, rt, s)).unwrap().matmul(v).unwrap();
        assert_eq!(y.dims(), &[b, g, rt, d]);
        y
    }

    fn flat(t: &Tensor) -> Vec<f32> {
        t.flatten_all().unwrap().to_vec1().unwrap()
    }

    fn max_diff(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
    }

    /// (batch, kv heads, n_rep, t, cached positions, padding): grouped and plain heads, a
    /// prefix in the cache, padded rows, no mask.
    type Case = (usize, usize, usize, usize, usize, Option<[usize; 2]>);
    const CASES: [Case; 4] = [
        (2, 2, 2, 5, 0, Some([0, 2])),
        (2, 1, 3, 4, 3, Some([1, 0])),
        (2, 3, 1, 6, 0, Some([5, 0])),
        (2, 2, 2, 3, 0, None),
    ];

    #[test]
    fn attention_without_a_graph_is_the_training_forward_bit_for_bit() {
        for (i, &(b, g, r, t, offset, pads)) in CASES.iter().enumerate() {
            let d = 4;
            let q = random(&[b, g, r * t, d], 10 + i as u64);
            let k = random(&[b, g, offset + t, d], 20 + i as u64);
            let v = random(&[b, g, offset + t, d], 30 + i as u64);
            let m = pads.map(|p| mask(&p, t, offset));
            let got = flat(&attention_inference(&q, &k, &v, t, 0.5, m.as_ref()).unwrap());
            let train = flat(&attention(&q, &k, &v, t, 0.5, m.as_ref()).unwrap());
            assert_eq!(got, train, "case {i}");
            let want = flat(&elementary(&q, &k, &v, t, 0.5, m.as_ref(), true));
            let worst = got
                .iter()
                .zip(&want)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max);
            assert!(worst < 1e-5, "case {i}: {worst} from candle's ops");
        }
    }

    #[test]
    fn attention_gives_the_elementary_ops_outputs_and_gradients() {
        for (i, &(b, g, r, t, offset, pads)) in CASES.iter().enumerate() {
            let d = 4;
            let q = Var::from_tensor(&random(&[b, g, r * t, d], 10 + i as u64)).unwrap();
            let k = Var::from_tensor(&random(&[b, g, offset + t, d], 20 + i as u64)).unwrap();
            let v = Var::from_tensor(&random(&[b, g, offset + t, d], 30 + i as u64)).unwrap();
            let w = random(&[b, g, r * t, d], 40 + i as u64);
            let m = pads.map(|p| mask(&p, t, offset));
            let run = |fused: bool| {
                let (qt, kt, vt) = (q.as_tensor(), k.as_tensor(), v.as_tensor());
                let y = match fused {
                    true => attention(qt, kt, vt, t, 0.5, m.as_ref()).unwrap(),
                    false => elementary(qt, kt, vt, t, 0.5, m.as_ref(), false),
                };
                let grads = (&y * &w).unwrap().sum_all().unwrap().backward().unwrap();
                let mut out = vec![flat(&y)];
                out.extend([qt, kt, vt].map(|x| flat(grads.get(x).unwrap())));
                out
            };
            let (fused, plain) = (run(true), run(false));
            for (name, (a, e)) in ["output", "dq", "dk", "dv"]
                .iter()
                .zip(fused.iter().zip(&plain))
            {
                assert!(e.iter().any(|x| *x != 0.0), "case {i}, {name}: all zero");
                let diff = max_diff(a, e);
                assert!(diff < 1e-5, "case {i}, {name}: differs by {diff}");
            }
        }
    }

    #[test]
    fn attention_returns_gradients_only_for_what_is_tracked() {
        let (b, g, r, t) = (1, 2, 2, 3);
        let q = Var::from_tensor(&random(&[b, g, r * t, 4], 1)).unwrap();
        // k and v as from a frozen projection of a frozen input: plain tensors.
        let k = random(&[b, g, t, 4], 2);
        let v = random(&[b, g, t, 4], 3);
        let y = attention(q.as_tensor(), &k, &v, t, 0.5, Some(&mask(&[0], t, 0))).unwrap();
        let grads = y.sum_all().unwrap().backward().unwrap();
        assert!(grads.get(q.as_tensor()).is_some());
        assert!(grads.get(&k).is_none() && grads.get(&v).is_none());
    }

    /// A frozen linear and its adapter through candle's ops: frozen.rs's x Wᵀ (+ bias) and
    /// lora.rs's delta.
    fn lora_elementary(
        lin: &candle_nn::Linear,
        x: &Tensor,
        a: &Tensor,
        b: &Tensor,
        scale: f64,
    ) -> Tensor {
        let y = super::super::frozen::linear(lin, x, true).unwrap();
        let delta = x.matmul(&a.t().unwrap()).unwrap();
        let delta = (delta.matmul(&b.t().unwrap()).unwrap() * scale).unwrap();
        (y + delta).unwrap()
    }

    #[test]
    fn lora_linear_gives_the_elementary_ops_outputs_and_gradients_bit_for_bit() {
        // (x's shape, out, r, bias, x tracks a gradient)
        let cases: [(&[usize], usize, usize, bool, bool); 4] = [
            (&[7, 12], 10, 3, false, true),
            (&[2, 9, 8], 16, 4, true, true),
            (&[20, 9], 5, 2, false, false),
            (&[3, 1, 6], 6, 8, true, true),
        ];
        for (i, &(xs, out, r, bias, tracked)) in cases.iter().enumerate() {
            let seed = 100 * i as u64;
            let k = *xs.last().unwrap();
            let lin = candle_nn::Linear::new(
                random(&[out, k], seed + 1),
                bias.then(|| random(&[out], seed + 2)),
            );
            let x = Var::from_tensor(&random(xs, seed + 3)).unwrap();
            let x = match tracked {
                true => x.as_tensor().clone(),
                false => x.as_tensor().detach(),
            };
            let a = Var::from_tensor(&random(&[r, k], seed + 4)).unwrap();
            let b = Var::from_tensor(&random(&[out, r], seed + 5)).unwrap();
            let mut wshape = xs.to_vec();
            *wshape.last_mut().unwrap() = out;
            let w = random(&wshape, seed + 6);
            let run = |fused: bool| {
                let (at, bt) = (a.as_tensor(), b.as_tensor());
                let y = match fused {
                    true => lora_linear(&lin, &x, at, bt, 2.5).unwrap(),
                    false => {
                        let x2 = x.reshape(((x.elem_count() / k), k)).unwrap();
                        lora_elementary(&lin, &x2, at, bt, 2.5)
                            .reshape(wshape.as_slice())
                            .unwrap()
                    }
                };
                assert_eq!(y.dims(), wshape.as_slice(), "case {i}");
                let grads = (&y * &w).unwrap().sum_all().unwrap().backward().unwrap();
                assert_eq!(grads.get(&x).is_some(), tracked, "case {i}: x's gradient");
                let mut out = vec![flat(&y)];
                out.extend([at, bt].map(|t| flat(grads.get(t).unwrap())));
                if tracked {
                    out.push(flat(grads.get(&x).unwrap()));
                }
                out
            };
            let (fused, plain) = (run(true), run(false));
            for (name, (f, e)) in ["output", "dA", "dB", "dx"]
                .iter()
                .zip(fused.iter().zip(&plain))
            {
                assert!(e.iter().any(|v| *v != 0.0), "case {i}, {name}: all zero");
                assert_eq!(f, e, "case {i}, {name}");
            }
        }
    }

    #[test]
    fn lora_linear_refuses_factors_that_do_not_fit() {
        let lin = candle_nn::Linear::new(random(&[6, 4], 1), None);
        let x = random(&[3, 4], 2);
        let e = lora_linear(&lin, &x, &random(&[2, 5], 3), &random(&[6, 2], 4), 1.0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("A [2, 5]") && e.contains("do not fit"), "{e}");
        let e = lora_linear(&lin, &x, &random(&[2, 4], 3), &random(&[6, 3], 4), 1.0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("B [6, 3]"), "{e}");
    }

    #[test]
    fn attention_weights_refuse_scores_and_masks_that_do_not_fit() {
        let q = random(&[2, 2, 6, 4], 1);
        let k = random(&[2, 2, 3, 4], 2);
        let v = random(&[2, 2, 3, 4], 3);
        // t = 4 does not divide the 6 query rows of a head group.
        let e = attention(&q, &k, &v, 4, 0.5, None).unwrap_err().to_string();
        assert!(e.contains("6 query rows are not whole groups of 4"), "{e}");
        let e = attention_inference(&q, &k, &v, 4, 0.5, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("6 query rows are not whole groups of 4"), "{e}");
        // A mask for another batch size.
        let m = mask(&[0], 3, 0);
        let e = attention(&q, &k, &v, 3, 0.5, Some(&m))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("the mask holds 9 values, not (2, 1, 3, 3)"),
            "{e}"
        );
        let e = attention_inference(&q, &k, &v, 3, 0.5, Some(&m))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("the mask holds 9 values, not (2, 1, 3, 3)"),
            "{e}"
        );
        // Keys and values of different lengths.
        let e = attention(&q, &k, &random(&[2, 2, 4, 4], 3), 3, 0.5, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("v holds 64 values, k 48"), "{e}");
    }
}
