"""A torch model (CUDA) of the compress arithmetic in two flavours, to tell
apart what the SPEC asks for from what the Triton reference computes:

- ``spec``: IEEE f32 division, a correctly rounded exp, separate multiply and
  add in the softmax-weighted sum (SPEC, shared numerics 5);
- ``triton``: what the reference's PTX does on the H200 (Triton 3.6 defaults):
  ``exp(t) = ex2.approx.f32(t * 0x3FB8AA3B)``, ``acc = fma.rn(p, k, acc)``,
  and ``div.full.f32`` for both ``acc / denom`` and ``x / scale``.

Everything else (Hadamard-128, bf16 and e4m3 rounding, the ue8m0 scale from
the bits of m) is shared. Used by the side-by-side test to show where kpool
and the reference differ; needs torch and triton.
"""

from __future__ import annotations

import sys

LOG2E_F32 = 1.4426950408889634  # rounds to 0x3FB8AA3B, the constant in the reference's PTX
INV_SQRT128 = 0.08838834764831845
INV_448 = 1.0 / 448.0

_kernels = None


def _triton_kernels():
    global _kernels
    if _kernels is None:
        import triton
        import triton.language as tl

        @triton.jit
        def ex2_approx_of_scaled(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            m = o < n
            v = tl.load(x_ptr + o, mask=m) * 1.4426950408889634
            r = tl.inline_asm_elementwise("ex2.approx.f32 $0, $1;", "=r,r", [v], dtype=tl.float32, is_pure=True,
                                          pack=1)
            tl.store(y_ptr + o, r, mask=m)

        @triton.jit
        def fma_rn(a_ptr, b_ptr, c_ptr, y_ptr, n, BLOCK: tl.constexpr):
            o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            m = o < n
            r = tl.inline_asm_elementwise("fma.rn.f32 $0, $1, $2, $3;", "=r,r,r,r",
                                          [tl.load(a_ptr + o, mask=m), tl.load(b_ptr + o, mask=m),
                                           tl.load(c_ptr + o, mask=m)], dtype=tl.float32, is_pure=True, pack=1)
            tl.store(y_ptr + o, r, mask=m)

        @triton.jit
        def div_full(a_ptr, b_ptr, y_ptr, n, BLOCK: tl.constexpr):
            o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            m = o < n
            r = tl.inline_asm_elementwise("div.full.f32 $0, $1, $2;", "=r,r,r",
                                          [tl.load(a_ptr + o, mask=m), tl.load(b_ptr + o, mask=m)],
                                          dtype=tl.float32, is_pure=True, pack=1)
            tl.store(y_ptr + o, r, mask=m)

        _kernels = (triton, ex2_approx_of_scaled, fma_rn, div_full)
    return _kernels


def _launch(kernel, out, *ins):
    triton = _triton_kernels()[0]
    ins = [t.contiguous() for t in ins]
    n = out.numel()
    kernel[(triton.cdiv(n, 1024),)](*ins, out, n, BLOCK=1024)
    return out


def _exp(t, flavour):
    torch = sys.modules["torch"]
    if flavour == "triton":
        return _launch(_triton_kernels()[1], torch.empty_like(t), t)
    return torch.exp(t.double()).float()  # exp in f64, rounded once: correctly rounded but for rare ties


def _fma(a, b, c):
    torch = sys.modules["torch"]
    return _launch(_triton_kernels()[2], torch.empty_like(c), a.expand_as(c), b.expand_as(c), c)


def _div(a, b, flavour):
    torch = sys.modules["torch"]
    if flavour == "triton":
        b = b.expand_as(a)
        return _launch(_triton_kernels()[3], torch.empty_like(a), a, b)
    return a / b


def hadamard128(x):
    """SPEC's order: strides 1, 2, ..., 64; i with bit s clear: x[i] + x[i+s],
    set: x[i-s] - x[i]; then times 1/sqrt(128). Last dim 128, f32."""
    shape = x.shape
    for s in (1, 2, 4, 8, 16, 32, 64):
        v = x.reshape(-1, 128 // (2 * s), 2, s)
        a, b = v[:, :, 0, :], v[:, :, 1, :]
        x = sys.modules["torch"].stack((a + b, a - b), dim=2).reshape(shape)
    return x * INV_SQRT128


def ue8m0(m):
    """2^ceil(log2(m)) from the bits of m (normal, positive m; inf for inf)."""
    torch = sys.modules["torch"]
    bits = m.view(torch.int32)
    exponent = (bits >> 23) & 0xFF
    up = ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return ((exponent + up) << 23).view(torch.float32)


def compress_rows(slot_k, slot_score, ape, round_scale=True, flavour="spec"):
    """(codes uint8 [n, 128], scales f32 [n]) of each pool."""
    torch = sys.modules["torch"]
    s = slot_score.float() + ape.float()[None]
    # Every max and min ignores NaN, as the reference's max.f32 / min.f32
    # (SPEC step 4): torch's max and clamp propagate it.
    m = torch.where(s.isnan(), float("-inf"), s).max(dim=1).values
    p = _exp(s - m[:, None], flavour)
    k = slot_k.float()
    P = s.shape[1]
    denom = p[:, 0]
    acc = p[:, 0] * k[:, 0]
    for j in range(1, P):
        denom = denom + p[:, j]
        acc = _fma(p[:, j], k[:, j], acc) if flavour == "triton" else acc + p[:, j] * k[:, j]
    x = _div(acc, denom, flavour).to(torch.bfloat16).float()
    x = hadamard128(x).to(torch.bfloat16).float()
    absmax = torch.fmax(torch.where(x.isnan(), 0.0, x.abs()).max(dim=1).values, torch.tensor(1e-4))
    m = absmax * INV_448
    scale = ue8m0(m) if round_scale else m
    y = torch.fmin(torch.fmax(_div(x, scale[:, None], flavour), torch.tensor(-448.0)), torch.tensor(448.0))
    return y.to(torch.float8_e4m3fn).view(torch.uint8), scale
