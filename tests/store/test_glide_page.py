"""docs/glide.md runs as printed: its sample makes a glide client, a store and two aguards."""

from __future__ import annotations

import pytest

from tests._pages import run_page
from tests._servers import RedisServer


@pytest.mark.redis
def test_the_glide_page_runs_as_printed(
    private_redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("glide", reason="valkey-glide is not installed (idemkey[glide])")
    run_page("docs/glide.md", private_redis_server.url)
    assert capsys.readouterr().out.splitlines() == [
        "False {'charge': 'ch_1'}",
        "True {'charge': 'ch_1'}",
    ]
