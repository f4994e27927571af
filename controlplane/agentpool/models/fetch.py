"""KV fetch time ``tau(x)`` and copy price ``kappa`` (evolving-infra App. E.3 and D.6).

A prefill node that lacks ``x`` prefix tokens which another node holds fetches them from that
node's host memory while the request waits in its queue. The fetch takes::

    tau(x) = base_s + per_token_s * x     for x >= min_tokens
    tau(x) = 0 (no fetch; the tokens are recomputed)   for x < min_tokens

and the router charges the duplicate copy the fetch creates with ``kappa * x`` seconds.

Which constants, and why. Appendix E.3 writes ``tau(x) = 0.45 s + 1 us * x``. Appendix D.6 measures
the same fetches: 54.6 KB of KV per token at about 52 GB/s (about 1.05 us per token), a median of
7 ms for the 92% of fetches under 16K tokens, and 129 ms at the median for 64K-128K tokens. A
0.45 s constant contradicts both measurements by two orders of magnitude, while 0.45 *ms* plus 1 us
per token reproduces them (a few ms for small fetches, ~97 ms at 96K tokens). The default here is
therefore ``base_s = 0.45e-3``; :data:`PAPER_LITERAL_FETCH_MODEL` keeps the literal reading for
anyone who wants to reproduce it. Both are plain values: pools configure their own.

The paper gives no value for ``kappa``. The default :data:`DEFAULT_COPY_PRICE_S_PER_TOKEN`
(0.1 us per token, a tenth of the per-token fetch time) makes a fetch of 64K tokens cost 6.6 ms of
predicted TTFT: enough to break near-ties in favour of not duplicating KV, far below typical
queueing delays, so it never outweighs a real load imbalance.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_COPY_PRICE_S_PER_TOKEN = 1e-7


@dataclass(frozen=True, slots=True)
class FetchModel:
    """``tau(x)``: seconds to fetch ``x`` prefix tokens from a peer; no fetch below ``min_tokens``."""

    base_s: float = 0.45e-3
    per_token_s: float = 1e-6
    min_tokens: int = 512

    def __post_init__(self) -> None:
        if self.base_s < 0 or self.per_token_s < 0 or self.min_tokens < 0:
            raise ValueError(f"fetch model parameters must be non-negative: {self}")

    def fetches(self, tokens: int) -> bool:
        """Whether a node fetches ``tokens`` missing prefix tokens (rather than recomputing them)."""
        return tokens > 0 and tokens >= self.min_tokens

    def tau(self, tokens: int) -> float:
        """Fetch time of ``tokens`` tokens; 0 when there is no fetch."""
        if tokens < 0:
            raise ValueError(f"tokens must be non-negative, got {tokens}")
        if not self.fetches(tokens):
            return 0.0
        return self.base_s + self.per_token_s * tokens


DEFAULT_FETCH_MODEL = FetchModel()
PAPER_LITERAL_FETCH_MODEL = FetchModel(base_s=0.45, per_token_s=1e-6, min_tokens=512)


def copy_price(kappa_s_per_token: float, tokens: int) -> float:
    """``kappa * x``: the price in seconds of the duplicate KV that fetching ``tokens`` creates."""
    if kappa_s_per_token < 0:
        raise ValueError(f"copy price must be non-negative, got {kappa_s_per_token}")
    return kappa_s_per_token * tokens
