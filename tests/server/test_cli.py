"""The command line: SGLang flag names, clear errors, and --random-seed reproducibility."""

from __future__ import annotations

import pytest

from arealite.server.cli import build_parser, build_state, check_args


def test_sglang_flag_names_parse(model_dir):
    args = build_parser().parse_args(
        [
            "--model-path",
            model_dir,
            "--port",
            "1234",
            "--dtype",
            "float32",
            "--context-length",
            "512",
            "--random-seed",
            "7",
            "--api-key",
            "k",
            "--max-running-requests",
            "8",
            "--log-level",
            "warning",
            "--tp-size",
            "1",
            "--mem-fraction-static",
            "0.8",
            "--disable-radix-cache",
            "--trust-remote-code",
        ]
    )
    check_args(args)
    assert (args.host, args.port, args.context_length, args.random_seed, args.max_running_requests) == (
        "127.0.0.1",
        1234,
        512,
        7,
        8,
    )


@pytest.mark.parametrize(
    "extra,fragment",
    [(["--max-running-requests", "0"], "--max-running-requests"), (["--context-length", "0"], "--context-length")],
)
def test_bad_values_name_the_flag(model_dir, extra, fragment):
    with pytest.raises(SystemExit, match=fragment):
        check_args(build_parser().parse_args(["--model-path", model_dir, *extra]))
    with pytest.raises(SystemExit, match="not a directory"):
        check_args(build_parser().parse_args(["--model-path", "/no/such/model"]))


def test_random_seed_makes_request_seeds_reproducible(model_dir):
    def seeds(seed: str) -> list[int]:
        state = build_state(
            build_parser().parse_args(["--model-path", model_dir, "--random-seed", seed, "--context-length", "64"])
        )
        assert state.context_len == 64
        return [state.next_seed() for _ in range(4)]

    first = seeds("5")
    assert seeds("5") == first and seeds("6") != first
