"""Reference routing (fusedmoe.reference.routing) against hand-checked cases.

Expected ids and weights are literals or closed-form expressions (exp, sigmoid) worked out
by hand in the comments; a few randomized checks test invariants only.
"""
import math

import pytest
import torch

from fusedmoe.config import Routing
from fusedmoe.errors import ConfigError, ConfigTypeError, InputError
from fusedmoe.reference.routing import (RoutingResult, get_routing_fn, register_routing_fn,
                                        registered_routing_fns, route, stable_topk)


def sig(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def check(res: RoutingResult, ids, weights, atol=1e-6):
    assert res.topk_ids.dtype == torch.int32 and res.topk_weights.dtype == torch.float32
    assert res.topk_ids.tolist() == ids
    torch.testing.assert_close(res.topk_weights, torch.tensor(weights, dtype=torch.float32), atol=atol, rtol=0)


# ----------------------------------------------------------------------------------------- #
# plain top-k
# ----------------------------------------------------------------------------------------- #
def test_softmax_renormalize():
    # top-2 of [1, 3, 2, 0] = experts 1, 2; renormalized softmax = e^3, e^2 over (e^3 + e^2)
    res = route(torch.tensor([[1.0, 3.0, 2.0, 0.0]]), 2, Routing())
    check(res, [[1, 2]], [[1 / (1 + math.exp(-1)), 1 / (1 + math.exp(1))]])


def test_softmax_no_renormalize():
    # softmax over all four experts, not renormalized: e^3 / S, e^2 / S with S = 1 + e + e^2 + e^3
    s = 1 + math.e + math.exp(2) + math.exp(3)
    res = route(torch.tensor([[1.0, 3.0, 2.0, 0.0]]), 2, Routing(renormalize=False))
    check(res, [[1, 2]], [[math.exp(3) / s, math.exp(2) / s]])
    torch.testing.assert_close(res.topk_weights, torch.tensor([[0.6439142598879724, 0.23688281808991016]]))


def test_sigmoid_two_tokens():
    logits = torch.tensor([[0.0, 2.0, -1.0, 1.0],
                           [-3.0, -2.0, 4.0, 0.5]])
    res = route(logits, 2, Routing(scoring="sigmoid", renormalize=False))
    check(res, [[1, 3], [2, 3]], [[sig(2), sig(1)], [sig(4), sig(0.5)]])
    res = route(logits, 2, Routing(scoring="sigmoid", renormalize=True))
    check(res, [[1, 3], [2, 3]], [[sig(2) / (sig(2) + sig(1)), sig(1) / (sig(2) + sig(1))],
                                  [sig(4) / (sig(4) + sig(0.5)), sig(0.5) / (sig(4) + sig(0.5))]])


def test_ties_go_to_lower_index():
    # three experts tie at 2.0: the two lower indices win; four equal logits: 0, 1, 2
    res = route(torch.tensor([[1.0, 2.0, 2.0, 2.0, 0.5]]), 2, Routing())
    check(res, [[1, 2]], [[0.5, 0.5]])
    res = route(torch.tensor([[5.0, 5.0, 5.0, 5.0]]), 3, Routing(scoring="sigmoid"))
    check(res, [[0, 1, 2]], [[1 / 3, 1 / 3, 1 / 3]])
    # ties after the first pick: 7 wins, then 0 and 4 tie -> 0
    res = route(torch.tensor([[1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 3.0]]), 2, Routing(renormalize=False))
    assert res.topk_ids.tolist() == [[7, 0]]


def test_stable_topk_ties():
    vals, idx = stable_topk(torch.tensor([[0.0, 1.0, 1.0, -1.0, 1.0]]), 3)
    assert idx.tolist() == [[1, 2, 4]] and vals.tolist() == [[1.0, 1.0, 1.0]]


def test_routed_scaling_factor():
    res = route(torch.tensor([[1.0, 3.0, 2.0, 0.0]]), 2, Routing(routed_scaling_factor=2.5))
    check(res, [[1, 2]], [[2.5 / (1 + math.exp(-1)), 2.5 / (1 + math.exp(1))]])


# ----------------------------------------------------------------------------------------- #
# correction bias and grouped top-k (DeepSeek)
# ----------------------------------------------------------------------------------------- #
def test_bias_changes_selection_not_weights():
    # sigmoid scores of [2, 1, 0, -1]; bias +5 on expert 2 makes it win although its score is lowest
    # but one; the weight stays the unbiased sigmoid(0) = 0.5 (not 5.5)
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    bias = torch.tensor([0.0, 0.0, 5.0, 0.0])
    r = Routing(scoring="sigmoid", renormalize=False, has_correction_bias=True)
    check(route(logits, 2, r, bias), [[2, 0]], [[0.5, sig(2)]])
    r = Routing(scoring="sigmoid", renormalize=True, has_correction_bias=True)
    check(route(logits, 2, r, bias), [[2, 0]], [[0.5 / (0.5 + sig(2)), sig(2) / (0.5 + sig(2))]])
    # the same logits without bias pick 0, 1
    assert route(logits, 2, Routing(scoring="sigmoid")).topk_ids.tolist() == [[0, 1]]


def test_grouped_with_bias_top2_group_score():
    # E=8 in 4 groups of 2, logits 0 -> every score is 0.5, selection = 0.5 + bias:
    #   g0 [1.5, 0.0] top2-sum 1.5 (max 1.5)   g1 [1.0, 1.0] sum 2.0   g2 [1.25, 0.625] sum 1.875
    #   g3 [0.5, 0.5] sum 1.0
    # keep 2 groups by top-2 sum -> g1, g2 -> experts {2, 3, 4, 5}; top-2: 4 (1.25), then 2 and 3 tie (1.0) -> 2.
    # (by max it would keep g0, g2 -> [0, 4]; ungrouped also [0, 4])
    bias = torch.tensor([1.0, -0.5, 0.5, 0.5, 0.75, 0.125, 0.0, 0.0])
    logits = torch.zeros(1, 8)
    r = Routing(scoring="sigmoid", renormalize=True, num_groups=4, topk_groups=2, has_correction_bias=True,
                routed_scaling_factor=2.5)
    check(route(logits, 2, r, bias), [[4, 2]], [[1.25, 1.25]])  # 0.5 / 1.0 renormalized, * 2.5
    ungrouped = Routing(scoring="sigmoid", has_correction_bias=True)
    assert route(logits, 2, ungrouped, bias).topk_ids.tolist() == [[0, 4]]


def test_grouped_without_bias_uses_group_max():
    # E=8, 4 groups of 2. group maxima: g0 3.0, g1 0.0, g2 3.5, g3 1.0; keep 1 group -> g2 = {4, 5}
    # ungrouped top-2 would be [4, 0]; grouped it is [4, 5]. Weights: softmax over all 8, renormalized.
    logits = torch.tensor([[3.0, -5.0, 0.0, 0.0, 3.5, 0.0, 1.0, 1.0]])
    r = Routing(num_groups=4, topk_groups=1)
    check(route(logits, 2, r), [[4, 5]], [[1 / (1 + math.exp(-3.5)), 1 / (1 + math.exp(3.5))]])
    assert route(logits, 2, Routing()).topk_ids.tolist() == [[4, 0]]
    # keep 2 groups: g2 and g0 -> top-2 [4, 0]
    assert route(logits, 2, Routing(num_groups=4, topk_groups=2)).topk_ids.tolist() == [[4, 0]]


def test_grouped_ties_pick_lower_groups():
    # all equal: groups 0 and 1 are kept, experts 0 and 1 chosen
    r = Routing(scoring="sigmoid", num_groups=4, topk_groups=2, has_correction_bias=True)
    res = route(torch.zeros(2, 8), 3, r, torch.zeros(8))
    check(res, [[0, 1, 2], [0, 1, 2]], [[1 / 3] * 3] * 2)


def test_grouped_random_invariants():
    # DeepSeek-V3 shape: every chosen expert lies in one of the topk_groups kept groups
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(64, 256, generator=g)
    bias = 0.1 * torch.randn(256, generator=g)
    r = Routing(scoring="sigmoid", num_groups=8, topk_groups=4, has_correction_bias=True, routed_scaling_factor=2.5)
    res = route(logits, 8, r, bias)
    groups = (res.topk_ids // 32).long()
    assert all(len(set(row)) <= 4 for row in groups.tolist())
    assert all(len(set(row)) == 8 for row in res.topk_ids.tolist())
    torch.testing.assert_close(res.topk_weights.sum(-1), torch.full((64,), 2.5))
    torch.testing.assert_close(res.topk_weights, torch.sigmoid(logits).gather(1, res.topk_ids.long())
                               / torch.sigmoid(logits).gather(1, res.topk_ids.long()).sum(-1, keepdim=True) * 2.5)


def test_random_matches_torch_topk_set():
    # without ties, the chosen set equals torch.topk's; bf16 logits are scored in fp32
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(33, 60, generator=g).to(torch.bfloat16)
    res = route(logits, 6, Routing(renormalize=False))
    want = torch.softmax(logits.float(), -1).topk(6, -1)
    assert res.topk_ids.shape == (33, 6)
    torch.testing.assert_close(res.topk_weights, want.values)


# ----------------------------------------------------------------------------------------- #
# custom routing
# ----------------------------------------------------------------------------------------- #
def test_builtin_sqrtsoftplus():
    # scores sqrt(softplus([0, 1, 2, -1])): top-2 = experts 2 (1.45840), 1 (1.14598)
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0]])
    res = route(logits, 2, Routing(custom="sqrtsoftplus", renormalize=False))
    check(res, [[2, 1]], [[1.4583991261115636, 1.145976303209723]])
    res = route(logits, 2, Routing(custom="sqrtsoftplus", renormalize=True, routed_scaling_factor=2.0))
    check(res, [[2, 1]], [[2 * 0.5599803736789323, 2 * (1 - 0.5599803736789323)]])
    assert "sqrtsoftplus" in registered_routing_fns()


def test_custom_fn_registered_and_called():
    seen = {}

    def last_k(hidden_states, router_logits, top_k, renormalize):
        seen["args"] = (hidden_states.shape, router_logits.shape, top_k, renormalize)
        T, E = router_logits.shape
        ids = torch.arange(E - top_k, E).expand(T, top_k)  # int64 on purpose: cast to int32
        return torch.full((T, top_k), 0.25, dtype=torch.float16), ids

    register_routing_fn("test_last_k", last_k)
    register_routing_fn("test_last_k", last_k)  # same function again: fine
    assert get_routing_fn("test_last_k") is last_k
    h = torch.randn(3, 16)
    res = route(torch.randn(3, 8), 2, Routing(custom="test_last_k", renormalize=False, routed_scaling_factor=2.0),
                hidden_states=h)
    assert seen["args"] == (torch.Size([3, 16]), torch.Size([3, 8]), 2, False)
    check(res, [[6, 7]] * 3, [[0.5, 0.5]] * 3)

    with pytest.raises(ConfigError) as e:
        register_routing_fn("test_last_k", lambda *a: None)
    assert e.value.param == "name"
    register_routing_fn("test_last_k", lambda h, x, k, r: (torch.ones(x.shape[0], k), torch.zeros(x.shape[0], k)),
                        replace=True)
    # a function returning the wrong shape is caught, naming it
    register_routing_fn("test_bad_shape", lambda h, x, k, r: (torch.ones(1, 1), torch.zeros(1, 1)))
    with pytest.raises(InputError, match="custom routing 'test_bad_shape' weights"):
        route(torch.randn(3, 8), 2, Routing(custom="test_bad_shape"))


def test_unknown_custom_lists_registered():
    with pytest.raises(ConfigError) as e:
        route(torch.randn(2, 4), 1, Routing(custom="no_such_fn"))
    assert e.value.param == "Routing.custom" and "sqrtsoftplus" in str(e.value)
    with pytest.raises(ConfigError):
        get_routing_fn("no_such_fn")


# ----------------------------------------------------------------------------------------- #
# edges and errors
# ----------------------------------------------------------------------------------------- #
def test_empty_batch():
    for r in (Routing(), Routing(custom="sqrtsoftplus")):
        res = route(torch.randn(0, 8), 3, r)
        assert res.topk_ids.shape == (0, 3) and res.topk_ids.dtype == torch.int32
        assert res.topk_weights.shape == (0, 3) and res.topk_weights.dtype == torch.float32


def test_top_k_equals_e():
    logits = torch.tensor([[0.5, -1.0, 2.0]])
    res = route(logits, 3, Routing())
    assert res.topk_ids.tolist() == [[2, 0, 1]]
    torch.testing.assert_close(res.topk_weights.sum(), torch.tensor(1.0))


@pytest.mark.parametrize("kwargs, param", [
    (dict(router_logits=torch.randn(8)), "router_logits"),                         # 1-D
    (dict(router_logits=torch.randn(2, 3, 8)), "router_logits"),                   # 3-D
    (dict(router_logits=torch.randint(0, 5, (2, 8))), "router_logits.dtype"),      # integer logits
    (dict(top_k=0), "top_k"),
    (dict(top_k=9), "top_k"),                                                      # > E
    (dict(routing=Routing(has_correction_bias=True)), "correction_bias"),          # bias missing
    (dict(routing=Routing(has_correction_bias=True), correction_bias=torch.randn(7)), "correction_bias"),
    (dict(correction_bias=torch.randn(8)), "correction_bias"),                     # bias without the flag
    (dict(routing=Routing(num_groups=3, topk_groups=1)), "num_groups"),            # 3 does not divide 8
    (dict(routing=Routing(num_groups=4, topk_groups=1), top_k=3), "top_k"),        # only 2 experts kept
    (dict(hidden_states=torch.randn(3, 16)), "hidden_states"),                     # T mismatch
    (dict(routing=Routing(custom="sqrtsoftplus", has_correction_bias=True), correction_bias=torch.randn(8)),
     "Routing.custom"),
])
def test_bad_inputs_name_the_parameter(kwargs, param):
    args = dict(router_logits=torch.randn(2, 8), top_k=2, routing=Routing())
    args.update(kwargs)
    with pytest.raises(ConfigError) as e:
        route(**args)
    assert e.value.param == param
    assert "accepted" in str(e.value)


def test_wrong_types():
    with pytest.raises(ConfigTypeError):
        route(torch.randn(2, 8), 2.0, Routing())
    with pytest.raises(ConfigTypeError):
        route([[1.0, 2.0]], 1, Routing())
    with pytest.raises(ConfigTypeError):
        route(torch.randn(2, 8), 2, "softmax")
