from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentpool.models import DecodeModel, NodeModel, PrefillModel, Work, WorkSlice
from agentpool.planner.throughput import NodeArrays, SliceArrays, split_throughput

coef = st.floats(min_value=1e-12, max_value=0.1)


@st.composite
def node_models(draw: st.DrawFn) -> NodeModel:
    dense = draw(st.booleans())
    total = 0 if dense else draw(st.integers(min_value=8, max_value=384))
    return NodeModel(
        prefill=PrefillModel(c0=draw(coef), c1=draw(coef), c2=draw(coef), c3=draw(coef)),
        decode=DecodeModel(
            d0=draw(coef),
            d1=draw(coef),
            d2=draw(coef),
            experts_active=0 if dense else draw(st.integers(min_value=1, max_value=total)),
            experts_total=total,
            t_fwd=draw(st.floats(min_value=1, max_value=8)),
        ),
        t_bar=draw(st.floats(min_value=1, max_value=16384)),
        f_restore=draw(st.floats(min_value=0, max_value=1)),
    )


slices = st.builds(
    lambda uc, c, out, acc, q: WorkSlice(Work(t_uc=uc, t_c=c, t_out=out, t_acc=acc), q),
    st.floats(min_value=1, max_value=1e5),
    st.floats(min_value=0, max_value=1e6),
    st.floats(min_value=1, max_value=1e4),
    st.floats(min_value=1, max_value=6),
    st.floats(min_value=0.5, max_value=2000),
)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(node_models(), min_size=1, max_size=4),
    st.lists(slices, min_size=1, max_size=4),
    st.integers(1, 9),
)
def test_vectorized_rates_equal_the_scalar_models(
    models: list[NodeModel], ss: list[WorkSlice], k: int
) -> None:
    arrays, s = NodeArrays.of(models), SliceArrays.of(ss)
    p, d = arrays.prefill_rates(s), arrays.decode_rates(s, k)
    for i, m in enumerate(models):
        for j, sl in enumerate(ss):
            assert p[i, j] == pytest.approx(m.prefill_rate(sl.work), rel=1e-9)
            assert d[i, j] == pytest.approx(m.decode_rate(sl.work, sl.decode_occupancy / k), rel=1e-9)


def test_split_throughput_is_the_slower_phase() -> None:
    m = NodeModel(PrefillModel(0.01, 1e-5, 1e-10, 0), DecodeModel(0.01, 0.02, 1e-4, 8, 256), t_bar=4096)
    s = WorkSlice(Work(t_uc=2000, t_c=10000, t_out=500), decode_occupancy=64)
    mu_p = 2 * m.prefill_rate(s.work)
    mu_d = 3 * m.decode_rate(s.work, 64 / 3)
    assert split_throughput([m, m], [m, m, m], s) == pytest.approx(min(mu_p, mu_d))
    assert split_throughput([], [m], s) == 0.0
    zero_q = WorkSlice(s.work, decode_occupancy=0)
    assert split_throughput([m], [m], zero_q) == 0.0
