"""FedGATConv against PyG's exact GATConv with copied weights."""

import itertools

import numpy as np
import pytest
import torch

from fedgat.approx import fit_score
from fedgat.encodings import EncodingBucket, Encodings, encode
from fedgat.layer import FedGATConv, output_error_bound
from fedgat.synthetic import synthetic_graph

from graph_helpers import random_csr, unit_rows


def layer_and_reference(x, csr, variant, score, heads=4, out=5, seed=0, concat=True, rng=1):
    torch.manual_seed(seed)
    layer = FedGATConv(x.shape[1], out, heads=heads, concat=concat, score=score).to(x.dtype).eval()
    with torch.no_grad():
        layer.bias.normal_()
    enc = encode(variant, x, csr, rng=rng)
    ours = layer(enc)
    ref = layer.to_gatconv().to(x.dtype).eval()(x, csr.to_edge_index())
    return layer, ours, ref


@pytest.fixture(scope="module")
def small():
    csr = random_csr(60, 9, seed=11)
    return csr, unit_rows(60, 16, seed=12).float()


@pytest.mark.parametrize("variant", ["matrix", "vector"])
@pytest.mark.parametrize("concat", [True, False])
def test_matches_gatconv_within_bound(small, variant, concat):
    csr, x = small
    layer, ours, ref = layer_and_reference(x, csr, variant, fit_score(degree=16), concat=concat)
    err = (ours - ref).abs().max().item()
    assert err <= output_error_bound(layer)
    # the polynomial is good to a few percent here; a wrong encoding would be off by O(1)
    assert err < 0.05 * ref.abs().max().item()


def test_error_falls_with_degree(small):
    csr, x = small
    x = x.double()
    enc = encode("vector", x, csr, rng=1)
    errs = []
    for p in (4, 8, 16, 24):
        torch.manual_seed(0)
        layer = FedGATConv(x.shape[1], 5, heads=4, score=fit_score("smooth_leaky_relu", degree=p)).double()
        errs.append((layer(enc) - _smooth_gat(layer, x, csr)).abs().max().item())
        assert errs[-1] <= output_error_bound(layer)
    assert all(a > b for a, b in itertools.pairwise(errs)), errs


def _smooth_gat(layer, x, csr):
    """Exact GAT with psi = smooth LeakyReLU, by direct per-edge softmax (test oracle)."""
    W, b1, b2, gamma = layer._head_weights()
    ei = csr.to_edge_index()
    src, dst = ei
    logits = gamma * ((x @ b1.T)[dst] + (x @ b2.T)[src])  # (E, H)
    scores = torch.from_numpy(layer.score.exact(logits.detach().numpy())).to(x.dtype)
    den = torch.zeros(x.shape[0], layer.heads, dtype=x.dtype).index_add_(0, dst, scores)
    z = torch.einsum("hfd,ed->ehf", W, x[src])
    num = torch.zeros(x.shape[0], layer.heads, layer.out_channels, dtype=x.dtype).index_add_(
        0, dst, scores[:, :, None] * z
    )
    return (num / den[:, :, None]).reshape(x.shape[0], -1) + layer.bias


def test_matrix_and_vector_agree(small):
    csr, x = small
    score = fit_score(degree=16)
    _, a, _ = layer_and_reference(x.double(), csr, "matrix", score, rng=3)
    torch.manual_seed(0)
    layer = FedGATConv(x.shape[1], 5, heads=4, score=score).double().eval()
    with torch.no_grad():
        layer.bias.normal_()
    b = layer(encode("vector", x.double(), csr, rng=4))
    torch.testing.assert_close(a.double(), b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant", ["matrix", "vector"])
def test_gradients_match_finite_differences(small, variant):
    csr, x = small
    torch.manual_seed(0)
    layer = FedGATConv(x.shape[1], 3, heads=2, score=fit_score(degree=8)).double()
    enc = encode(variant, x.double(), csr, rng=5)
    params = [layer.lin.weight, layer.att_src, layer.att_dst]

    out = layer(enc).square().sum()
    grads = torch.autograd.grad(out, params)
    assert all(g.abs().sum() > 0 for g in grads)
    assert torch.autograd.gradcheck(
        lambda w: _with_weight(layer, enc, w),
        (layer.lin.weight.detach().clone().requires_grad_(),),
        eps=1e-6,
        atol=1e-5,
    )


def _with_weight(layer, enc, w):
    original = layer.lin.weight
    del layer.lin.weight
    layer.lin.weight = w
    try:
        return layer(enc)
    finally:
        layer.lin.weight = original


def test_logits_never_leave_domain(small):
    csr, x = small
    layer = FedGATConv(x.shape[1], 4, heads=3, score=fit_score(degree=16, domain=2.0))
    with torch.no_grad():
        layer.att_src.mul_(50.0)  # push ||b1|| + ||b2|| far past the domain
    _, b1, b2, gamma = layer._head_weights()
    src, dst = csr.to_edge_index()
    logits = gamma * ((x @ b1.T)[dst] + (x @ b2.T)[src])
    assert (gamma < 1).all()
    assert logits.abs().max() <= 2.0 + 1e-6


def test_on_cora_against_gatconv(cora):
    from fedgat.partition import make_partition

    part = make_partition(cora, num_clients=1, beta=1.0, seed=0, neighbour_cap=16)
    csr = part.neighbourhoods
    x = cora.x
    for variant in ("vector", "matrix"):
        nodes = np.arange(cora.num_nodes) if variant == "vector" else np.arange(0, cora.num_nodes, 7)
        torch.manual_seed(0)
        layer = FedGATConv(x.shape[1], 8, heads=8, score=fit_score(degree=16)).eval()
        enc = encode(variant, x, csr, nodes=nodes, rng=0)
        ref = layer.to_gatconv().eval()(x, csr.to_edge_index())[torch.from_numpy(nodes)]
        for ours in (layer(enc), layer(enc.compact().factorise())):
            err = (ours - ref).abs().max().item()
            assert err <= output_error_bound(layer)
            assert err < 0.02 * ref.abs().max().item(), (variant, err)


@pytest.mark.parametrize("variant", ["matrix"])
def test_compacted_encodings_give_the_same_output_and_gradients(variant):
    csr = random_csr(50, 6, seed=21)
    x = torch.relu(unit_rows(50, 40, seed=22)) * (
        torch.rand(50, 40, generator=torch.Generator().manual_seed(3)) < 0.2
    )
    x = torch.nn.functional.normalize(x, dim=1).double()  # sparse, bag-of-words-like
    enc = encode(variant, x, csr, rng=9).with_dense_M2()
    small = enc.compact()
    assert sum(b.M2.shape[-1] for b in small.buckets) < sum(b.M2.shape[-1] for b in enc.buckets)
    assert encode("vector", x, csr, rng=9).compact().buckets[0].cols is None  # nothing to compact
    torch.manual_seed(0)
    layer = FedGATConv(40, 3, heads=2, score=fit_score(degree=16)).double()
    dense_out = layer(enc)
    dense_grad = torch.autograd.grad(dense_out.square().sum(), [layer.lin.weight, layer.att_src])
    small_out = layer(small)
    small_grad = torch.autograd.grad(small_out.square().sum(), [layer.lin.weight, layer.att_src])
    torch.testing.assert_close(small_out, dense_out)
    for a, b in zip(small_grad, dense_grad):
        torch.testing.assert_close(a, b)


def _bow_graph(seed=21):
    csr = random_csr(50, 6, seed=seed)
    x = torch.relu(unit_rows(50, 40, seed=seed + 1)) * (
        torch.rand(50, 40, generator=torch.Generator().manual_seed(3)) < 0.2
    )
    return csr, torch.nn.functional.normalize(x, dim=1).double()  # sparse, bag-of-words-like


def _output_and_grads(layer, enc):
    out = layer(enc)
    return [out, *torch.autograd.grad(out.square().sum(), [layer.lin.weight, layer.att_src, layer.att_dst])]


@pytest.mark.parametrize("compact", [False, True])
def test_factorised_matrix_encodings_give_the_same_output_and_gradients(compact):
    csr, x = _bow_graph()
    enc = encode("matrix", x, csr, rng=9)
    enc = enc.with_dense_M2().compact() if compact else enc
    fact = enc.factorise()
    assert fact.factorised and not enc.factorised
    assert all(b.factors.residual < 1e-12 for b in fact.buckets)
    assert all(b.factors.R.shape[1] == b.bases.n for b in fact.buckets)
    torch.manual_seed(0)
    layer = FedGATConv(40, 3, heads=2, score=fit_score(degree=16)).double()
    for a, b in zip(_output_and_grads(layer, fact), _output_and_grads(layer, enc)):
        torch.testing.assert_close(a, b)
    vec = encode("vector", x, csr, rng=9)
    assert vec.factorise().buckets[0] is vec.buckets[0]  # nothing to factorise


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_factorised_sparse_path_matches_the_padded_dense_one(dtype):
    """The factorised matrix layer's block-diagonal sparse path (``_MatrixPlan``, one plan per
    encodings, dtype and head count) against the padded per-group path, outputs and gradients."""
    from fedgat import layer as layer_module

    csr, x = _bow_graph(seed=41)
    enc = encode("matrix", x.to(dtype), csr, rng=5).factorise()
    torch.manual_seed(0)
    layer = FedGATConv(40, 3, heads=2, score=fit_score(degree=16)).to(dtype)
    params = [layer.lin.weight, layer.att_src, layer.att_dst]
    W, b1, b2, gamma = layer._head_weights()
    Wf = W.reshape(6, -1)
    padded = torch.cat(layer._matrix_outputs(enc, Wf, b1, b2, gamma))[enc.order]
    sparse = layer._factorised_outputs(enc, Wf, gamma)
    g = torch.randn(sparse.shape, dtype=dtype, generator=torch.Generator().manual_seed(2))
    tol = {} if dtype == torch.float64 else {"rtol": 1e-4, "atol": 1e-5}
    torch.testing.assert_close(sparse, padded, **tol)
    want = torch.autograd.grad((padded * g).sum(), params, retain_graph=True)
    for a, b in zip(torch.autograd.grad((sparse * g).sum(), params), want):
        torch.testing.assert_close(a, b, **tol)
    plan = layer_module._matrix_plan(enc, dtype, 2)
    assert (
        layer_module._matrix_plan(enc, dtype, 2) is plan
        and layer_module._matrix_plan(enc, dtype, 3) is not plan
    )


def test_factorise_tolerates_decryption_noise_and_refuses_foreign_rows():
    csr, x = _bow_graph(seed=31)
    enc = encode("matrix", x.float(), csr, rng=4).with_dense_M2()
    g = torch.Generator().manual_seed(0)
    noisy = Encodings(
        enc.variant,
        enc.nodes,
        [
            EncodingBucket(
                b.bases,
                b.h_self + 1e-6 * torch.randn(b.h_self.shape, generator=g),
                b.K2 + 1e-6 * torch.randn(b.K2.shape, generator=g),
                b.M2 + 1e-6 * torch.randn(b.M2.shape, generator=g),
            )
            for b in enc.buckets
        ],
    )
    torch.manual_seed(0)
    layer = FedGATConv(40, 3, heads=2).eval()
    torch.testing.assert_close(layer(noisy.compact(1e-5).factorise()), layer(enc), atol=1e-4, rtol=0)
    # a row that is not a combination of the neighbours' features cannot be factorised
    bucket = enc.buckets[-1]
    M2 = bucket.M2.clone()
    M2[0, 0] += 0.01 * torch.randn(M2.shape[-1], generator=g)
    bad = EncodingBucket(bucket.bases, bucket.h_self, bucket.K2, M2)
    with pytest.raises(ValueError, match="not combinations"):
        bad.factorise()
    assert bad.factors is None


def test_vector_layer_with_embed_factor_and_its_cached_sparse_plan(small):
    """The vector path's block-diagonal sparse operators (``_VectorPlan``): ``m = 2n`` rows per node,
    one plan per (encodings, dtype), reused across calls and dropped with the encodings."""
    import gc

    from fedgat import layer as layer_module

    csr, x = small
    enc = encode("vector", x.double(), csr, rng=6, embed_factor=2)
    assert all(b.bases.m == 2 * b.bases.n for b in enc.buckets)
    torch.manual_seed(0)
    layer = FedGATConv(x.shape[1], 5, heads=4, score=fit_score(degree=16)).double().eval()
    ours = layer(enc)
    ref = layer.to_gatconv().double().eval()(x.double(), csr.to_edge_index())
    assert (ours - ref).abs().max().item() <= output_error_bound(layer)
    plan = layer_module._vector_plan(enc, torch.float64)
    torch.testing.assert_close(layer(enc), ours)
    assert layer_module._vector_plan(enc, torch.float64) is plan
    float_plan = layer_module._vector_plan(enc, torch.float32)  # row sums in the layer's dtype
    assert float_plan is not plan and float_plan.row_sum.A.dtype == torch.float32
    float_out = layer.float()(encode("vector", x, csr, rng=6, embed_factor=2))
    torch.testing.assert_close(float_out.double(), ours, atol=1e-5, rtol=1e-4)
    keys = [k for k in layer_module._PLANS if k[0] == id(enc)]
    assert len(keys) == 2
    del enc, plan
    gc.collect()
    assert not any(k in layer_module._PLANS for k in keys)


def test_polynomial_backward_is_the_derivative():
    from fedgat.layer import _Polynomial

    coeffs = fit_score(degree=8).power.tolist()
    x = torch.linspace(-3.9, 3.9, 41, dtype=torch.float64).view(-1, 1).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: _Polynomial.apply(t, coeffs), (x,))
    horner = torch.zeros_like(x)
    for c in reversed(coeffs):
        horner = horner * x + c
    torch.testing.assert_close(_Polynomial.apply(x, coeffs), horner)


_METADATA_OPS = {
    "aten::" + name
    for name in [
        "empty",
        "empty_like",
        "empty_strided",
        "as_strided",
        "expand",
        "view",
        "view_as",
        "reshape",
        "_reshape_alias",
        "slice",
        "select",
        "t",
        "transpose",
        "alias",
        "unsqueeze",
        "detach",
        "resolve_conj",
        "resolve_neg",
        "lift_fresh",
        "result_type",
    ]
}


def _aten_ops(fn) -> int:
    """Operators ``fn`` dispatches that do work (leaves of the aten call tree, views and allocations left
    out): on a GPU each is a kernel launch."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(
        1
        for e in prof.events()
        if e.name.startswith("aten::")
        and e.name not in _METADATA_OPS
        and not any(c.name.startswith("aten::") for c in e.cpu_children)
    )


def test_polynomial_from_powers_matches_horner_with_few_launches():
    from fedgat.layer import _Polynomial

    power = fit_score().power  # degree 16, as the layer uses it
    coeffs = power.tolist()
    table = torch.tensor(coeffs, dtype=torch.float64)
    exponents = torch.arange(1, len(coeffs), dtype=torch.float64)
    dtable = table[1:] * exponents
    x = (torch.rand(300, 8, dtype=torch.float64) * 9.8 - 4.9).requires_grad_()
    horner = _Polynomial.apply(x, coeffs)
    powers = _Polynomial.apply(x, coeffs, table, dtable, exponents)
    torch.testing.assert_close(powers, horner, rtol=1e-9, atol=1e-9)  # float64 rounding; float32 follows
    (g_h,) = torch.autograd.grad(horner.sum(), x)
    (g_p,) = torch.autograd.grad(powers.sum(), x)
    torch.testing.assert_close(g_p, g_h, rtol=1e-9, atol=1e-9)
    small = torch.linspace(-3.9, 3.9, 41, dtype=torch.float64).view(-1, 1).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda t: _Polynomial.apply(t, coeffs, table, dtable, exponents), (small,)
    )
    # launches are what a GPU epoch pays for: Horner issues ~4 per degree, the power path a handful
    n_horner = _aten_ops(lambda: _Polynomial.apply(x, coeffs).sum().backward())
    n_powers = _aten_ops(lambda: _Polynomial.apply(x, coeffs, table, dtable, exponents).sum().backward())
    assert n_horner >= 4 * (len(coeffs) - 1) and n_powers <= 12, (n_horner, n_powers)


def test_vector_layer_with_the_power_polynomial_matches_the_cpu_path(monkeypatch):
    import fedgat.layer as layer_module

    g = synthetic_graph(num_nodes=60, num_features=10, train_per_class=4, num_val=8, num_test=8, seed=5)
    enc = encode("vector", g.x, g.neighbourhoods(), rng=0)
    torch.manual_seed(0)
    layer = FedGATConv(10, 4, heads=3)
    want = layer(enc)
    (want_grad,) = torch.autograd.grad(want.square().sum(), layer.lin.weight)
    monkeypatch.setattr(layer_module, "_powers_on", lambda device: True)
    got = layer(enc)
    (got_grad,) = torch.autograd.grad(got.square().sum(), layer.lin.weight)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-5, atol=1e-6)


def test_vector_plan_keeps_one_csr_pair(small):
    """The vector plan stores ``Q`` and its transpose once each (``2 sum_i m_i n_i`` values, int32
    indices): the logits are ``Q^T`` applied to the attention rows, the spread ``Q``, each the other's
    backward."""
    from fedgat import layer as layer_module

    csr, x = small
    enc = encode("vector", x.double(), csr, rng=3)
    plan = layer_module._vector_plan(enc, torch.float64)
    slots = sum(len(b.bases) * b.bases.m * b.bases.n for b in enc.buckets)
    assert plan.spread.A is plan.gather.At and plan.gather.A is plan.spread.At
    assert plan.spread.A._nnz() == plan.gather.A._nnz() == slots
    assert plan.spread.A.col_indices().dtype == torch.int32
    dense = torch.block_diag(*[q for b in enc.buckets for q in b.plain["Q"]])  # bucket order
    torch.testing.assert_close(plan.spread.A.to_dense(), dense)
    torch.testing.assert_close(plan.gather.A.to_dense(), dense.T)
