from __future__ import annotations

import math

import pytest

from agentpool.models import (
    DecodeModel,
    LinearAttentionCost,
    NodeModel,
    PrefillBatchItem,
    PrefillModel,
    TtftSlo,
    Work,
    moe_fraction,
)


def test_attention_pairs_hand_computed() -> None:
    # 3 uncached after 10 cached: token i attends 10 + i  -> 11 + 12 + 13 = 36
    assert Work(t_uc=3, t_c=10).attention_pairs == 36


def test_prefill_iteration_eq1_hand_computed() -> None:
    m = PrefillModel(c0=0.01, c1=1e-5, c2=1e-9, c3=2e-6)
    batch = [PrefillBatchItem(t_uc=100, t_c=1000, t_rst=500), PrefillBatchItem(t_uc=50)]
    a = 100 * 1000 + 100 * 101 / 2 + 50 * 51 / 2
    assert m.iteration_time(batch) == pytest.approx(0.01 + 1e-5 * 150 + 1e-9 * a + 2e-6 * 500)


def test_prefill_request_time_eq3_and_single_request_matches_iteration() -> None:
    m = PrefillModel(c0=0.02, c1=2e-5, c2=3e-10, c3=1e-6)
    w = Work(t_uc=4096, t_c=8192)
    # When the request is the whole iteration (t_bar == t_uc) and restores all cached tokens (f=1),
    # Eq. 3 equals Eq. 1 for that single-request batch.
    eq3 = m.request_time(w, t_bar=4096, f_restore=1.0)
    eq1 = m.iteration_time([PrefillBatchItem(t_uc=4096, t_c=8192, t_rst=8192)])
    assert eq3 == pytest.approx(eq1)
    assert m.request_time(w, t_bar=8192, f_restore=0.0) == pytest.approx(
        0.02 * 0.5 + 2e-5 * 4096 + 3e-10 * w.attention_pairs
    )


def test_decode_eq2_eq4_and_moe_fraction() -> None:
    d = DecodeModel(d0=0.010, d1=0.020, d2=0.0002, experts_active=8, experts_total=128)
    phi = 1 - (1 - 8 / 128) ** 16
    assert d.phi(16) == pytest.approx(phi)
    assert d.iteration_time(16) == pytest.approx(0.010 + 0.020 * phi + 0.0002 * 16)
    w = Work(t_uc=0, t_out=300, t_acc=1.5)
    assert d.request_time(w, 16) == pytest.approx(d.iteration_time(16) * 300 / (16 * 1.5))
    assert moe_fraction(5, 0, 0) == 1.0
    assert moe_fraction(0, 8, 128) == 0.0


def test_node_rates() -> None:
    n = NodeModel(PrefillModel(0.01, 1e-5, 0, 0), DecodeModel(0.01, 0, 0, experts_total=0), t_bar=1000)
    w = Work(t_uc=1000, t_out=100)
    assert n.prefill_rate(w) == pytest.approx(1 / (0.01 + 0.01))
    assert n.decode_rate(w, 10) == pytest.approx(1 / (0.01 * 100 / 10))
    assert math.isinf(n.prefill_rate(Work(t_uc=0)))


def test_slo_and_smetric_cost() -> None:
    assert TtftSlo(base=1.0, per_token=1e-4).deadline(10_000) == pytest.approx(2.0)
    c = LinearAttentionCost(c_linear=1e-5, c_attn=1e-9)
    assert c.cost(100, 1000) == pytest.approx(1e-5 * 100 + 1e-9 * 100 * (1000 - 50))
    with pytest.raises(ValueError):
        c.cost(10, 5)
    with pytest.raises(ValueError):
        TtftSlo(base=0, per_token=0)


@pytest.mark.parametrize("bad", [dict(t_uc=-1), dict(t_uc=1, t_acc=0)])
def test_work_validation(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Work(**bad)
