//! `y = x Wᵀ` for a frozen weight `W` whose backward returns only the input gradient.
//!
//! candle 0.11.1's matmul backward computes the gradient of both operands, even when one of them
//! is a plain (non-Var) tensor: every frozen linear of the differentiable path then costs an
//! extra weight-sized matmul, allocation and add in backward (for the lm_head, a vocab x hidden
//! one per chunk). This custom op keeps the weight out of the graph: its backward is
//! `grad_x = grad_y W` and nothing else. Used on CPU when the input tracks a gradient and the
//! weight does not; everything else takes candle's ordinary matmul (or, for a few rows without
//! gradients, the transposed product of `small_batch`).

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, DType, Layout, Shape, Storage, Tensor};

struct FrozenMatmul {
    /// (out, in)
    w: Tensor,
}

impl CustomOp1 for FrozenMatmul {
    fn name(&self) -> &'static str {
        "frozen-matmul"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let (m, k) = l.shape().dims2()?;
        let (n, k2) = self.w.dims2()?;
        if k != k2 {
            candle_core::bail!("frozen-matmul: input has {k} features, weight expects {k2}");
        }
        let (ws, wl) = self.w.storage_and_layout();
        let Storage::Cpu(ws) = &*ws else {
            candle_core::bail!("frozen-matmul: weight is not on the CPU");
        };
        let wt = wl.transpose(0, 1)?;
        let out = s.matmul(ws, (1, m, n, k), l, &wt)?;
        Ok((out, Shape::from((m, n))))
    }

    fn bwd(&self, _x: &Tensor, _y: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(grad.contiguous()?.matmul(&self.w)?))
    }
}

/// Whether `x Wᵀ` should go through [`FrozenMatmul`] (`enabled`: the base's
/// [`Kernels::frozen_matmul`](super::Kernels)).
fn applies(enabled: bool, x: &Tensor, w: &Tensor) -> bool {
    enabled
        && x.device().is_cpu()
        && x.track_op()
        && !w.track_op()
        && w.rank() == 2
        && x.dtype() == w.dtype()
}

/// `linear.forward(x)`, with a backward that skips the weight gradient when the weight is
/// frozen and the input is differentiable (CPU). `enabled: false` takes candle's own
/// matmul everywhere.
pub(crate) fn linear(
    lin: &candle_nn::Linear,
    x: &Tensor,
    enabled: bool,
) -> candle_core::Result<Tensor> {
    let w = lin.weight();
    if !applies(enabled, x, w) {
        return small_batch(lin, x, enabled);
    }
    let dims = x.dims().to_vec();
    let in_dim = *dims.last().unwrap();
    let rows: usize = dims[..dims.len() - 1].iter().product();
    let x2 = x.reshape((rows, in_dim))?.contiguous()?;
    let mut y = x2.apply_op1(FrozenMatmul { w: w.contiguous()? })?;
    if let Some(b) = lin.bias() {
        y = y.broadcast_add(b)?;
    }
    let mut out = dims;
    *out.last_mut().unwrap() = w.dim(0)?;
    y.reshape(out)
}

/// `linear.forward(x)` without gradient tracking. For 2..=16 rows (batched decoding) on CPU it
/// runs the [`super::rows`] kernel (AVX2 + FMA) or, without it, computes `(W xᵀ)ᵀ`: gemm then
/// reads the weight as a row-major left-hand side instead of packing `Wᵀ` for every call,
/// about 1.6x faster for a layer's linears and 2.4x for the lm_head at 8 rows
/// (MAPORL_BENCH_GEMM=1 in host/benches/model.rs measures it). One row (gemm's matrix-vector
/// path is already bound by memory) and larger blocks keep candle's `x Wᵀ`.
fn small_batch(lin: &candle_nn::Linear, x: &Tensor, enabled: bool) -> candle_core::Result<Tensor> {
    use candle_core::Module;
    let w = lin.weight();
    let dims = x.dims().to_vec();
    let in_dim = *dims.last().unwrap();
    let rows: usize = dims[..dims.len() - 1].iter().product();
    if !enabled
        || !x.device().is_cpu()
        || x.track_op()
        || w.rank() != 2
        || !(2..=16).contains(&rows)
    {
        return lin.forward(x);
    }
    let x2 = x.reshape((rows, in_dim))?.contiguous()?;
    let mut y = match rows_kernel(&x2, w)? {
        Some(y) => y,
        None => w.matmul(&x2.t()?)?.t()?.contiguous()?,
    };
    if let Some(b) = lin.bias() {
        y = y.broadcast_add(b)?;
    }
    let mut out = dims;
    *out.last_mut().unwrap() = w.dim(0)?;
    y.reshape(out)
}

/// `x Wᵀ` by [`super::rows`] when the CPU has it and both are contiguous f32 on the CPU.
fn rows_kernel(x: &Tensor, w: &Tensor) -> candle_core::Result<Option<Tensor>> {
    if !super::rows::available() || x.dtype() != DType::F32 || w.dtype() != DType::F32 {
        return Ok(None);
    }
    let (m, k) = x.dims2()?;
    let (n, _) = w.dims2()?;
    let (xs, xl) = x.storage_and_layout();
    let (ws, wl) = w.storage_and_layout();
    let (Storage::Cpu(CpuStorage::F32(xv)), Storage::Cpu(CpuStorage::F32(wv))) = (&*xs, &*ws)
    else {
        return Ok(None);
    };
    let (Some((x0, x1)), Some((w0, w1))) = (xl.contiguous_offsets(), wl.contiguous_offsets())
    else {
        return Ok(None);
    };
    let y = super::rows::x_wt(&xv[x0..x1], &wv[w0..w1], m, n, k);
    Ok(Some(Tensor::from_vec(y, (m, n), x.device())?))
}
