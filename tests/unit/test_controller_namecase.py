"""Served names that differ only in case (controller/fleet/namecase.py)."""

from __future__ import annotations

import pytest

from llmgw.controller.errors import InvalidSpec
from llmgw.controller.fleet.namecase import check_case
from tests.unit.controller_reconcile_world import World, spec


class TestStoredClashesApplyAgain:
    """Names stored before the rule keep working, alone or together."""

    def test_two_stored_models_that_clash_apply_again_together(self) -> None:
        """`Llama` and `llama` stored before the rule: the fleet file naming both, unchanged,
        applies again (as each alone does), rather than a 422 for a clash it had."""
        w = World()
        w.model(spec("Llama"))
        w.model(spec("llama"))
        check_case(w.state, [spec("Llama"), spec("llama")])
        check_case(w.state, [spec("llama")])

    def test_a_new_name_clashing_with_a_stored_one_in_the_request_is_refused(self) -> None:
        """A name newly taken still may not differ only in case from one in the request."""
        w = World()
        w.model(spec("Llama"))
        with pytest.raises(InvalidSpec, match="differs only in case from 'Llama'"):
            check_case(w.state, [spec("Llama"), spec("llama")])
        with pytest.raises(InvalidSpec, match="differs only in case from 'llama'"):
            check_case(w.state, [spec("llama"), spec("Llama")])
