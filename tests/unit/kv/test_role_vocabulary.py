"""One role vocabulary: the CRD's role strings and the role files' are agentpool.kv.Role's values."""

from __future__ import annotations

from agentpool.api import status
from agentpool.kv import Role
from agentpool.local import file_roles
from agentpool.node import Role as NodeRole
from agentpool.operator import status as operator_status
from agentpool.router.policy import Role as PolicyRole


def test_every_role_name_is_the_one_role_type() -> None:
    assert NodeRole is Role and PolicyRole is Role
    values = ["prefill", "decode", "both"]
    assert [r.value for r in Role] == values
    assert status.Role is Role and list(status.ROLES) == values  # the CRD's status models use it too
    assert list(file_roles.ROLES) == values and list(operator_status.ROLES) == values
    assert Role("decode") is Role.DECODE and "prefill" in operator_status.ROLES
