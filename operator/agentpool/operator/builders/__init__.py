"""Pure builders: from a validated pool spec to the manifests of its children (no kopf, no client).

`children(pool, spec, settings)` returns every child the operator applies, in apply order; each
carries the pool's owner reference and labels. Secrets are built by `secrets.generated_secret`
from values the caller generates (randomness is I/O), and only when they do not exist yet.
"""

from agentpool.operator.builders.pool import InvalidPoolError, children
from agentpool.operator.builders.settings import BuildSettings

__all__ = ["BuildSettings", "InvalidPoolError", "children"]
