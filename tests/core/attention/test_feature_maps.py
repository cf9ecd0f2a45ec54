"""The feature maps against their closed forms, written out here independently of the library:

* Hedgehog: phi(x) = [softmax(x W_h), softmax(-x W_h)], a softmax over each half of f features
  (not one over all 2f), floored at eps; the identity initialisation puts W_h = I (first f columns);
* T2R: phi(x) = relu(x W_h + b_h), one bias per head.

Every attention test takes its features from these maps and so does its oracle; only this file
would see a map computing the wrong formula."""

import math

import pytest
import torch

from core.attention.feature_maps import HedgehogFeatureMap, T2RFeatureMap, build_feature_map

B, H, L, D = 2, 3, 11, 8


def inputs(seed=0):
    return torch.randn(B, H, L, D, generator=torch.Generator().manual_seed(seed)) * 2


def hedgehog_by_hand(x, weight):
    """Loop over heads, tokens and features: exp(u_i) / sum_{i' in the same half} exp(u_i')."""
    out = torch.empty(B, H, L, 2 * weight.shape[-1], dtype=torch.float64)
    for h in range(H):
        for b in range(B):
            for t in range(L):
                u = x[b, h, t].double() @ weight[h].double()
                for sign, half in ((1, slice(0, u.shape[0])), (-1, slice(u.shape[0], 2 * u.shape[0]))):
                    e = [math.exp(sign * value) for value in u.tolist()]
                    out[b, h, t, half] = torch.tensor([v / sum(e) for v in e])
    return out


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "autograd"])
def test_hedgehog_is_a_softmax_over_each_half(grad):
    fmap = HedgehogFeatureMap(H, D, 6, init="random")
    x = inputs().requires_grad_(grad)
    phi = fmap(x)
    assert phi.shape == (B, H, L, 12)
    assert torch.allclose(phi.double(), hedgehog_by_hand(x.detach(), fmap.weight.detach()), atol=1e-6)
    assert torch.allclose(phi.sum(-1), torch.full((B, H, L), 2.0), atol=1e-5)  # two distributions
    one_softmax = torch.softmax(torch.cat([x @ fmap.weight, -x @ fmap.weight], -1), -1)
    assert (phi - one_softmax).abs().max() > 1e-2  # what a single softmax over 2f features would give


def test_hedgehog_identity_init_reads_the_first_coordinates():
    fmap = build_feature_map("hedgehog", H, D, 5)  # the recipe's init: W_h = first f columns of I
    x = inputs(1)
    want = torch.cat([torch.softmax(x[..., :5], -1), torch.softmax(-x[..., :5], -1)], -1)
    assert torch.allclose(fmap(x), want, atol=1e-6)
    wide = build_feature_map("hedgehog", H, D, 12)  # f > d: zero-padded columns give exp(0) = 1 weights
    assert torch.allclose(wide.weight[:, :, D:], torch.zeros(H, D, 4))
    assert torch.equal(wide.weight[0, :, :D], torch.eye(D))


def test_hedgehog_floors_at_eps():
    fmap = HedgehogFeatureMap(1, 2, 2, init="identity", eps=1e-6)
    x = torch.tensor([[[[200.0, -200.0]]]])  # softmax underflows to 0 for the small entries
    phi = fmap(x)
    assert phi.min().item() == pytest.approx(1e-6) and phi.max().item() == pytest.approx(1.0)


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "autograd"])
def test_t2r_is_relu_of_an_affine_map_with_one_bias_per_head(grad):
    fmap = T2RFeatureMap(H, D, 7, init="random")
    with torch.no_grad():
        fmap.bias.copy_(torch.tensor([0.5, -0.3, 1.2]))
    x = inputs(2).requires_grad_(grad)
    phi = fmap(x)
    want = torch.empty(B, H, L, 7)
    for h in range(H):
        want[:, h] = torch.clamp(x.detach()[:, h] @ fmap.weight.detach()[h] + fmap.bias.detach()[h], min=0)
    assert torch.allclose(phi, want, atol=1e-6)
    assert (phi == 0).any() and (phi > 0).any()
    unbiased = torch.relu(torch.einsum("bhld,hdf->bhlf", x.detach(), fmap.weight.detach()))
    assert (phi - unbiased).abs().max() > 0.1  # the bias enters


def test_maps_in_pieces_equal_the_whole():
    """Inference on CPU runs the maps over cache-sized pieces of rows and tokens: same values."""
    x = torch.randn(4, H, 3000, D, generator=torch.Generator().manual_seed(3))
    for fmap in (HedgehogFeatureMap(H, D, 32, init="random"), T2RFeatureMap(H, D, 32, init="random")):
        with torch.no_grad():
            pieces = fmap(x)
        whole = fmap(x.requires_grad_(True)).detach()  # autograd takes the whole tensor
        x.requires_grad_(False)
        assert torch.allclose(pieces, whole, atol=1e-6)
