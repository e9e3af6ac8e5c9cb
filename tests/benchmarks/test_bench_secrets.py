"""The benchmark suite never writes the Redis password: not in an error on stderr, not in the
results file (``--json PATH``, made to be kept and shared), whose ``meta.command`` repeats the
command line with ``--redis-url``'s password as ``***``, as every idemkey command prints it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from benchmarks import main
from benchmarks.cli import command_line
from tests._servers import RedisServer, free_port

SECRET = "Bench-S3cret"


def test_an_unreachable_redis_is_named_without_its_password(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = f"redis://:{SECRET}@127.0.0.1:{free_port()}/0"
    assert main(["--quick", "--no-http-servers", "--redis-url", url]) == 2
    captured = capsys.readouterr()
    assert SECRET not in captured.out + captured.err
    assert "cannot reach Redis at redis://:***@127.0.0.1:" in captured.err


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        (["--redis-url", f"redis://:{SECRET}@h:1/0", "--quick"],
         "python -m benchmarks --redis-url redis://:***@h:1/0 --quick"),
        ([f"--redis-url=redis://u:{SECRET}@h:1/0"],
         "python -m benchmarks --redis-url=redis://u:***@h:1/0"),
        (["--redis", f"redis://:{SECRET}@h:1/0"],  # argparse takes a prefix of the option
         "python -m benchmarks --redis redis://:***@h:1/0"),
        (["--quick", "--redis-url", f"redis://h:1/0?password={SECRET}"],
         "python -m benchmarks --quick --redis-url redis://h:1/0?password=***"),
        (["--quick", "--redis-url", "redis://h:1/0"],
         "python -m benchmarks --quick --redis-url redis://h:1/0"),
        (["--quick"], "python -m benchmarks --quick"),
    ],
)  # fmt: skip
def test_the_command_line_kept_in_the_results_hides_the_password(
    argv: list[str], shown: str
) -> None:
    url = next((a.partition("=")[2] or argv[i + 1] for i, a in enumerate(argv)
                if a.startswith("--redis")), None)  # fmt: skip
    assert command_line(argv, url) == shown


@pytest.mark.benchmark
@pytest.mark.redis
def test_the_results_file_holds_no_password(
    redis_server_factory: Callable[..., RedisServer], tmp_path: Path
) -> None:
    server = redis_server_factory()
    with server.client() as admin:
        admin.config_set("requirepass", SECRET)
    out = tmp_path / "bench.json"
    url = f"redis://:{SECRET}@{server.host}:{server.port}/0"
    status = main(["--quick", "--rounds", "30", "--no-http-servers", "--redis-url", url,
                   "--json", str(out)])  # fmt: skip
    assert status in (0, 1)
    text = out.read_text()
    assert SECRET not in text
    assert "--redis-url redis://:***@" in json.loads(text)["meta"]["command"]
