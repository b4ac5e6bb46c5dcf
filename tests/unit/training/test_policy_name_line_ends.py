"""A custom selection policy's ``module:function`` ends where its text ends: a name with a
trailing newline (which a ``$`` anchor lets through) is refused before anything is imported."""

from __future__ import annotations

import pytest

from grove.training.errors import SelectionPolicyError
from grove.training.selection import resolve_selection_policy


@pytest.mark.parametrize("spec", ["json\n:loads", "json:loads\n", "os.path\n:join"])
def test_a_policy_name_with_a_newline_is_refused(spec: str):
    with pytest.raises(SelectionPolicyError, match=r"\(malformed_name\)"):
        resolve_selection_policy(spec)
