"""Shared transformer blocks (icmltools.nn): causality, masks, position hooks, exact small cases."""
import math

import pytest
import torch

from icmltools.nn import (
    ALiBi,
    DecoderStack,
    RMSNorm,
    RotaryEmbedding,
    TransformerConfig,
    alibi_slopes,
    apply_rotary,
    build_attn_mask,
    rotate_half,
)

torch.set_num_threads(1)


def _stack(pe=None, vocab=None, d=32, h=4, layers=2, seed=0):
    torch.manual_seed(seed)
    cfg = TransformerConfig(d_model=d, n_layers=layers, n_heads=h, vocab_size=vocab)
    fac = None
    if pe == "rope":
        fac = lambda i: RotaryEmbedding(cfg.head_dim)  # noqa: E731
    elif pe == "alibi":
        fac = lambda i: ALiBi(h)  # noqa: E731
    return DecoderStack(cfg, fac).eval()


@pytest.mark.parametrize("pe", [None, "rope", "alibi"])
def test_causal_future_does_not_leak(pe):
    m = _stack(pe, vocab=20)
    x = torch.randint(0, 20, (2, 12))
    y = x.clone()
    y[:, 7:] = (y[:, 7:] + 3) % 20
    with torch.no_grad():
        a, b = m(x), m(y)
    assert torch.allclose(a[:, :7], b[:, :7], atol=1e-5)
    assert not torch.allclose(a[:, 7:], b[:, 7:], atol=1e-3)


def test_embeds_and_all_true_mask_match_unmasked():
    m = _stack("rope")
    e = torch.randn(3, 9, 32)
    with torch.no_grad():
        ref = m(embeds=e)
        full = m(embeds=e, attn_mask=torch.ones(3, 9, dtype=torch.bool))
        add = m(embeds=e, attn_mask=torch.zeros(3, 9))
    assert ref.shape == (3, 9, 32)
    assert torch.allclose(ref, full, atol=1e-5) and torch.allclose(ref, add, atol=1e-5)


def test_key_padding_mask_ignores_padded_keys():
    m = _stack(None)
    e = torch.randn(1, 8, 32)
    e2 = e.clone()
    e2[:, :3] = torch.randn(1, 3, 32)  # change only the padded (left) positions
    mask = torch.ones(1, 8, dtype=torch.bool)
    mask[:, :3] = False
    with torch.no_grad():
        a, b = m(embeds=e, attn_mask=mask), m(embeds=e2, attn_mask=mask)
    assert torch.allclose(a[:, 3:], b[:, 3:], atol=1e-5)
    assert torch.isfinite(a).all()


def test_build_attn_mask_causal_and_bias():
    mask = build_attn_mask(None, 1, 2, 3, 3, True, "cpu", torch.float32, bias=torch.ones(2, 3, 3))
    assert mask.shape == (1, 2, 3, 3)
    assert mask[0, 0, 0, 1] == float("-inf") and mask[0, 1, 2, 0] == 1.0
    assert build_attn_mask(None, 1, 2, 3, 3, False, "cpu", torch.float32) is None


def test_rmsnorm_exact():
    n = RMSNorm(4)
    x = torch.tensor([[3.0, 4.0, 0.0, 0.0]])
    rms = math.sqrt((9 + 16) / 4 + 1e-6)
    assert torch.allclose(n(x), x / rms)


def test_rope_relative_position_property():
    """<R(m) q, R(n) k> depends on m - n only."""
    torch.manual_seed(0)
    pe = RotaryEmbedding(16)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)
    cos, sin = pe.cos_sin(64)

    def dot(m, n):
        return (apply_rotary(q, cos[..., m:m + 1, :], sin[..., m:m + 1, :])
                * apply_rotary(k, cos[..., n:n + 1, :], sin[..., n:n + 1, :])).sum().item()

    assert dot(10, 3) == pytest.approx(dot(50, 43), abs=1e-4)
    assert dot(7, 7) == pytest.approx((q * k).sum().item(), abs=1e-4)
    assert dot(10, 3) != pytest.approx(dot(10, 4), abs=1e-3)


def test_rotate_half_and_pi_yarn():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert rotate_half(x).tolist() == [-3.0, -4.0, 1.0, 2.0]
    pe = RotaryEmbedding(16)
    base = pe.inv_freq.clone()
    pe.set_scaling({"type": "pi", "factor": 4.0})
    assert torch.allclose(pe.inv_freq, base / 4)
    pe.set_scaling({"type": "yarn", "factor": 4.0, "original_length": 64})
    # highest frequency kept (extrapolation), lowest interpolated by the factor
    assert pe.inv_freq[0] == pytest.approx(base[0].item())
    assert pe.inv_freq[-1] == pytest.approx(base[-1].item() / 4)
    assert pe.attention_factor == pytest.approx(0.1 * math.log(4) + 1)
    pe.set_scaling(None)
    assert torch.allclose(pe.inv_freq, base)


def test_alibi_slopes():
    assert alibi_slopes(8).tolist() == pytest.approx([2 ** -(i + 1) for i in range(8)])
    assert len(alibi_slopes(6)) == 6
    b = ALiBi(2).bias(3, 3, "cpu", torch.float32)
    assert b[0, 2, 0] == pytest.approx(-2 * 2 ** -4)


def test_tables_cached_per_key_and_cleared_on_move_or_rescale():
    pe = RotaryEmbedding(8)
    a = pe.cos_sin(5)
    assert pe.cos_sin(5) is a and pe.cos_sin(6) is not a
    pe.set_scaling({"type": "pi", "factor": 2.0})
    assert not torch.equal(pe.cos_sin(5)[1], a[1])
    pe.set_scaling(None)
    assert torch.equal(pe.cos_sin(5)[1], a[1])
    pe.to(torch.float32)
    assert pe._cache == {}
    al = ALiBi(2)
    assert al.bias(3, 3, "cpu", torch.float32) is al.bias(3, 3, "cpu", torch.float32)
    for n in range(40):                                   # bounded cache
        pe.cos_sin(n + 1)
    assert len(pe._cache) <= pe.cache_size


def test_rotate_qk_matches_apply_rotary():
    from icmltools.nn import rotate_qk

    pe = RotaryEmbedding(8)
    q, k = torch.randn(1, 2, 5, 8, dtype=torch.float64), torch.randn(1, 2, 5, 8)
    cos, sin = pe.cos_sin(5)
    qr, kr = rotate_qk(q, k, cos, sin)
    assert qr.dtype == torch.float64 and kr.dtype == torch.float32
    assert torch.allclose(kr, apply_rotary(k, cos, sin))
    assert torch.equal(pe(q, k)[1], kr)
